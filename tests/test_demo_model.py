"""The demo reward model: deterministic, valid shapes, loud about its random weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from rmserve.demo_model import DemoModelConfig, build_demo_model
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def chat_corpus(rmbench_dir: Path) -> Path:
    return rmbench_dir / "chat_filtered.json"


@pytest.mark.model
def test_cli_builds_deterministically_and_warns_about_random_weights(tmp_path, chat_corpus):
    runner = CliRunner()
    first = runner.invoke(app, ["demo-model", str(tmp_path / "a"), "--corpus", str(chat_corpus), "--seed", "0"])
    assert first.exit_code == 0, first.output
    assert "RANDOM weights" in first.stderr and "mean nothing" in first.stderr
    build_demo_model(tmp_path / "b", chat_corpus, DemoModelConfig(seed=0))
    build_demo_model(tmp_path / "c", chat_corpus, DemoModelConfig(seed=1))

    a, b, c = (tmp_path / name for name in "abc")
    assert _sha256(a / "model.safetensors") == _sha256(b / "model.safetensors")
    assert _sha256(a / "tokenizer.json") == _sha256(b / "tokenizer.json")
    assert _sha256(a / "model.safetensors") != _sha256(c / "model.safetensors")
    assert _sha256(a / "tokenizer.json") == _sha256(c / "tokenizer.json")  # the seed only drives weights
    assert first.stdout == ""  # status only: stdout stays for what a command's output is
    assert f"wrote {a}: " in first.stderr and _sha256(a / "model.safetensors")[:16] in first.stderr


def test_default_model_layout(demo_model_dir: Path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    config = json.loads((demo_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert len(config["id2label"]) == 1  # num_labels = 1
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 32
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["intermediate_size"]) == (2, 2, 352)
    assert config["pad_token_id"] is not None and config["pad_token_id"] != config["eos_token_id"]
    tokenizer_config = json.loads((demo_model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"].startswith("{{- bos_token -}}")
    assert not (demo_model_dir / "chat_template.jinja").exists()
    assert "RANDOM weights" in (demo_model_dir / "README.md").read_text()
    with safe_open(str(demo_model_dir / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
        assert "score.weight" in set(weights.keys())
    assert dtypes == {"F32"}

    model = AutoModelForSequenceClassification.from_pretrained(str(demo_model_dir), dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([[1, 4, 100, 2, 5, 200, 2]])).logits
    assert logits.shape == (1, 1)


@pytest.mark.model
def test_benchmark_shape_from_plain_text(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(f"Sentence {i}: the reward model scores chosen and rejected answers." for i in range(500)),
        encoding="utf-8",
    )
    config = DemoModelConfig(layers=4, hidden=512, heads=8, kv_heads=4, intermediate=1408, vocab=2000)
    report = build_demo_model(tmp_path / "bench", corpus, config)
    written = json.loads((tmp_path / "bench" / "config.json").read_text())
    assert (written["num_hidden_layers"], written["hidden_size"], written["num_attention_heads"]) == (4, 512, 8)
    assert (written["num_key_value_heads"], written["intermediate_size"], written["head_dim"]) == (4, 1408, 64)
    assert written["vocab_size"] == report.vocab_size <= 2000
    tokenizer = json.loads((tmp_path / "bench" / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == report.vocab_size


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"hidden": 96, "heads": 4}, ("head dim", "24", "32")),
        ({"kv_heads": 3}, ("kv_heads", "3")),
        ({"vocab": 100}, ("vocab", "300")),
        ({"layers": 0}, ("layers", "1")),
    ],
)
def test_invalid_shape_names_field_and_limit(kwargs, words):
    with pytest.raises(ValueError) as info:
        DemoModelConfig(**kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.model
def test_corpus_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_demo_model(tmp_path / "x", tmp_path / "missing")
    records = tmp_path / "records.json"
    records.write_text('[{"id": 1, "text": "no prompt here"}]', encoding="utf-8")
    with pytest.raises(DataError) as info:
        build_demo_model(tmp_path / "y", records)
    assert info.value.field == "prompt" and "records.json" in str(info.value)


@pytest.mark.model
def test_refuses_a_non_empty_output_folder(tmp_path, chat_corpus):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not an empty folder"):
        build_demo_model(tmp_path / "used", chat_corpus)
    assert (tmp_path / "used" / "keep.txt").read_text() == "x"


@pytest.mark.model
def test_causal_demo_model_is_a_causal_lm_with_the_demo_tokenizer(demo_policy_dir, demo_model_dir):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((demo_policy_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(demo_policy_dir)
    assert model.lm_head.weight.shape[0] == config["vocab_size"]
    policy_tok = AutoTokenizer.from_pretrained(demo_policy_dir)
    rm_tok = AutoTokenizer.from_pretrained(demo_model_dir)
    assert policy_tok.get_vocab() == rm_tok.get_vocab()
    assert policy_tok.chat_template == rm_tok.chat_template


def test_demo_model_kind_is_checked():
    from rmserve.demo_model import DemoModelConfig

    with pytest.raises(ValueError, match="kind: 'policy' must be reward, causal, gated, qwen2-rm, internlm2-rm, inf-orm, grm or ldl"):
        DemoModelConfig(kind="policy")


@pytest.mark.model
def test_cli_builds_a_family_and_names_the_families_on_a_bad_one(tmp_path, chat_corpus):
    runner = CliRunner()
    built = runner.invoke(app, ["demo-model", str(tmp_path / "m"), "--family", "mistral", "--corpus", str(chat_corpus)])
    assert built.exit_code == 0, built.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["MistralForSequenceClassification"]
    assert "Family mistral" in (tmp_path / "m" / "README.md").read_text()
    bad = runner.invoke(app, ["demo-model", str(tmp_path / "x"), "--family", "qwen9", "--corpus", str(chat_corpus)])
    assert bad.exit_code == 2
    assert "Invalid value for '--family': 'qwen9' is not one of demo, llama3, qwen2, qwen3, gemma2, mistral" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_the_family_help_names_every_family():
    from rmserve.demo_families import FAMILY_NAMES

    result = CliRunner().invoke(app, ["demo-model", "--help"])
    flat = " ".join(result.output.split())
    assert "--family FAMILY Model family" in flat
    assert all(f"{name} (" in flat for name in FAMILY_NAMES), flat
