"""read_values (tui/core/server/metrics_text.py), the fast reading of /metrics, against prometheus_client's
parser (parse_metrics_slowly): the same values and info on texts made the way vLLM makes them (prometheus_client's
own exposition, histograms with hundreds of buckets) and on hand-written edge cases; what it does not take
it leaves to prometheus_client, never read another way."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest

from tui.core.server.metrics import parse_metrics, parse_metrics_slowly
from tui.core.server.metrics_text import read_values


def vllm_like_text() -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Counter("vllm:prefix_cache_queries", "queries", labels, registry=registry).labels("m", "0").inc(4096)
    Counter("vllm:prefix_cache_hits", "hits", labels, registry=registry).labels("m", "0").inc(1536)
    Gauge("vllm:num_requests_running", "running", labels, registry=registry).labels("m", "0").set(3)
    Gauge("vllm:kv_cache_usage_perc", "usage", labels, registry=registry).labels("m", "0").set(0.25)
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_prompt_tokens"):
        histogram = Histogram(name, "h", labels, registry=registry,
                              buckets=[0.001 * 2 ** i for i in range(30)])
        for engine in ("0", "1"):
            for value in (0.002, 0.5, 3.0, 1e6):
                histogram.labels("m", engine).observe(value)
    Summary("vllm:iteration_tokens", "s", labels, registry=registry).labels("m", "0").observe(12)
    gauge = Gauge("vllm:cache_config_info", "config", ["block_size", "engine", "note"], registry=registry)
    gauge.labels("128", "0", 'a "quoted", {braced} value').set(1)
    Info("vllm:build", "build", registry=registry).info({"version": "0.26.0", "engine": "0"})
    return generate_latest(registry).decode()


LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 2048
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""

EDGES = [
    "# TYPE foo counter\nfoo 3\nfoo{a=\"b\"} 4\n",                       # a counter's bare name gets _total
    "# TYPE foo counter\nfoo_total 3\n",                                  # outside the family: its own, as is
    "bare 1\nbare 2 1700000000000\n\n   \n# a comment here\n# HELP\n",   # untyped, a timestamp, blanks
    "# HELP h help\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 5\nh_count 5\nh_sum 2.5\nh_created 1.7e9\n",
    "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_count 2\ns_sum 3\n",
    "g{a=\"x y\",b=\"}\"} NaN\ng{a=\"z\"} +Inf\nk -Inf\nn 1e3\n", "m 0x10\n",
    "# TYPE weird stateset\nweird{weird=\"a\"} 1\n",
    "x_info{engine=\"0\",v=\"1\"} 1\ny_info 1\n",
    "# TYPE i info\ni_info{v=\"1\"} 1\n",                                  # an info family: left to prometheus_client
    "bad_value 1_000\n", "name{__name__=\"other\"} 1\n", "ex_total 1 # {trace=\"a\"} 1\n",
    "\"quoted\" 1\n", "# TYPE \"quoted\" counter\n", "tabbed\t1\n", "ts 1 notanumber\n", "three 1 2 3\n",
    "# TYPE t\n", "1bad 2\n",
]


def same(text: str) -> None:
    fast, slow = parse_metrics(text, t=0), parse_metrics_slowly(text, t=0)
    # repr: NaN is not equal to itself, its repr is
    assert repr((fast.values, fast.info, fast.error)) == repr((slow.values, slow.info, slow.error))


def test_a_vllm_like_exposition_reads_the_same_and_fast():
    text = vllm_like_text()
    assert text.count("\n") > 200 and read_values(text) is not None       # read here, not left over
    same(text)
    assert parse_metrics(text).get("vllm:prefix_cache_hits_total") == 1536


def test_llamacpp_names_read_the_same():
    assert read_values(LLAMACPP) is not None
    same(LLAMACPP)


@pytest.mark.parametrize("text", EDGES)
def test_edge_cases_read_the_same_or_left_to_prometheus_client(text):
    same(text)


def test_the_usual_shapes_are_read_here():
    for text in (EDGES[0], EDGES[1], EDGES[3], EDGES[4], EDGES[5], EDGES[8]):
        assert read_values(text) is not None, text


def test_what_it_leaves_over_is_left_whole():
    for text in ("# TYPE i info\ni_info{v=\"1\"} 1\n", "name{__name__=\"o\"} 1\n", "ex_total 1 # {t=\"a\"} 1\n"):
        assert read_values(text) is None


def test_info_labels_read_once_per_line_stay_each_scrapes_own():
    """An info line's labels are kept per line (read once, not every scrape); each scrape still gets its own
    dict: parse_metrics drops `engine` from it, and the next scrape has the label again to drop."""
    text = vllm_like_text()
    first, second = read_values(text), read_values(text)
    assert first[1] == second[1] and first[1]["vllm:cache_config_info"] is not second[1]["vllm:cache_config_info"]
    first[1]["vllm:cache_config_info"]["block_size"] = "edited"
    assert read_values(text)[1] == second[1] == parse_metrics_slowly(text).info
