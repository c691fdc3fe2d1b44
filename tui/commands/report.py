"""`hitproof report LOG [--format ...]`: a recorded soak summarized (the renderers are tui/core/report's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from ..core.config.errors import HitproofError


def add_parser(sub) -> argparse.ArgumentParser:
    report = sub.add_parser("report", help="summarize a recorded soak log")
    report.add_argument("log", metavar="LOG", help="a recorded soak log (--record), plain or gzipped")
    report.add_argument("--format", choices=("text", "markdown", "json", "junit", "html", "issue"), default="text",
                        help="issue: a bug report for an engine's tracker, with a finding's reproduction script")
    report.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")
    report.add_argument("--finding", type=int, metavar="N", help="with --format issue: the fail-class finding to "
                                                                  "report (as `hitproof repro --finding N`)")
    report.set_defaults(func=run)
    return report


def run(args) -> int:
    return _report(args, Console(highlight=False))


def _report(args, console: Console) -> int:
    from ..core.report.formats import incident_text, to_json, to_junit, to_markdown
    from ..core.log.reader import iter_log
    from ..core.report.report import FED_TYPES, RunReport
    from ..headless import report_text

    from ..core.log.compressed import plain
    args.log = str(plain(args.log))           # a gzipped log (benchmarks/gpu/results) read as it is
    if args.format == "issue":                # the incident, a finding and its reproduction script
        from .repro import run_issue
        return run_issue(args)
    warnings: list[str] = []
    fold = None
    if args.format == "html":                 # also reads metrics samples (tui.core.report.html)
        from ..core.report.html import read_log, to_html
        report, fold = read_log(args.log, warnings)
    else:
        report = RunReport.from_events(iter_log(args.log, warnings, only=FED_TYPES))
    report.warning = warnings[0] if warnings else None
    if fold is not None:
        text = to_html(report, fold)
    elif args.format == "json":
        text = to_json(report)
    elif args.format == "markdown":
        text = to_markdown(report)
    elif args.format == "junit":
        text = to_junit(report)
    else:
        text = report_text(report)
        incident = incident_text(report)
        if incident:
            text = text.rstrip("\n") + "\n" + incident
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise HitproofError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if report.warning:
        Console(stderr=True).print(f"hitproof: warning: {report.warning}", style="yellow", markup=False)
    return 0
