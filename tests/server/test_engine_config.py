"""EngineConfig validation, the backend registry and the model fingerprint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rmserve.server.engines.registry import ENGINES, engine_class
from rmserve.server.config import EngineConfig
from rmserve.fingerprint import model_fingerprint

from rmserve.errors import ServerFault


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"engine": "tgi"}, ("engine", "'tgi'", "hf, vllm")),
        ({"dtype": "int8"}, ("dtype", "float32")),
        ({"max_model_len": 8}, ("max_model_len", "16")),
        ({"block_size": 24}, ("block_size", "power of 2")),
        ({"block_size": 512}, ("block_size", "256")),
        ({"gpu_memory_utilization": 0.0}, ("gpu_memory_utilization", "(0, 1]")),
        ({"gpu_memory_utilization": 1.5}, ("gpu_memory_utilization", "(0, 1]")),
        ({"tensor_parallel_size": 0}, ("tensor_parallel_size", "1")),
        ({"kv_cache_memory_bytes": 1000}, ("kv_cache_memory_bytes", "1 MiB")),
        ({"chat_template": Path("/no/such/template.jinja")}, ("chat_template", "not a file")),
        ({"hf_batch_size": 0}, ("hf_batch_size", "1")),
        ({"served_model_name": ""}, ("served_model_name",)),
    ],
)
def test_bad_values_name_field_and_limit(kwargs, words):
    with pytest.raises(ValueError) as info:
        EngineConfig(model="org/model", **kwargs)
    for word in words:
        assert word in str(info.value)


def test_name_defaults_to_folder_or_hub_id(tmp_path):
    folder = tmp_path / "my-rm"
    folder.mkdir()
    assert EngineConfig(model=str(folder)).name == "my-rm"
    assert EngineConfig(model="org/some-rm").name == "org/some-rm"
    assert EngineConfig(model="org/some-rm", served_model_name="rm").name == "rm"


def test_chat_template_path_is_normalised(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    assert EngineConfig(model="m", chat_template=str(template)).chat_template == template


@pytest.mark.model
def test_registry_lists_choices_and_loads_lazily():
    assert set(ENGINES) == {"vllm", "hf"}
    with pytest.raises(ValueError) as info:
        engine_class("onnx")
    assert "'onnx'" in str(info.value) and "hf, vllm" in str(info.value)
    from rmserve.server.engines.hf_engine import HFEngine

    assert engine_class("hf") is HFEngine


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_fingerprint_is_short_hex_and_independent_of_location(demo_model_dir, tmp_path):
    template = json.loads((demo_model_dir / "tokenizer_config.json").read_text())["chat_template"]
    fingerprint = model_fingerprint(demo_model_dir, template)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert model_fingerprint(_copy_model(demo_model_dir, tmp_path / "copy"), template) == fingerprint


def test_fingerprint_changes_with_template_tokenizer_and_weights(demo_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    template = json.loads((demo_model_dir / "tokenizer_config.json").read_text())["chat_template"]
    base = model_fingerprint(demo_model_dir, template)
    assert model_fingerprint(demo_model_dir, template + " ") != base

    tok = _copy_model(demo_model_dir, tmp_path / "tok")
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["model_max_length"] = 2048
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    assert model_fingerprint(tok, template) != base

    # same shapes and file size, different values (a later checkpoint of the same run)
    ckpt = _copy_model(demo_model_dir, tmp_path / "ckpt")
    model = AutoModelForSequenceClassification.from_pretrained(str(demo_model_dir), dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.01)
    (ckpt / "model.safetensors").unlink()
    model.save_pretrained(ckpt)
    assert (ckpt / "model.safetensors").stat().st_size == (demo_model_dir / "model.safetensors").stat().st_size
    assert model_fingerprint(ckpt, template) != base


def test_fingerprint_needs_a_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ServerFault, match="config.json"):
        model_fingerprint(tmp_path / "empty", None)


@pytest.mark.model
def test_cpu_build_cache_defaults(monkeypatch):
    """On the CPU build an unset block size is 32 and an unset KV cache is 4 GiB (or the env's)."""
    pytest.importorskip("vllm")
    from rmserve.server.engines.vllm_compat import platform_cache_defaults
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("CPU-build defaults")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert platform_cache_defaults(EngineConfig(model="m")) == (32, 4 * 1024**3)
    assert platform_cache_defaults(EngineConfig(model="m", block_size=64, kv_cache_memory_bytes=1 << 30)) == (64, 1 << 30)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert platform_cache_defaults(EngineConfig(model="m")) == (32, None)
