"""Long validations on the tiny hybrids served by llama.cpp, moved out of CI (its time budget): the
cache-option matrix (five servers) and the mix phase on both models. CI keeps the hybrid soak on both
models and the corrupted-hit cases (tests/real/test_real_hybrid.py). Run: see README.md here."""

import json

import pytest

from support.cli import ROOT, report_json, run_hitproof
from test_real_hybrid import HYBRID, MODELS

pytestmark = pytest.mark.realserver


async def test_llamacpp_cache_option_matrix(tmp_path):
    profiles = ROOT / "scenarios" / "profiles"
    out = tmp_path / "matrix"
    result = await run_hitproof("matrix", "--profile", str(profiles / "llamacpp-qwen-baseline.toml"),
                                "--profile", str(profiles / "llamacpp-qwen-no-checkpoints.toml"),
                                "--scenario", HYBRID, "--out", str(out), "--headless", timeout=1800)
    assert result.code == 0, result.out + result.err
    rows = {row["profile"]: row for row in json.loads((out / "matrix.json").read_text())}
    assert rows["llamacpp-qwen-baseline"]["verdict"] == "pass"
    assert rows["llamacpp-qwen-baseline"]["cache_hits"] > 20
    # without context checkpoints a hybrid model cannot resume from a shared prefix (only an exact
    # repeat of the slot's last prompt is reused): phases that need hits prove nothing
    assert rows["llamacpp-qwen-no-checkpoints"]["verdict"] == "inconclusive"
    assert rows["llamacpp-qwen-no-checkpoints"]["cache_hits"] < rows["llamacpp-qwen-baseline"]["cache_hits"] / 4


@pytest.mark.parametrize("model", MODELS)
async def test_mix_on_the_hybrid_models_passes_or_says_what_it_found(tmp_path, model):
    # partial-prefix hits on a hybrid model need a checkpoint inside the shared part: those that
    # find none re-process in full (checkpoint_miss, info); every hit that does restore one is compared
    # with its clean reference by fingerprint (the tiny models cannot recall a code)
    log = tmp_path / f"mix-{model}.jsonl"
    result = await run_hitproof("run", "--engine", "llamacpp", "--model", model, "--scenario",
                                str(ROOT / "scenarios" / "mix-quick.toml"), "--headless", "--record", str(log),
                                timeout=1800)
    print(result.out[-2500:])
    report = report_json(log)
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert result.code in (0, 1, 4), result.out + result.err
    # a fail-class finding is never bare: it names its draw and seed and reproduced on every re-sent hit
    for f in fails:
        assert f["kind"] in ("hit_path_divergence", "foreign_code", "foreign_state"), f
        if f["kind"] == "hit_path_divergence":
            assert f["evidence"]["hit_reproduced"] == f["evidence"]["k"] and f["evidence"]["cold_reproduced"] == 0
    coverage = report["phases"]["mix"]["coverage"]["buckets"]
    assert sum(b["hits"] for b in coverage.values()) > 0, coverage
    assert report["power"]["evidence"]["fingerprint"]["checked_hits"] > 0
