"""Issue 3's contract: each reference-server fault gives its exit code and finding on the quick soak."""

import pytest

from support.cli import ROOT, kinds, report_json, run_hitproof
from tui.refserver import start_refserver

QUICK = str(ROOT / "scenarios" / "quick.toml")

EXPECTED = [
    ("none", 0, None),
    ("zero_state", 1, "recall_miss"),
    ("foreign_state", 1, "foreign_code"),
    ("repeat_token", 1, "repetition"),
    ("empty_turn", 1, "empty_answer"),
    ("wording_drift", 0, None),
]


@pytest.mark.parametrize("fault,code,kind", EXPECTED)
async def test_fault_gives_its_verdict(tmp_path, fault, code, kind):
    handle = await start_refserver(port=0, fault=fault, seed=0)
    log = tmp_path / f"{fault}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", QUICK, "--headless",
                                    "--record", str(log))
    finally:
        await handle.close()
    assert result.code == code, result.out + result.err
    report = report_json(log)
    fails = kinds(report, "fail")
    if kind is None:
        assert fails == set(), report["findings"]
    else:
        assert kind in fails
    if fault == "wording_drift":
        # the field report's sparse top-k drift: seen, classified, never a failure
        assert "kernel_nondeterminism" in kinds(report, "info")
        assert report["phases"]["determinism"]["determinism"]["kind"] == "kernel_nondeterminism"
    if fault == "foreign_state":
        foreign = [f for f in report["findings"] if f["kind"] == "foreign_code" and f["severity"] == "fail"]
        assert all(f["evidence"]["owner"] != f["memo"] for f in foreign)
