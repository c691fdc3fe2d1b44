"""`hitproof matrix`: one scenario once per launch profile (a fresh server each); DIR/matrix.json and .md."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from ..core.config.errors import EXIT_INTERRUPTED, HitproofError
from ..core.config.scenario import load_scenario, resolve_scenario_path
from ..core.server import eventloop


def add_parser(sub) -> argparse.ArgumentParser:
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
    matrix.set_defaults(func=run)
    return matrix


def run(args) -> int:
    return _matrix(args, Console(highlight=False), Console(stderr=True, highlight=False), args.argv)


def _matrix(args, console: Console, err: Console, argv: list[str]) -> int:
    from rich.table import Table
    from rich.text import Text

    from ..core.server.profiles import load_profile, resolve_profile_path
    from ..core.soak.hooks import RunHooks
    from ..headless import LIVE_TEXT_UNWATCHED, STATUS_STYLE, HeadlessConsole, StartupLines
    from ..matrix import RESULT, check_names, row_line, run_matrix

    # Everything is validated before anything is launched: a bad profile or scenario is exit 2.
    profiles = [load_profile(resolve_profile_path(p)) for p in args.profile]
    check_names(profiles)
    scenario = load_scenario(resolve_scenario_path(args.scenario))
    eventloop.loop_kind()                                  # HITPROOF_EVENT_LOOP
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HitproofError(f"--out {out}: exists and is not a folder")
    total = len(profiles)
    if not args.headless:
        from ..app.matrix_view import run_matrix_app
        code, rows = run_matrix_app(scenario, profiles, out, argv=["hitproof", *argv])
        for index, row in enumerate(rows):
            console.print(Text(row_line(index, total, row), style=STATUS_STYLE.get(row["verdict"], "bold")))
        console.print(f"matrix: {out / 'matrix.json'}, {out / 'matrix.md'}")
        return code
    console.print(f"matrix: {total} profile(s) x scenario {scenario.name} -> {out}")
    consoles: list[HeadlessConsole] = []

    def hooks(profile) -> RunHooks:
        console.print(Text(f"[{profiles.index(profile) + 1}/{total}] {profile.name}: launching", style="bold"))
        consoles.append(HeadlessConsole(console, show_info=args.verbose))

        def echo(line: str) -> None:
            err.print(f"[{profile.name} log] {line}", style="grey50", markup=False, highlight=False)

        # without a terminal, a start-up line only when it changes
        return RunHooks(listeners=[consoles[-1]], progress=StartupLines(err, profile.name),
                        echo=echo if args.verbose else None, live_text_every=LIVE_TEXT_UNWATCHED)

    def on_row(index: int, row: dict) -> None:
        if consoles:
            consoles[-1].stop()
        console.print(Text(row_line(index, total, row), style=STATUS_STYLE.get(row["verdict"], "bold")))

    started = time.monotonic()
    try:
        rows = eventloop.run(run_matrix(scenario, profiles, out, hooks=hooks, on_row=on_row,
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
