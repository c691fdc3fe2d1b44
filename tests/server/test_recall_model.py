"""qwen3next-recall (issue 33): the tiny Qwen3-Next trained to recall hitproof's codes, shipped in the package.

Setup copies the shipped folder after checking every file against SHA256SUMS; a changed file is one clear
setup error naming it. The real vLLM serving it: benchmarks/RESULTS.md ("A hybrid that recalls")."""

import json
import shutil

import pytest

from tui.embedded import SetupError, llamacpp, shipped, tiny, tiny_vllm, vllm

MODEL = "qwen3next-recall"


def test_the_shipped_weights_match_their_sums_and_are_a_choice():
    build = tiny_vllm.VLLM_TINY[MODEL]
    assert build.shipped is not None and shipped.mismatched(build.shipped) == []
    assert MODEL in vllm.MODELS and MODEL in llamacpp.MODELS
    assert shipped.mismatched(shipped.RECALL_GGUF) == []
    config = json.loads((build.shipped / "config.json").read_text())
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["head_dim"] == 128
    assert shipped.parameters(build.shipped / "model.safetensors") == 2579864


def test_the_recurrent_recall_model_ships_too_its_attention_adding_nothing():
    """qwen3next-recurrent-recall: every layer that counts recurrent, a last attention layer whose output
    projection is zero (recall_hybridize.py), for vLLM and llama.cpp, each folder matching its sums."""
    model = shipped.SHIPPED[shipped.RECURRENT_RECALL]
    assert shipped.mismatched(model.hf) == [] and shipped.mismatched(model.gguf) == []
    assert model.name in vllm.MODELS and model.name in llamacpp.MODELS
    assert tiny_vllm.VLLM_TINY[model.name].shipped == model.hf and tiny.TINY_MODELS[model.name].shipped == model.gguf
    config = json.loads((model.hf / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention"] * 8 + ["full_attention"]
    assert config["full_attention_interval"] == 9                       # llama.cpp's reading of the same layout
    with (model.hf / "model.safetensors").open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    o_proj = header["model.layers.8.self_attn.o_proj.weight"]
    start, end = o_proj["data_offsets"]
    with (model.hf / "model.safetensors").open("rb") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little") + start)
        assert not any(f.read(end - start))                            # all zero bytes: the layer adds nothing


def test_a_changed_file_is_named(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_vllm.VLLM_TINY[MODEL].shipped, folder)
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "model.safetensors").unlink()
    assert sorted(shipped.mismatched(folder)) == ["model.safetensors", "tokenizer_config.json"]


def test_setup_copies_the_checked_folder_and_launch_names_the_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    lines = []
    tiny_vllm.prepare(MODEL, lines.append)
    out = tiny_vllm.hf_dir(MODEL)
    assert shipped.mismatched(out) == [] and any("copy qwen3next-recall" in line for line in lines)
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


def test_llamacpp_setup_copies_the_checked_gguf(tmp_path, monkeypatch):
    """The GGUF is copied after its sum is checked; the load check (llama-server) is the real tier's."""
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny, "_verify_loads", lambda s, step, binary, gguf, model: "ok")
    tiny.prepare(MODEL, lambda line: None, server_binary="/bin/true")
    gguf = tiny.gguf_path(MODEL)
    assert gguf.name == "qwen3next-recall-bf16.gguf" and gguf.read_bytes()[:4] == b"GGUF"
    entry = tiny.built_info()[MODEL]
    assert entry["sha256"] == shipped.sums(shipped.RECALL_GGUF)[gguf.name] and entry["verified"] == "ok"
    facts = tiny.launch_facts(MODEL)
    assert "recall" in facts["weights"] and "seed" not in facts and facts["quantization"].startswith("bf16")


def test_a_corrupted_gguf_is_one_setup_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HITPROOF_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "gguf"
    shutil.copytree(shipped.RECALL_GGUF, folder)
    (folder / "qwen3next-recall-bf16.gguf").write_bytes(b"GGUF but not the weights")
    monkeypatch.setitem(tiny.TINY_MODELS, MODEL, tiny.TinyModel(MODEL, "qwen3next", "Qwen3NextForCausalLM", "x",
                                                                 seed=0, shipped=folder))
    with pytest.raises(SetupError, match="qwen3next-recall-bf16.gguf .* differ from SHA256SUMS"):
        tiny.prepare(MODEL, lambda line: None, server_binary="/bin/true")
    assert not tiny.gguf_path(MODEL).exists()
