"""Reproductions of the restore phase's findings: llama.cpp slot state saved on one server and
restored on another (both started with the same `--slot-save-path`).

- `restore_no_reuse`: the memo prefilled into slot S of the first server (one token generated: the
  slot holds exactly its tokens), saved, restored into slot S of the second, and the question about
  it (a continuation of the saved tokens) sent pinned there: the fault shows when the restore is
  accepted and the continuation reuses nothing (llama.cpp #26676).
- `bad_restore`: the saved file damaged as the phase damaged it (the script writes the copy in the
  slot folder given on its command line), restored into slot D of the second server, and the
  finding's request sent pinned there, against the same request sent cold to the first: the fault
  shows when the damaged file is accepted and the answer is wrong where the cold one is right.
"""

from __future__ import annotations

from typing import Any

from ..log.events import Finding, RequestStarted
from .repro_log import LoadedLog, body_of, finding_of, prompt_of, run_of, seen_of

RESTORE_CLAIMS = {"restore_no_reuse": "restore_no_reuse", "bad_restore": "bad_restore"}


def _prefill(log: LoadedLog, finding: Finding) -> RequestStarted | None:
    """The phase's first request: the memo, cold, one token, into the slot that is then saved."""
    return next((s for s in sorted(log.starts.values(), key=lambda s: s.request)
                 if s.phase == finding.phase and s.expect == "cold" and s.arm == "main" and s.max_tokens == 1), None)


def restore_unreplayable(log: LoadedLog, finding: Finding) -> str | None:
    hit = log.starts.get(finding.request) if finding.request is not None else None
    if hit is None:
        return f"the {finding.kind} finding names no request the log holds"
    prefill = _prefill(log, finding)
    if prefill is None:
        return "the restore phase's prefill (the memo written into the saved slot) is not in the log"
    for start in (prefill, hit):
        if prompt_of(log, start) is None:
            return (f"request {start.request}'s prompt ({start.prompt_chars or 'an unknown number of'} characters) "
                    f"is not in the log whole")
    if finding.kind == "bad_restore" and not (finding.evidence or {}).get("damage"):
        return "the bad_restore finding does not say how the file was damaged"
    return None


def restore_plan(log: LoadedLog, finding: Finding, index: int, of: int, repeats: int) -> dict[str, Any]:
    ev = finding.evidence or {}
    settings = log.settings().get("restore") or {}
    hit, prefill = log.starts[finding.request], _prefill(log, finding)
    prefill_body = body_of(log, prefill, None)
    prefill_body.update(max_tokens=1)
    prefill_body.pop("logprobs", None)
    cold_body = body_of(log, hit, "cold")          # llama.cpp: cache_prompt false, not pinned to a slot
    steps = [{"role": "prefill", "label": f"the memo into slot S (request {prefill.request})", "request": prefill.request,
              "body": prefill_body, "fresh_salt": False, "log": seen_of(log, prefill.request)},
             {"role": "cold", "label": "the request sent cold to the first server", "request": ev.get("control_request"),
              "body": cold_body, "fresh_salt": False, "log": seen_of(log, ev.get("control_request"))},
             {"role": "hit", "label": "the request pinned to the restored slot", "request": hit.request,
              "body": body_of(log, hit, None), "fresh_salt": False, "log": seen_of(log, hit.request),
              "repeats": 1}]
    evidence = log.settings().get("evidence") or {}
    return {"finding": finding_of(finding, index, of), "claim": RESTORE_CLAIMS[finding.kind], "run": run_of(log),
            "api": hit.api, "code": hit.code, "codes": {}, "single_group": False, "batched": False,
            "tolerance": evidence.get("fingerprint_tolerance", 0.5),
            "fingerprint_tokens": evidence.get("fingerprint_tokens", 12), "cold_tolerance": 0, "steps": steps,
            "slot": settings.get("slot", 0), "damaged_slot": settings.get("damaged_slot", 1),
            "damage": ev.get("damage"), "restored": ev.get("restored")}


_FLOW = r'''
def add_arguments(parser):
    parser.add_argument("--to", metavar="URL2", required=True,
                        help="the second llama-server (same model, same --slot-save-path) the slot moves to")
    if PLAN["claim"] == "bad_restore":
        parser.add_argument("--slot-dir", metavar="DIR", required=True,
                            help="the servers' --slot-save-path folder (the damaged copy is written there)")


def slot_action(url, slot, action, filename, timeout):
    """POST /slots/S?action=...: (HTTP status, the answer's JSON or text)."""
    body = json.dumps({"filename": filename} if filename else {}).encode()
    request = urllib.request.Request(f"{url}/slots/{slot}?action={action}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, " ".join(exc.read().decode("utf-8", "replace").split())[:200]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, str(getattr(exc, "reason", None) or exc)


def damage(data, kind):
    """The saved file damaged as hitproof's restore phase damages it."""
    data, middle = bytearray(data), len(data) // 2
    if kind == "truncated":
        return bytes(data[:middle])
    if kind == "short":
        return bytes(data[:-1])
    if kind == "magic":
        data[0] ^= 0xFF
    elif kind == "flipped":
        data[middle] ^= 0xFF
    elif kind == "scrambled":
        end = min(len(data), middle + 4096)
        data[middle:end] = bytes((b * 151 + 89) % 256 for b in data[middle:end])
    return bytes(data)


def pinned(step, slot):
    return dict(step["body"], id_slot=slot)


def save_and_restore(url, to, slot, into, args, kind=None):
    """Prefill slot `slot` of `url`, save it, (damage it), restore it into slot `into` of `to`: (the
    restore's status and answer, the file restored)."""
    name = f"hitproof-repro-{uuid.uuid4().hex[:12]}.bin"
    prefill = PLAN["steps"][0]
    print(f"prefill now: {show(send(url, pinned(prefill, slot), args.timeout))}  [{prefill['label']}]")
    status, saved = slot_action(url, slot, "save", name, args.timeout)
    if status != 200:
        raise Problem(f"{url}: saving slot {slot} failed (HTTP {status}: {saved}); is --slot-save-path set?")
    print(f"save   now: slot {slot} of {url}: {saved.get('n_saved')} tokens to {name}")
    if kind:
        path = os.path.join(args.slot_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
            name = f"{name}.{kind}"
            with open(os.path.join(args.slot_dir, name), "wb") as f:
                f.write(damage(data, kind))
        except OSError as exc:
            raise Problem(f"{path}: {exc.strerror or exc} (--slot-dir must be the servers' --slot-save-path)")
        print(f"damage now: {kind} copy {name}")
    status, restored = slot_action(to, into, "restore", name, args.timeout)
    print(f"restore now: slot {into} of {to}: HTTP {status}: "
          f"{restored.get('n_restored') if isinstance(restored, dict) else restored}")
    return status, restored, name


def run_no_reuse(url, args):
    to, slot = args.to.rstrip("/"), PLAN["slot"]
    print(f"log: the restore was accepted ({PLAN['restored']} tokens) and the continuation reused "
          f"{PLAN['steps'][2]['log']['cached_tokens']}")
    status, restored, _ = save_and_restore(url, to, slot, slot, args)
    if status != 200:
        print(f"the restore was refused (HTTP {status}): not the silent no-op the log saw; the fault does not show")
        return 0
    answer = send(to, pinned(PLAN["steps"][2], slot), args.timeout)
    print(f"hit    now: {show(answer)}  [{PLAN['steps'][2]['label']}]")
    if answer["cached"] is None:
        print("NOTHING TO JUDGE: the server does not report cached tokens")
        return 4
    if answer["cached"] == 0:
        print(f"FAULT SHOWS: the restore was accepted ({restored.get('n_restored')} tokens) and the continuation "
              f"of the saved tokens reused nothing")
        return 1
    print(f"fault no longer shows: the continuation reused {answer['cached']} tokens after the restore")
    return 0


def run_bad_restore(url, args):
    to, slot, into, kind = args.to.rstrip("/"), PLAN["slot"], PLAN["damaged_slot"], PLAN["damage"]
    seen = PLAN["steps"][2]["log"]
    print(f"log: after the {kind} file was accepted, request {seen['request']} answered {seen['text'][:70]!r}")
    status, restored, _ = save_and_restore(url, to, slot, into, args, kind)
    if status is None:
        alive = health(to, args.timeout)
        print(f"FAULT SHOWS: the restore of the {kind} file {'failed' if alive else 'killed the server'}: {restored}")
        return 1
    if status != 200:
        print(f"the {kind} file was refused (HTTP {status}): the fault does not show")
        return 0
    cold = send(url, PLAN["steps"][1]["body"], args.timeout)
    print(f"cold   now: {show(cold)}  [{PLAN['steps'][1]['label']}]")
    answer = send(to, pinned(PLAN["steps"][2], into), args.timeout)
    print(f"hit    now: {show(answer)}  [{PLAN['steps'][2]['label']}]")
    why = wrong(answer, cold, "recall") if PLAN["code"] else ""
    if not why and first_divergence(cold["text"], answer["text"]) is not None:
        why = f"it answers {answer['text'][:60]!r} where the cold run answers {cold['text'][:60]!r}"
    if not why and answer["logprobs"] and cold["logprobs"]:
        why = wrong(answer, cold, "fingerprint")
    elif not why and cold["logprobs"] and not answer["logprobs"]:
        why = "no log-probabilities in the answer (the cold run has them)"
    if why:
        print(f"FAULT SHOWS: the {kind} file was accepted ({restored.get('n_restored')} tokens) and the answer on "
              f"its slot is wrong: {why}; the cold run is right")
        return 1
    print(f"fault no longer shows: the {kind} file was accepted and the answer on its slot is as the cold run's")
    return 0


def health(url, timeout):
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=min(timeout, 30)) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


FLOWS = {"restore_no_reuse": run_no_reuse, "bad_restore": run_bad_restore}'''

RESTORE_FLOWS = {"restore_no_reuse": _FLOW, "bad_restore": _FLOW}
