"""launch_spec's keyword options (lora, drafter, small_cache, extra_args) build the commands the
real-server tiers run (tests/real/test_real_lora.py, test_real_drafter.py); defaults stay unchanged."""

import json

import pytest

from tui.embedded import llamacpp as llamacpp_mod

from tui import embedded as engines
from tui.embedded import lora_adapters


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    hf = tmp_path / "models" / "gemma3-270m-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    gguf = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "info.json").write_text(json.dumps(
        {"engine_version": "0.32.0", "gemma3-270m": {"model_path": str(hf), "gguf": str(gguf)}}))
    (tmp_path / "llamacpp").mkdir()
    (tmp_path / "llamacpp" / "info.json").write_text(json.dumps(
        {"binary": "/bin/true", "engine_version": "x", "gemma3-270m": {"gguf": str(gguf)}}))
    return tmp_path


def _make_adapters(cache):
    info = {}
    for name in ("a", "b"):
        lora_adapters.peft_dir(name).mkdir(parents=True)
        (lora_adapters.peft_dir(name) / "adapter_model.safetensors").write_bytes(b"x")
        lora_adapters.gguf_path(name).write_bytes(b"GGUF")
        info[name] = {"gguf": str(lora_adapters.gguf_path(name)), "seed": lora_adapters.SEEDS[name]}
    (cache / "lora").mkdir()
    (cache / "lora" / "info.json").write_text(json.dumps({"peft": "0.21.2", **info}))


def test_defaults_are_unchanged_but_llamacpp_never_repacks(cache):
    v = engines.launch_spec("vllm", port=8001)
    assert "--enable-lora" not in v.argv and "--speculative-config" not in v.argv
    assert v.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and v.argv[v.argv.index("--max-model-len") + 1] == "16384"
    ll = engines.launch_spec("llamacpp", port=8002)
    # the AMX kernels of the native build fault in an AMX VM; elsewhere nothing to turn off (machines differ)
    assert ("--no-repack" in ll.argv) == llamacpp_mod.cpu_has_amx()
    assert not {"-md", "--lora-scaled", "--cache-ram"} & set(ll.argv)


def test_lora_without_adapters_is_one_clear_line(cache):
    for engine in ("vllm", "llamacpp"):
        with pytest.raises(engines.SetupError, match=r"LoRA adapters are not made yet .*prepare\(engine, lora=True\)"):
            engines.launch_spec(engine, port=8003, lora=True)


def test_lora_options(cache):
    _make_adapters(cache)
    v = engines.launch_spec("vllm", port=8004, lora=True)
    i = v.argv.index("--lora-modules")
    assert v.argv[i + 1:i + 3] == [f"a={lora_adapters.peft_dir('a')}", f"b={lora_adapters.peft_dir('b')}"]
    assert v.argv[v.argv.index("--max-lora-rank") + 1] == "8" and "--enable-lora" in v.argv
    ll = engines.launch_spec("llamacpp", port=8005, lora=True)
    assert ll.argv.count("--lora-scaled") == 1 and "--lora" not in ll.argv   # one list: the last --lora wins
    a, b = lora_adapters.gguf_path("a"), lora_adapters.gguf_path("b")
    assert ll.argv[ll.argv.index("--lora-scaled") + 1] == f"{a}:0,{b}:0"
    assert ll.facts["lora_ids"] == {"a": 0, "b": 1}


def test_request_fields_choose_adapters():
    assert lora_adapters.request_fields("vllm", "a") == {"model": "a"}
    assert lora_adapters.request_fields("vllm", None) == {"model": "gemma3-270m"}
    assert lora_adapters.request_fields("llamacpp", "b")["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    assert lora_adapters.request_fields("llamacpp", None)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    with pytest.raises(ValueError, match="unknown adapter 'c'"):
        lora_adapters.request_fields("vllm", "c")


def test_drafter_small_cache_and_extra_args(cache, monkeypatch):
    ll = engines.launch_spec("llamacpp", port=8006, drafter=True, small_cache=True, extra_args=("--parallel", "1"))
    i = ll.argv.index("-md")
    assert ll.argv[i + 1].endswith("gemma-3-270m-q4_k_m.gguf") and ll.argv[i + 2:i + 4] == ["--spec-type", "draft-simple"]
    assert ll.argv[ll.argv.index("-c") + 1] == "4096" and ll.argv[ll.argv.index("--cache-ram") + 1] == "64"
    assert ll.argv[-2:] == ["--parallel", "1"]       # extra arguments last: they win
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")   # an inherited value would override the bytes
    v = engines.launch_spec("vllm", port=8007, drafter=True, small_cache=True)
    assert json.loads(v.argv[v.argv.index("--speculative-config") + 1])["method"] == "ngram"
    assert v.argv[v.argv.index("--kv-cache-memory-bytes") + 1] == str(256 * 2**20)
    assert v.argv[v.argv.index("--max-model-len") + 1] == "4096"
    assert "VLLM_CPU_KVCACHE_SPACE" not in v.env and "VLLM_CPU_KVCACHE_SPACE" not in v.env_of_interest
