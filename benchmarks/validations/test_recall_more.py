"""qwen3next-recall's shipped GGUF on llama.cpp (context checkpoints), moved out of CI (its time budget):
`hybrid-recall` clean, hits checked for their own code, the power target reached. CI keeps the vLLM soak
(tests/real/test_real_recall.py). Run: see README.md here."""

import pytest

from support.servers import BackgroundServer
from test_real_recall import MODEL, clean_soak

pytestmark = pytest.mark.realserver


async def test_every_hit_answers_its_own_code_on_llamacpps_checkpoints(tmp_path):
    server = BackgroundServer("llamacpp", model=MODEL).start()
    try:
        await clean_soak(server.url, tmp_path / "llamacpp.jsonl")
    finally:
        server.stop()
