"""The workload options every benchmark client takes (clients.py, and vllm_client.py, which runs in
the vLLM venv: this module imports nothing outside the standard library)."""

from __future__ import annotations

import argparse


def parse_workload(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Adds the shared options to `parser` and parses; a flood has no pacing and no delay."""
    parser.add_argument("--mode", choices=("ttft", "flood"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--prompt-chars", type=int, default=100)
    args = parser.parse_args(argv)
    if args.mode == "flood":
        args.rate, args.delay_ms = 0.0, 0.0
    return args
