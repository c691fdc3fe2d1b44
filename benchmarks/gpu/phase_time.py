"""Where hitproof's soak took longer than the raw client's replay of it, phase by phase (issue 34).

rate.py's request-rate ratio is one number for the whole soak. On the GPU it moved between 0.68 and 1.10 from one
soak to the next (run Z, 128 streams), and the raw client can only be faster where hitproof was slow between a
request's dependencies ending and its own start (its judging, its loop's queue, the waits it adds: the replay
keeps every dependency hitproof had and none of its work). This splits both timelines at the same places: a phase's
share is from the end of the phase before it (the first request's start, for the first phase) to the last end of
its own requests, so the shares add up to each side's whole span and the gap before a phase's first request
counts against that phase. A probe the replay sends first (the cache-report probe, no phase of hitproof's) is left
out of its span.
"""

from __future__ import annotations


def shares(rows: list[tuple[str, float, float]]) -> dict[str, float]:
    """rows: (phase, start, end) in start order, one a request, one clock. Each phase's share of the span."""
    if not rows:
        return {}
    last_end: dict[str, float] = {}
    for phase, _, end in rows:
        last_end[phase] = max(end, last_end.get(phase, end))
    out, boundary = {}, rows[0][1]
    for phase in dict.fromkeys(p for p, _, _ in rows):       # phases in the order they began
        edge = max(boundary, last_end[phase])   # a phase that ended before the one before it took no time
        out[phase] = edge - boundary
        boundary = edge
    return out


def phase_time(hitproof: list[tuple[str, float, float]], raw: list[tuple[str, float, float]]) -> list[dict]:
    """Per phase, in hitproof's order: requests, hitproof's seconds, the raw client's, and what hitproof added."""
    h, r = shares(hitproof), shares(raw)
    counts: dict[str, int] = {}
    for phase, _, _ in hitproof:
        counts[phase] = counts.get(phase, 0) + 1
    return [{"phase": phase, "requests": counts[phase], "hitproof_s": round(h[phase], 3),
             "raw_s": None if phase not in r else round(r[phase], 3),
             "added_s": None if phase not in r else round(h[phase] - r[phase], 3)} for phase in h]


def span(rows: list[tuple[str, float, float]]) -> float:
    """From the first start to the last end (0 for no rows)."""
    return max(end for _, _, end in rows) - min(start for _, start, _ in rows) if rows else 0.0


def rows_of(log: dict, replay: list[dict]) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """evidence_rate.read_log's facts and the replay's requests (key, start, end) as rows for phase_time. A
    request with no end (it failed) ends where it began."""
    starts, ends = log["starts"], log["ends"]
    h = []
    for rid in log["order"]:
        began = starts[rid].get("t")
        if began is None:
            continue
        ended = (ends.get(rid) or {}).get("t")
        h.append((label(starts[rid]), began, began if ended is None else ended))
    r = []
    for x in replay:
        if x.get("start") is None or not x["key"].isdigit() or int(x["key"]) not in starts:
            continue
        r.append((label(starts[int(x["key"])]), x["start"], x["start"] if x.get("end") is None else x["end"]))
    r.sort(key=lambda row: row[1])
    return h, r


def label(start: dict) -> str:
    """A phase's name; rotation's round 0 (barriered, the memos' cold runs) apart from its rounds 1 on (no
    barrier). A re-run in isolation counts in the phase it re-runs (the soak waits for it there)."""
    if start.get("phase") == "rotation":
        return "rotation 0" if not start.get("round") else "rotation 1+"
    return start.get("phase") or "?"


def line(rows: list[dict], top: int = 3) -> str:
    """The phases where hitproof added the most, largest first: 'rotation 1+ +1.20 s, cold_hit +0.31 s'."""
    added = sorted((row for row in rows if row["added_s"] is not None), key=lambda row: -row["added_s"])
    return ", ".join(f"{row['phase']} {row['added_s']:+.2f} s" for row in added[:top]) or "none measured"
