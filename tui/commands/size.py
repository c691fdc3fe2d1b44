"""`hitproof size`: how many rotation rounds catch a given fault rate with a given probability."""

from __future__ import annotations

import argparse

from rich.console import Console

from ..core.config.errors import HitproofError


def add_parser(sub) -> argparse.ArgumentParser:
    size = sub.add_parser("size", help="how many rotation rounds catch a given fault rate with a given probability")
    size.add_argument("--fault-rate", type=float, default=0.01, help="per-hit fault rate to catch (default 0.01)")
    size.add_argument("--probability", type=float, default=0.95, help="probability of catching it (default 0.95)")
    size.add_argument("--slots", type=int, default=4, help="rotation slots (default 4)")
    size.set_defaults(func=run)
    return size


def run(args) -> int:
    return _size(args, Console(highlight=False))


def _size(args, console: Console) -> int:
    from ..core.report.power import sizing_sentence

    if not 0 < args.fault_rate < 1 or not 0 < args.probability < 1 or args.slots < 2:
        raise HitproofError("--fault-rate and --probability must be between 0 and 1, --slots at least 2")
    console.print(sizing_sentence(args.fault_rate, args.probability, args.slots))
    return 0
