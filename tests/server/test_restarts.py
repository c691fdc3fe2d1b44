"""Restart detection that ordering cannot fool (issue 26): a counter that went back in a scrape answered
late is not a restart. The pure parts exactly; then the quick soak through a proxy that answers /metrics
out of order and hides per-request cached tokens (hits proven by counters only)."""

from __future__ import annotations

import asyncio

from support.cli import ROOT, report_json, run_hitproof
from support.reordering_proxy import ReorderingProxy
from tui.core.server.metrics import MetricSnapshot
from tui.core.server.restarts import RestartWatch, counter_back, in_order, restart_sign
from tui.refserver import start_refserver

QUICK = str(ROOT / "scenarios" / "quick.toml")
GEN = "vllm:generation_tokens_total"


def snap(sent=None, **values) -> MetricSnapshot:
    return MetricSnapshot(t=0.0, values={k.replace("__", ":"): float(v) for k, v in values.items()}, sent=sent)


# --- the pure parts ---------------------------------------------------------------------------------------

def test_a_counter_back_is_a_sign_only_without_a_start_time():
    before, after = snap(vllm__generation_tokens_total=859), snap(vllm__generation_tokens_total=835)
    assert counter_back(before, after) == f"its counter {GEN} went back from 859 to 835"
    assert restart_sign(before, after) == counter_back(before, after)
    assert counter_back(after, before) is None and restart_sign(after, before) is None
    assert counter_back(snap(my_gauge_total=9), snap(my_gauge_total=1)) is None   # not a known counter
    same = dict(process_start_time_seconds=1000.25)
    assert restart_sign(snap(**same, vllm__generation_tokens_total=859),
                        snap(**same, vllm__generation_tokens_total=835)) is None  # the start time decides
    assert restart_sign(snap(process_start_time_seconds=1000, vllm__generation_tokens_total=5),
                        snap(process_start_time_seconds=2000, vllm__generation_tokens_total=9)) \
        == "its process_start_time_seconds changed from 1000 to 2000"


def test_observe_ignores_a_scrape_sent_before_the_last_one_judged():
    watch = RestartWatch()
    assert watch.observe(snap(sent=2, vllm__generation_tokens_total=859)) is None
    assert watch.observe(snap(sent=1, vllm__generation_tokens_total=835)) is None    # sent earlier, came late
    assert watch.observe(snap(sent=3, vllm__generation_tokens_total=859)) is None
    assert not watch.seen.is_set()
    why = watch.observe(snap(sent=4, vllm__generation_tokens_total=12))
    assert why == f"its counter {GEN} went back from 859 to 12"
    assert watch.seen.is_set() and watch.message.startswith("the server restarted during the soak (its counter")


def test_observe_prefers_the_process_start_time():
    watch = RestartWatch()
    assert watch.observe(snap(process_start_time_seconds=1000, vllm__generation_tokens_total=859)) is None
    assert watch.observe(snap(process_start_time_seconds=1000, vllm__generation_tokens_total=835)) is None
    assert watch.observe(snap(process_start_time_seconds=1000, vllm__generation_tokens_total=858)) is None
    assert not watch.seen.is_set()                      # 858 < 859 still: the baseline stayed at the newest state
    assert "process_start_time_seconds changed from 1000 to 1001" in watch.observe(
        snap(process_start_time_seconds=1001, vllm__generation_tokens_total=900))


async def test_in_order_takes_one_scrape_at_a_time_and_stamps_it():
    in_flight, most, answers = 0, 0, iter([1, 2, 3, 4])

    async def fetch():
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return snap(vllm__generation_tokens_total=next(answers))

    server = type("Server", (), {})()   # any object a line can be keyed on
    got = await asyncio.gather(*(in_order(server, fetch) for _ in range(4)))
    assert most == 1
    assert [s.values[GEN] for s in got] == [1, 2, 3, 4]
    assert [s.sent for s in got] == sorted(s.sent for s in got) and len({s.sent for s in got}) == 4


async def test_in_order_reads_again_when_a_scrape_shows_a_restart_sign():
    answers = [859, 835, 860, 12, 13]                   # a stale answer, then a real restart
    calls = []

    async def fetch():
        calls.append(answers[len(calls)])
        return snap(vllm__generation_tokens_total=calls[-1])

    server = type("Server", (), {})()   # any object a line can be keyed on
    assert (await in_order(server, fetch)).values[GEN] == 859
    fresh = await in_order(server, fetch)
    assert fresh.values[GEN] == 860 and calls == [859, 835, 860]      # 835 went back: read again
    restarted = await in_order(server, fetch)
    assert restarted.values[GEN] == 13 and calls == [859, 835, 860, 12, 13]   # still back: the fresh one says so
    watch = RestartWatch()
    for one in (fresh, restarted):
        watch.observe(one)
    assert watch.message == f"the server restarted during the soak (its counter {GEN} went back from 860 to 13); " \
                            "the soak ends here"


# --- end to end: the reference server behind a reordering proxy --------------------------------------------

async def test_quick_soak_through_a_reordering_proxy_never_errors(tmp_path):
    """Every other scrape answered 0.4 s late (on the code before issue 26 a later scrape overtook it:
    exit 3, "its counter vllm:generation_tokens_total went back from 859 to 835"), and every fifth
    answered with a body two scrapes old, as a gateway caching /metrics would. One soak has both: a
    second soak with the delays alone (the late scrapes are most of both) cost the fast tier 43 s."""
    stale_every = 5
    handle = await start_refserver(port=0, fault="none")
    proxy = await ReorderingProxy(handle.url, stale_every=stale_every).start()
    log = tmp_path / "run.jsonl"
    try:
        result = await run_hitproof("run", "--attach", proxy.url, "--scenario", QUICK, "--headless",
                                    "--record", str(log))
    finally:
        await proxy.close()
        await handle.close()
    assert proxy.delayed > 5 and proxy.generations > 50, (proxy.delayed, proxy.generations)
    assert proxy.stale > 3, proxy.stale
    assert result.code in (0, 4), result.out + result.err
    assert "restarted" not in result.out + result.err
    report = report_json(log)
    if result.code == 4:
        reasons = [why for phase in report["phases"].values() if phase["status"] == "inconclusive"
                   for why in phase["reasons"]]
        assert report["verdict"] == "inconclusive" and reasons, report      # a stated reason, never an error
    else:
        assert report["verdict"] == "pass"
    for name, phase in report["phases"].items():      # hits are proven by the counter, never assumed
        if phase["status"] == "pass" and name != "control":
            assert phase["hits"] > 0 and "by counter" in phase["hits_proven"], (name, phase)
