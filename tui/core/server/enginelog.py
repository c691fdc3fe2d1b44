"""Engine-log watch: which server output lines mean trouble, and how bad.

``classify(line)`` is pure: one output line in, ``(kind, severity)`` or ``None`` out. The runner
turns every classified line of a server hitproof launched into a finding of kind ``engine_log``
whose ``detail`` is the line and whose ``evidence`` holds the line, its kind and the lines
before it.

The mapping (first match wins, in this order):

============================  =========  ==========================================================
kind                          severity   lines that match (case-insensitive)
============================  =========  ==========================================================
``illegal_memory_access``     fail       "illegal memory access", ``cudaErrorIllegalAddress``
``out_of_memory``             fail       ``OutOfMemoryError``, "CUDA out of memory", "CUDA error: out
                                         of memory", ``cudaErrorMemoryAllocation``, ``std::bad_alloc``
``cuda_error``                fail       "CUDA error", ``CUBLAS_STATUS_*`` (not SUCCESS), "NCCL error",
                                         "device-side assert"
``engine_dead``               fail       ``EngineDeadError``, "EngineCore encountered a fatal error",
                                         "engine core ... died", "output_handler failed",
                                         "worker ... died", "Worker failed with error" (the root cause)
``crash``                     fail       "Segmentation fault", "Fatal Python error", "core dumped",
                                         ``GGML_ASSERT``, "terminate called after throwing", SIGSEGV /
                                         SIGABRT / SIGBUS
``preemption``                warn       "preempted", "preempting", "preemption" as words
                                         (not config keys such as ``preemption_mode`` or metric names
                                         such as ``num_preemptions``)
``traceback``                 warn       "Traceback (most recent call last)"
============================  =========  ==========================================================

Why: a crash, an illegal memory access, an out-of-memory error or a dead engine core means every
answer after it is suspect, so it is fail-class. A preemption is the scheduler evicting a
running request's blocks and recomputing them later: legal, but exactly the cache path a soak
wants to see, so it is a warning to read next to the cache findings. A traceback alone can be a
request the server rejected and survived, so it is a warning; the exception line that follows
it is classified on its own (an OOM or CUDA error there is fail-class).

A server that *exits* is not a log line: the soak engine reports it as a ``server_error``
finding (fail) with the exit code and the last output lines, and the run ends with exit 3.
"""

from __future__ import annotations

import re

__all__ = ["KINDS", "SEVERITY", "classify", "matched_text"]

# (kind, severity, pattern); order matters: the first match wins.
_RULES: list[tuple[str, str, re.Pattern[str]]] = [
    ("illegal_memory_access", "fail",
     re.compile(r"illegal memory access|cudaErrorIllegalAddress|illegal address was encountered", re.I)),
    ("out_of_memory", "fail",
     re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation"
                r"|std::bad_alloc|\bout of memory: killed process", re.I)),
    ("cuda_error", "fail",
     re.compile(r"\bCUDA error\b|\bCUDA_ERROR_[A-Z_]+|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+|\bNCCL error\b"
                r"|ncclInternalError|ncclUnhandledCudaError|device-side assert", re.I)),
    ("engine_dead", "fail",
     re.compile(r"EngineDeadError|EngineCore encountered a fatal error|engine ?core\b.*\bdied\b"
                r"|output_handler failed|\bworker\b.*\bdied\b|engine process failed"
                r"|Worker failed with error", re.I)),    # vLLM's multiproc executor: the root cause, quoted
    ("crash", "fail",
     re.compile(r"Segmentation fault|Fatal Python error|core dumped|GGML_ASSERT|"
                r"terminate called after throwing|\bSIG(SEGV|ABRT|BUS)\b", re.I)),
    ("preemption", "warn",
     re.compile(r"(?<![\w.])preempt(ed|ing|ion|ions)?(?![\w.=])", re.I)),
    ("traceback", "warn",
     re.compile(r"Traceback \(most recent call last\)")),
]

KINDS: tuple[str, ...] = tuple(kind for kind, _, _ in _RULES)
SEVERITY: dict[str, str] = {kind: severity for kind, severity, _ in _RULES}


def classify(line: str) -> tuple[str, str] | None:
    """``(kind, severity)`` for a server output line that means trouble, else ``None``."""
    hit = _match(line)
    return None if hit is None else (hit[0], hit[1])


def matched_text(line: str) -> str | None:
    """The part of the line that decided its class (for the evidence), or None."""
    hit = _match(line)
    return None if hit is None else hit[2]


def _match(line: str) -> tuple[str, str, str] | None:
    if not line or len(line) < 4 or line.lstrip().startswith(("# HELP ", "# TYPE ")):   # echoed metric docs
        return None
    for kind, severity, pattern in _RULES:
        found = pattern.search(line)
        if found:
            return kind, severity, found.group(0)
    return None
