"""Launch profiles (tui.core.server.profiles) and what a launch command says for the incident header
(tui.core.server.incident): validation with file:line:key errors, {port}/{python}/~ expansion, overlays."""

import hashlib
import os
import sys
from pathlib import Path

import pytest

from tui.core.config.errors import BadInput
from tui.core.server.incident import cache_reuse, command_facts, commit_from, quantization, speculative
from tui.core.server.profiles import DEFAULT_STARTUP_TIMEOUT, adhoc_plan, env_of_interest, load_profile, parse_profile

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as err:
        load_profile(path)
    return str(err.value).replace(str(path), "P")


def test_full_profile_and_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("LLAMA_API_KEY", "sekrit")
    monkeypatch.setenv("UNRELATED", "x")
    (tmp_path / "patches").mkdir()
    patch = tmp_path / "patches" / "fix.patch"
    patch.write_bytes(b"--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n")
    path = write(tmp_path, """
name = "spec-on"
description = "drafter on"
command = '''
serve ~/models/q --port {port}
  --speculative-config '{"method": "dflash", "model": "z/drafter", "num_speculative_tokens": 4}'
  --chat-template={profile_dir}/t.jinja --x=~/y
'''
startup_timeout = 30
overlays = ["patches/fix.patch"]
[env]
VLLM_USE_V1 = 1
HF_HOME = "~/hf"
FLAG = true
[facts]
quantization = "nvfp4 (compressed-tensors)"
""")
    profile = load_profile(path)
    assert profile.name == "spec-on" and profile.startup_timeout == 30.0
    assert profile.url == "http://127.0.0.1:{port}"          # the default with {port} in the command
    assert profile.env == {"VLLM_USE_V1": "1", "HF_HOME": "~/hf", "FLAG": "1"}
    assert profile.overlays[0].sha256 == hashlib.sha256(patch.read_bytes()).hexdigest()
    assert profile.overlays[0].path == "patches/fix.patch" and profile.overlays[0].resolved == str(patch)

    plan = profile.plan(port=4321)
    home = str(tmp_path / "home")
    assert plan.argv[:4] == ["serve", f"{home}/models/q", "--port", "4321"]
    assert plan.argv[5] == '{"method": "dflash", "model": "z/drafter", "num_speculative_tokens": 4}'
    assert f"--chat-template={tmp_path}/t.jinja" in plan.argv and f"--x={home}/y" in plan.argv
    assert plan.url == "http://127.0.0.1:4321"
    assert plan.env["HF_HOME"] == f"{home}/hf" and plan.env["UNRELATED"] == "x"
    # the profile's env table plus VLLM_* / CUDA_* / LLAMA_* of the server's environment; secrets redacted
    assert plan.env_of_interest == {"CUDA_VISIBLE_DEVICES": "0", "FLAG": "1", "HF_HOME": f"{home}/hf",
                                    "LLAMA_API_KEY": "<redacted>", "VLLM_LOGGING_LEVEL": "DEBUG",
                                    "VLLM_USE_V1": "1"}
    assert plan.profile["name"] == "spec-on" and plan.profile["sha256"] == profile.sha256
    assert plan.overlays == [{"path": "patches/fix.patch", "resolved": str(patch),
                              "sha256": profile.overlays[0].sha256, "bytes": patch.stat().st_size}]
    assert plan.engine is None and plan.startup_timeout == 30.0

    spec = speculative(plan.argv)
    assert spec == {"method": "dflash", "drafter": "z/drafter", "num_speculative_tokens": 4,
                    "flags": ["--speculative-config"]}


def test_free_port_and_python_placeholders(tmp_path):
    profile = load_profile(write(tmp_path, 'command = "{python} -m http.server {port}"\n'))
    assert profile.name == "p" and profile.startup_timeout == DEFAULT_STARTUP_TIMEOUT
    a, b = profile.plan(), profile.plan()
    assert a.argv[0] == sys.executable and a.argv[1:3] == ["-m", "http.server"]
    port = int(a.argv[3])
    assert 0 < port < 65536 and a.url == f"http://127.0.0.1:{port}"
    assert a.env["PYTHONUNBUFFERED"] == "1" or os.environ.get("PYTHONUNBUFFERED")
    assert b.argv[3].isdigit()


def test_example_profiles_load():
    for name in ("vllm-prefix-on", "vllm-prefix-off", "refserver-none", "refserver-zero-state"):
        profile = load_profile(ROOT / "scenarios" / "profiles" / f"{name}.toml")
        assert profile.name == name and "{port}" in profile.command
    from tui.embedded import placeholders          # {chat_template}: the embedded Gemma chat template

    on = load_profile(ROOT / "scenarios" / "profiles" / "vllm-prefix-on.toml").plan(port=1, placeholders=placeholders())
    off = load_profile(ROOT / "scenarios" / "profiles" / "vllm-prefix-off.toml").plan(port=1,
                                                                                      placeholders=placeholders())
    assert [a for a in on.argv if "prefix-caching" in a] == ["--enable-prefix-caching"]
    assert [a for a in off.argv if "prefix-caching" in a] == ["--no-enable-prefix-caching"]
    assert cache_reuse(on.argv) == {"forced_off": False, "decided_by": "--enable-prefix-caching"}
    assert cache_reuse(off.argv) == {"forced_off": True, "decided_by": "--no-enable-prefix-caching"}
    assert not any("~" in a for a in on.argv) and on.engine == "vllm"
    assert Path(on.argv[on.argv.index("--chat-template") + 1]).resolve() == \
        (ROOT / "tui" / "embedded" / "gemma_chat.jinja").resolve()


@pytest.mark.parametrize("text, expected", [
    ('command = "x --port {port}"\nport = 3\n', "P:2: port: unknown key (known: name, description, command, url, "
                                                "env, startup_timeout, overlays, facts, replicas, router_metrics)"),
    ('command = "x {port}"\n\n[envv]\nA = "1"\n', "P:3: envv: unknown key"),
    ('command = "x {port}"\nstartup_timeout = "10"\n', "P:2: startup_timeout: must be a number of seconds, got str '10'"),
    ('command = "x {port}"\nstartup_timeout = 0\n', "P:2: startup_timeout: must be more than 0 seconds, got 0"),
    ('command = "x {port}"\n[env]\nGOOD = "1"\nBAD = [1, 2]\n', "P:4: env.BAD: must be a string, number or boolean"),
    ('command = "x {port}"\n[env]\n"1BAD" = "x"\n', "P:3: env.1BAD: not a valid environment variable name"),
    ('command = "x {port}"\noverlays = ["nope.patch"]\n', "P:2: overlays: overlay 'nope.patch' not found"),
    ('command = "x {port}"\noverlays = "a.patch"\n', "P:2: overlays: must be a list of patch file paths"),
    ('name = "bad name"\ncommand = "x {port}"\n', "P:1: name: must be a short name"),
    ('url = "http://127.0.0.1:8000"\n', "P: command: missing"),
    ('command = "x --port 8000"\n', "P: url: missing (give url, or use {port} in the command"),
    ('command = "x"\nurl = "127.0.0.1:8000"\n', "P:2: url: must be an http(s) URL"),
    ('command = "x {prot}"\nurl = "http://h:1"\n', "P:1: command: unknown placeholder {prot}"),
    ('command = "x \'unclosed"\nurl = "http://h:1"\n', "P:1: command: cannot be split like a shell line"),
    ('command = ""\nurl = "http://h:1"\n', "P:1: command: must be a non-empty string"),
    ('command = "x {port}"\nfacts = 3\n', "P:2: facts: must be a table"),
    ('command = "x {port}\n', "P:1: invalid TOML"),
])
def test_errors_name_file_line_and_key(tmp_path, text, expected):
    assert error(tmp_path, text).startswith(expected)


def test_missing_file_and_list_command(tmp_path):
    with pytest.raises(BadInput, match="profile file not found"):
        load_profile(tmp_path / "absent.toml")
    profile = parse_profile('command = ["a b", "--port", "{port}"]\n', "x.toml")
    assert profile.plan(port=9).argv == ["a b", "--port", "9"]


def test_adhoc_plan():
    plan = adhoc_plan("{python} -m tui.refserver --port {port}", None, 5)
    assert plan.argv[0] == sys.executable and plan.startup_timeout == 5.0 and plan.profile is None
    assert plan.url == f"http://127.0.0.1:{plan.argv[-1]}"
    plan = adhoc_plan("llama-server -m m.gguf --port 8080", "http://127.0.0.1:8080")
    assert plan.url == "http://127.0.0.1:8080" and plan.engine == "llamacpp"
    with pytest.raises(BadInput, match="--launch needs --url"):
        adhoc_plan("llama-server --port 8080", None)
    with pytest.raises(BadInput, match="the command is empty"):
        adhoc_plan("  ", "http://x:1")


# --- what the command line says --------------------------------------------------------------------

@pytest.mark.parametrize("argv, forced_off, decided_by", [
    (["vllm", "serve", "m"], False, "engine default"),
    (["vllm", "serve", "m", "--no-enable-prefix-caching"], True, "--no-enable-prefix-caching"),
    (["vllm", "serve", "m", "--no-enable-prefix-caching", "--enable-prefix-caching"], False, "--enable-prefix-caching"),
    (["vllm", "serve", "m", "--enable-prefix-caching=false"], True, "--enable-prefix-caching=false"),
    (["python", "-m", "sglang.launch_server", "--disable-radix-cache"], True, "--disable-radix-cache"),
    (["llama-server", "-m", "x.gguf", "--no-cache-prompt"], True, "--no-cache-prompt"),
    (["llama-server", "-m", "x.gguf", "--cache-reuse", "0"], False, "engine default"),   # KV shifting only
    (["llama-server", "-m", "x.gguf", "--cache-ram", "0"], False, "engine default"),
])
def test_cache_reuse(argv, forced_off, decided_by):
    assert cache_reuse(argv) == {"forced_off": forced_off, "decided_by": decided_by}


def test_cache_reuse_from_llama_env():
    assert cache_reuse(["llama-server"], {"LLAMA_ARG_CACHE_PROMPT": "0"}) == \
        {"forced_off": True, "decided_by": "LLAMA_ARG_CACHE_PROMPT=0"}


@pytest.mark.parametrize("argv, method, drafter, tokens", [
    (["vllm", "serve", "m"], "none", "none", 0),
    (["vllm", "serve", "m", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'],
     "mtp", "none (mtp needs no separate model)", 2),
    (["vllm", "serve", "m", '--speculative-config={"method":"dspark","model":"d/x","num_speculative_tokens":5}'],
     "dspark", "d/x", 5),
    (["vllm", "serve", "m", "--speculative-config.method", "eagle3", "--speculative-config.model", "e/y",
      "--speculative-config.num_speculative_tokens", "3"], "eagle3", "e/y", 3),
    (["vllm", "serve", "m", "--speculative-model", "small", "--num-speculative-tokens", "4"], "draft model", "small", 4),
    (["llama-server", "-m", "big.gguf", "-md", "small.gguf", "--spec-draft-n-max", "8"], "draft model", "small.gguf", 8),
    (["llama-server", "-m", "big.gguf", "--spec-type", "ngram-mod"], "ngram-mod",
     "none (ngram-mod needs no separate model)", "unknown"),
    (["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE",
      "--speculative-draft-model-path", "e/d", "--speculative-num-draft-tokens", "6"], "EAGLE", "e/d", 6),
    (["x", "--num-speculative-tokens", "2"], "unknown", "unknown", 2),
])
def test_speculative(argv, method, drafter, tokens):
    got = speculative(argv)
    assert (got["method"], got["drafter"], got["num_speculative_tokens"]) == (method, drafter, tokens)


def test_command_facts_skip_the_interpreter_and_read_model_flags(tmp_path):
    facts = command_facts(["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                           "--dtype", "float32", "--block-size", "32", "--mamba-cache-mode", "align",
                           "--quantization", "fp8", "--served-model-name", "g"])
    assert facts["model_arg"] == "/m" and facts["dtype"] == "float32" and facts["quantization_flag"] == "fp8"
    assert facts["block_size_flag"] == "32" and facts["mamba_cache_mode_flag"] == "align"
    assert facts["served_model_name"] == "g"
    assert command_facts(["python3", "-m", "some.server", "--port", "1"])["model_arg"] is None
    assert command_facts(["vllm", "serve", "org/model", "--port", "1"])["model_arg"] == "org/model"


def test_quantization_sources(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"quantization_config": {"quant_method": "compressed-tensors", '
                                       '"format": "nvfp4-pack-quantized"}}')
    assert quantization({"quantization": "stated"}, {}, None) == ("stated", "profile facts")
    assert quantization({}, {"quantization_flag": "awq"}, None) == ("awq", "--quantization flag")
    assert quantization({}, {"model_arg": str(model)}, None)[0] == "compressed-tensors nvfp4-pack-quantized"
    assert quantization({}, {"model_arg": "/x/gemma-3-270m-Q4_K_M.gguf"}, None) == ("gguf q4_k_m", "model file name")
    (model / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert quantization({}, {"dtype": "float32"}, str(model))[0] == "none (bfloat16 checkpoint, served as float32)"
    assert quantization({}, {}, None) == ("unknown", "none")


def test_commit_from():
    assert commit_from("0.11.1rc2.dev15+g1a2b3c4d5") == ("1a2b3c4d5", "version string")
    assert commit_from(None, None, "b6123-abc1234") == ("abc1234", "build info")
    # vLLM's system_fingerprint ends in a config hash, not a commit
    assert commit_from("0.32.0", "vllm-0.32.0-47bfb1ab") == ("unknown", "not reported by the server")


def test_env_of_interest_redacts():
    assert env_of_interest({"HF_TOKEN": "t", "A": "1"}, {"VLLM_API_KEY": "k", "CUDA_HOME": "/c", "PATH": "/bin"}) == \
        {"A": "1", "CUDA_HOME": "/c", "HF_TOKEN": "<redacted>", "VLLM_API_KEY": "<redacted>"}
