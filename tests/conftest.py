import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from support.servers import BackgroundServer  # noqa: E402


@pytest.fixture(scope="session")
def vllm_lora_server():
    """One real vLLM with adapters a and b, shared by the LoRA and partition tests (a vLLM start on
    this CPU is a minute of CI's budget)."""
    server = BackgroundServer("vllm", lora=True).start()
    yield server
    server.stop()
