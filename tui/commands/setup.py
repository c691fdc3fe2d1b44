"""`hitproof setup`: install an embedded real engine and its model, or the routers (cached)."""

from __future__ import annotations

import argparse

from rich.console import Console

from ..core.config.errors import HitproofError
from .run import ENGINES


def add_parser(sub) -> argparse.ArgumentParser:
    setup = sub.add_parser("setup", help="install an embedded real engine and its model (cached)")
    setup.add_argument("--engine", choices=ENGINES + ("router", "all"), default="vllm",
                       help="an engine, the routers (vllm-router and sglang-router), or all of them")
    setup.add_argument("--model", default="gemma3-270m")
    setup.set_defaults(func=run)
    return setup


def run(args) -> int:
    return _setup(args, Console(stderr=True, highlight=False))


def _setup(args, err: Console) -> int:
    from ..embedded import SetupError, prepare

    engines = ENGINES + ("router",) if args.engine == "all" else (args.engine,)
    for engine in engines:
        if engine == "router":
            from .replica_options import prepare_router
            prepare_router(err)
            continue
        try:
            prepare(engine, model=args.model, progress=lambda line: err.print(f"[setup {engine}] {line}",
                                                                             markup=False, highlight=False))
        except SetupError as exc:
            raise HitproofError(str(exc)) from None
    err.print("setup complete", style="green")
    return 0
