"""The real-server tier behind a real gateway (issue 26): Debian's nginx on loopback in front of the
embedded vLLM (Gemma 3 270M on the CPU), proxy_buffering off, keep-alive to the upstream. The quick
soak passes through it with every hit proven by the per-request cached tokens and by vLLM's counter."""

import json

import pytest

from support.cli import ROOT, report_json, run_hitproof
from support.nginx import Nginx, available
from support.servers import BackgroundServer

pytestmark = pytest.mark.realserver
QUICK = str(ROOT / "scenarios" / "quick.toml")


@pytest.fixture(scope="module")
def vllm():
    server = BackgroundServer("vllm").start()      # as tests/test_real_vllm.py: one vLLM per module, stopped after
    yield server
    server.stop()


async def test_quick_soak_through_nginx_in_front_of_vllm(vllm, tmp_path):
    assert available(), "nginx is not installed: apt-get install -y nginx (.ci/run installs it)"
    gateway = await Nginx(vllm.url, buffering=False).start()
    log = tmp_path / "vllm-nginx-quick.jsonl"
    try:
        result = await run_hitproof("run", "--attach", gateway.url, "--scenario", QUICK, "--headless",
                                    "--record", str(log), timeout=1800)
        served = gateway.requests()
    finally:
        await gateway.close()
    print(result.out[-3000:])
    assert result.code == 0, result.out + result.err
    assert len(served) > 100                       # every request went through nginx
    report = report_json(log)
    assert report["verdict"] == "pass" and report["server"]["dialect"] == "vllm"
    assert [f for f in report["findings"] if f["severity"] == "fail"] == []
    for name, phase in report["phases"].items():
        assert phase["status"] == "pass", (name, phase)
        assert phase["unknown_cached"] == 0, (name, phase)
        if name != "control":
            assert phase["hits"] > 0 and phase["hits_agree"] is True, (name, phase)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    ends = [e for e in events if e["type"] == "request_end" and not e["error"]]
    assert ends and all(e["cached_source"] == "request" for e in ends)
