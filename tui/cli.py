"""hitproof command line: run / matrix / report / replay / refserver / setup / size."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from . import __version__
from .core.config.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_LOG, HitproofError
from .core.config.scenario import load_scenario, resolve_scenario_path
from .core.server.replicas import normalize as normalize_url

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
    where.add_argument("--launch", metavar="COMMAND",
                       help="start this server command (its own process group), wait for /health and /v1/models "
                            "at --url, soak it, stop it; {port} in the command picks a free port")
    where.add_argument("--profile", metavar="FILE",
                       help="launch profile TOML (command, url, env, startup_timeout, overlays; see "
                            "scenarios/profiles/)")
    run.add_argument("--replica", metavar="URL", action="append", default=[],
                     help="with --attach ROUTER_URL: a server behind that router, read directly (its /metrics, "
                          "model, tokenizer); repeat for each. Each request is attributed to the replica that "
                          "served it; the report has a row per replica")
    run.add_argument("--router-metrics", metavar="URL",
                     help="with --replica: the router's own metrics (its per-worker request counters), if it has one")
    run.add_argument("--replicas", type=int, metavar="N",
                     help="with --engine: start N embedded servers behind a real router (see --router, --policy)")
    run.add_argument("--router", choices=("vllm-router", "sglang-router"), default=None,
                     help="with --replicas: the router in front of them (default: vllm-router)")
    run.add_argument("--policy", metavar="NAME",
                     help="with --replicas: the router's policy (default: round_robin; vllm-router also has "
                          "cache_aware, consistent_hash, power_of_two, ...)")
    run.add_argument("--url", metavar="URL", help="with --launch: where the server will answer (default with "
                                                   "{port} in the command: http://127.0.0.1:{port})")
    run.add_argument("--startup-timeout", type=float, metavar="SECONDS",
                     help="with --launch or --profile: seconds to wait for the server (default: the profile's, "
                          "else 600)")
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
    run.add_argument("--verbose", action="store_true",
                     help="also print info-level findings and a launched server's output")
    run.add_argument("--seed", type=int, metavar="N",
                     help="the scenario's seed (memo text, codes, the mix phase's draws): the same seed replays "
                          "the same sequence of draws")
    run.add_argument("--power", metavar="RATE",
                     help="a per-hit fault rate the run must rule out, e.g. 1%% or 0.01 (overrides the scenario's "
                          "[power] fault_rate): rotation keeps going until enough hits were checked, or its "
                          "budget is spent (then exit 4)")

    matrix = sub.add_parser("matrix", help="run one scenario once per launch profile (a fresh server each), "
                                           "write DIR/matrix.json and DIR/matrix.md")
    matrix.add_argument("--profile", metavar="FILE", action="append", required=True,
                        help="launch profile TOML; repeat for each configuration")
    matrix.add_argument("--scenario", default="default", metavar="FILE",
                        help="scenario TOML, or a name in scenarios/ (default: default)")
    matrix.add_argument("--out", metavar="DIR", required=True,
                        help="folder for DIR/<profile>.jsonl, DIR/matrix.json and DIR/matrix.md")
    matrix.add_argument("--headless", action="store_true", help="no TUI: rows on the console as they finish "
                                                                "(without it the app shows the rows and the running soak)")
    matrix.add_argument("--verbose", action="store_true", help="also print each server's output")

    replay = sub.add_parser("replay", help="open a recorded soak log in the app (final state first, then play)")
    replay.add_argument("log", metavar="LOG")

    report = sub.add_parser("report", help="summarize a recorded soak log")
    report.add_argument("log", metavar="LOG")
    report.add_argument("--format", choices=("text", "markdown", "json", "junit", "html", "issue"), default="text",
                        help="issue: a bug report for an engine's tracker, with a finding's reproduction script")
    report.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")
    report.add_argument("--finding", type=int, metavar="N", help="with --format issue: the fail-class finding to "
                                                                  "report (as `hitproof repro --finding N`)")

    from .commands import repro as repro_command
    repro_command.add_parser(sub)

    refserver = sub.add_parser("refserver", help="the reference fault server (an OpenAI-compatible test server)")
    from .refserver.cli import configure
    configure(refserver)

    size = sub.add_parser("size", help="how many rotation rounds catch a given fault rate with a given probability")
    size.add_argument("--fault-rate", type=float, default=0.01, help="per-hit fault rate to catch (default 0.01)")
    size.add_argument("--probability", type=float, default=0.95, help="probability of catching it (default 0.95)")
    size.add_argument("--slots", type=int, default=4, help="rotation slots (default 4)")

    setup = sub.add_parser("setup", help="install an embedded real engine and its model (cached)")
    setup.add_argument("--engine", choices=ENGINES + ("router", "all"), default="vllm",
                       help="an engine, the routers (vllm-router and sglang-router), or all of them")
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
        if args.command == "repro":
            from .commands.repro import run as repro_run
            return repro_run(args)
        if args.command == "matrix":
            return _matrix(args, console, err, argv)
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
        err.print(f"hitproof: error: {exc}", style="red", markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("hitproof: interrupted", style="yellow")
        return EXIT_INTERRUPTED
    except Exception as exc:                 # a bug in hitproof: one line and exit 6, not a traceback
        if os.environ.get("HITPROOF_DEBUG"):
            raise
        err.print(f"hitproof: error: internal error: {type(exc).__name__}: {exc} (a bug in hitproof; "
                  f"HITPROOF_DEBUG=1 shows the traceback)", style="red", markup=False, soft_wrap=True)
        return EXIT_INTERNAL
    parser.error(f"unknown command {args.command}")
    return EXIT_BAD_INPUT


def _size(args, console: Console) -> int:
    from .core.report.power import sizing_sentence

    if not 0 < args.fault_rate < 1 or not 0 < args.probability < 1 or args.slots < 2:
        raise HitproofError("--fault-rate and --probability must be between 0 and 1, --slots at least 2")
    console.print(sizing_sentence(args.fault_rate, args.probability, args.slots))
    return 0


def _setup(args, err: Console) -> int:
    from .embedded import SetupError, prepare

    engines = ENGINES + ("router",) if args.engine == "all" else (args.engine,)
    for engine in engines:
        if engine == "router":
            from .cli_replicas import prepare_router
            prepare_router(err)
            continue
        try:
            prepare(engine, model=args.model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                             markup=False, highlight=False))
        except SetupError as exc:
            raise HitproofError(str(exc)) from None
    err.print("setup complete", style="green")
    return 0


def _run(args, console: Console, err: Console, argv: list[str]) -> int:
    from .cli_replicas import prepare_router, replica_urls
    from .core.soak.engine import Target
    from .runner import default_log_path, run_embedded, run_launched, run_soak

    scenario, plan = _run_inputs(args)       # every input validated (exit 2) before anything starts
    record = None if args.no_record else Path(args.record) if args.record else default_log_path()
    if record is not None:
        from .core.log.recorder import check_writable
        check_writable(record)               # exit 5 before a server is launched or a model loaded
    engine = None if (args.attach or plan) else (args.engine or "vllm")
    label = engine or ((plan.profile or {}).get("name") if plan else None) or "server"

    from .headless import StartupLines
    progress = StartupLines(err, label)      # without a terminal, a line only when it changes

    def echo(line: str) -> None:       # --verbose: the launched server's output as it comes
        err.print(f"[{label} log] {line}", style="grey50", markup=False, highlight=False)

    replicas = replica_urls(args)
    if engine:
        _prepare_embedded(engine, args.model, err)
        if args.replicas:
            prepare_router(err)
    hitproof_argv = ["hitproof", *argv]
    url = normalize_url(args.attach) if args.attach else None

    async def start(*, bus, listeners, after_run=None, on_engine=None, progress=progress):
        common = dict(bus=bus, record=record, listeners=listeners, argv=hitproof_argv, isolate=args.isolate,
                      after_run=after_run, on_engine=on_engine)
        verbose = echo if args.verbose and args.headless else None
        if plan is not None:
            return await run_launched(scenario, plan, progress=progress, echo=verbose, **common)
        if engine and args.replicas:
            from .runner import run_embedded_cluster
            return await run_embedded_cluster(scenario, engine, args.model, args.replicas,
                                              router=args.router or "vllm-router",
                                              policy=args.policy or "round_robin", progress=progress, echo=verbose,
                                              **common)
        if engine:
            return await run_embedded(scenario, engine, args.model, progress=progress, echo=verbose, **common)
        return await run_soak(scenario, Target(url=url, dialect=args.dialect, replicas=replicas,
                                               router_metrics=args.router_metrics), **common)

    if not args.headless:
        return _run_app(start, record, err)
    return _run_headless(start, record, console, err, verbose=args.verbose)


def _run_inputs(args):
    """The scenario (with --power applied) and the launch plan (--profile or --launch, else None)."""
    from .core.server.profiles import adhoc_plan, load_profile, resolve_profile_path

    if args.url and not args.launch:
        raise HitproofError("--url goes with --launch (use --attach URL for a server you started yourself)")
    if args.startup_timeout is not None and not (args.launch or args.profile):
        raise HitproofError("--startup-timeout goes with --launch or --profile")
    if args.startup_timeout is not None and args.startup_timeout <= 0:
        raise HitproofError("--startup-timeout must be more than 0 seconds")
    scenario = load_scenario(resolve_scenario_path(args.scenario))
    if args.power is not None:
        scenario = dataclasses.replace(scenario, power=dataclasses.replace(scenario.power,
                                                                          fault_rate=parse_rate(args.power)))
    if args.seed is not None:
        scenario = dataclasses.replace(scenario, seed=args.seed)
    plan = None
    if args.profile:
        from .embedded import placeholders
        plan = load_profile(resolve_profile_path(args.profile)).plan(placeholders=placeholders())
        if args.startup_timeout is not None:
            plan.startup_timeout = args.startup_timeout
    elif args.launch:
        plan = adhoc_plan(args.launch, normalize_url(args.url) if args.url else None, args.startup_timeout)
    return scenario, plan


def _prepare_embedded(engine: str, model: str, err: Console) -> None:
    from .embedded import SetupError, prepare

    try:
        prepare(engine, model=model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                    markup=False, highlight=False))
    except SetupError as exc:
        raise HitproofError(str(exc)) from None


def _run_headless(start, record: Path | None, console: Console, err: Console, *, verbose: bool) -> int:
    """The soak on the console: progress while it runs, the summary and the power line after."""
    from .core.log.events import EventBus
    from .core.report.power import power_line
    from .core.report.report import RunReport
    from .headless import HeadlessConsole, summary_renderable

    bus = EventBus()
    report = RunReport()
    bus.subscribe(report.feed)
    headless = HeadlessConsole(console, show_info=verbose)
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
        console.print(summary_renderable(report, show_info=verbose))
        console.print(power_line(report), style="grey62")
    if outcome.verdict == "error":
        err.print(f"hitproof: error: {outcome.message}", style="red", markup=False, soft_wrap=True)
    if record:
        console.print(f"log: {record}" + (" (incomplete: see the error above)" if outcome.exit_code == EXIT_LOG
                                          else ""))
    return outcome.exit_code


def _matrix(args, console: Console, err: Console, argv: list[str]) -> int:
    from rich.table import Table
    from rich.text import Text

    from .core.server.profiles import load_profile, resolve_profile_path
    from .headless import STATUS_STYLE, HeadlessConsole
    from .matrix import RESULT, check_names, row_line, run_matrix

    # Everything is validated before anything is launched: a bad profile or scenario is exit 2.
    profiles = [load_profile(resolve_profile_path(p)) for p in args.profile]
    check_names(profiles)
    scenario = load_scenario(resolve_scenario_path(args.scenario))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HitproofError(f"--out {out}: exists and is not a folder")
    total = len(profiles)
    if not args.headless:
        from .app.matrix_view import run_matrix_app
        code, rows = run_matrix_app(scenario, profiles, out, argv=["hitproof", *argv])
        for index, row in enumerate(rows):
            console.print(Text(row_line(index, total, row), style=STATUS_STYLE.get(row["verdict"], "bold")))
        console.print(f"matrix: {out / 'matrix.json'}, {out / 'matrix.md'}")
        return code
    console.print(f"matrix: {total} profile(s) x scenario {scenario.name} -> {out}")
    consoles: list[HeadlessConsole] = []

    def listeners(profile):
        console.print(Text(f"[{profiles.index(profile) + 1}/{total}] {profile.name}: launching", style="bold"))
        consoles.append(HeadlessConsole(console, show_info=args.verbose))
        return [consoles[-1]]

    from .headless import StartupLines
    lines: dict[str, StartupLines] = {}

    def progress(name: str, line: str) -> None:     # without a terminal, a line only when it changes
        lines.setdefault(name, StartupLines(err, name))(line)

    def echo(name: str, line: str) -> None:
        err.print(f"[{name} log] {line}", style="grey50", markup=False, highlight=False)

    def on_row(index: int, row: dict) -> None:
        if consoles:
            consoles[-1].stop()
        console.print(Text(row_line(index, total, row), style=STATUS_STYLE.get(row["verdict"], "bold")))

    started = time.monotonic()
    try:
        rows = asyncio.run(run_matrix(scenario, profiles, out, progress=progress, listeners=listeners,
                                      on_row=on_row, echo=echo if args.verbose else None,
                                      argv=["hitproof", *argv]))
    except KeyboardInterrupt:
        for c in consoles:
            c.stop()
        err.print(f"hitproof: matrix interrupted; rows so far in {out / 'matrix.json'}", style="yellow")
        return EXIT_INTERRUPTED
    table = Table(title=f"hitproof matrix ({time.monotonic() - started:.0f} s)", title_justify="left")
    for column in ("profile", "result", "exit", "requests", "cache hits", "f/w/i", "fail kinds", "seconds"):
        table.add_column(column, justify="right" if column in ("exit", "requests", "cache hits", "seconds")
                         else "left")
    for row in rows:
        f = row["findings"]
        table.add_row(row["profile"], Text(RESULT.get(row["verdict"], row["verdict"]),
                                           style=STATUS_STYLE.get(row["verdict"], "")),
                      str(row["exit_code"]), str(row["requests"]), str(row["cache_hits"]),
                      f"{f['fail']}/{f['warn']}/{f['info']}", ", ".join(f["fail_kinds"]), f"{row['duration_s']:.0f}")
    console.print(table)
    console.print(f"matrix: {out / 'matrix.json'}, {out / 'matrix.md'}")
    return 0


def _run_app(start, record, err: Console) -> int:
    from .app.app import build_app
    from .app.sources import LiveSource
    from .core.log.events import EventBus

    def live_start(*, listeners, after_run, on_engine, progress):
        return start(bus=EventBus(), listeners=listeners, after_run=after_run, on_engine=on_engine,
                     progress=progress)

    app = build_app(LiveSource(live_start))
    app.run()
    code = app.return_code if app.return_code is not None else EXIT_INTERRUPTED
    if app.failure:                          # seen on screen; said again once the screen is gone
        err.print(f"hitproof: error: {app.failure}", style="red", markup=False, soft_wrap=True)
        code = app.exit_code if app.exit_code is not None else code
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
    from .core.report.formats import incident_text, to_junit, to_markdown
    from .core.report.power import power_json
    from .core.log.recorder import iter_log
    from .core.report.report import FED_TYPES, RunReport
    from .headless import report_text

    if args.format == "issue":                # the incident, a finding and its reproduction script
        from .commands.repro import run_issue
        return run_issue(args)
    warnings: list[str] = []
    fold = None
    if args.format == "html":                 # also reads metrics samples (tui.core.report.html)
        from .core.report.html import read_log, to_html
        report, fold = read_log(args.log, warnings)
    else:
        report = RunReport.from_events(iter_log(args.log, warnings, only=FED_TYPES))
    report.warning = warnings[0] if warnings else None
    if fold is not None:
        text = to_html(report, fold)
    elif args.format == "json":
        data = report.to_json()
        data["power"] = power_json(report)
        data["incident"] = ((report.header.target if report.header else None) or {}).get("incident") or None
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
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


def parse_rate(text: str) -> float:
    """"1%", "0.5 %" or "0.01" -> 0.01; a rate outside (0, 1) is bad input."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise HitproofError(f"--power {text}: not a rate (write 1% or 0.01)") from None
    if not 0.0 < value < 1.0:
        raise HitproofError(f"--power {text}: the rate must be above 0 and below 100%")
    return value


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
