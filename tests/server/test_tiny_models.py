"""The tiny hybrid recurrent models (Qwen3-Next, Granite-4.0-H) made locally for llama.cpp.

Fast tests check the launch command and the setup plumbing against a fake cache; the real
llama-server on each is benchmarks/validations/test_tiny_models_more.py (CI: tests/real/test_real_hybrid.py).
"""

import importlib.util
import json
from pathlib import Path

import pytest

from tui.embedded import SetupError, launch_spec, llamacpp, prepare, tiny

TINY = ("qwen3next-tiny", "granite-h-tiny")


# -- fast --------------------------------------------------------------------------------------


def test_model_names_and_choices():
    # the trained ones ship (test_recall_model.py)
    assert set(tiny.TINY_MODELS) == {*TINY, "qwen3next-recall", "qwen3next-recurrent-recall"}
    assert llamacpp.MODELS[0] == "gemma3-270m"  # the default stays first
    assert set(TINY) <= set(llamacpp.MODELS)
    assert tiny.tiny_model("qwen3next-tiny").convert_args == ("--no-mtp",)
    assert tiny.tiny_model("granite-h-tiny").architecture == "granitehybrid"
    with pytest.raises(SetupError, match="unknown tiny model"):
        tiny.tiny_model("llama-tiny")


def test_converter_matches_the_server_version():
    assert tiny.SDIST == llamacpp.LLAMA


def test_builder_knows_every_model():
    spec = importlib.util.spec_from_file_location("tiny_build", tiny.BUILDER)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)  # stdlib-only at import time; torch etc. load inside functions
    assert set(builder.BUILDERS) == {m for m, spec in tiny.TINY_MODELS.items() if spec.shipped is None} == set(TINY)
    assert builder.VOCAB_DEFAULT == tiny.VOCAB
    assert builder.SPECIALS[1:] == ["<|im_start|>", "<|im_end|>"]  # ChatML


def test_launch_argv():
    argv = tiny.launch_argv("/x/llama-server", "/m/q.gguf", "qwen3next-tiny", 8123)
    assert argv[0] == "/x/llama-server"
    joined = " ".join(argv)
    for part in ("-m /m/q.gguf", "--alias qwen3next-tiny", "--host 127.0.0.1", "--port 8123",
                 "-c 16384", "--parallel 4", "--metrics", "-lv 4", "--chat-template chatml", "--poll 0"):
        assert part in joined, part


def test_patch_converter_text():
    original = (
        "        if res is None:\n"
        "            logger.warning(\"**************\")\n"
        f"{tiny._PATCH_FROM}\n"
        "        return res\n"
    )
    patched = tiny.patch_converter_text(original)
    assert 'res = "qwen2"' in patched and "raise NotImplementedError" not in patched
    assert tiny.patch_converter_text(patched) == patched  # idempotent
    with pytest.raises(ValueError, match="not found"):
        tiny.patch_converter_text("def get_vocab_base_pre(self): pass\n")


def _fake_cache(root: Path, monkeypatch, *, built: bool) -> Path:
    monkeypatch.setenv("HITPROOF_CACHE", str(root))
    binary = root / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'version: 1 (fake)'\n")
    binary.chmod(0o755)
    (root / "llamacpp").mkdir()
    (root / "llamacpp" / "info.json").write_text(json.dumps({"binary": str(binary), "engine_version": "fake 1"}))
    if built:
        gguf = tiny.gguf_path("granite-h-tiny")
        gguf.parent.mkdir(parents=True)
        gguf.write_bytes(b"GGUF")
        (root / "tiny").mkdir()
        (root / "tiny" / "info.json").write_text(json.dumps({
            "build": {"torch": "2.13.0+cpu", "transformers": "5.24.0"},
            "granite-h-tiny": {"gguf": str(gguf), "parameters": 2268304, "architecture": "granitehybrid"},
        }))
    return binary


def test_launch_spec_for_a_tiny_model(tmp_path, monkeypatch):
    binary = _fake_cache(tmp_path, monkeypatch, built=True)
    spec = launch_spec("llamacpp", port=8124, model="granite-h-tiny")
    assert spec.engine == "llamacpp" and spec.model == "granite-h-tiny"
    assert spec.url == "http://127.0.0.1:8124"
    assert spec.argv[:3] == [str(binary), "-m", str(tiny.gguf_path("granite-h-tiny"))]
    facts = spec.facts
    assert facts["architecture"] == "granitehybrid"
    assert facts["parameters"] == 2268304
    assert facts["seed"] == tiny.TINY_MODELS["granite-h-tiny"].seed
    assert "random" in facts["weights"]
    assert facts["engine_version"] == "fake 1"
    assert facts["slots"] == 4 and facts["context_per_slot"] == 4096


def test_launch_spec_before_the_build_says_what_to_run(tmp_path, monkeypatch):
    _fake_cache(tmp_path, monkeypatch, built=False)
    with pytest.raises(SetupError, match=r"prepare\('llamacpp', model='qwen3next-tiny'\)"):
        launch_spec("llamacpp", port=8125, model="qwen3next-tiny")


def test_unknown_model_is_a_setup_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    with pytest.raises(SetupError, match="unknown model"):
        prepare("llamacpp", model="mamba-huge", progress=lambda line: None)
