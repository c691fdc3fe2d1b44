"""The server metrics hitproof reads, by name: the vocabulary of MetricsSample events (what the
soak scrapes and the reports read back). Counters are summed across label sets (engines, models)."""

PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
CACHE_CONFIG = "vllm:cache_config_info"
LLAMA_PROMPT_TOKENS = "llamacpp:prompt_tokens_total"
LLAMA_PREDICTED = "llamacpp:tokens_predicted_total"
LLAMA_CACHED = "llamacpp:prompt_tokens_cached_total"
LLAMA_SPEC_DRAFTS = "llamacpp:spec_decode_num_drafts_total"
LLAMA_SPEC_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
LLAMA_PROCESSING = "llamacpp:requests_processing"
LLAMA_DEFERRED = "llamacpp:requests_deferred"

COUNTERS = (PREFIX_QUERIES, PREFIX_HITS, PREEMPTIONS, SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED,
            LLAMA_PROMPT_TOKENS, LLAMA_PREDICTED, LLAMA_CACHED, LLAMA_SPEC_DRAFTS, LLAMA_SPEC_ACCEPTED)


