"""The command line's replica options: `--attach ROUTER --replica URL ...` and `--engine E --replicas N
--router R --policy P`, checked before anything starts (exit 2 with one line)."""

from __future__ import annotations

from rich.console import Console

from ..core.config.errors import HitproofError
from ..core.server.replicas import check_urls, normalize

# the routers' --policy choices (tui/embedded/router.py pins the versions these come from)
VLLM_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                        "sticky_least_loaded")
SGLANG_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")


def replica_urls(args) -> list[str]:
    """--replica URLs (with --attach), checked; --replicas N (with --engine), checked."""
    if (args.replica or args.router_metrics) and not args.attach:
        raise HitproofError("--replica and --router-metrics go with --attach ROUTER_URL (the router the replicas "
                            "are behind)")
    if args.replicas is not None:
        if args.attach or args.launch or args.profile:
            raise HitproofError("--replicas N goes with --engine (hitproof starts N embedded servers and a router); "
                                "for servers you run, use --attach ROUTER_URL --replica URL ...")
        if not 1 <= args.replicas <= 8:
            raise HitproofError(f"--replicas {args.replicas}: give 1 to 8 replicas")
    elif args.router or args.policy:
        raise HitproofError("--router and --policy go with --replicas N")
    if args.policy and args.router != "sglang-router" and args.policy not in VLLM_ROUTER_POLICIES:
        raise HitproofError(f"--policy {args.policy}: vllm-router has {', '.join(VLLM_ROUTER_POLICIES)}")
    if args.policy and args.router == "sglang-router" and args.policy not in SGLANG_ROUTER_POLICIES:
        raise HitproofError(f"--policy {args.policy}: sglang-router has {', '.join(SGLANG_ROUTER_POLICIES)}")
    try:
        urls = check_urls(args.replica)
    except ValueError as exc:
        raise HitproofError(str(exc)) from None
    if args.attach and normalize(args.attach) in urls:
        raise HitproofError("--replica: the router's own URL is not a replica")
    return urls


def prepare_router(err: Console) -> None:
    from ..embedded import SetupError
    from ..embedded.router import prepare_router as setup

    try:
        setup(progress=lambda line: err.print(f"[setup router] {line}", markup=False, highlight=False))
    except SetupError as exc:
        raise HitproofError(str(exc)) from None


