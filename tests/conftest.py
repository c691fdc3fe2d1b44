"""The suite's layout: tests/PART/test_*.py by the part of hitproof they test, and tests/real/ the
real-server tier (real vLLM, llama.cpp, routers started by the suite). The `realserver` marker is set
here, by the folder, and nowhere else (`pytest -m "not realserver"`: the fast tier);
tests/house/test_tiers.py holds the two together."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REAL = TESTS / "real"
# support/ and the test modules whose helpers other tests import (by module name) are importable
# from every folder, in any collection order
sys.path[:0] = [str(TESTS)] + sorted(str(d) for d in TESTS.iterdir() if d.is_dir() and d.name not in
                                     ("support", "fixtures", "__pycache__"))

import pytest  # noqa: E402

from support.servers import BackgroundServer  # noqa: E402


def in_real_tier(path: Path) -> bool:
    return REAL in Path(path).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_real_tier(item.path):
            item.add_marker(pytest.mark.realserver)


@pytest.fixture(scope="session")
def vllm_lora_server():
    """One real vLLM with adapters a and b, shared by the LoRA and partition tests (a vLLM start on
    this CPU is a minute of CI's budget)."""
    server = BackgroundServer("vllm", lora=True).start()
    yield server
    server.stop()
