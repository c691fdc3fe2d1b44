"""`hitproof refserver`: the reference fault server (its options and body live in tui/refserver/cli.py)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    from ..refserver.cli import configure

    refserver = sub.add_parser("refserver", help="the reference fault server (an OpenAI-compatible test server)")
    configure(refserver)
    refserver.set_defaults(func=run)
    return refserver


def run(args) -> int:
    from ..refserver.cli import main as refserver_main

    return refserver_main(args)
