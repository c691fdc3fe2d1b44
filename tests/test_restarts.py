"""Restart detection that ordering cannot fool (issue 26): a counter that went back in a scrape answered
late is not a restart. The pure parts exactly; then the quick soak through a proxy that answers /metrics
out of order and hides per-request cached tokens (hits proven by counters only)."""

from __future__ import annotations

import pytest

from support.cli import ROOT, report_json, run_hitproof
from support.reordering_proxy import ReorderingProxy
from tui.refserver import start_refserver

QUICK = str(ROOT / "scenarios" / "quick.toml")


# --- end to end: the reference server behind a reordering proxy --------------------------------------------

async def test_quick_soak_through_a_reordering_proxy_never_errors(tmp_path):
    handle = await start_refserver(port=0, fault="none")
    proxy = await ReorderingProxy(handle.url).start()
    log = tmp_path / "run.jsonl"
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario", QUICK, "--headless",
                                    "--record", str(log))
    finally:
        await proxy.close()
        await handle.close()
    assert proxy.delayed > 5 and proxy.generations > 50, (proxy.delayed, proxy.generations)
    assert result.code in (0, 4), result.out + result.err
    assert "restarted" not in result.out + result.err
    report = report_json(log)
    if result.code == 4:
        assert report["verdict"] == "inconclusive" and report["reasons"], report
    else:
        assert report["verdict"] == "pass"
    for name, phase in report["phases"].items():      # hits are proven by the counter, never assumed
        if phase["status"] == "pass" and name != "control":
            assert phase["hits"] > 0 and "by counter" in phase["hits_proven"], (name, phase)
