"""`hitproof run`: soak a server (attached, launched, a profile, or an embedded engine, alone or as replicas
behind a router) in the app or headless, the same way: tui.runner.run starts what the inputs name."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.console import Console

from ..core.config.errors import EXIT_INTERRUPTED, EXIT_LOG, HitproofError
from ..core.config.scenario import load_scenario, resolve_scenario_path
from ..core.server.replicas import checked_url, normalize as normalize_url
from ..core.server import eventloop

ENGINES = ("vllm", "llamacpp")


def add_parser(sub) -> argparse.ArgumentParser:
    cmd = sub.add_parser("run", help="run a soak (against an embedded real server unless --attach)")
    where = cmd.add_mutually_exclusive_group()
    where.add_argument("--attach", metavar="URL", help="soak a server that is already running")
    where.add_argument("--engine", choices=ENGINES, default=None,
                       help="embedded real server to set up and start (default: vllm)")
    where.add_argument("--launch", metavar="COMMAND",
                       help="start this server command (its own process group), wait for /health and /v1/models "
                            "at --url, soak it, stop it; {port} in the command picks a free port")
    where.add_argument("--profile", metavar="FILE",
                       help="launch profile TOML (command, url, env, startup_timeout, overlays; see "
                            "scenarios/profiles/)")
    cmd.add_argument("--replica", metavar="URL", action="append", default=[],
                     help="with --attach ROUTER_URL: a server behind that router, read directly (its /metrics, "
                          "model, tokenizer); repeat for each. Each request is attributed to the replica that "
                          "served it; the report has a row per replica")
    cmd.add_argument("--router-metrics", metavar="URL",
                     help="with --replica: the router's own metrics (its per-worker request counters), if it has one")
    cmd.add_argument("--replicas", type=int, metavar="N",
                     help="with --engine: start N embedded servers behind a real router (see --router, --policy)")
    cmd.add_argument("--router", choices=("vllm-router", "sglang-router"), default=None,
                     help="with --replicas: the router in front of them (default: vllm-router)")
    cmd.add_argument("--policy", metavar="NAME",
                     help="with --replicas: the router's policy (default: round_robin; vllm-router also has "
                          "cache_aware, consistent_hash, power_of_two, ...)")
    cmd.add_argument("--url", metavar="URL", help="with --launch: where the server will answer (default with "
                                                   "{port} in the command: http://127.0.0.1:{port})")
    cmd.add_argument("--startup-timeout", type=float, metavar="SECONDS",
                     help="with --launch or --profile: seconds to wait for the server (default: the profile's, "
                          "else 600)")
    cmd.add_argument("--model", default="gemma3-270m", help="embedded model (default: gemma3-270m)")
    cmd.add_argument("--scenario", default="default", metavar="FILE",
                     help="scenario TOML, or a name in scenarios/ (default: default)")
    cmd.add_argument("--headless", action="store_true", help="no TUI: progress and summary on the console")
    cmd.add_argument("--record", metavar="FILE", help="write the event log here (default: logs/hitproof-TIME.jsonl)")
    cmd.add_argument("--no-record", action="store_true", help="do not write an event log")
    cmd.add_argument("--dialect", choices=("vllm", "llamacpp", "sglang", "openai"),
                     help="server dialect when attaching (default: detect)")
    cmd.add_argument("--isolate", action="store_true",
                     help="re-send every fail- or warn-class request alone (k hits, k cold) before finishing")
    cmd.add_argument("--verbose", action="store_true",
                     help="also print info-level findings and a launched server's output")
    cmd.add_argument("--seed", type=int, metavar="N",
                     help="the scenario's seed (memo text, codes, the mix phase's draws): the same seed replays "
                          "the same sequence of draws")
    cmd.add_argument("--power", metavar="RATE",
                     help="a per-hit fault rate the run must rule out, e.g. 1%% or 0.01 (overrides the scenario's "
                          "[power] fault_rate): rotation keeps going until enough hits were checked, or its "
                          "budget is spent (then exit 4)")
    cmd.add_argument("--streams", type=int, metavar="N",
                     help="concurrent slots of the rotation phase (and workers of the mix phase), overriding the "
                          "scenario: each slot its own memo, so a foreign code stays unambiguous across a round "
                          "(2 to 256; `hitproof size --streams` says what a width buys)")
    cmd.set_defaults(func=run)
    return cmd


def run(args) -> int:
    return _run(args, Console(highlight=False), Console(stderr=True, highlight=False), args.argv)


def _run(args, console: Console, err: Console, argv: list[str]) -> int:
    from .replica_options import prepare_router, replica_urls
    from ..core.soak.hooks import RunHooks
    from .. import runner
    from ..runner import Embedded, Target, default_log_path

    scenario, plan = _run_inputs(args)       # every input validated (exit 2) before anything starts
    eventloop.loop_kind()                    # HITPROOF_EVENT_LOOP too
    record = None if args.no_record else Path(args.record) if args.record else default_log_path()
    if record is not None:
        from ..core.log.recorder import check_writable
        check_writable(record)               # exit 5 before a server is launched or a model loaded
    replicas = replica_urls(args)
    if args.attach:
        what = Target(url=normalize_url(args.attach), dialect=args.dialect, replicas=replicas,
                      router_metrics=args.router_metrics)
        label = "server"
    elif plan is not None:
        what, label = plan, (plan.profile or {}).get("name") or "server"
    else:
        engine = args.engine or "vllm"
        _prepare_embedded(engine, args.model, err)
        if args.replicas:
            prepare_router(err)
        what, label = Embedded(engine, args.model, args.replicas, args.router, args.policy), engine

    def start(hooks: RunHooks):
        """The one way the run goes, headless or in the app: start what the inputs name, soak it, stop it."""
        return runner.run(scenario, what, hooks, record=record, argv=["hitproof", *argv], isolate=args.isolate)

    if not args.headless:
        return _run_app(start, record, err)
    from ..headless import LIVE_TEXT_UNWATCHED, StartupLines

    def echo(line: str) -> None:       # --verbose: the launched server's output as it comes
        err.print(f"[{label} log] {line}", style="grey50", markup=False, highlight=False)

    # without a terminal, a start-up line only when it changes
    return _run_headless(start, RunHooks(progress=StartupLines(err, label), echo=echo if args.verbose else None,
                                         live_text_every=LIVE_TEXT_UNWATCHED),
                         record, console, err, verbose=args.verbose)


def _run_inputs(args):
    """The scenario (with --power applied) and the launch plan (--profile or --launch, else None)."""
    from ..core.server.profiles import adhoc_plan, load_profile, resolve_profile_path

    if args.url and not args.launch:
        raise HitproofError("--url goes with --launch (use --attach URL for a server you started yourself)")
    for option, raw in (("--attach", args.attach), ("--url", args.url), ("--router-metrics", args.router_metrics)):
        if raw:
            try:
                checked_url(raw, option)
            except ValueError as exc:
                raise HitproofError(str(exc)) from None
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
    if getattr(args, "streams", None) is not None:
        scenario = with_streams(scenario, args.streams)
    plan = None
    if args.profile:
        from ..embedded import placeholders
        plan = load_profile(resolve_profile_path(args.profile)).plan(placeholders=placeholders())
        if args.startup_timeout is not None:
            plan.startup_timeout = args.startup_timeout
    elif args.launch:
        plan = adhoc_plan(args.launch, normalize_url(args.url) if args.url else None, args.startup_timeout)
    return scenario, plan


def _prepare_embedded(engine: str, model: str, err: Console) -> None:
    from ..embedded import SetupError, prepare

    try:
        prepare(engine, model=model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                    markup=False, highlight=False))
    except SetupError as exc:
        raise HitproofError(str(exc)) from None


def _run_headless(start, hooks, record: Path | None, console: Console, err: Console, *, verbose: bool) -> int:
    """The soak on the console: progress while it runs, the summary and the power line after."""
    from ..core.report.power import power_line
    from ..core.report.report import RunReport
    from ..headless import HeadlessConsole, summary_renderable

    report = RunReport(feeds_tally=False)
    headless = HeadlessConsole(console, show_info=verbose, tally=report.tally)
    hooks.listeners = [report.feed, headless]
    hooks.tally = report.tally                  # the engine feeds the tally the report and the console read
    try:
        outcome = eventloop.run(start(hooks))
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


def _run_app(start, record, err: Console) -> int:
    from ..app.app import build_app
    from ..app.sources import LiveSource

    app = build_app(LiveSource(start))
    eventloop.run(app.run_async())             # App.run() is asyncio.run(run_async()): the same, on our loop
    code = app.return_code if app.return_code is not None else EXIT_INTERRUPTED
    if app.failure:                          # seen on screen; said again once the screen is gone
        err.print(f"hitproof: error: {app.failure}", style="red", markup=False, soft_wrap=True)
        code = app.exit_code if app.exit_code is not None else code
    if record:
        err.print(f"log: {record}")
    return code


def with_streams(scenario, streams: int):
    """The scenario with rotation `streams` slots wide (its memos one per slot) and the mix phase's
    `streams` workers over a pool that stays larger than them."""
    if not 2 <= streams <= 256:
        raise HitproofError(f"--streams must be between 2 and 256 (got {streams})")
    settings = dict(scenario.phase_settings)
    settings["rotation"] = dataclasses.replace(settings["rotation"], slots=streams)
    mix = settings["mix"]
    settings["mix"] = dataclasses.replace(mix, workers=streams, memos=max(mix.memos, streams + 2))
    return dataclasses.replace(scenario, phase_settings=settings)


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
