"""`hitproof setup`: install an embedded real engine and its model, or the routers (cached), and with
--test-deps the system packages the test suite uses (system_packages.py)."""

from __future__ import annotations

import argparse

from rich.console import Console

from ..core.config.errors import HitproofError
from .run import ENGINES


def add_parser(sub) -> argparse.ArgumentParser:
    setup = sub.add_parser("setup", help="install an embedded real engine and its model (cached), or the test "
                                         "suite's system packages")
    setup.add_argument("--engine", choices=ENGINES + ("router", "all"), default=None,
                       help="an engine, the routers (vllm-router and sglang-router), or all of them "
                            "(default: vllm, unless --test-deps is given alone)")
    setup.add_argument("--model", default="gemma3-270m", help="the embedded model to set up (default: gemma3-270m)")
    setup.add_argument("--test-deps", action="store_true",
                       help="install the system packages the test suite needs and pip cannot: Debian's nginx "
                            "and chromium, with apt-get (as root, or through sudo); skipped when on the PATH")
    setup.set_defaults(func=run)
    return setup


def run(args) -> int:
    return _setup(args, Console(stderr=True, highlight=False))


def _setup(args, err: Console) -> int:
    from ..embedded import SetupError, prepare

    if args.test_deps:
        from .system_packages import install
        install(lambda line: err.print(f"[setup test-deps] {line}", markup=False, highlight=False))
        if args.engine is None:
            err.print("setup complete", style="green")
            return 0
    engine = args.engine or "vllm"
    engines = ENGINES + ("router",) if engine == "all" else (engine,)
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
