"""hitproof command line: run / report / refserver / setup."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from rich.console import Console

from . import __version__
from .core.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, HitproofError
from .core.scenario import load_scenario, resolve_scenario_path

ENGINES = ("vllm", "llamacpp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hitproof", description=(
        "Prove that an LLM server's prefix-cache hits are real: plant codes in long memos, ask for them "
        "on every hit, rotate memos across concurrent slots, compare cold vs hit."))
    parser.add_argument("--version", action="version", version=f"hitproof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a soak (against an embedded real server unless --attach)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--attach", metavar="URL", help="soak a server that is already running")
    where.add_argument("--engine", choices=ENGINES, default=None,
                       help="embedded real server to set up and start (default: vllm)")
    run.add_argument("--model", default="gemma3-270m", help="embedded model (default: gemma3-270m)")
    run.add_argument("--scenario", default="default", metavar="FILE",
                     help="scenario TOML, or a name in scenarios/ (default: default)")
    run.add_argument("--headless", action="store_true", help="no TUI: progress and summary on the console")
    run.add_argument("--record", metavar="FILE", help="write the event log here (default: logs/hitproof-TIME.jsonl)")
    run.add_argument("--no-record", action="store_true", help="do not write an event log")
    run.add_argument("--dialect", choices=("vllm", "llamacpp", "sglang", "openai"),
                     help="server dialect when attaching (default: detect)")
    run.add_argument("--isolate", action="store_true",
                     help="re-send every fail- or warn-class request alone (k hits, k cold) before finishing")
    run.add_argument("--verbose", action="store_true", help="also print info-level findings")

    replay = sub.add_parser("replay", help="open a recorded soak log in the app (final state first, then play)")
    replay.add_argument("log", metavar="LOG")

    report = sub.add_parser("report", help="summarize a recorded soak log")
    report.add_argument("log", metavar="LOG")
    report.add_argument("--format", choices=("text", "markdown", "json", "junit"), default="text")
    report.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")

    refserver = sub.add_parser("refserver", help="the reference fault server (an OpenAI-compatible test server)")
    from .refserver.cli import configure
    configure(refserver)

    size = sub.add_parser("size", help="how many rotation rounds catch a given fault rate with a given probability")
    size.add_argument("--fault-rate", type=float, default=0.01, help="per-hit fault rate to catch (default 0.01)")
    size.add_argument("--probability", type=float, default=0.95, help="probability of catching it (default 0.95)")
    size.add_argument("--slots", type=int, default=4, help="rotation slots (default 4)")

    setup = sub.add_parser("setup", help="install an embedded real engine and its model (cached)")
    setup.add_argument("--engine", choices=ENGINES + ("all",), default="vllm")
    setup.add_argument("--model", default="gemma3-270m")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    try:
        if args.command == "run":
            return _run(args, console, err, argv)
        if args.command == "report":
            return _report(args, console)
        if args.command == "replay":
            return _replay(args)
        if args.command == "refserver":
            from .refserver.cli import main as refserver_main
            return refserver_main(args)
        if args.command == "setup":
            return _setup(args, err)
        if args.command == "size":
            return _size(args, console)
    except HitproofError as exc:
        err.print(f"hitproof: error: {exc}", style="red", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("hitproof: interrupted", style="yellow")
        return EXIT_INTERRUPTED
    parser.error(f"unknown command {args.command}")
    return EXIT_BAD_INPUT


def _size(args, console: Console) -> int:
    from .core.power import sizing_sentence

    if not 0 < args.fault_rate < 1 or not 0 < args.probability < 1 or args.slots < 2:
        raise HitproofError("--fault-rate and --probability must be between 0 and 1, --slots at least 2")
    console.print(sizing_sentence(args.fault_rate, args.probability, args.slots))
    return 0


def _setup(args, err: Console) -> int:
    from .engines import SetupError, prepare

    engines = ENGINES if args.engine == "all" else (args.engine,)
    for engine in engines:
        try:
            prepare(engine, model=args.model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                             markup=False, highlight=False))
        except SetupError as exc:
            raise HitproofError(str(exc)) from None
    err.print("setup complete", style="green")
    return 0


def _run(args, console: Console, err: Console, argv: list[str]) -> int:
    from .core.events import EventBus
    from .core.report import RunReport
    from .core.power import power_line
    from .headless import HeadlessConsole, summary_renderable
    from .runner import default_log_path, run_embedded, run_soak
    from .core.engine import Target

    scenario = load_scenario(resolve_scenario_path(args.scenario))
    record = None if args.no_record else Path(args.record) if args.record else default_log_path()
    engine = None if args.attach else (args.engine or "vllm")

    def progress(line: str) -> None:
        err.print(f"[{engine or 'server'}] {line}", markup=False, highlight=False)

    if engine:
        from .engines import SetupError, prepare
        try:
            prepare(engine, model=args.model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                             markup=False, highlight=False))
        except SetupError as exc:
            raise HitproofError(str(exc)) from None

    hitproof_argv = ["hitproof", *argv]
    url = None if engine else _normalize_url(args.attach)

    async def start(*, bus, listeners, after_run=None, on_engine=None, progress=progress):
        common = dict(bus=bus, record=record, listeners=listeners, argv=hitproof_argv, isolate=args.isolate,
                      after_run=after_run, on_engine=on_engine)
        if engine:
            return await run_embedded(scenario, engine, args.model, progress=progress, **common)
        return await run_soak(scenario, Target(url=url, dialect=args.dialect), **common)

    if not args.headless:
        return _run_app(start, record, err)

    bus = EventBus()
    report = RunReport()
    bus.subscribe(report.feed)
    headless = HeadlessConsole(console, show_info=args.verbose)
    try:
        outcome = asyncio.run(start(bus=bus, listeners=[headless]))
    except KeyboardInterrupt:
        headless.stop()
        kept = f"; log kept at {record} ({_count_lines(record)} events)" if record and record.exists() else ""
        err.print(f"hitproof: interrupted{kept}", style="yellow")
        return EXIT_INTERRUPTED
    finally:
        headless.stop()
    if report.phases or report.end:
        console.print(summary_renderable(report, show_info=args.verbose))
        console.print(power_line(report), style="grey62")
    if outcome.verdict == "error":
        err.print(f"hitproof: error: {outcome.message}", style="red", markup=False)
    if record:
        console.print(f"log: {record}")
    return outcome.exit_code


def _run_app(start, record, err: Console) -> int:
    from .app.app import build_app
    from .app.sources import LiveSource
    from .core.events import EventBus

    def live_start(*, listeners, after_run, on_engine, progress):
        return start(bus=EventBus(), listeners=listeners, after_run=after_run, on_engine=on_engine,
                     progress=progress)

    app = build_app(LiveSource(live_start))
    app.run()
    code = app.return_code if app.return_code is not None else EXIT_INTERRUPTED
    if record:
        err.print(f"log: {record}")
    return code


def _replay(args) -> int:
    from .app.app import build_app
    from .app.replay import ReplaySource

    app = build_app(ReplaySource(args.log))
    app.run()
    return 0


def _report(args, console: Console) -> int:
    from .core.formats import to_junit, to_markdown
    from .core.power import power_json
    from .core.recorder import iter_log
    from .core.report import RunReport
    from .headless import report_text

    warnings: list[str] = []
    report = RunReport.from_events(iter_log(args.log, warnings, skip_deltas=True))
    report.warning = warnings[0] if warnings else None
    if args.format == "json":
        data = report.to_json()
        data["power"] = power_json(report)
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    elif args.format == "markdown":
        text = to_markdown(report)
    elif args.format == "junit":
        text = to_junit(report)
    else:
        text = report_text(report)
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


def _normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if "://" not in url:
        url = "http://" + url
    return url


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
