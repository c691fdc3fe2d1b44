"""The tiny hybrid recurrent models on a real llama-server: both built (once; cached), each started, and a
repeated 3,000-token prompt is a hit served from a restored context checkpoint (the models' fast tests:
tests/server/test_tiny_models.py). Moved out of CI on 2026-12-03: the tiny hybrids' soaks in
tests/real/test_real_hybrid.py prove the same hits from restored checkpoints on both models."""

import asyncio
import secrets

import httpx
import pytest

from tui.core.server.checkpoints import parse_checkpoint_line
from tui.core.server.launch import ServerProcess, free_port
from tui.embedded import launch_spec, prepare

pytestmark = pytest.mark.realserver

TINY = ("qwen3next-tiny", "granite-h-tiny")


# -- real llama-server -------------------------------------------------------------------------


async def _prompt(client: httpx.AsyncClient, n_tokens: int) -> str:
    """About n_tokens of text, unique to this run (so the first request is cold)."""
    words = "cache state memo slot token prefix restore layer delta mamba gate window checkpoint".split()
    rng = secrets.SystemRandom()
    text = f"Memo {secrets.token_hex(6)}.\n" + " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(n_tokens))
    ids = (await client.post("/tokenize", json={"content": text})).json()["tokens"]
    return (await client.post("/detokenize", json={"tokens": ids[:n_tokens]})).json()["content"]


@pytest.mark.parametrize("model", TINY)
async def test_tiny_model_hit_restores_a_checkpoint(model):
    await asyncio.to_thread(prepare, "llamacpp", model=model, progress=print)  # minutes once, then instant
    spec = launch_spec("llamacpp", port=free_port(), model=model)
    events = []
    server = ServerProcess(spec.argv, url=spec.url, env=spec.env,
                           on_line=lambda line: (e := parse_checkpoint_line(line)) and events.append(e))
    await server.start()
    try:
        await server.wait_ready(spec.startup_timeout)
        # a fresh connection per request: llama-server may close a kept-alive one unannounced
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=spec.url, timeout=300, trust_env=False, limits=no_reuse) as client:
            prompt = await _prompt(client, 3000)
            body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3}
            cold = (await client.post("/v1/completions", json=body)).json()
            hit = (await client.post("/v1/completions", json=body)).json()
        await asyncio.sleep(0.5)  # let the last log lines arrive
    finally:
        await server.stop()
    assert cold["timings"]["cache_n"] == 0
    assert hit["timings"]["cache_n"] > 2900, hit["timings"]
    assert hit["choices"][0]["text"] == cold["choices"][0]["text"]
    assert hit["choices"][0]["logprobs"] == cold["choices"][0]["logprobs"]  # exact on llama.cpp CPU
    kinds = [e.kind for e in events]
    assert "created" in kinds, kinds
    restored = [e for e in events if e.kind == "restored"]
    assert restored and restored[-1].n_past == hit["timings"]["cache_n"], events
    assert server.returncode is not None  # stopped
