"""Launch profiles: how to start one server configuration, as a TOML file.

    name = "vllm-prefix-on"                 # default: the file name without .toml
    description = "..."                     # optional
    command = "vllm serve ~/models/x --port {port} --enable-prefix-caching"
    url = "http://127.0.0.1:{port}"         # default: http://127.0.0.1:{port} when the command has {port}
    startup_timeout = 600                   # seconds until /health and /v1/models answer (default 600)
    overlays = ["patches/fix.patch"]        # patch files applied to the server (recorded, not applied)
    [env]                                   # added to hitproof's environment for the server
    VLLM_CPU_KVCACHE_SPACE = "2"
    [facts]                                 # free-form facts for the incident header
    quantization = "nvfp4"

``{port}`` in command and url becomes a port that was free a moment before the launch (a matrix
never collides), ``{python}`` the interpreter running hitproof, ``{profile_dir}`` the folder of
the profile file; ``{llama_server}``, ``{models}`` and ``{chat_template}`` (the embedded Gemma chat
template, package data of every install) come from the embedded engines. ``~`` at the start of a word of
the command (or after ``=`` in ``--flag=~/x`` or ``name=~/x``) and in env values is the home directory. Overlay
paths are relative to the profile file; each must exist and its sha256 goes in the run header.
Errors name file, line and key, like scenario errors.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config.errors import BadInput
from ..config import builtin, toml
from .profile_replicas import (ROUTER_PLACEHOLDERS, ReplicaSpec, check_router_metrics, check_router_placeholders,
                               parse_replicas)

__all__ = ["DEFAULT_STARTUP_TIMEOUT", "LaunchPlan", "Profile", "adhoc_plan", "env_of_interest", "load_profile",
           "parse_profile", "resolve_profile_path"]

DEFAULT_STARTUP_TIMEOUT = 600.0   # long enough for a first model load
# placeholders whose values come from the embedded engines (tui.embedded), handed in by the caller
EMBEDDED_PLACEHOLDERS = ("llama_server", "models", "chat_template", "router_python")
Placeholders = Mapping[str, Callable[[], str]]
_KEYS = ("name", "description", "command", "url", "env", "startup_timeout", "overlays", "facts", "replicas",
         "router_metrics")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_INTERESTING_ENV = re.compile(r"^(VLLM_|CUDA_|LLAMA_|SGLANG_|NCCL_|PYTORCH_CUDA_|TORCH_CUDA_)")
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)


@dataclass(frozen=True)
class Overlay:
    path: str        # as written in the profile
    resolved: str    # absolute
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Profile:
    name: str
    command: str
    url: str
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    overlays: tuple[Overlay, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str = "<profile>"
    text: str = ""
    base: str = "."                  # the profile file's folder: overlays and {profile_dir}
    replicas: ReplicaSpec | None = None   # [replicas]: servers started before the command (a router)
    router_metrics: str | None = None     # the router's own metrics URL (its per-worker counters)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def plan(self, port: int | None = None, placeholders: Placeholders | None = None) -> "LaunchPlan":
        """The concrete launch: {port} filled (a free port if none given), ~ expanded, env merged.
        `placeholders` give the values of {llama_server}, {models} and {chat_template} (the embedded engines know
        them; the core does not), each called only if the profile uses it."""
        from .launch import free_port
        if port is None and ("{port}" in self.command or "{port}" in self.url):
            port = free_port()
        extra: dict[str, str] = {}
        replicas: list[LaunchPlan] = []
        slot_dir = None
        if self.replicas is not None:
            if "{slot_dir}" in self.command + self.replicas.command:
                import tempfile
                slot_dir = tempfile.mkdtemp(prefix="hitproof-slots-")
            taken = {port}
            for index in range(self.replicas.count):
                replicas.append(self._replica_plan(index, taken, slot_dir, placeholders))
            extra = {"replica_urls": " ".join(shlex.quote(r.url) for r in replicas),
                     "metrics_port": str(_another_port(taken)), "slot_dir": shlex.quote(slot_dir or "")}
        fill = lambda text, shell=False: _fill(text, port, self.base, shell, placeholders or {},   # noqa: E731
                                               extra if shell else {k: v.strip("'") for k, v in extra.items()})
        command = fill(self.command, True)
        try:
            argv = [_expand(word) for word in shlex.split(command)]
        except ValueError as exc:     # validated at load; a {python} path with a quote could still break it
            raise BadInput(f"{self.source}: command: {exc}") from None
        env_add = {k: os.path.expanduser(fill(v)) for k, v in self.env.items()}
        return LaunchPlan(
            argv=argv, url=fill(self.url).rstrip("/"), env=_child_env(env_add),
            env_of_interest=env_of_interest(env_add, _child_env(env_add)),
            startup_timeout=self.startup_timeout, engine=_engine_guess(argv), facts=dict(self.facts),
            profile={"name": self.name, "source": self.source, "sha256": self.sha256,
                     "description": self.description},
            overlays=[{"path": o.path, "resolved": o.resolved, "sha256": o.sha256, "bytes": o.bytes}
                      for o in self.overlays],
            replicas=replicas, router_metrics=fill(self.router_metrics) if self.router_metrics else None,
            slot_dir=slot_dir)

    def _replica_plan(self, index: int, taken: set, slot_dir: str | None,
                      placeholders: Placeholders | None) -> "LaunchPlan":
        spec = self.replicas
        assert spec is not None
        port = _another_port(taken)
        extra = {"index": str(index), "slot_dir": shlex.quote(slot_dir or "")}
        command = _fill(spec.command, port, self.base, True, placeholders or {}, extra)
        try:
            argv = [_expand(word) for word in shlex.split(command)]
        except ValueError as exc:
            raise BadInput(f"{self.source}: replicas.command: {exc}") from None
        env_add = {k: os.path.expanduser(_fill(v, port, self.base, False, placeholders or {},
                                                {"index": str(index)})) for k, v in {**self.env, **spec.env}.items()}
        url = _fill(spec.url, port, self.base, False, placeholders or {}, {"index": str(index)}).rstrip("/")
        return LaunchPlan(argv=argv, url=url, env=_child_env(env_add),
                          env_of_interest=env_of_interest(env_add, _child_env(env_add)),
                          startup_timeout=spec.startup_timeout, engine=_engine_guess(argv),
                          facts={"replica": index})


@dataclass
class LaunchPlan:
    """Everything needed to start one server and to describe it in the incident header."""

    argv: list[str]
    url: str
    env: dict[str, str] | None                # the child's full environment (None: hitproof's own)
    env_of_interest: dict[str, str]           # what goes in the header
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    engine: str | None = None                 # vllm | llamacpp | sglang | None (a guess from the command)
    facts: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] | None = None     # name, source, sha256, description
    overlays: list[dict[str, Any]] = field(default_factory=list)
    # Several servers behind a router (this plan's command): each replica's own plan, started first;
    # the router's metrics URL; the folder the replicas save llama.cpp slots in (hitproof's, per run).
    replicas: list["LaunchPlan"] = field(default_factory=list)
    router_metrics: str | None = None
    slot_dir: str | None = None

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


# --- loading -----------------------------------------------------------------------------------

def resolve_profile_path(name_or_path: str) -> Path:
    """A path, or a bare name looked up in ./scenarios/profiles and hitproof's own profiles."""
    return builtin.find(name_or_path, "profiles")


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    text = toml.read_text(path, "profile")
    return parse_profile(text, str(path), base=path.resolve().parent, default_name=path.stem)


def parse_profile(text: str, source: str = "<profile>", *, base: Path | None = None,
                  default_name: str = "profile") -> Profile:
    data = toml.parse(text, source)
    base = base or Path.cwd()

    def fail(key: str, message: str, section: str = "") -> BadInput:
        return toml.located(text, source, section, key, message)

    for key in data:
        if key not in _KEYS:
            raise fail(key, f"unknown key (known: {', '.join(_KEYS)})")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not _NAME.match(name):
        raise fail("name", "must be a short name of letters, digits, '.', '_' or '-' (it names the log file)")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    command = _command(data, source, fail)
    facts = data.get("facts", {})
    if not isinstance(facts, dict):
        raise fail("facts", "must be a table [facts]")
    in_table = lambda key, message, section="replicas": fail(key, message, section)   # noqa: E731
    replicas = parse_replicas(data, fail, lambda t: _command(t, f"{source}: replicas", in_table),
                              lambda t, extra: _url(t, t["command"], f"{source}: replicas", in_table, extra),
                              lambda t: _startup_timeout(t, in_table), lambda t: _env(t, in_table))
    check_router_placeholders(command, replicas, fail)
    return Profile(name=name, command=command, url=_url(data, command, source, fail, ROUTER_PLACEHOLDERS),
                   env=_env(data, fail), startup_timeout=_startup_timeout(data, fail),
                   overlays=_overlays(data, base, fail), facts=dict(facts), description=description, source=source,
                   text=text, base=str(base), replicas=replicas, router_metrics=check_router_metrics(data, fail))


def _command(data: dict, source: str, fail) -> str:
    if "command" not in data:
        raise BadInput(f"{source}: command: missing (the server command line to start)")
    command = data["command"]
    if isinstance(command, list):
        if not command or not all(isinstance(w, str) for w in command):
            raise fail("command", "must be a string or a non-empty list of strings")
        command = shlex.join(command)
    if not isinstance(command, str) or not command.strip():
        raise fail("command", "must be a non-empty string")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise fail("command", f"cannot be split like a shell line: {exc}") from None
    if not words:
        raise fail("command", "must be a non-empty string")
    return command


def _url(data: dict, command: str, source: str, fail, extra: tuple[str, ...] = ()) -> str:
    url = data.get("url")
    if url is None:
        if "{port}" not in command:
            raise BadInput(f"{source}: url: missing (give url, or use {{port}} in the command so that "
                           "hitproof picks the port and the url)")
        url = "http://127.0.0.1:{port}"
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        raise fail("url", f"must be an http(s) URL such as http://127.0.0.1:{{port}}, got {url!r}")
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    in_command = re.findall(r"\{([A-Za-z_]\w*)\}", command)
    for placeholder in re.findall(r"\{([A-Za-z_]\w*)\}", command + " " + url):
        if placeholder not in ("port", "python", "profile_dir", *EMBEDDED_PLACEHOLDERS, *extra):
            known = ", ".join("{" + k + "}" for k in ("port", "python", "profile_dir", *EMBEDDED_PLACEHOLDERS, *extra))
            raise fail("command" if placeholder in in_command else "url",
                       f"unknown placeholder {{{placeholder}}} (known: {known})")
    return url


def _env(data: dict, fail) -> dict[str, str]:
    env = data.get("env", {})
    if not isinstance(env, dict):
        raise fail("env", "must be a table [env] of NAME = \"value\"")
    clean: dict[str, str] = {}
    for key, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise fail(key, "not a valid environment variable name", "env")
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (int, float)):
            value = str(value)
        if not isinstance(value, str):
            raise fail(key, f"must be a string, number or boolean, got {type(value).__name__}", "env")
        clean[key] = value
    return clean


def _startup_timeout(data: dict, fail) -> float:
    timeout = data.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise fail("startup_timeout", f"must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if timeout <= 0:
        raise fail("startup_timeout", f"must be more than 0 seconds, got {timeout}")
    return float(timeout)


def _overlays(data: dict, base: Path, fail) -> tuple[Overlay, ...]:
    overlays_in = data.get("overlays", [])
    if not isinstance(overlays_in, list) or not all(isinstance(p, str) and p for p in overlays_in):
        raise fail("overlays", "must be a list of patch file paths (relative to the profile file)")
    overlays = []
    for item in overlays_in:
        path = Path(os.path.expanduser(item))
        path = path if path.is_absolute() else base / path
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            raise fail("overlays", f"overlay {item!r} not found (looked for {path})") from None
        except OSError as exc:
            raise fail("overlays", f"cannot read overlay {item!r}: {exc.strerror or exc}") from None
        overlays.append(Overlay(item, str(path.resolve()), hashlib.sha256(content).hexdigest(), len(content)))
    return tuple(overlays)


def adhoc_plan(command: str, url: str | None, startup_timeout: float | None = None) -> LaunchPlan:
    """`hitproof run --launch COMMAND --url URL`: a profile without a file."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise BadInput(f"--launch: cannot split the command like a shell line: {exc}") from None
    if not words:
        raise BadInput("--launch: the command is empty")
    if url is None and "{port}" not in command:
        raise BadInput("--launch needs --url URL (or {port} in the command, and hitproof picks a free port)")
    text = f"# --launch\ncommand = {_toml_str(command)}\n" + (f"url = {_toml_str(url)}\n" if url else "") \
        + (f"startup_timeout = {float(startup_timeout)}\n" if startup_timeout is not None else "")
    profile = parse_profile(text, "--launch", base=Path.cwd(), default_name="launch")
    plan = profile.plan()
    plan.profile = None
    return plan


# --- helpers -------------------------------------------------------------------------------------

def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _fill(text: str, port: int | None, base: str, shell: bool, placeholders: Placeholders,
          extra: Mapping[str, str] | None = None) -> str:
    q = shlex.quote if shell else str
    text = text.replace("{python}", q(sys.executable)).replace("{profile_dir}", q(base))
    for name, value in (extra or {}).items():       # already quoted for the shell where they need it
        text = text.replace("{" + name + "}", value)
    for name in EMBEDDED_PLACEHOLDERS:
        if "{" + name + "}" in text:
            provide = placeholders.get(name)
            if provide is None:
                raise BadInput(f"{{{name}}}: this command needs the embedded engines' {name.replace('_', '-')}, "
                               f"which only `hitproof run --profile` and `hitproof matrix` provide")
            text = text.replace("{" + name + "}", q(provide()))
    return text.replace("{port}", str(port)) if port is not None else text


def _another_port(taken: set) -> int:
    from .launch import free_port
    while True:
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port


def _expand(word: str) -> str:
    if word.startswith("~"):
        return os.path.expanduser(word)
    if "=~" in word:        # --flag=~/x, and NAME=~/x (vLLM's --lora-modules a=~/adapter)
        flag, _, value = word.partition("=")
        return f"{flag}={os.path.expanduser(value)}"
    return word


def _child_env(add: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")   # a Python server's output arrives as it is written
    env.update(add)
    return env


def env_of_interest(profile_env: dict[str, str], child_env: dict[str, str] | None) -> dict[str, str]:
    """The profile's env table plus every VLLM_* / CUDA_* / LLAMA_* (and SGLANG_, NCCL_, PYTORCH_CUDA_)
    variable the server will see. Values of names that look secret are redacted."""
    chosen = dict(profile_env)
    for key, value in (child_env or {}).items():
        if _INTERESTING_ENV.match(key):
            chosen.setdefault(key, value)
    return {k: ("<redacted>" if _SECRET_ENV.search(k) else v) for k, v in sorted(chosen.items())}


def _engine_guess(argv: list[str]) -> str | None:
    words = [Path(w).name for w in argv[:4]] + argv[:4]
    joined = " ".join(words)
    if "llama-server" in joined:
        return "llamacpp"
    if "sglang" in joined:
        return "sglang"
    if "vllm" in joined:
        return "vllm"
    return None
