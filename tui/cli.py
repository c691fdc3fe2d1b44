"""hitproof command line: builds the parser from the command modules (tui/commands/) and dispatches;
errors become one line and the documented exit code, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from rich.console import Console

from . import __version__
from .commands import COMMANDS
from .core.config.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, HitproofError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hitproof", description=(
        "Prove that an LLM server's prefix-cache hits are real: plant codes in long memos, ask for them "
        "on every hit, rotate memos across concurrent slots, compare cold vs hit."))
    parser.add_argument("--version", action="version", version=f"hitproof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.commands.{name}").add_parser(sub)
    return parser


def _stop_as_if_ctrl_c(signum, frame) -> None:
    """SIGTERM (a CI job's timeout, `kill`) and SIGHUP (a closed terminal) end a run the way Ctrl-C does:
    the log gets its run_end ("interrupted") and every server the run launched is stopped. Python's default
    for them ends the process at once, leaving a launched llama-server or vLLM running with nobody to stop it
    (seen here: a killed soak's llama-server spinning on both cores afterwards)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signal.SIGINT, frame)        # asyncio's runner: cancels the main task; KeyboardInterrupt follows
    else:
        raise KeyboardInterrupt


def _stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:      # one that was ignored on purpose stays ignored
                signal.signal(sig, _stop_as_if_ctrl_c)
        except (ValueError, OSError):                       # not the main thread (an embedding caller)
            pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _stop_signals()
    args = build_parser().parse_args(argv)
    args.argv = argv                         # the command line as given: the log's header records it
    err = Console(stderr=True, highlight=False)
    try:
        return args.func(args)
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


if __name__ == "__main__":
    sys.exit(main())
