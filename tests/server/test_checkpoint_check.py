"""File checks of a checkpoint folder before a load: each rule refuses with 422 naming file and rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rmserve.server.kinds.heads import known_heads
from rmserve.server.config import check_lm_head
from rmserve.server.swaps.checkpoints import architecture_problem, check_checkpoint, check_config, num_labels

from rmserve.errors import InvalidCheckpoint, ServerFault

GOOD_CONFIG = {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "LABEL_0"}}

KNOWN_HEADS = f"the heads it knows: {known_heads()}"  # its words are pinned in tests/test_heads.py
CAUSAL_LM_FIX = (
    "a causal LM whose reward is one LM-head logit (as Llama-3.1-Nemotron-70B-Reward-HF) is served with --head "
    "lm-logit [--head-token-id N]; to score a DPO policy by its implicit reward use --kind dpo with --ref-model REF "
    "or --ref-free avg|sum|norm"
)


def _folder(tmp_path: Path, *, config=GOOD_CONFIG, tokenizer: str | None = '{"model": {}}',
            weights: tuple[str, ...] = ("model.safetensors",)) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(tokenizer)
    for name in weights:
        (folder / name).write_bytes(b"\0" * 8)
    return folder


def test_a_servable_folder_passes(tmp_path):
    assert check_checkpoint(_folder(tmp_path)) is None


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"id2label": {"0": "A"}}, 1),
        ({"id2label": {"0": "A", "1": "B"}, "num_labels": 1}, 2),  # id2label wins, as in transformers
        ({"num_labels": 1}, 1),
        ({"id2label": {}}, 0),  # an empty id2label still counts, as in transformers
        ({}, 2),  # transformers' default
    ],
)
def test_num_labels_counts_as_transformers_does(config, expected):
    assert num_labels(config) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": {**GOOD_CONFIG, "id2label": {"0": "A", "1": "B"}}},
         "checkpoint 'ckpt/config.json': has 2 labels (num_labels/id2label: 0 A, 1 B); rmserve reads one reward from "
         "them: give --label-index I (0 ≤ I < 2) for one label, or --label-weights w1,...,w2 for their weighted sum"),
        ({"config": {"architectures": ["LlamaForCausalLM"], "num_labels": 1}},
         "checkpoint 'ckpt/config.json': has architectures ['LlamaForCausalLM'], whose reward head rmserve does not "
         f"know; {KNOWN_HEADS}; {CAUSAL_LM_FIX}"),
        ({"config": {"architectures": ["LlamaForSequenceClassification"]}},
         "checkpoint 'ckpt/config.json': has 2 labels (num_labels/id2label); rmserve reads one reward from them: give "
         "--label-index I (0 ≤ I < 2) for one label, or --label-weights w1,...,w2 for their weighted sum"),
        ({"config": None}, "checkpoint 'ckpt/config.json': is missing"),
        ({"config": "[1, 2]"}, "checkpoint 'ckpt/config.json': holds a JSON list, not an object"),
        ({"tokenizer": None},
         "checkpoint 'ckpt': has no tokenizer files (expected one of tokenizer.json, tokenizer_config.json, "
         "special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json)"),
        ({"weights": ()}, "checkpoint 'ckpt': has no weight files (*.safetensors or *.bin)"),
    ],
)
def test_each_rule_refuses_with_422_naming_file_and_rule(tmp_path, kwargs, message):
    with pytest.raises(InvalidCheckpoint) as info:
        check_checkpoint(_folder(tmp_path, **kwargs))
    assert info.value.status == 422
    assert info.value.type == "invalid_checkpoint"
    assert info.value.field == "path"
    assert str(info.value) == message


def test_unparsable_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(InvalidCheckpoint, match=r"^checkpoint 'ckpt/tokenizer.json': is not readable JSON \(JSONDecodeError"):
        check_checkpoint(_folder(tmp_path, tokenizer="{not json"))


def test_a_sharded_checkpoint_needs_every_shard(tmp_path):
    folder = _folder(tmp_path, weights=("model-00001-of-00002.safetensors",))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InvalidCheckpoint) as info:
        check_checkpoint(folder)
    assert str(info.value) == (
        "checkpoint 'ckpt/model.safetensors.index.json': names 1 missing shard(s) of 2, "
        "first 'model-00002-of-00002.safetensors'"
    )
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\0")
    assert check_checkpoint(folder) is None


def test_the_demo_model_passes(tmp_path, demo_model_dir):
    assert check_checkpoint(demo_model_dir) is None


CAUSAL_LM_RULE = "needs a causal LM with an LM head (*ForCausalLM or *LMHeadModel)"


@pytest.mark.parametrize(
    ("kind", "config", "problem"),
    [
        ("classifier", GOOD_CONFIG, None),
        ("classifier", {"architectures": ["GPT2LMHeadModel"]},
         f"has architectures ['GPT2LMHeadModel'], whose reward head rmserve does not know; {KNOWN_HEADS}; "
         f"{CAUSAL_LM_FIX}"),
        ("classifier", {"architectures": ["BertModel"]},
         f"has architectures ['BertModel'], whose reward head rmserve does not know; {KNOWN_HEADS}; give --head NAME "
         "when the checkpoint has one of them"),
        ("classifier", {"architectures": ["LlamaForSequenceClassification"], "num_labels": 3},
         "has 3 labels (num_labels/id2label); rmserve reads one reward from them: give --label-index I (0 ≤ I < 3) "
         "for one label, or --label-weights w1,...,w3 for their weighted sum"),
        ("dpo", {"architectures": ["LlamaForCausalLM"]}, None),
        ("judge", {"architectures": ["GPT2LMHeadModel"]}, None),
        ("dpo", GOOD_CONFIG,
         f"has architectures ['LlamaForSequenceClassification']; kind dpo {CAUSAL_LM_RULE}; it is a reward "
         "classifier: serve it with --kind classifier, or give a DPO-trained causal LM"),
        ("dpo", {},
         f"has architectures []; kind dpo {CAUSAL_LM_RULE}; give a causal LM checkpoint (the DPO policy, or the "
         "model it was trained from)"),
        ("judge", {"architectures": ["BertModel"]},
         f"has architectures ['BertModel']; kind judge {CAUSAL_LM_RULE}; give a chat model (a causal LM with a "
         "chat template)"),
        ("length", {"architectures": ["BertModel"]}, None),
    ],
)
def test_each_kind_has_one_architecture_rule(kind, config, problem):
    assert architecture_problem(kind, config) == problem


@pytest.mark.parametrize("kind", ["dpo", "judge"])
def test_start_and_swap_refuse_a_classifier_as_causal_lm_with_the_same_rule(tmp_path, kind):
    folder = _folder(tmp_path)
    rule = (f"has architectures ['LlamaForSequenceClassification']; kind {kind} {CAUSAL_LM_RULE}; it is a reward "
            "classifier: serve it with --kind classifier, or give a DPO-trained causal LM")
    with pytest.raises(ServerFault) as start:
        check_lm_head(str(folder), "ref_model", kind)
    assert str(start.value) == f"ref_model: {str(folder)!r} {rule}"
    with pytest.raises(InvalidCheckpoint) as swap:
        check_config(folder, kind)
    assert str(swap.value) == f"checkpoint 'ckpt/config.json': {rule}"
