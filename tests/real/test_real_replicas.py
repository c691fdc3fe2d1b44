"""Replicas behind a real router, and slot state that moves between real servers (issue 18): two
llama.cpp servers (embedded, 127.0.0.1) behind vllm-router, all started here and stopped afterwards.

- a soak through the router passes clean and every replica served hits (attributed per request
  from the answer's model field: each llama-server serves as MODEL@i);
- a corrupting proxy in front of one replica (the router routes to the proxy) is caught, and every
  fail-class finding names that replica;
- the restore phase: a slot saved on one server, restored on the other and on the first after a
  restart, passes on the tiny hybrid model (recurrent state survives the file); on Gemma a restore is
  accepted and reuses nothing (llama.cpp #26676), which the phase reports instead of passing; damaged
  slot files are refused or, accepted and answering wrong, fail naming the replica.

Run under the machine's lock: flock /work/notes/realserver.lock .venv/bin/python -m pytest -m realserver
tests/real/test_real_replicas.py"""

import asyncio

import pytest

from support.cli import report_json, run_hitproof, scenario
from support.restore_scenario import restore_scenario
from support.corrupting_proxy import CorruptingProxy
from tui.core.server.launch import ServerProcess
from tui.embedded import prepare
from tui.embedded import router as R


# Memos past 512 tokens: llama.cpp keeps Gemma 3's sliding-window cache only through checkpoints
# taken a batch before a prompt's end, so a 300-token memo asked with another question is never a
# hit (seen: every rotation request fully re-processed, LCP similarity 0.94); 1,100 tokens are.
SMALL = """
[scenario]
phases = ["cold_hit", "rotation"]
[evidence]
memo_tokens = 1100
[phases.rotation]
slots = 4
rounds = 3
memo_tokens = 1100
"""
async def routing_to(metrics_url: str, workers: list[str], timeout: float = 60.0) -> None:
    """Until the router's own metrics list every worker healthy (it registers them after it answers)."""
    import httpx

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            try:
                healthy = R.worker_health((await client.get(metrics_url)).text)
                if all(healthy.get(w) for w in workers):
                    return
            except httpx.HTTPError:
                pass
            assert loop.time() < end, f"the router does not route to {workers} after {timeout:.0f}s"
            await asyncio.sleep(0.25)


@pytest.fixture(scope="module")
def set_up():
    prepare("llamacpp", progress=print)
    R.prepare_router(progress=print)


@pytest.mark.parametrize("router, policy", [("vllm-router", "power_of_two"), ("sglang-router", "cache_aware")])
async def test_real_routers_in_front_of_reference_servers_pass_with_every_replica_hit(set_up, tmp_path, router, policy):
    """Seconds: the routers are real, the servers the reference ones (no model)."""
    from tui.core.server.launch import free_port
    from tui.refserver.replicas import start_replicas

    async with await start_replicas(2, decode_ms_per_token=0) as cluster:
        port, metrics_port = free_port(), free_port()
        argv = R.router_argv(router, port=port, metrics_port=metrics_port, worker_urls=cluster.replica_urls,
                             policy=policy)
        front = ServerProcess(argv, url=f"http://127.0.0.1:{port}", env=R.child_env({"NO_COLOR": "1"}))
        await front.start()
        try:
            await front.wait_ready(60)
            await routing_to(f"http://127.0.0.1:{metrics_port}/metrics", cluster.replica_urls)
            log = tmp_path / "run.jsonl"
            result = await run_hitproof("run", "--attach", front.url, "--replica", cluster.replica_urls[0],
                                        "--replica", cluster.replica_urls[1], "--router-metrics",
                                        f"http://127.0.0.1:{metrics_port}/metrics", "--scenario", "quick",
                                        "--headless", "--record", str(log), timeout=600)
        finally:
            await front.stop()
    assert result.code == 0, result.out[-3000:] + result.err[-2000:]
    replicas = report_json(log)["replicas"]
    assert replicas["attribution"] == "model" and replicas["routing_ok"] is True
    assert all(r["hits"] > 0 and r["findings"]["fail"] == 0 for r in replicas["rows"]), replicas["rows"]


async def test_a_corrupting_proxy_on_one_replica_is_caught_naming_it(set_up, tmp_path):
    plan = R.plan_cluster(2, router="vllm-router", policy="round_robin")
    workers = [ServerProcess(w.argv, url=w.url, env=w.env) for w in plan.workers]
    proxy = router = None
    try:
        for w in workers:
            await w.start()
        await asyncio.gather(*(w.wait_ready(180) for w in workers))
        proxy = await CorruptingProxy(plan.worker_urls[1], "foreign").start()
        port = int(plan.url.rsplit(":", 1)[1])
        metrics_port = int(plan.metrics_url.split(":")[2].split("/")[0])
        argv = R.router_argv("vllm-router", port=port, metrics_port=metrics_port, policy="round_robin",
                             worker_urls=[plan.worker_urls[0], proxy.url])
        router = ServerProcess(argv, url=plan.url, env=plan.front.env)
        await router.start()
        await router.wait_ready(60)
        await routing_to(plan.metrics_url, [plan.worker_urls[0], proxy.url])
        log = tmp_path / "run.jsonl"
        result = await run_hitproof("run", "--attach", plan.url, "--replica", plan.worker_urls[0], "--replica",
                                    proxy.url, "--router-metrics", plan.metrics_url, "--scenario",
                                    str(scenario(tmp_path, SMALL)), "--headless", "--record", str(log),
                                    timeout=1500)
    finally:
        if router is not None:
            await router.stop()
        if proxy is not None:
            await proxy.close()
        await asyncio.gather(*(w.stop() for w in workers))
    assert result.code == 1, result.out[-3000:] + result.err[-2000:]
    report = report_json(log)
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert fails and all(f["replica"] == 1 for f in fails), [(f["kind"], f["replica"]) for f in fails]
    rows = {r["index"]: r for r in report["replicas"]["rows"]}
    assert rows[0]["findings"]["fail"] == 0 and rows[1]["findings"]["fail"] > 0


async def restore_run(tmp_path, model, *, codes, damages, tokens):
    text = restore_scenario(tokens=tokens, codes=codes, damages=damages)
    log = tmp_path / f"{model}.jsonl"
    result = await run_hitproof("run", "--engine", "llamacpp", "--model", model, "--replicas", "2", "--scenario",
                                str(scenario(tmp_path, text)), "--headless", "--record", str(log), timeout=1500)
    assert "Traceback" not in result.err, result.err[-2000:]
    return result, report_json(log)


async def test_restore_passes_clean_across_two_servers_and_a_restart_on_a_hybrid_model(set_up, tmp_path):
    result, report = await restore_run(tmp_path, "qwen3next-tiny", codes=False, damages="[]", tokens=1500)
    assert result.code == 0, result.out[-3000:] + result.err[-2000:]
    moves = report["phases"]["restore"]["restore"]["moves"]
    assert [(m["how"], m["replica"]) for m in moves] == [("on another replica", 1), ("after a restart", 0)]
    assert all(m["cached"] > 1000 for m in moves), moves
    compared = [e for e in report["findings"] if e["kind"] == "fingerprint_mismatch" and e["severity"] != "info"]
    assert not compared


async def test_damaged_slot_files_are_refused_or_caught_on_a_hybrid_model(set_up, tmp_path):
    result, report = await restore_run(tmp_path, "qwen3next-tiny", codes=False,
                                       damages='["truncated", "magic", "scrambled"]', tokens=1500)
    outcomes = {d["damage"]: d["outcome"] for d in report["phases"]["restore"]["restore"]["damages"]}
    assert outcomes["truncated"] == "refused" and outcomes["magic"] == "refused", outcomes
    bad = [f for f in report["findings"] if f["kind"] == "bad_restore"]
    if outcomes["scrambled"] == "accepted, answered wrong":
        assert result.code == 1 and bad and all(f["replica"] == 1 for f in bad), bad
    else:
        assert outcomes["scrambled"] in ("refused", "accepted, later requests correct") and not bad
        assert result.code == 0, result.out[-3000:]


async def test_restore_on_gemma_is_accepted_reuses_nothing_and_is_reported(set_up, tmp_path):
    result, report = await restore_run(tmp_path, "gemma3-270m", codes=True, damages='["truncated"]', tokens=600)
    assert result.code == 4, result.out[-3000:] + result.err[-2000:]
    noop = [f for f in report["findings"] if f["kind"] == "restore_no_reuse"]
    assert [f["replica"] for f in noop] == [1, 0], noop
    assert {d["damage"]: d["outcome"] for d in report["phases"]["restore"]["restore"]["damages"]} == \
        {"truncated": "refused"}
