"""`hitproof size`: how many rotation rounds catch a given fault rate with a given probability, and
(--streams) what each rotation width buys: checked hits per round, rounds, requests and, given a measured
request rate (--rate), seconds to the target."""

from __future__ import annotations

import argparse

from rich.console import Console

from ..core.config.errors import HitproofError


def add_parser(sub) -> argparse.ArgumentParser:
    size = sub.add_parser("size", help="how many rotation rounds catch a given fault rate with a given probability")
    size.add_argument("--fault-rate", type=float, default=0.01, help="per-hit fault rate to catch (default 0.01)")
    size.add_argument("--probability", type=float, default=0.95, help="probability of catching it (default 0.95)")
    size.add_argument("--slots", type=int, default=4, help="rotation slots (default 4)")
    size.add_argument("--streams", metavar="N,N,...",
                      help="rotation widths to compare (e.g. 4,32,128): checked hits per round, rounds and requests "
                           "to the target for each (every slot's hit checked, as with fingerprints or recall on "
                           "every slot; --every-other-slot for recall on every other slot)")
    size.add_argument("--rate", metavar="R[,R,...]",
                      help="with --streams: requests per second measured at each width (one value for all), e.g. "
                           "benchmarks/gpu/rate.py's hitproof requests/s: adds the seconds to the target")
    size.add_argument("--every-other-slot", action="store_true",
                      help="with --streams: recall asked on every other slot (the default scenario's tasks)")
    size.set_defaults(func=run)
    return size


def run(args) -> int:
    return _size(args, Console(highlight=False))


def _numbers(text: str, kind, what: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise HitproofError(f"{what} takes a comma-separated list of numbers (got {text!r})") from None
    if not values:
        raise HitproofError(f"{what} takes a comma-separated list of numbers (got {text!r})")
    return values


def _size(args, console: Console) -> int:
    from ..core.report.power import sizing_sentence, width_rows

    if not 0 < args.fault_rate < 1 or not 0 < args.probability < 1 or args.slots < 2:
        raise HitproofError("--fault-rate and --probability must be between 0 and 1, --slots at least 2")
    if getattr(args, "streams", None) is None:
        if getattr(args, "rate", None) is not None:
            raise HitproofError("--rate goes with --streams (the request rate measured at each width)")
        console.print(sizing_sentence(args.fault_rate, args.probability, args.slots))
        return 0
    widths = _numbers(args.streams, int, "--streams")
    if any(not 2 <= w <= 256 for w in widths):
        raise HitproofError(f"--streams: every width between 2 and 256 (got {args.streams})")
    rates = _numbers(args.rate, float, "--rate") if args.rate is not None else None
    if rates is not None and (any(r <= 0 for r in rates) or len(rates) not in (1, len(widths))):
        raise HitproofError(f"--rate: one request rate above 0 for every width, or one for all (got {args.rate})")
    rows = width_rows(args.fault_rate, args.probability, widths, rates, every_slot=not args.every_other_slot)
    console.print(sizing_sentence(args.fault_rate, args.probability, widths[0]).split(":")[0] + ":")
    for row in rows:
        seconds = f", {row.seconds:.1f} s at {row.requests / row.seconds:.1f} requests/s" if row.seconds else ""
        console.print(f"  {row.slots} slots: {row.checked_per_round} checked hits a round, {row.rounds} rounds "
                      f"(round 0 cold), {row.requests} requests{seconds}")
    return 0
