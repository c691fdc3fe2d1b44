"""Parsers and command lines of tui/embedded/router.py and slots.py (the fast tier: no server).

The metrics texts are lines the real routers and llama-server printed here (vllm-router 0.1.17,
sglang-router 0.3.2, llama-server b11434); the real-server tests are test_real_router.py and
test_real_slots.py."""

import pytest

from tui.embedded import router as R
from tui.embedded.common import SetupError
from tui.embedded.slots import valid_filename

W0, W1 = "http://127.0.0.1:47093", "http://127.0.0.1:57271"

VLLM_ROUTER = f"""# HELP vllm_router_processed_requests_total processed
# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{{worker="{W0}"}} 9
vllm_router_processed_requests_total{{worker="{W1}"}} 8
vllm_router_cb_outcomes_total{{worker="{W0}",outcome="success"}} 9
vllm_router_cb_outcomes_total{{worker="{W1}",outcome="success"}} 8
vllm_router_worker_health{{worker="{W0}"}} 1
vllm_router_worker_health{{worker="{W1}"}} 0
vllm_router_active_workers 2
"""

SGLANG_ROUTER = f"""smg_worker_cb_outcomes_total{{worker="{W0}",outcome="success"}} 4
smg_worker_cb_outcomes_total{{worker="{W0}",outcome="failure"}} 2
smg_worker_cb_outcomes_total{{worker="{W1}",outcome="success"}} 3
smg_worker_health{{worker="{W0}"}} 1
smg_worker_health{{worker="{W1}"}} 1
smg_worker_pool_size{{worker_type="regular",connection_mode="http",model="unknown"}} 2
"""

LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 974
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens served from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 946
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 48
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def test_vllm_router_counts_requests_per_worker():
    assert R.worker_request_counts("vllm-router", VLLM_ROUTER) == {W0: 9, W1: 8}
    assert R.worker_health(VLLM_ROUTER) == {W0: True, W1: False}


def test_sglang_router_counts_only_successful_outcomes():
    assert R.worker_request_counts("sglang-router", SGLANG_ROUTER) == {W0: 4, W1: 3}
    assert R.worker_health(SGLANG_ROUTER) == {W0: True, W1: True}


def test_damaged_metrics_text_gives_nothing_rather_than_raising():
    assert R.worker_request_counts("vllm-router", "vllm_router_processed_requests_total{worker=") == {}
    assert R.worker_health("not { prometheus") == {}
    assert R.llamacpp_counters("") == {}


def test_llamacpp_counters_and_the_worker_that_moved():
    values = R.llamacpp_counters(LLAMACPP)
    assert values == {"llamacpp:prompt_tokens_total": 974, "llamacpp:prompt_tokens_cached_total": 946,
                      "llamacpp:tokens_predicted_total": 48}
    after = {W0: dict(values), W1: dict(values)}
    before = {W0: dict(values), W1: {**values, "llamacpp:tokens_predicted_total": 40}}
    assert R.served_by(before, after) == [W1]
    assert R.served_by(after, after) == []
    # a worker that did not answer one scrape names nobody (unknown is not zero)
    assert R.served_by({W0: {}, W1: dict(values)}, after) == []


def test_router_argv_listens_on_loopback_without_retries():
    argv = R.router_argv("vllm-router", port=30001, metrics_port=30002, worker_urls=[W0, W1], policy="round_robin")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--worker-urls") + 1: argv.index("--worker-urls") + 3] == [W0, W1]
    assert "--disable-retries" in argv
    assert "--tokenizer-path" not in argv  # vllm-router has no such flag


def test_sglang_router_gets_the_local_tokenizer(tmp_path):
    argv = R.router_argv("sglang-router", port=1, metrics_port=2, worker_urls=[W0], policy="cache_aware",
                         tokenizer=tmp_path)
    assert argv[argv.index("--tokenizer-path") + 1] == str(tmp_path)


@pytest.mark.parametrize("router,policy,worker_urls,message", [
    ("nginx", "round_robin", [W0], "unknown router 'nginx'"),
    ("sglang-router", "consistent_hash", [W0], "sglang-router has no policy 'consistent_hash'"),
    ("vllm-router", "round_robin", [], "needs at least one worker URL"),
])
def test_router_argv_refuses_bad_input_with_one_line(router, policy, worker_urls, message):
    with pytest.raises(SetupError) as e:
        R.router_argv(router, port=1, metrics_port=2, worker_urls=worker_urls, policy=policy)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_plan_cluster_refuses_wrong_port_count():
    with pytest.raises(SetupError, match="needs 4 ports for 2 workers, got 3"):
        R.plan_cluster(2, ports=[1, 2, 3])


@pytest.mark.parametrize("name,ok", [
    ("memo-a.bin", True), ("p_1.slot", True), ("../x.bin", False), ("a/b.bin", False), ("", False),
    ("..", False), ("a b.bin", False),
])
def test_slot_file_names(name, ok):
    assert valid_filename(name) is ok


def test_llamacpp_workers_share_the_cores_unless_threads_are_given(monkeypatch):
    monkeypatch.setattr(R, "_cores", lambda: 2)
    assert R.worker_threads("llamacpp", 2, ()) == 1
    assert R.worker_threads("llamacpp", 3, ()) == 1                 # never 0
    monkeypatch.setattr(R, "_cores", lambda: 8)
    assert R.worker_threads("llamacpp", 2, ("--slot-save-path", "/x")) == 4
    assert R.worker_threads("llamacpp", 2, ("-t", "3")) is None      # the caller chose
    assert R.worker_threads("vllm", 2, ()) is None                   # vLLM's own threading is left alone
