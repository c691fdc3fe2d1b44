"""The second real engine: llama.cpp's llama-server (built from source by pip), launched by hitproof."""

import json
import subprocess

import pytest

from support.cli import ROOT, report_json, run_hitproof

pytestmark = pytest.mark.realserver
QUICK = str(ROOT / "scenarios" / "quick.toml")


async def test_embedded_llamacpp_quick_soak_passes(tmp_path):
    log = tmp_path / "llamacpp.jsonl"
    result = await run_hitproof("run", "--engine", "llamacpp", "--scenario", QUICK, "--headless",
                                "--record", str(log), timeout=1800)
    print(result.out[-3000:])
    assert result.code == 0, result.out + result.err
    report = report_json(log)
    assert report["server"]["dialect"] == "llamacpp"
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
    for name, phase in report["phases"].items():
        assert phase["status"] == "pass", (name, phase)
        if name != "control":
            assert phase["hits"] > 0, name
        # llama.cpp counts cached prompt tokens in llamacpp:prompt_tokens_cached_total
        assert phase["hits_agree"] is True, (name, phase["metrics"], phase["reported_cached_tokens"])
    header = json.loads(log.read_text().splitlines()[0])
    command = header["target"]["launch_command"]
    assert "llama-server" in command
    port = command.split("--port ")[1].split()[0]
    assert subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True).stdout == ""
