"""The restore phase: llama.cpp slot state that moves between servers (`--slot-save-path`).

A memo is prefilled cold in slot S of replica A (sent to A directly, pinned with `id_slot`, one
token generated, so the slot holds exactly the memo's tokens), the slot is saved, then restored into
slot S of replica B (same model, same folder) and, after A is restarted, into A again. After each
restore the question about the memo (a *continuation* of the saved tokens) is sent pinned to that
slot: it must be a hit (cached tokens > 0: a restore the server accepts can still reuse nothing,
llama.cpp #26676; a prompt no longer than what the slot holds is never a hit after a restore, it
needs a rollback a restored slot has no checkpoint for), and it gets every check a hit gets (its own
code, no foreign code, its fingerprint equal to the cold one, judged against a cold control).

Then the damaged files: copies of the saved file, damaged (`truncated` to half, the `magic` first
byte flipped, 4 KiB `scrambled` in the middle, one byte `flipped` in the middle), restored into
another slot of B. Each ends one of three ways, and the phase says which: refused with an error;
accepted, and the continuation and an unrelated memo on that slot (both pinned to it, where a
poisoned slot shows: llama.cpp #27068) answer as right as a cold control on A; or accepted and
answering wrong (fail-class, `bad_restore`). A server the restore kills ends the soak, naming the
replica (one byte short does that on llama.cpp here, so it is not in the default list). A slot a
damaged file was accepted into is erased, and B is restarted when hitproof launched it (the
poison outlives an erase on llama.cpp).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import httpx

from ...checks import detectors as checks
from ...checks.answers import hit_path_problems
from ...config.errors import ServerProblem
from ...server.slots import SlotClient, SlotError
from ..results import UNSET, PhaseResult
from ...report import fmt
from ...report.facts import fmt_count

TITLE = "restore (slot state moved)"
DAMAGES = ("truncated", "magic", "scrambled", "flipped")
WORDS = {"truncated": "a slot file cut to half its size", "short": "a slot file one byte short",
         "magic": "a slot file with its first byte flipped", "flipped": "a slot file with one byte flipped in the middle",
         "scrambled": "a slot file with 4 KiB scrambled in the middle"}

OPTIONAL = True               # never in the default list: it needs launched llama.cpp replicas
RESTORE_DAMAGES = tuple(WORDS)  # what `damages` may list


@dataclass(frozen=True)
class Settings:
    """[phases.restore]: llama.cpp slot state that moves: saved on one replica, restored on another and
    after a restart."""
    memo_tokens: int = 600
    slot: int = 0                    # the slot the memo is prefilled in, saved from and restored into
    damaged_slot: int = 1            # where the damaged files are restored (then checked, then erased)
    damages: tuple[str, ...] = ("truncated", "magic", "scrambled")   # see damage() below


MINIMUMS = {"memo_tokens": 64}


def check(s: Settings) -> tuple[str, str, str] | None:
    if any(d not in RESTORE_DAMAGES for d in s.damages):
        return "phases.restore", "damages", f"must list damages from {', '.join(RESTORE_DAMAGES)}"
    if s.slot == s.damaged_slot or min(s.slot, s.damaged_slot) < 0:
        return "phases.restore", "damaged_slot", "must be a slot number other than `slot`"
    return None



@dataclass
class Result(PhaseResult):
    # "moves": each restore of the saved slot (how, replica, restored, saved, cached, request);
    # "damages": each damaged file restored (damage, bytes, replica, outcome)
    restore: dict = UNSET


def plan(scenario) -> dict:
    r = scenario.restore
    return {"slots": 1, "rounds": 1, "planned_requests": 3 + 4 * len(r.damages)}


def damage(source: Path, target: Path, kind: str) -> int:
    """Write a damaged copy of a slot file; the bytes it has."""
    data = bytearray(source.read_bytes())
    middle = len(data) // 2
    if kind == "truncated":
        data = data[:middle]
    elif kind == "short":
        data = data[:-1]
    elif kind == "magic":
        data[0] ^= 0xFF
    elif kind == "flipped":
        data[middle] ^= 0xFF
    elif kind == "scrambled":
        end = min(len(data), middle + 4096)
        data[middle:end] = bytes((b * 151 + 89) % 256 for b in data[middle:end])
    else:
        raise ValueError(f"unknown damage {kind!r} (known: {', '.join(DAMAGES)}, short)")
    target.write_bytes(bytes(data))
    return len(data)


async def run(rq, state) -> None:
    r = rq.scenario.restore
    replicas, ctx = rq.replicas, rq.ctx
    state.result = Result(restore={"moves": [], "damages": []})
    if replicas is None or len(replicas) < 2:
        state.mark_inconclusive("the restore phase needs two replicas (--replica twice, or --replicas 2)")
        rq.finding(state, "restore_not_run", "warn",
                   detail="the restore phase needs two llama.cpp replicas behind the router, with one slot folder")
        return
    a, b = 0, 1
    name = f"hp-{rq.nonce}-restore.bin"
    memo = await rq.memo(state, tokens=r.memo_tokens, tag="restore")
    cont = dataclasses.replace(rq.question(memo.text, "recall"), slot_id=r.slot)
    if cont.prompt is None:
        state.mark_inconclusive("the restore phase continues a completion prompt: use api = \"completions\"")
        rq.finding(state, "restore_not_run", "warn", detail="the restore phase needs api = \"completions\"")
        return
    # The slot must hold a prefix of the question's tokens, nothing more: a request shorter than what a
    # restored slot holds needs a rollback it has no checkpoint for (llama.cpp re-processes it all).
    # So the memo alone is prefilled with one token to generate (the slot then holds exactly its
    # tokens), cut where its tokens stop being the question's (a tokenizer merges across "." + "\n\n").
    head = await _aligned_prefix(replicas, a, memo.text, cont.prompt)
    prefill = dataclasses.replace(rq.spec(prompt=head, max_tokens=1), max_tokens=1, logprobs=None, slot_id=r.slot)
    cold = await rq.send(state, prefill, task="turn", memo=memo, expect="cold", replica=a, judges=("foreign",),
                         control=False)
    try:
        saved = await _slot(replicas, a, "save", r.slot, name)
    except SlotError as exc:
        state.mark_inconclusive(f"the slot could not be saved: {exc}")
        rq.finding(state, "restore_not_run", "warn", cold, detail=f"saving slot {r.slot} on "
                   f"{replicas.label(a)} failed: {exc}")
        return
    await _move(rq, state, memo, cont, b, name, saved.tokens, "on another replica")
    if ctx.restart_replica is None:
        rq.finding(state, "restore_no_restart", "info", detail=f"{replicas.label(a)} was not launched by hitproof: "
                   f"the restore after a restart was not tried")
    else:
        await ctx.restart_replica(a)
        state.metrics_before = None           # its counters start again: the phase's counter check is off
        await _move(rq, state, memo, cont, a, name, saved.tokens, "after a restart")
    if not ctx.slot_dir:
        rq.finding(state, "restore_no_damage", "info", detail="the replicas' slot folder is not known (hitproof did "
                   "not launch them): the damaged-file half was not run")
        return
    poisoned = False
    for kind in r.damages:
        poisoned |= await _damaged(rq, state, memo, cont, b, a, Path(ctx.slot_dir), name, kind)
    if poisoned and ctx.restart_replica is not None:
        await ctx.restart_replica(b)          # a poisoned slot outlives an erase: leave later phases a clean B
        state.metrics_before = None


async def _aligned_prefix(replicas, index: int, head: str, whole: str) -> str:
    """The longest start of `whole`, at most `head`, whose tokens on that replica are a prefix of whole's
    (its /tokenize and /detokenize); `head` itself where the server cannot say."""
    url = replicas.replicas[index].url
    try:
        async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
            async def tokens(text: str) -> list:
                answer = await client.post(url + "/tokenize", json={"content": text, "add_special": False})
                answer.raise_for_status()
                return list(answer.json()["tokens"])

            mine, theirs = await tokens(head), await tokens(whole)
            n = 0
            while n < min(len(mine), len(theirs)) and mine[n] == theirs[n]:
                n += 1
            if n == len(mine):
                return head
            answer = await client.post(url + "/detokenize", json={"tokens": theirs[:n]})
            text = answer.json().get("content")
            if isinstance(text, str) and text and whole.startswith(text) and await tokens(text) == theirs[:n]:
                return text
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return head


async def _slot(replicas, index: int, action: str, slot: int, filename: str | None = None):
    async with SlotClient(replicas.replicas[index].url) as slots:
        if action == "save":
            return await slots.save(slot, filename)
        if action == "restore":
            return await slots.restore(slot, filename)
        return await slots.erase(slot)


async def _move(rq, state, memo, cont, target: int, name: str, saved: int | None, how: str) -> None:
    """Restore the saved slot on `target`, then the continuation pinned to it: a hit, checked as every hit."""
    r, replicas = rq.scenario.restore, rq.replicas
    where = f"{replicas.label(target)} ({how})"
    try:
        restored = await _slot(replicas, target, "restore", r.slot, name)
    except SlotError as exc:
        state.mark_inconclusive(f"the restore {how} was refused")
        rq.finding(state, "restore_refused", "warn", detail=f"restoring the saved slot on {where} failed: {exc}",
                   replica=target)
        return
    record = await rq.send(state, cont, task="recall", memo=memo, expect="hit", replica=target)
    # (rq.send's judge has checked its code, foreign codes and fingerprint against a cold control)
    state.result.restore["moves"].append({"how": how, "replica": target, "restored": restored.tokens,
                                            "saved": saved, "cached": record.cached, "request": record.request})
    if not record.hit:
        state.mark_inconclusive(f"the restore {how} reused nothing")
        rq.finding(state, "restore_no_reuse", "warn", record,
                   detail=f"the restore on {where} was accepted ({restored.tokens} tokens) but the continuation of "
                          f"the saved tokens reused {'nothing' if record.cached == 0 else 'an unknown part'}: a "
                          f"silent no-op (llama.cpp #26676)", restored=restored.tokens)


async def _damaged(rq, state, memo, cont, target: int, clean: int, folder: Path, name: str, kind: str) -> bool:
    """One damaged file restored on `target`; True when it was accepted (the slot may be poisoned)."""
    r, replicas = rq.scenario.restore, rq.replicas
    bad = f"{name}.{kind}"
    size = damage(folder / name, folder / bad, kind)
    where = f"{replicas.label(target)} slot {r.damaged_slot}"
    row = {"damage": kind, "bytes": size, "replica": target}
    state.result.restore["damages"].append(row)
    try:
        restored = await _slot(replicas, target, "restore", r.damaged_slot, bad)
    except SlotError as exc:
        if not exc.refused:              # the server died: the soak ends naming the replica
            raise ServerProblem(f"{where} did not answer the restore of {WORDS[kind]}: {exc}") from None
        row["outcome"] = "refused"
        rq.finding(state, "restore_damaged", "info", detail=f"{WORDS[kind]} was refused by {where}: {exc}",
                   damage=kind, outcome="refused", replica=target)
        return False
    row["restored"] = restored.tokens
    unrelated = await rq.memo(state, tokens=r.memo_tokens, tag=f"restore-{kind}")
    specs = [(cont, memo), (rq.question(unrelated.text, "recall"), unrelated)]
    wrong = []
    for spec, owner in specs:
        spec = dataclasses.replace(spec, slot_id=r.damaged_slot)
        record = await rq.send(state, spec, task="recall", memo=owner, expect="any", replica=target, control=False)
        control = await rq.send(state, dataclasses.replace(spec, salt=rq.fresh_salt(), slot_id=None), task="recall",
                                memo=owner, expect="cold", arm="control", of_request=record.request, replica=clean)
        for problem, offset, detail in _against_cold(rq, record, control):
            if problem is None:
                rq.finding(state, "restore_damaged", "info", record, offset=offset, detail=f"{detail}; after "
                           f"{WORDS[kind]} was accepted by {where}", damage=kind)
                continue
            wrong.append(record.request)
            rq.finding(state, "bad_restore", "fail", record, offset=offset,
                       detail=f"after {WORDS[kind]} was accepted by {where}: {detail}, while the cold "
                              f"control (request {control.request}, on {replicas.label(clean)}) is right",
                       damage=kind, problem=problem, control_request=control.request, cached_tokens=record.cached)
    row["outcome"] = "accepted, answered wrong" if wrong else "accepted, later requests correct"
    if not wrong:
        rq.finding(state, "restore_damaged", "info", detail=f"{WORDS[kind]} was accepted by {where} "
                   f"({restored.tokens} tokens) and the requests on that slot after it answered right",
                   damage=kind, outcome="accepted", replica=target)
    try:
        await _slot(replicas, target, "erase", r.damaged_slot)
    except SlotError:
        pass
    return True


def _against_cold(rq, record, control) -> list[tuple[str | None, int | None, str]]:
    """What is wrong with `record` where its cold control on a clean replica is right: (problem, offset,
    detail); problem None for what is the model's (or numerics), not the restore's."""
    out: list[tuple[str | None, int | None, str]] = []
    control_kinds = {k for k, _, _ in hit_path_problems(control.checks)}
    for problem, offset, detail in hit_path_problems(record.checks):
        if problem in control_kinds:
            out.append((None, offset, f"{detail}; the cold control fails the same way: the model, not the restore"))
        else:
            out.append((problem, offset, detail))
    e = rq.scenario.evidence
    if e.fingerprints and record.completion.logprobs and control.completion.logprobs and control.cold:
        match = checks.fingerprint_match(record.completion.logprobs, control.completion.logprobs, e.fingerprint_tokens)
        if not match.matches(e.fingerprint_tolerance):
            flip = checks.compare_logprobs(control.completion.logprobs, record.completion.logprobs)
            if checks.near_tie_explains(match, flip, e.fingerprint_tolerance):
                out.append((None, None, f"a near-tied token flips at output token {flip.token}: numerics"))
            else:
                out.append(("fingerprint_mismatch", None, f"its greedy tokens and log-probabilities are off the cold "
                            f"control's ({match.agreeing} tokens agree, distance {match.distance:.4f})"))
    return out


# --- what the phase adds to the reports ---------------------------------------------------------------

def console_lines(summary: dict) -> list[str]:
    """Each move of the saved slot (cached tokens of the continuation after the restore) and each
    damaged file's outcome."""
    r = Result.read(summary).restore
    if not r:
        return []
    lines = []
    for m in r.get("moves", []):
        cached = fmt.MISSING if m.get("cached") is None else m["cached"]
        lines.append(f"restore {m.get('how')}: r{m.get('replica')}: {fmt_count(m.get('restored'))} of "
                     f"{fmt_count(m.get('saved'))} saved tokens restored, {cached} reused")
    for d in r.get("damages", []):
        lines.append(f"damaged slot file ({d.get('damage')}, {fmt_count(d.get('bytes'))} bytes) on "
                     f"r{d.get('replica')}: {d.get('outcome') or 'not judged'}")
    return lines


timing_lines = console_lines
