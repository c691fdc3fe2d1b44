"""Which of hitproof's requests each in-engine fault broke, from one log: the fault plugin's lines (kept as
`server_log` events when hitproof launched the server) joined to the requests by the X-Request-Id hitproof sent
(vLLM names the request `cmpl-<id>-...`).

    .venv/bin/python benchmarks/plugin_restores.py runs/rrecall/vllm-rrecall-fault-stale-checkpoint.jsonl [--rows]

Per broken restore: the request, its phase and arm, its memo and where the memo's code sat (tokens), the token
the restore was at, the token whose state it got (stale_checkpoint), and what the recall check said. The summary
counts restores per (phase, recall status) and those whose skipped stretch held the code."""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.core.log.reader import iter_log  # noqa: E402

LINE = re.compile(r"hitproof-fault (\w+): request cmpl-(hitproof-[a-z]+-\d+)-\S* restored at token (\d+): (.*)")
SOURCE = re.compile(r"state of token (\d+)")


def broken_restores(path: Path) -> tuple[list[dict], int]:
    """(one row per plugin line naming a request of this run, the run's hits)."""
    starts, ends, memos, lines = {}, {}, {}, []
    for event in iter_log(path, [], skip_deltas=True):
        kind = event.type
        if kind == "request_start":
            starts[event.request] = event
        elif kind == "request_end":
            ends[event.request] = event
        elif kind == "memo":
            memos[event.memo] = event
        elif kind == "server_log":
            lines.append(event.line)
    by_id = {s.request_id: r for r, s in starts.items() if s.request_id}
    rows = []
    for line in lines:
        match = LINE.search(line)
        if match is None or match.group(2) not in by_id:
            continue
        fault, rid, at, what = match.groups()
        request = by_id[rid]
        start, end = starts[request], ends.get(request)
        memo = memos.get(start.memo or "")
        code = list(memo.code_tokens) if memo is not None and memo.code_tokens else [None, None]
        source = SOURCE.search(what)
        recall = ((end.checks if end else {}).get("recall") or {}).get("status")
        rows.append({"request": request, "fault": fault, "phase": start.phase, "arm": start.arm, "memo": start.memo,
                     "code_start": code[0], "code_end": code[1], "restored_at": int(at),
                     "state_of": int(source.group(1)) if source else None, "recall": recall})
    hits = sum(1 for e in ends.values() if (e.cached_tokens or 0) > 0)
    return rows, hits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--rows", action="store_true", help="print every broken restore")
    args = parser.parse_args()
    rows, hits = broken_restores(args.log)
    if args.rows:
        for row in rows:
            print("\t".join(str(v) for v in row.values()))
    skipped_code = [r for r in rows if r["state_of"] is not None and r["code_start"] is not None
                    and r["state_of"] <= r["code_start"] and r["code_end"] <= r["restored_at"]]
    print(f"{args.log.name}: {len(rows)} broken restores on {len({r['request'] for r in rows})} requests; "
          f"{hits} hits in the run")
    for (phase, recall), n in sorted(collections.Counter((r["phase"], r["recall"] or "-") for r in rows).items()):
        print(f"  {phase:<20} recall {recall:<8} {n}")
    if any(r["state_of"] is not None for r in rows):
        told = collections.Counter(r["recall"] or "-" for r in skipped_code)
        print(f"  the code inside the skipped stretch: {len(skipped_code)} ({dict(told)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
