"""Replicas behind a router (issue 18), fast tier: the reference router in front of reference servers
(tui/refserver/replicas.py), each a whole server with its own cache and counters. The claims about
real routers and llama.cpp replicas are shown in tests/real/test_real_replicas.py.

Attribution by every way a response can name its replica (the model field, a header) and by the
replicas' counter deltas alone; a fault on one replica is caught naming it; a replica that never
hits makes the run inconclusive; bad --replica input is one line and exit 2."""

import collections
import json

import pytest

from support.cli import ROOT, report_json, run_hitproof, scenario
from support.corrupting_proxy import CorruptingProxy
from tui.core.server.metrics import MetricSnapshot
from tui.core.server.replicas import (ClusterSnapshot, Replica, Signature, assign, check_urls, named_by_response,
                                      replica_deltas, router_worker_counts)
from tui.core.report.replicas import routing_judgment
from tui.refserver import start_refserver
from tui.refserver.replicas import start_replicas, start_router

QUICK = str(ROOT / "scenarios" / "quick.toml")
SMALL = """
[scenario]
phases = ["cold_hit", "rotation"]
[evidence]
memo_tokens = 400
[phases.rotation]
slots = 4
rounds = 3
memo_tokens = 300
"""


# --- pure parts -----------------------------------------------------------------------------------

def snap(**values: float) -> MetricSnapshot:
    return MetricSnapshot(t=0.0, values={k.replace("__", ":"): v for k, v in values.items()})


def llama(generated: float, prompt: float, cached: float) -> MetricSnapshot:
    return MetricSnapshot(t=0.0, values={"llamacpp:tokens_predicted_total": generated,
                                         "llamacpp:prompt_tokens_total": prompt - cached,
                                         "llamacpp:prompt_tokens_cached_total": cached})


def test_a_request_alone_is_attributed_to_the_replica_whose_counters_moved():
    before = ClusterSnapshot({0: llama(10, 100, 0), 1: llama(20, 200, 50)})
    after = ClusterSnapshot({0: llama(10, 100, 0), 1: llama(24, 500, 330)})
    deltas = replica_deltas(before, after)
    assert assign({7: Signature(4, 300, 280)}, deltas) == {7: 1}


def test_two_concurrent_requests_are_told_apart_only_where_the_deltas_leave_one_way():
    before = ClusterSnapshot({0: llama(0, 0, 0), 1: llama(0, 0, 0)})
    distinct = ClusterSnapshot({0: llama(4, 300, 0), 1: llama(8, 500, 256)})
    assert assign({1: Signature(4, 300, 0), 2: Signature(8, 500, 256)}, replica_deltas(before, distinct)) == \
        {1: 0, 2: 1}
    # two identical requests, one on each replica: either way explains the deltas, so neither is named
    same = ClusterSnapshot({0: llama(4, 300, 0), 1: llama(4, 300, 0)})
    assert assign({1: Signature(4, 300, 0), 2: Signature(4, 300, 0)}, replica_deltas(before, same)) == \
        {1: None, 2: None}
    # someone else's traffic: nothing explains the deltas, nothing is guessed
    other = ClusterSnapshot({0: llama(9, 900, 0), 1: llama(0, 0, 0)})
    assert assign({1: Signature(4, 300, 0)}, replica_deltas(before, other)) == {1: None}


def test_a_replica_that_did_not_answer_its_metrics_leaves_the_window_unattributed():
    before = ClusterSnapshot({0: llama(0, 0, 0), 1: None})
    after = ClusterSnapshot({0: llama(4, 300, 0), 1: llama(0, 0, 0)})
    assert replica_deltas(before, after) is None


def test_the_response_names_its_replica_by_header_or_by_model_field():
    replicas = [Replica(0, "http://127.0.0.1:9001", ("gemma@0",)), Replica(1, "http://127.0.0.1:9002", ("gemma@1",))]
    assert named_by_response(replicas, "gemma@1", {}).replica == 1
    served = named_by_response(replicas, "gemma", {"x-served-by": "127.0.0.1:9001"})
    assert (served.replica, served.source) == (0, "header")
    shared = [Replica(0, "http://127.0.0.1:9001", ("gemma",)), Replica(1, "http://127.0.0.1:9002", ("gemma",))]
    assert named_by_response(shared, "gemma", {"server": "llama.cpp"}).replica is None


def test_router_per_worker_counters_are_read_by_worker_url():
    replicas = [Replica(0, "http://127.0.0.1:9001"), Replica(1, "http://127.0.0.1:9002")]
    text = ('# TYPE vllm_router_processed_requests_total counter\n'
            'vllm_router_processed_requests_total{worker="http://127.0.0.1:9001"} 3\n'
            'vllm_router_processed_requests_total{worker="http://127.0.0.1:9002/"} 5\n')
    assert router_worker_counts(text, replicas) == {0: 3.0, 1: 5.0}
    assert router_worker_counts("not prometheus {{{", replicas) == {}


def test_routing_judgment_names_a_replica_that_never_hit():
    rows = [{"label": "r0", "url": "http://a", "hits": 9, "requests": 12, "all_requests": 12},
            {"label": "r1", "url": "http://b", "hits": 0, "requests": 6, "all_requests": 6}]
    ok, detail = routing_judgment(rows)
    assert not ok and "replica r1 (http://b) served 6 request(s) and never hit" in detail
    rows[1]["hits"] = 2
    assert routing_judgment(rows) == (True, "")


def test_replica_urls_are_checked():
    assert check_urls(["127.0.0.1:9001/v1", "http://127.0.0.1:9002/"]) == ["http://127.0.0.1:9001",
                                                                          "http://127.0.0.1:9002"]
    with pytest.raises(ValueError, match="given twice"):
        check_urls(["http://a:1", "http://a:1/"])
    with pytest.raises(ValueError, match="not an http"):
        check_urls(["ftp://a:1"])


# --- whole soaks through the reference router -----------------------------------------------------

async def soak(cluster_url, replica_urls, tmp_path, *, metrics=None, scenario_path=QUICK):
    log = tmp_path / "run.jsonl"
    args = ["run", "--attach", cluster_url, "--scenario", scenario_path, "--headless", "--record", str(log)]
    for url in replica_urls:
        args += ["--replica", url]
    if metrics:
        args += ["--router-metrics", metrics]
    result = await run_hitproof(*args)
    assert "Traceback" not in result.err, result.err
    return result, report_json(log)


@pytest.mark.parametrize("names, method", [("model", "model"), ("header", "header"), ("none", "counter")])
async def test_a_clean_cluster_passes_with_hits_on_every_replica(tmp_path, names, method):
    async with await start_replicas(2, names=names, decode_ms_per_token=0) as cluster:
        result, report = await soak(cluster.url, cluster.replica_urls, tmp_path,
                                    metrics=cluster.metrics_url if names == "none" else None)
        assert result.code == 0, result.out + result.err
        replicas = report["replicas"]
        assert replicas["attribution"] == method
        assert replicas["routing_ok"] is True
        rows = replicas["rows"]
        assert [r["url"] for r in rows] == cluster.replica_urls
        assert all(r["hits"] > 0 and r["findings"]["fail"] == 0 for r in rows), rows
        # what the router counted per worker is what hitproof attributed (every arm, the probe aside),
        # less what hitproof sent to a replica directly (the determinism repeats go to the replica
        # that wrote their prefix, not through the router)
        events = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
        direct = collections.Counter(e["replica"] for e in events
                                     if e["type"] == "request_end" and e.get("replica_source") == "direct")
        assert sum(direct.values()) >= 1
        for row in rows:
            assert row["all_requests"] - direct[row["index"]] <= cluster.routed[row["url"]]
        assert sum(r["all_requests"] for r in rows) + replicas["unattributed"] >= report["requests"] - 1
        assert "replicas:" in result.out and "r0" in result.out and "r1" in result.out


async def test_a_fault_on_one_replica_is_caught_naming_it(tmp_path):
    async with await start_replicas(2, faults={1: "foreign_state"}, decode_ms_per_token=0) as cluster:
        result, report = await soak(cluster.url, cluster.replica_urls, tmp_path)
    assert result.code == 1, result.out + result.err
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert fails and {f["replica"] for f in fails} == {1}, fails
    rows = {r["index"]: r for r in report["replicas"]["rows"]}
    assert rows[1]["findings"]["fail"] > 0 and rows[0]["findings"]["fail"] == 0
    assert "replica r1" in result.out
    # every format carries the per-replica rows
    page = await run_hitproof("report", str(tmp_path / "run.jsonl"), "--format", "html")
    assert page.code == 0 and '<h2 id="replicas">Replicas</h2>' in page.out
    assert f"<td>{cluster.replica_urls[1]}</td>" in page.out
    md = await run_hitproof("report", str(tmp_path / "run.jsonl"), "--format", "markdown")
    assert md.code == 0 and cluster.replica_urls[1] in md.out and "r1" in md.out


async def test_a_corrupting_proxy_in_front_of_one_replica_is_named(tmp_path):
    clean = await start_refserver(port=0, model_name="refmodel@0", decode_ms_per_token=0)
    behind = await start_refserver(port=0, model_name="refmodel@1", decode_ms_per_token=0)
    proxy = await CorruptingProxy(behind.url, "foreign").start()
    router = await start_router([clean.url, proxy.url])
    try:
        result, report = await soak(router.url, [clean.url, proxy.url], tmp_path,
                                    scenario_path=str(scenario(tmp_path, SMALL)))
    finally:
        await router.close()
        await proxy.close()
        await behind.close()
        await clean.close()
    assert result.code == 1, result.out + result.err
    fails = [f for f in report["findings"] if f["severity"] == "fail"]
    assert fails and all(f["replica"] == 1 for f in fails), fails
    assert any(f["kind"] == "foreign_code" for f in fails)


async def test_a_replica_that_never_hits_makes_the_run_inconclusive(tmp_path):
    async with await start_replicas(2, replica_options={1: {"prefix_caching": False}},
                                    decode_ms_per_token=0) as cluster:
        result, report = await soak(cluster.url, cluster.replica_urls, tmp_path,
                                    scenario_path=str(scenario(tmp_path, SMALL)))
    assert result.code == 4, result.out + result.err
    assert report["verdict"] == "inconclusive"
    replicas = report["replicas"]
    assert replicas["routing_ok"] is False
    assert "replica r1" in replicas["routing_detail"] and "never hit" in replicas["routing_detail"]
    rows = {r["index"]: r for r in replicas["rows"]}
    assert rows[0]["hits"] > 0 and rows[1]["hits"] == 0 and rows[1]["requests"] > 0
    assert "routing" in result.out


@pytest.mark.parametrize("args, words", [
    (["--replica", "http://127.0.0.1:9"], "--replica and --router-metrics go with --attach"),
    (["--attach", "http://127.0.0.1:9", "--replica", "ftp://x"], "not an http(s) URL"),
    (["--attach", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:9"], "router's own URL is not a replica"),
    (["--engine", "llamacpp", "--replicas", "12"], "give 1 to 8 replicas"),
    (["--engine", "llamacpp", "--replicas", "2", "--policy", "nonsense"], "--policy nonsense"),
    (["--attach", "http://127.0.0.1:9", "--policy", "round_robin"], "--router and --policy go with --replicas"),
    # a port that is not a number was an internal error (exit 6) before 2026-12-05
    (["--attach", "http://127.0.0.1:8400x"], "--attach http://127.0.0.1:8400x: not a URL hitproof can reach"),
    (["--attach", "http://127.0.0.1:99999"], "Port out of range"),
    (["--attach", "http://127.0.0.1:9", "--replica", "http://127.0.0.1:80x"], "--replica http://127.0.0.1:80x"),
    (["--launch", "true", "--url", "http://[::1"], "--url http://[::1"),
])
async def test_bad_replica_options_are_one_line_and_exit_2(args, words):
    result = await run_hitproof("run", "--headless", "--no-record", *args)
    assert result.code == 2, result.out + result.err
    assert words in result.err and "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err


async def test_a_replica_that_does_not_answer_is_one_line_naming_it(tmp_path):
    async with await start_replicas(1, decode_ms_per_token=0) as cluster:
        result = await run_hitproof("run", "--attach", cluster.url, "--replica", cluster.replica_urls[0],
                                    "--replica", "http://127.0.0.1:9", "--scenario", QUICK, "--headless",
                                    "--no-record")
    assert result.code == 3, result.out + result.err
    assert "replica r1" in result.out + result.err and "Traceback" not in result.err


async def test_a_router_that_could_not_send_to_a_worker_is_asked_again_naming_the_replica(tmp_path):
    async with await start_replicas(2, decode_ms_per_token=0) as cluster:
        proxy = await CorruptingProxy(cluster.url, "send_failed_once", after=5, names=cluster.replica_urls[1]).start()
        try:
            result, report = await soak(proxy.url, cluster.replica_urls, tmp_path,
                                        scenario_path=str(scenario(tmp_path, SMALL)))
        finally:
            await proxy.close()
    assert result.code == 0, result.out + result.err
    sent = [f for f in report["findings"] if f["kind"] == "router_send_failed"]
    assert len(sent) == 1 and sent[0]["severity"] == "info" and sent[0]["replica"] == 1, sent


async def test_a_worker_error_through_the_router_still_ends_the_soak(tmp_path):
    async with await start_replicas(2, decode_ms_per_token=0) as cluster:
        proxy = await CorruptingProxy(cluster.url, "http500", after=5).start()
        try:
            result, report = await soak(proxy.url, cluster.replica_urls, tmp_path,
                                        scenario_path=str(scenario(tmp_path, SMALL)))
        finally:
            await proxy.close()
    assert result.code == 3, result.out + result.err
    assert not [f for f in report["findings"] if f["kind"] == "router_send_failed"]
