"""What resuming costs, calibrated at the run's width (tui/core/soak/resume.py, WIDE_FROM).

On a GPU, resumes alone were bit-exact while hits among 32-128 requests in flight moved 0.05 nats from
their cold runs (run E, the H200): a solo calibration excused nothing of it and two clean wide soaks
FAILed. The reference server's `--wide-cost` makes that shape: a hit admitted while at least 4 others are
served moves up to NATS more. A wide run calibrates as many prompts at once as it has slots; a fault
that makes every restore wrong (zero_state) still fails at that width."""

from __future__ import annotations

from support.cli import ROOT, report_json, run_hitproof
from tui.refserver import start_refserver

HYBRID = str(ROOT / "scenarios" / "hybrid-quick.toml")


async def wide_soak(tmp_path, name: str, streams: int, **options) -> tuple[int, dict, str]:
    handle = await start_refserver(port=0, **options)
    log = tmp_path / f"{name}.jsonl"
    try:
        result = await run_hitproof("run", "--attach", handle.url, "--scenario", HYBRID, "--headless",
                                    "--streams", str(streams), "--record", str(log), timeout=300)
    finally:
        await handle.close()
    return result.code, report_json(log), result.out + result.err


def calibration_of(log_report: dict) -> dict:
    return log_report["resume"]


async def test_a_clean_server_whose_wide_hits_cost_more_is_calibrated_at_its_width(tmp_path):
    code, report, out = await wide_soak(tmp_path, "wide", 16, wide_cost=0.12)
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert code in (0, 4) and not fails, out
    cal = calibration_of(report)
    assert cal["width"] == 16 and cal["tried"] == 3 + 16
    assert cal["measured"] > 0.05 and cal["bound"] > 0.05, cal       # the solo prompts alone measure 0


async def test_every_restore_wrong_still_fails_at_width(tmp_path):
    code, report, out = await wide_soak(tmp_path, "zero", 16, fault="zero_state", wide_cost=0.12)
    assert code == 1, out
    assert calibration_of(report)["width"] == 16
