"""Phase: partition, the paired assertion (both halves) for each identity field the server has.

- `cache_salt` (vLLM, SGLang, any server that takes one; llama.cpp has none, and the phase says so):
  a memo under salt A twice (the repeat must hit), then under salt B twice: B's first request must
  reuse nothing beyond the tokens before the run nonce, and its repeat must hit. Then A and B at
  the same moment on a memo A has computed. Codes and fingerprints are judged as everywhere.
- LoRA adapters (the scenario names them, or the server lists them: vLLM's `/v1/models` entries with
  a `parent`, llama.cpp's `/lora-adapters`), with the base model as one more identity: per order
  (a rotation of the identities) a fresh memo goes through each identity twice (first request: no
  reuse of what the others computed; repeat: must hit), then back to the first identity, then every
  identity at once. Each identity's own cold fingerprint of the memo is taken last (solo, under a
  fresh salt / `cache_prompt: false`), and every answer is compared with it and with the others'
  (partition_identities.py, beside it). Then every memo again under each identity, alone (a state saved
  elsewhere and brought back must be the asker's), and once per phase every identity at once on
  a memo nobody computed.
- The fingerprint tolerance is calibrated on the first memo (`calibrate = true`): this server's own
  noise on same-identity answers, times ten, at least 0.05 nats, never above the scenario's
  (checks.detectors.calibrated_tolerance says why). The report gives the numbers.

`partition_leak` (fail) and `partition_no_reuse` (warn); the report lists each pair tried.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config.errors import BadInput
from ...server.adapters import Identity, identities
from .partition_identities import PairBook, Sent, under
from ..record import concurrently
from ..results import UNSET, PhaseResult
from ...report import fmt
from ...report.facts import text_table
from ...report.phase_facts import Section

TITLE = "partition"
GUESS_IDENTITIES = 3          # for the plan, before the server is asked: base, a, b


@dataclass(frozen=True)
class Settings:
    """[phases.partition]: the paired assertion: the same tokens under two identities (cache_salt, LoRA
    adapter) must not share cached blocks, and a repeat under the same identity must hit."""
    memo_tokens: int = 1200
    salts: bool = True               # cache_salt pairs, where the dialect has salts (llama.cpp has none)
    lora: bool = True                # adapter pairs, where the server serves adapters
    adapters: tuple[str, ...] = ()   # the adapters to pair; empty: the first two the server lists
    base: bool = True                # the base model is one of the identities
    base_selection: str = "explicit"   # "explicit": the base model named (llama.cpp: every adapter at
                                     # scale 0); "default": no adapter field (the server's default set)
    orders: int = 3                  # adapter orders, each on its own memo (rotations of the identities)
    concurrent: bool = True          # also every identity at once on the same memo
    calibrate: bool = True           # fingerprint tolerance from the server's own same-identity noise
                                     # (checks.detectors.calibrated_tolerance), never above the scenario's


MINIMUMS = {"memo_tokens": 64, "orders": 1}


def check(s: Settings) -> tuple[str, str, str] | None:
    if s.base_selection not in ("explicit", "default"):
        return "phases.partition", "base_selection", 'must be "explicit" or "default"'
    return None



@dataclass
class Result(PhaseResult):
    pairs: list[dict] = UNSET                 # one per identity pair tried (PairBook.pair_summary)
    not_tried: list[dict] = UNSET             # {"field", "why"} per identity field the server left out
    identities: list[dict] = UNSET            # the adapter identities paired: name, model, fields, what
    fingerprint_tolerance: dict = UNSET       # the calibration: used, noise, answers, factor, floor, scenario


def plan(scenario) -> dict:
    p = scenario.partition
    n = GUESS_IDENTITIES
    per_order = 2 * n + 1 + (n if p.concurrent else 0) + n + n      # ... + references + the revisit
    calibration = 2 * n if p.calibrate and p.concurrent else 0       # each identity twice at once, once
    planned = (4 + (3 if p.concurrent else 0)) * p.salts + p.lora * (p.orders * per_order + calibration
                                                                     + (2 * n if p.concurrent else 0))
    return {"slots": n if p.concurrent else 1, "rounds": p.orders + 1 + bool(p.concurrent), "planned_requests": planned}


async def run(rq, state) -> None:
    p = rq.scenario.partition
    pairs: list[dict] = []
    not_tried: list[dict] = []
    result = state.result = Result(pairs=pairs, not_tried=not_tried)
    if not p.salts:
        not_tried.append({"field": "cache_salt", "why": "switched off in the scenario"})
    elif rq.server.dialect == "llamacpp":
        not_tried.append({"field": "cache_salt", "why": "llama.cpp has no cache_salt (hitproof forces its cold "
                                                           "requests with cache_prompt: false)"})
    else:
        pairs += await salt_pairs(rq, state)
    who = _identities(rq, p) if p.lora else []
    if not p.lora:
        not_tried.append({"field": "lora", "why": "switched off in the scenario"})
    elif len(who) < 2:
        not_tried.append({"field": "lora", "why": "the server serves no LoRA adapter (no /v1/models entry with a "
                                                  "parent, no /lora-adapters)" if not rq.server.adapters
                          else "fewer than two identities to pair (set [phases.partition] adapters or base)"})
    else:
        result.identities = [{"name": i.name, "model": i.model, "fields": i.extra, "what": i.describe()}
                                     for i in who]
        pairs += await adapter_pairs(rq, state, who)
    if not pairs:
        state.mark_inconclusive("nothing to partition on: " + "; ".join(f"{n['field']}: {n['why']}"
                                                                         for n in not_tried))


def _identities(rq, p) -> list[Identity]:
    server = rq.server
    try:
        return identities(server.adapters, server.model, server.dialect, wanted=p.adapters, base=p.base,
                          selection=p.base_selection)
    except KeyError as exc:
        served = ", ".join(a["name"] for a in server.adapters) or "none"
        raise BadInput(f"{rq.scenario.source}: phases.partition.adapters: the server serves no adapter "
                       f"{exc.args[0]!r} (it serves: {served})") from None


def _question(rq, memo, salt: str | None = None):
    e = rq.scenario.evidence
    spec = rq.question(memo.text, "recall", salt=salt, logprobs=e.fingerprint_top_k)
    return dataclasses.replace(spec, max_tokens=max(spec.max_tokens, e.fingerprint_tokens))


# --- cache_salt ------------------------------------------------------------------------------

async def salt_pairs(rq, state) -> list[dict]:
    p = rq.scenario.partition
    book = PairBook(rq, state, "cache_salt", ["A", "B"])
    who = {n: Identity(n, rq.server.model, adapter=False, label=f"cache_salt {n}") for n in "AB"}
    salts = {n: rq.fresh_salt() for n in "AB"}

    async def send(n: str, spec, memo, expect: str, round_: int):
        return await rq.send(state, spec, task="recall", memo=memo, slot="AB".index(n), round=round_, expect=expect)

    memo = await rq.memo(state, tokens=p.memo_tokens, tag="salt")
    spec = {n: _question(rq, memo, salts[n]) for n in "AB"}
    await send("A", spec["A"], memo, "cold", 0)
    book.same(await send("A", spec["A"], memo, "hit", 0), who["A"])
    book.cross(await send("B", spec["B"], memo, "any", 0), who["B"], {"A"}, step="first")
    book.same(await send("B", spec["B"], memo, "hit", 0), who["B"])
    if p.concurrent:
        memo = await rq.memo(state, tokens=p.memo_tokens, tag="salt-c")
        spec = {n: _question(rq, memo, salts[n]) for n in "AB"}
        await send("A", spec["A"], memo, "cold", 1)
        a, b = await concurrently(send("A", spec["A"], memo, "hit", 1), send("B", spec["B"], memo, "any", 1))
        book.same(a, who["A"])
        book.cross(b, who["B"], {"A"}, step="concurrent", with_=("A",))
    return book.conclude()


# --- LoRA adapters ---------------------------------------------------------------------------

async def adapter_pairs(rq, state, who: list[Identity]) -> list[dict]:
    p = rq.scenario.partition
    book = PairBook(rq, state, "lora", [i.name for i in who])
    slot = {i.name: n for n, i in enumerate(who)}

    def sender(memo, specs, round_: int):
        async def send(i: Identity, expect: str = "any", arm: str = "main"):
            return await rq.send(state, specs[i.name], task="recall", memo=memo, slot=slot[i.name], round=round_,
                                 expect=expect, arm=arm, fingerprints=False)

        async def cold_ref(i: Identity):
            return await rq.send(state, dataclasses.replace(specs[i.name], salt=rq.fresh_salt()), task="recall",
                                 memo=memo, slot=slot[i.name], round=round_, expect="cold", arm="control")

        def alone(i: Identity):
            return lambda: send(i, arm="control")

        def in_group(i: Identity):
            async def again():
                records = await concurrently(*(send(j, arm="control") for j in who))
                return records[who.index(i)]
            return again
        return send, cold_ref, alone, in_group

    history: list[tuple] = []                 # (memo, specs, references) of each order, for the revisit
    for k in range(p.orders):
        order = who[k % len(who):] + who[:k % len(who)]
        memo = await rq.memo(state, tokens=p.memo_tokens, tag=f"part{k}")
        specs = {i.name: under(_question(rq, memo), i) for i in who}
        send, cold_ref, alone, in_group = sender(memo, specs, k)
        rq.round(state, k, p.orders, {str(slot[i.name]): f"{memo.memo_id} as {i.name}" for i in order})
        sent: list[Sent] = []
        computed: set[str] = set()
        for i in order:
            first = await send(i, "any" if computed else "cold")
            book.cross(first, i, computed, step="first")
            computed.add(i.name)
            again = await send(i, "hit")
            book.same(again, i)
            sent += [Sent(i, first, "first", rerun=alone(i)), Sent(i, again, "repeat", rerun=alone(i))]
        sent.append(Sent(order[0], await send(order[0]), "return", rerun=alone(order[0])))
        if p.concurrent:
            group = await concurrently(*(send(i) for i in who))
            names = tuple(i.name for i in who)
            sent += [Sent(i, r, "concurrent", names, rerun=in_group(i)) for i, r in zip(who, group)]
        refs = {i.name: await cold_ref(i) for i in who}
        if k == 0 and p.calibrate:
            state.result.fingerprint_tolerance = await _calibrate(book, who, send, sent, refs, p.concurrent)
        await book.judge_answers(refs, sent, cold_ref)
        history.append((memo, specs, refs))
    await _revisit(rq, state, book, who, sender, history)
    if p.concurrent:
        await _all_at_once_cold(rq, state, book, who, sender)
    return book.conclude()


async def _calibrate(book: PairBook, who: list[Identity], send, sent: list[Sent], refs: dict, concurrent: bool) -> dict:
    """The server's own noise on the first memo: each identity's repeat (alone) and, when the phase
    sends identities at once, each identity twice at once (a batch that mixes nothing) against the
    identity's cold reference. The tolerance judged with follows it (PairBook.calibrate)."""
    clean = [(s.identity.name, s.record) for s in sent if s.step == "repeat"]
    if concurrent:
        for i in who:
            clean += [(i.name, r) for r in await concurrently(send(i, arm="control"), send(i, arm="control"))]
    return book.calibrate(refs, clean)


async def _revisit(rq, state, book: PairBook, who: list[Identity], sender, history: list) -> None:
    """Every memo again, once under each identity (alone, in an order turned by one per memo), after
    other prompts have taken the slots: a state kept or saved elsewhere (llama.cpp's RAM prompt cache)
    and brought back must be the asking identity's. Each identity computed each memo already, so a
    hit proves nothing either way here: the answers are judged against the memo's references."""
    p = rq.scenario.partition
    rq.round(state, p.orders, p.orders + 1, {str(n): f"{m.memo_id} again" for n, (m, _, _) in enumerate(history)})
    for k, (memo, specs, refs) in enumerate(history):
        send, cold_ref, alone, _ = sender(memo, specs, p.orders)
        order = who[(k + 1) % len(who):] + who[:(k + 1) % len(who)]
        sent = [Sent(i, await send(i), "revisit", rerun=alone(i)) for i in order]
        await book.judge_answers(refs, sent, cold_ref, compare_refs=False)


async def _all_at_once_cold(rq, state, book: PairBook, who: list[Identity], sender) -> None:
    """Every identity at the same moment on a memo nobody has computed: each must reuse nothing and
    answer with its own fingerprint (a batch that mixes identities must keep their weights apart)."""
    p = rq.scenario.partition
    memo = await rq.memo(state, tokens=p.memo_tokens, tag="part-together")
    specs = {i.name: under(_question(rq, memo), i) for i in who}
    send, cold_ref, _, in_group = sender(memo, specs, p.orders + 1)
    rq.round(state, p.orders + 1, p.orders + 2, {str(n): f"{memo.memo_id} as {i.name}" for n, i in enumerate(who)})
    group = await concurrently(*(send(i) for i in who))
    names = tuple(i.name for i in who)
    for i, record in zip(who, group):
        book.cross(record, i, set(names) - {i.name}, step="concurrent_cold", with_=tuple(n for n in names if n != i.name))
    refs = {i.name: await cold_ref(i) for i in who}
    await book.judge_answers(refs, [Sent(i, r, "concurrent_cold", names, rerun=in_group(i))
                                    for i, r in zip(who, group)], cold_ref)


# --- what the phase adds to the reports ---------------------------------------------------------------

HEADER = ("field", "pair", "status", "cross", "reused", "by fp", "repeats hit", "fp")


def report_rows(summary: dict) -> tuple[list[list[str]], list[str]]:
    """(one row per identity pair tried, a sentence per field not tried and for the calibration)."""
    r = Result.read(summary)
    rows = []
    for pair in r.pairs or []:
        same = ", ".join(f"{n} {v['hits']}/{v['repeats']}" for n, v in (pair.get("same_identity") or {}).items())
        fp = pair.get("fingerprints")
        rows.append([pair["field"], " / ".join(pair["pair"]), pair["status"], str(pair["cross_requests"]),
                     str(pair["cross_reused"]), str(pair["fingerprint_leaks"]), same or "none",
                     fmt.MISSING if fp in (None, "not compared") else fp])
    notes = [f"partition: {n['field']} not tried: {n['why']}" for n in r.not_tried or []]
    cal = r.fingerprint_tolerance
    if cal:
        noise = "not measured" if cal.get("noise") is None else f"{cal['noise']:.2g} nats"
        if cal.get("unlike"):
            noise += f", {cal['unlike']} unlike their own state: not calibrated"
        notes.append(f"partition: fingerprint tolerance {cal['used']:.2g} nats (this server's own noise {noise} on "
                     f"{cal['answers']} same-identity answers, x{cal['factor']:g}, at least {cal['floor']:g}, "
                     f"at most the scenario's {cal['scenario']:g})")
    return rows, notes


def console_lines(summary: dict) -> list[str]:
    rows, notes = report_rows(summary)
    table = ["partition: identity pairs tried", *text_table(HEADER, rows, "")] if rows else []
    return table + notes


def section(summary: dict) -> Section | None:
    rows, notes = report_rows(summary)
    return Section("Identity pairs (partition)", "partition", HEADER, rows, notes=notes) if rows or notes else None
