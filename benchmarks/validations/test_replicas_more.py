"""Long validations of replicas, moved out of CI (its time budget, 2026-12-04): a clean soak through a real
vllm-router in front of two launched llama.cpp servers (63 s in CI). CI keeps the routers in front of reference
servers and the corrupting proxy on one real replica, caught and named (tests/real/test_real_replicas.py).
Run: see README.md here."""

import pytest

from support.cli import report_json, run_hitproof, scenario
from test_real_replicas import SMALL, set_up  # noqa: F401  (set_up: a fixture)

pytestmark = pytest.mark.realserver


async def test_a_soak_through_vllm_router_passes_with_hits_on_both_replicas(set_up, tmp_path):
    log = tmp_path / "run.jsonl"
    result = await run_hitproof("run", "--engine", "llamacpp", "--replicas", "2", "--scenario",
                                str(scenario(tmp_path, SMALL)), "--headless", "--record", str(log), timeout=1500)
    assert result.code == 0, result.out[-3000:] + result.err[-2000:]
    replicas = report_json(log)["replicas"]
    assert replicas["attribution"] == "model" and replicas["routing_ok"] is True
    rows = replicas["rows"]
    assert len(rows) == 2 and all(r["hits"] > 0 and r["findings"]["fail"] == 0 for r in rows), rows
    assert replicas["unattributed"] == 0
