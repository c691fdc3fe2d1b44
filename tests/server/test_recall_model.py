"""qwen3next-recall (issue 33): the tiny Qwen3-Next trained to recall hitproof's codes, shipped in the package.

Setup copies the shipped folder after checking every file against SHA256SUMS; a changed file is one clear
setup error naming it. The real vLLM serving it: benchmarks/RESULTS.md ("A hybrid that recalls")."""

import json
import shutil

import pytest

from tui.embedded import SetupError, tiny_vllm, vllm

MODEL = "qwen3next-recall"


def test_the_shipped_weights_match_their_sums_and_are_a_choice():
    build = tiny_vllm.VLLM_TINY[MODEL]
    assert build.shipped is not None and tiny_vllm.verify_shipped(build.shipped) == []
    assert MODEL in vllm.MODELS
    config = json.loads((build.shipped / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["head_dim"] == 128
    assert tiny_vllm.parameters(build.shipped / "model.safetensors") == 2579864


def test_a_changed_file_is_named(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_vllm.VLLM_TINY[MODEL].shipped, folder)
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "model.safetensors").unlink()
    assert sorted(tiny_vllm.verify_shipped(folder)) == ["model.safetensors", "tokenizer_config.json"]


def test_setup_copies_the_checked_folder_and_launch_names_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    lines = []
    tiny_vllm.prepare(MODEL, lines.append)
    out = tiny_vllm.hf_dir(MODEL)
    assert tiny_vllm.verify_shipped(out) == [] and any("copy qwen3next-recall" in line for line in lines)
    argv, facts = tiny_vllm.launch(MODEL)
    assert argv[:2] == ["--dtype", "bfloat16"]
    assert facts["parameters"] == 2579864 and facts["weights_sha256"].startswith("fac69d6c")
    assert "recall" in facts["weights"] and facts["model_path"] == str(out)


def test_a_corrupted_package_copy_is_one_setup_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    shutil.copytree(tiny_vllm.VLLM_TINY[MODEL].shipped, folder)
    (folder / "model.safetensors").write_bytes(b"not the weights")
    monkeypatch.setitem(tiny_vllm.VLLM_TINY, MODEL, tiny_vllm.VllmTiny("vllm", "bfloat16", "x", shipped=folder))
    with pytest.raises(SetupError, match="model.safetensors .* differ from SHA256SUMS"):
        tiny_vllm.prepare(MODEL, lambda line: None)
    assert not tiny_vllm.hf_dir(MODEL).exists()
