"""What a server's launch command says about it, read from its flags (pure): speculative decoding
(method, drafter, token count), whether cache reuse was forced off and by which flag, the model
argument, dtypes, and the quantization and commit where flags, file names or version strings tell.
Nothing here raises: a fact that cannot be found is "unknown"."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"


# --- the command line ------------------------------------------------------------------------

def _options(argv: list[str]) -> list[tuple[int, str, str | None]]:
    """(index, flag, value) for every word that starts with '-': `--x=v`, or `--x v` when the next
    word is not itself a flag (a heuristic: we do not know each server's flags)."""
    out = []
    for i, word in enumerate(argv):
        if not word.startswith("-") or word in ("-", "--"):
            continue
        if word.startswith("--") and "=" in word:
            flag, _, value = word.partition("=")
            out.append((i, flag, value))
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        value = nxt if nxt is not None and (not nxt.startswith("-") or re.match(r"^-\d", nxt)) else None
        out.append((i, word, value))
    return out


def _last(opts: list[tuple[int, str, str | None]], *names: str) -> tuple[str, str | None] | None:
    found = None
    for _, flag, value in opts:
        if flag in names:
            found = (flag, value)
    return found


def speculative(argv: list[str]) -> dict[str, Any]:
    """Drafter, method and speculative token count from the flags; "none" when there is no drafter.

    vLLM: --speculative-config JSON (method, model, num_speculative_tokens) or its dotted form
    (--speculative-config.method ...), older --speculative-model / --num-speculative-tokens;
    llama.cpp: --spec-type, -md/--model-draft/--spec-draft-model, --spec-draft-n-max;
    SGLang: --speculative-algorithm, --speculative-draft-model-path, --speculative-num-draft-tokens.
    """
    opts = _options(argv)
    method = drafter = tokens = None
    flags: list[str] = []
    found = _last(opts, "--speculative-config", "-sc")
    if found and found[1]:
        flags.append(found[0])
        try:
            config = json.loads(found[1])
        except ValueError:
            config = None
        if isinstance(config, dict):
            method, drafter, tokens = config.get("method"), config.get("model"), config.get("num_speculative_tokens")
        else:
            method = f"unparsed: {found[1][:80]}"
    for _, flag, value in opts:
        if flag.startswith("--speculative-config."):
            flags.append(flag)
            key = flag.split(".", 1)[1].replace("-", "_")
            if key == "method":
                method = value
            elif key == "model":
                drafter = value
            elif key == "num_speculative_tokens":
                tokens = value
    for names, slot in ((("--speculative-model", "--speculative-draft-model-path", "-md", "--model-draft",
                          "--spec-draft-model"), "drafter"),
                        (("--speculative-method", "--speculative-algorithm", "--spec-type"), "method"),
                        (("--num-speculative-tokens", "--speculative-num-draft-tokens", "--spec-draft-n-max",
                          "--draft-max", "--draft-n", "--draft"), "tokens")):
        hit = _last(opts, *names)
        if hit and hit[1] is not None:
            flags.append(hit[0])
            if slot == "drafter":
                drafter = hit[1]
            elif slot == "method":
                method = hit[1]
            else:
                tokens = hit[1]
    if method in ("none", "") and drafter is None:
        method = None
    try:
        tokens = int(tokens) if tokens is not None else None
    except (TypeError, ValueError):
        pass
    if method is None and drafter is None and not tokens:
        return {"method": "none", "drafter": "none", "num_speculative_tokens": 0, "flags": flags}
    if method is None:
        method = "draft model" if drafter else UNKNOWN
    if drafter is None:
        drafter = f"none ({method} needs no separate model)" if str(method).lower() in _SELF_DRAFTING else UNKNOWN
    return {"method": str(method), "drafter": str(drafter),
            "num_speculative_tokens": tokens if tokens is not None else UNKNOWN, "flags": flags}


_SELF_DRAFTING = {"mtp", "ngram", "ngram-simple", "ngram-mod", "ngram-cache", "ngram-map-k", "ngram-map-k4v",
                  "draft-mtp", "suffix", "deepseek_mtp", "qwen3_next_mtp"}

_OFF = {"--no-enable-prefix-caching": "vLLM", "--disable-radix-cache": "SGLang", "--no-cache-prompt": "llama.cpp",
        "--disable-prefix-caching": "", "--no-prefix-caching": ""}
_ON = {"--enable-prefix-caching", "--cache-prompt"}


def cache_reuse(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether the launch command forces prefix-cache reuse off, and the flag that decided it.

    The last of --enable-prefix-caching / --no-enable-prefix-caching (vLLM), --cache-prompt /
    --no-cache-prompt (llama.cpp, also LLAMA_ARG_CACHE_PROMPT=0 in the environment),
    --disable-radix-cache (SGLang) wins; `--enable-prefix-caching=false` counts as off. Not
    counted: llama.cpp's --cache-reuse 0 (its default; it turns off KV *shifting*, prompts still
    reuse their common prefix) and --cache-ram 0 (the host-memory cache; the slot's own prefix
    is still reused). Per-request salts (cache_salt, cache_prompt=false) are the scenario's
    business, not the server's. Best-effort: without any such flag, the engine default applies
    (on for vLLM V1, SGLang and llama-server), and forced_off is False.
    """
    decided: tuple[int, bool, str] | None = None
    for index, flag, value in _options(argv):
        off = None
        if flag in _OFF:
            off = True
        elif flag in _ON:
            off = bool(value is not None and "=" in argv[index] and value.lower() in ("0", "false", "no", "off"))
        if off is not None:
            decided = (index, off, argv[index])
    if decided is not None:
        return {"forced_off": decided[1], "decided_by": decided[2]}
    value = (env or {}).get("LLAMA_ARG_CACHE_PROMPT")
    if value is not None and value.strip().lower() in ("0", "false", "no", "off", "disabled"):
        return {"forced_off": True, "decided_by": f"LLAMA_ARG_CACHE_PROMPT={value}"}
    return {"forced_off": False, "decided_by": "engine default" if argv else None}


def server_args(argv: list[str]) -> list[str]:
    """The server's own arguments: without the program, and without `python [opts] -m module`
    (whose -m is the interpreter's, not llama.cpp's model flag)."""
    if argv and Path(argv[0]).name.startswith("python") and "-m" in argv[1:]:
        return argv[argv.index("-m", 1) + 2:]
    return argv[1:]


def command_facts(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the launch command line says about the incident (pure)."""
    argv = [argv[0], *server_args(argv)] if argv else []
    opts = _options(argv)
    value = lambda *names: (lambda hit: hit[1] if hit else None)(_last(opts, *names))   # noqa: E731
    model = value("--model", "-m", "--model-path")
    if model is None and "serve" in argv:            # `vllm serve MODEL ...`
        after = argv.index("serve") + 1
        if after < len(argv) and not argv[after].startswith("-"):
            model = argv[after]
    return {
        "model_arg": model,
        "served_model_name": value("--served-model-name", "--alias", "-a"),
        "quantization_flag": value("--quantization", "-q"),
        "dtype": value("--dtype"),
        "kv_cache_dtype": value("--kv-cache-dtype", "--cache-type-k", "-ctk"),
        "block_size_flag": value("--block-size"),
        "mamba_cache_mode_flag": value("--mamba-cache-mode"),
        "mamba_block_size_flag": value("--mamba-block-size"),
        "speculative": speculative(argv),
        "cache_reuse": cache_reuse(argv, env),
    }


_GGUF_QUANT = re.compile(r"[-_.]((?:I?Q\d+(?:_[A-Z0-9]+)*)|F16|BF16|F32)\.gguf$", re.I)


def quantization(facts: dict[str, Any], flags: dict[str, Any], model_root: str | None) -> tuple[str, str]:
    """(quantization, where it came from): profile/engine facts, --quantization, the model folder's
    config.json quantization_config, a GGUF file name, else the dtype."""
    if facts.get("quantization"):
        return str(facts["quantization"]), "profile facts"
    if flags.get("quantization_flag"):
        return str(flags["quantization_flag"]), "--quantization flag"
    for candidate in (flags.get("model_arg"), model_root):
        if not candidate:
            continue
        path = Path(os.path.expanduser(candidate))
        match = _GGUF_QUANT.search(path.name)
        if match:
            return f"gguf {match.group(1).lower()}", "model file name"
        config = path / "config.json"
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        q = data.get("quantization_config")
        if isinstance(q, dict):
            parts = [str(q.get("quant_method") or "")]
            fmt, groups = q.get("format"), q.get("config_groups")
            if not fmt and isinstance(groups, dict):
                fmt = next((g["format"] for g in groups.values() if isinstance(g, dict) and g.get("format")), None)
            if fmt:
                parts.append(str(fmt))
            return " ".join(p for p in parts if p) or "quantized", f"{config}"
        dtype = data.get("torch_dtype") or data.get("dtype")
        served = flags.get("dtype")
        return (f"none ({dtype} checkpoint" + (f", served as {served})" if served else ")")), f"{config}"
    if flags.get("dtype"):
        return f"none (--dtype {flags['dtype']})", "--dtype flag"
    return UNKNOWN, "none"


def commit_from(version: str | None, fingerprint: str | None = None, build_info: str | None = None) -> tuple[str, str]:
    """(commit, source): a '+g<sha>' in a dev version, a llama.cpp build 'b1234-<sha>', else unknown.

    vLLM's system_fingerprint ('vllm-0.32.0-47bfb1ab') ends in an 8-hex *config* hash
    (vllm_config.compute_hash(): model, quantization, speculative, attention backend), not a git
    commit; it is recorded as is, and it is a good "same config?" check across runs.
    """
    for text in (version, build_info):
        if not text:
            continue
        match = re.search(r"\+g([0-9a-f]{7,40})", text) or re.search(r"\bb\d+-([0-9a-f]{7,40})\b", text) \
            or re.search(r"commit ([0-9a-f]{7,40})", text)
        if match:
            return match.group(1), ("version string" if text is version else "build info")
    return UNKNOWN, "not reported by the server"


def python_package_commit(argv: list[str]) -> str | None:
    """For `python -m vllm...` or a `vllm` console script: vllm/_version.py's commit id, read without
    importing vllm (a fraction of a second). None when not applicable or not recorded."""
    if not argv:
        return None
    python = None
    name = Path(argv[0]).name
    if name.startswith("python") and "-m" in argv and any(w.startswith("vllm") for w in argv[1:4]):
        python = argv[0]
    elif name == "vllm":
        try:
            first = Path(argv[0] if os.sep in argv[0] else _which(argv[0]) or "").read_text(errors="replace") \
                .splitlines()[0]
        except (OSError, IndexError):
            return None
        python = first[2:].strip() if first.startswith("#!") else None
    if not python:
        return None
    code = ("import importlib.util,re,pathlib;s=importlib.util.find_spec('vllm');"
            "p=pathlib.Path(s.origin).parent/'_version.py';t=p.read_text() if p.exists() else '';"
            "m=re.search(r\"commit_id\\s*=\\s*['\\\"]([^'\\\"]+)\", t);print(m.group(1) if m else '')")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=20,
                             env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")})
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit or None


def _which(name: str) -> str | None:
    import shutil
    return shutil.which(name)
