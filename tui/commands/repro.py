"""`hitproof repro LOG [--finding N] [--kind KIND] --output FILE`: a standalone script that replays the minimal
request sequence behind a fail-class finding and checks the same claim (tui/core/report/repro.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..core.config.errors import BadInput, HitproofError


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("repro", help="write a standalone Python script (standard library only) that "
                                          "reproduces a fail-class finding of a log against a URL")
    parser.add_argument("log", metavar="LOG")
    parser.add_argument("--finding", type=int, metavar="N",
                        help="which fail-class finding, counted from 1 in the log's order (default: the first "
                             "whose prompts the log holds whole)")
    parser.add_argument("--kind", metavar="KIND",
                        help="reproduce a finding of this kind, fail- or warn-class (e.g. reuse_short); --finding "
                             "then counts the findings of this kind")
    parser.add_argument("--output", metavar="FILE", required=True,
                        help="where to write the script ('-': standard output)")
    parser.add_argument("--repeats", type=int, default=3, metavar="K",
                        help="how many times the script sends the hit (default 3; the script's --repeats too)")
    parser.set_defaults(func=run)
    return parser


def script_for(log: str, finding: int | None, repeats: int = 3, kind: str | None = None) -> tuple[dict, str]:
    from ..core.report.repro import plan_repro
    from ..core.report.repro_script import script_text

    if repeats < 1:
        raise BadInput("--repeats must be at least 1")
    plan = plan_repro(log, finding, repeats, kind)
    return plan, script_text(plan)


def run(args) -> int:
    plan, text = script_for(args.log, args.finding, args.repeats, args.kind)
    f = plan["finding"]
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    try:
        out.write_text(text, encoding="utf-8")
        os.chmod(out, 0o755)
    except OSError as exc:
        raise HitproofError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"wrote {out}: finding {f['number']} of {f['of']} ({f['kind']}, {f['phase']}, request {f['request']}); "
          f"run it: python3 {out} URL (exit 0: the fault no longer shows, 1: it shows)", file=sys.stderr)
    return 0


def run_issue(args) -> int:
    """`hitproof report LOG --format issue [--finding N] [--output FILE]`."""
    from ..core.report.issue import issue_markdown

    text = issue_markdown(args.log, getattr(args, "finding", None))
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise HitproofError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0
