"""/metrics in Prometheus text format 0.0.4 with vLLM's metric names and labels.

Counters are exported with ``# HELP``/``# TYPE`` lines under their ``_total`` names the
way prometheus_client writes them, so ``text_string_to_metric_families`` reads this
exactly as it reads a real vLLM.  Prefix-cache queries and hits are in tokens, as vLLM
counts them (queries += prompt tokens, hits += cached tokens).  Spec-decode counters
appear only when the server pretends to have a drafter (``num_speculative_tokens``).
"""

from __future__ import annotations

from .pipeline import Pipeline


def _labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def render(pipeline: Pipeline) -> str:
    cfg, stats = pipeline.config, pipeline.stats
    base = {"engine": "0", "model_name": cfg.model_name}
    lines: list[str] = []

    def family(name: str, kind: str, doc: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(labels)} {float(value)!r}" for labels, value in samples)

    def counter(name: str, doc: str, value: float) -> None:
        family(name, "counter", doc, [(base, value)])

    def gauge(name: str, doc: str, value: float) -> None:
        family(name, "gauge", doc, [(base, value)])

    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", pipeline.running)
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 0)
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", pipeline.cache.usage())
    counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", stats.preemptions)
    counter("vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.", stats.queries)
    counter("vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.", stats.hits)
    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", stats.prompt_tokens)
    counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
            stats.generation_tokens)
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
           [({"engine": "0", "finished_reason": reason, "model_name": cfg.model_name},
             stats.success[reason]) for reason in ("stop", "length", "abort")])
    if cfg.num_speculative_tokens:
        counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", stats.drafts)
        counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", stats.draft_tokens)
        counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
                stats.accepted_tokens)
    info = {
        "block_size": str(cfg.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(cfg.prefix_caching),
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "mamba_block_size": str(cfg.block_size),
        "mamba_cache_mode": "align",
        "num_gpu_blocks": str(cfg.num_blocks),
        "prefix_caching_hash_algo": "blake2b",
        "sliding_window": "None",
        "engine": "0",
    }
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
           [(info, 1.0)])
    return "\n".join(lines) + "\n"
