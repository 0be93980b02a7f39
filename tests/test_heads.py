"""Reward heads without an engine: the registry's rules on configs, how a reward is read, the
head options, the fingerprint (a default classifier keeps the value it had before heads were
recorded), score records and the refusals ``rmserve serve`` gives before an engine starts.

Every expected value is written out: messages in full, rewards worked by hand, fingerprints
computed before heads existed (``DEFAULT_FINGERPRINT``: rmserve 08dddba, the commit before heads)
or, for the other heads, once and pinned (a change of the hashed sections must be deliberate).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from rmserve.client.records import record_from_result
from rmserve.client.score_file import ScoreFileWriter, read_scores
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import (
    HEAD_NAMES,
    Group,
    GroupKey,
    GroupResult,
    Message,
    ModelInfo,
    RewardHead,
    Scorer,
    ScoreRecord,
    encode,
)
from rmserve.server.config import EngineConfig, check_reward_head
from rmserve.server.kinds.heads import (
    HEADS,
    HeadProblem,
    HeadSettings,
    detect_head,
    engine_problem,
    head_change,
    read_reward,
    resolve_head,
    swap_head_problem,
)
from rmserve.errors import ServerFault

CLASSIFIER = {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
THREE = {"architectures": ["LlamaForSequenceClassification"], "num_labels": 3}
NAMED = {"architectures": ["LlamaForSequenceClassification"],
         "id2label": {"0": "helpfulness", "1": "correctness", "2": "coherence"}}
CAUSAL = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256}

KNOWN_HEADS = (
    "the heads it knows: classifier (a *ForSequenceClassification with one label); multi-label (a "
    "*ForSequenceClassification with num_labels > 1); lm-logit (a *ForCausalLM, named with --head lm-logit); "
    "remote-code (a checkpoint with its own modeling code (auto_map: AutoModelForSequenceClassification), with "
    "--trust-remote-code); token-value (a per-token value model (Qwen2ForRewardModel)); reward-token (a per-token "
    "value model read at a reward token (InternLM2ForRewardModel, reward_token_id)); mlp-value (a classifier whose "
    "score head is a two-layer MLP (INFORMForSequenceClassification: score.0, ReLU, score.2), shipping no code for it); "
    "value-head (a decoder with a value head (GRewardModel: v_head.summary.* tensors, linear layers with ReLU between), "
    "shipping no code for it); label-distribution (a decoder beside regression_layer.pt and gating_layer.pt "
    "(LDL-Reward), named with --head label-distribution)"
)
INTERNLM2 = {"architectures": ["InternLM2ForRewardModel"], "vocab_size": 92544, "reward_token_id": 92527,
             "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"}}
QWEN2_RM = {"architectures": ["Qwen2ForRewardModel"], "num_labels": 1,
            "auto_map": {"AutoModel": "modeling_qwen2_rm.Qwen2ForRewardModel"}}
ARMO = {"architectures": ["LlamaForRewardModelWithGating"],
        "auto_map": {"AutoModelForSequenceClassification": "modeling_custom.LlamaForRewardModelWithGating"}}
INF_ORM = {"architectures": ["INFORMForSequenceClassification"], "model_type": "llama"}  # no num_labels: 2 by default
MLP_TENSORS = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")
OWN_CODE = (
    "has its own modeling code (auto_map AutoModelForSequenceClassification: {target}), which rmserve runs only when "
    "the server is started with --trust-remote-code (it executes the checkpoint's Python files; off by default), "
    "on the transformers engine (--engine hf: vLLM runs no checkpoint code)"
)


# --- the registry ----------------------------------------------------------------------------


def test_the_registry_holds_every_head_with_its_engines():
    assert tuple(HEADS) == HEAD_NAMES == (
        "classifier", "multi-label", "lm-logit", "remote-code", "token-value", "reward-token", "mlp-value", "value-head",
        "label-distribution")
    # vLLM runs no model code and has no MLP or value head over a decoder; transformers has no
    # Qwen2ForRewardModel or InternLM2ForRewardModel
    assert [rule.engines for rule in HEADS.values()] == [("vllm", "hf")] * 3 + [("hf",), ("vllm",), ("vllm",), ("hf",),
                                                                                 ("hf",), ("hf",)]
    # a causal LM and a decoder with label-distribution files: only with --head
    assert [rule.detected for rule in HEADS.values()] == [True, True, False, True, True, True, True, True, False]
    assert engine_problem(RewardHead("mlp-value"), "vllm") == (
        "the mlp-value head is served by the hf engine only (vLLM has no MLP score head over a decoder; transformers "
        "runs the decoder and the MLP from the checkpoint's tensors): add --engine hf")
    assert engine_problem(RewardHead("remote-code"), "hf") is None
    assert engine_problem(RewardHead("remote-code"), "vllm") == (
        "the remote-code head is served by the hf engine only (vLLM does not run a checkpoint's own modeling code): "
        "add --engine hf")
    assert engine_problem(RewardHead("classifier"), "vllm") is None
    assert engine_problem(RewardHead("token-value"), "hf") == (
        "the token-value head is served by the vllm engine only (transformers has no class for the architecture; "
        "vLLM implements it): add --engine vllm")


@pytest.mark.parametrize(
    ("config", "head"),
    [
        (CLASSIFIER, "classifier"),
        ({"architectures": ["Qwen3ForSequenceClassification"], "num_labels": 1}, "classifier"),
        (THREE, "multi-label"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "multi-label"),  # transformers' default: 2 labels
        (CAUSAL, None),  # never taken for an lm-logit head unless asked
        (INTERNLM2, "reward-token"),
        (QWEN2_RM, "token-value"),  # whatever its auto_map: vLLM implements the architecture
        (ARMO, "remote-code"),  # its own class, whatever its name or label count
        (INF_ORM, "mlp-value"),  # whatever its label count: the MLP's last layer has one row
        ({"architectures": ["GRewardModel"], "model_type": "llama"}, "value-head"),  # GRM
        ({**INF_ORM, "num_labels": 1, "architectures": ["LlamaForSequenceClassification"]}, "classifier"),
        ({"architectures": ["LlamaForSequenceClassification"], "auto_map": {"AutoTokenizer": ["tok.T", None]}},
         "multi-label"),  # code for the tokenizer only: the classifier is transformers'
        ({}, None),
    ],
)
def test_detection_reads_the_architecture_and_the_label_count(config, head):
    assert detect_head(config) == head


@pytest.mark.parametrize(
    ("config", "settings", "head"),
    [
        (CLASSIFIER, HeadSettings(), RewardHead("classifier")),
        (CLASSIFIER, HeadSettings(choice="classifier"), RewardHead("classifier")),
        (THREE, HeadSettings(label_index=2), RewardHead("multi-label", label_index=2)),
        (THREE, HeadSettings(choice="multi-label", label_weights=(0.5, 0.25, -1.0)),
         RewardHead("multi-label", label_weights=(0.5, 0.25, -1.0))),
        (CAUSAL, HeadSettings(choice="lm-logit"), RewardHead("lm-logit", token_id=0)),  # Nemotron's id 0 by default
        (CAUSAL, HeadSettings(choice="lm-logit", token_id=128255), RewardHead("lm-logit", token_id=128255)),
        ({"architectures": ["Gemma2ForCausalLM"], "vocab_size": 10, "final_logit_softcapping": None},
         HeadSettings(choice="lm-logit", token_id=9), RewardHead("lm-logit", token_id=9)),
        (ARMO, HeadSettings(trust_remote_code=True), RewardHead("remote-code")),
        (QWEN2_RM, HeadSettings(), RewardHead("token-value")),
        (QWEN2_RM, HeadSettings(choice="token-value"), RewardHead("token-value")),
        (INTERNLM2, HeadSettings(trust_remote_code=True), RewardHead("reward-token", token_id=92527)),
        ({**INTERNLM2, "auto_map": {}}, HeadSettings(), RewardHead("reward-token", token_id=92527)),  # a config of its own
        (ARMO, HeadSettings(choice="remote-code", trust_remote_code=True), RewardHead("remote-code")),
        (INF_ORM, HeadSettings(), RewardHead("mlp-value")),
        (CLASSIFIER, HeadSettings(choice="mlp-value"), RewardHead("mlp-value")),  # the tensors are checked at start
        ({**ARMO, "architectures": ["LlamaForSequenceClassification"], "num_labels": 1},
         HeadSettings(choice="classifier"), RewardHead("classifier")),  # transformers' own class, asked for
    ],
)
def test_a_servable_config_resolves_to_its_head(config, settings, head):
    assert resolve_head(config, settings) == head


@pytest.mark.parametrize(
    ("config", "settings", "problem"),
    [
        (THREE, HeadSettings(),
         "has 3 labels (num_labels/id2label); rmserve reads one reward from them: give --label-index I (0 ≤ I < 3) "
         "for one label, or --label-weights w1,...,w3 for their weighted sum"),
        (NAMED, HeadSettings(label_index=3),
         "has 3 labels (num_labels/id2label: 0 helpfulness, 1 correctness, 2 coherence); --label-index 3 is out of "
         "range (0 … 2)"),
        (THREE, HeadSettings(label_weights=(1.0, 2.0)),
         "has 3 labels (num_labels/id2label); --label-weights gives 2 weights: it needs one per label, 3"),
        (THREE, HeadSettings(choice="classifier"),
         "has 3 labels (num_labels/id2label); the classifier head reads exactly 1: serve it with --head multi-label "
         "and --label-index I or --label-weights w1,...,w3"),
        (CLASSIFIER, HeadSettings(label_index=0),
         "has 1 label (num_labels/id2label): its logit is the reward; --label-index and --label-weights are for a "
         "multi-label head (num_labels > 1): drop them"),
        (CLASSIFIER, HeadSettings(choice="multi-label", label_index=0),
         "has 1 label (num_labels/id2label); the multi-label head needs num_labels > 1: serve it with the classifier "
         "head (leave out --head, --label-index and --label-weights)"),
        (CAUSAL, HeadSettings(),
         f"has architectures ['LlamaForCausalLM'], whose reward head rmserve does not know; {KNOWN_HEADS}; a causal "
         "LM whose reward is one LM-head logit (as Llama-3.1-Nemotron-70B-Reward-HF) is served with --head lm-logit "
         "[--head-token-id N]; to score a DPO policy by its implicit reward use --kind dpo with --ref-model REF or "
         "--ref-free avg|sum|norm"),
        ({"architectures": ["InternLMForRewardModel"], "auto_map": {"AutoModel": "modeling.M"}}, HeadSettings(),
         f"has architectures ['InternLMForRewardModel'], whose reward head rmserve does not know; {KNOWN_HEADS}; it "
         "ships its own modeling code (auto_map) but no AutoModelForSequenceClassification class, which the "
         "remote-code head runs"),
        ({**INTERNLM2, "reward_token_id": None}, HeadSettings(trust_remote_code=True),
         "has reward_token_id None; the reward-token head appends that token to every sequence and reads the reward "
         "there, so the config must name a token id of its vocabulary (0 … 92543)"),
        (INTERNLM2, HeadSettings(),
         "has its own configuration class (auto_map AutoConfig: configuration_internlm2.InternLM2Config), which "
         "transformers runs to read the config and the tokenizer only when the server is started with "
         "--trust-remote-code (it executes the checkpoint's Python files; off by default; vLLM runs the model itself)"),
        (INTERNLM2, HeadSettings(trust_remote_code=True, token_id=3),
         "has a reward token (reward_token_id 92527) at which the reward is read: --head-token-id does not apply to "
         "the reward-token head; drop it"),
        (ARMO, HeadSettings(), OWN_CODE.format(target="modeling_custom.LlamaForRewardModelWithGating")),
        ({"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1,
          "auto_map": {"AutoModelForSequenceClassification": ["modeling_qwen2_rm.Qwen2RM", None]}}, HeadSettings(),
         OWN_CODE.format(target="modeling_qwen2_rm.Qwen2RM") + "; or --head classifier / multi-label to read it as "
         "transformers' own Qwen2ForSequenceClassification instead (none of its code)"),
        (QWEN2_RM, HeadSettings(label_index=0),
         "has a per-token value head (Qwen2ForRewardModel) whose last value is the reward: --label-index does not "
         "apply to the token-value head; drop it"),
        ({**QWEN2_RM, "num_labels": 2}, HeadSettings(),
         "has 2 labels (num_labels/id2label); the token-value head reads exactly 1 value per token"),
        (CLASSIFIER, HeadSettings(choice="token-value"),
         "has architectures ['LlamaForSequenceClassification']; the token-value head reads a per-token value model "
         "(Qwen2ForRewardModel)"),
        (ARMO, HeadSettings(trust_remote_code=True, label_index=0),
         "has its own reward model class (modeling_custom.LlamaForRewardModelWithGating), whose output is the reward: "
         "--label-index does not apply to the remote-code head; drop it"),
        (INF_ORM, HeadSettings(label_weights=(1.0,)),
         "has an MLP score head whose one value is the reward: --label-weights does not apply to the mlp-value head; "
         "drop it"),
        (CAUSAL, HeadSettings(choice="mlp-value"),
         "has architectures ['LlamaForCausalLM']; the mlp-value head reads a classifier whose score head is a "
         "two-layer MLP (score.0.weight, score.0.bias, score.2.weight, score.2.bias), a *ForSequenceClassification"),
        (CLASSIFIER, HeadSettings(choice="remote-code", trust_remote_code=True),
         "has architectures ['LlamaForSequenceClassification'] and no auto_map entry AutoModelForSequenceClassification; "
         "the remote-code head runs a checkpoint's own reward model class (leave out --head for a "
         "*ForSequenceClassification)"),
        ({"architectures": ["BertModel"]}, HeadSettings(),
         f"has architectures ['BertModel'], whose reward head rmserve does not know; {KNOWN_HEADS}; give --head NAME "
         "when the checkpoint has one of them"),
        (CAUSAL, HeadSettings(choice="multi-label", label_index=0),
         "has architectures ['LlamaForCausalLM']; the multi-label head needs a *ForSequenceClassification; for a "
         "causal LM whose reward is one LM-head logit use --head lm-logit"),
        (CLASSIFIER, HeadSettings(choice="lm-logit"),
         "has architectures ['LlamaForSequenceClassification']; the lm-logit head reads the LM head of a causal LM "
         "(*ForCausalLM or *LMHeadModel); a *ForSequenceClassification is served with the classifier or multi-label "
         "head (leave out --head)"),
        (CAUSAL, HeadSettings(choice="lm-logit", token_id=128256),
         "has vocab_size 128256; --head-token-id 128256 is out of range (0 … 128255)"),
        ({"architectures": ["Gemma2ForCausalLM"], "vocab_size": 256000, "final_logit_softcapping": 30.0},
         HeadSettings(choice="lm-logit"),
         "has final_logit_softcapping=30.0: the model transforms its logits after the LM-head projection, and the "
         "lm-logit head reads the projection itself (hidden · W[id]); rmserve does not serve it"),
    ],
)
def test_each_refusal_names_what_was_found_the_rule_and_the_fix(config, settings, problem):
    with pytest.raises(HeadProblem) as info:
        resolve_head(config, settings)
    assert str(info.value) == problem


# --- reading a reward --------------------------------------------------------------------------


def test_a_reward_is_read_from_the_heads_values():
    assert read_reward(RewardHead("classifier"), [1.25]) == 1.25
    assert read_reward(RewardHead("lm-logit", token_id=0), [-3.5]) == -3.5
    assert read_reward(RewardHead("multi-label", label_index=2), [0.5, -1.0, 4.0]) == 4.0
    # 0.5·2 + 0.25·(−4) + (−1)·0.5 = 1 − 1 − 0.5
    assert read_reward(RewardHead("multi-label", label_weights=(0.5, 0.25, -1.0)), [2.0, -4.0, 0.5]) == -0.5


@pytest.mark.parametrize(
    ("head", "values", "message"),
    [
        (RewardHead("classifier"), [1.0, 2.0], "the engine gave 2 values; the classifier head reads exactly one"),
        (RewardHead("multi-label", label_index=3), [1.0, 2.0, 3.0],
         "the engine gave 3 label values; label_index 3 is out of range"),
        (RewardHead("multi-label", label_weights=(1.0, 1.0)), [1.0, 2.0, 3.0],
         "the engine gave 3 label values for 2 label weights"),
    ],
)
def test_a_value_count_the_head_does_not_read_is_an_error(head, values, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        read_reward(head, values)


# --- the head options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "dpo", "ref_free": "avg", "head": "classifier"},
         "head: only for kind classifier (a reward head); drop --head or use --kind classifier"),
        ({"kind": "judge", "label_index": 1, "head_token_id": 0},
         "label_index / head_token_id: only for kind classifier (a reward head); drop --label-index, --head-token-id "
         "or use --kind classifier"),
        ({"head": "value"}, "head: 'value' is not one of classifier, multi-label, lm-logit, remote-code, token-value, reward-token, "
                           "mlp-value, value-head, label-distribution"),
        ({"kind": "dpo", "ref_free": "avg", "trust_remote_code": True},
         "trust_remote_code: only for kind classifier (a reward head); drop --trust-remote-code or use --kind "
         "classifier"),
        ({"trust_remote_code": "yes"}, "trust_remote_code: 'yes' must be true or false"),
        ({"label_index": -1}, "label_index: -1 must be an integer ≥ 0"),
        ({"head": "lm-logit", "head_token_id": -2}, "head_token_id: -2 must be an integer ≥ 0"),
        ({"label_index": 0, "label_weights": "1,2"},
         "label_index / label_weights: give one: --label-index I reads one label, --label-weights w1,... their "
         "weighted sum"),
        ({"label_weights": "1,,2"}, "label_weights: '1,,2' must be numbers separated by commas (e.g. 0.5,0.3,0.2)"),
        ({"label_weights": "1,x"}, "label_weights: weight 1 ('x') of '1,x' is not a number"),
        ({"label_weights": "1,nan"}, "label_weights: weight 1 ('nan') of '1,nan' must be finite"),
        ({"head": "classifier", "label_index": 0},
         "label_index: only for the multi-label head (num_labels > 1); --head classifier reads one label"),
        ({"head": "lm-logit", "label_weights": "1"},
         "label_weights: only for the multi-label head (num_labels > 1); --head lm-logit reads one vocabulary logit"),
        ({"head_token_id": 0}, "head_token_id: only with --head lm-logit (a causal LM read at one vocabulary logit)"),
    ],
)
def test_bad_head_options_are_refused_naming_the_field(options, message):
    with pytest.raises(ValueError) as info:
        EngineConfig(model="m", **options)
    assert str(info.value) == message


def test_the_head_options_become_head_settings():
    assert EngineConfig(model="m").head_settings == HeadSettings()
    config = EngineConfig(model="m", label_weights=" 0.5, 1 ,-2")
    assert config.head_settings == HeadSettings(label_weights=(0.5, 1.0, -2.0))
    assert EngineConfig(model="m", head="lm-logit", head_token_id=7).head_settings == HeadSettings("lm-logit", token_id=7)


def _config_folder(tmp_path: Path, config: dict, name: str = "rm") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_start_check_names_the_model_and_returns_the_head(tmp_path):
    folder = _config_folder(tmp_path, NAMED)
    assert check_reward_head(str(folder), HeadSettings(label_index=1)) == RewardHead("multi-label", label_index=1)
    with pytest.raises(ServerFault) as info:
        check_reward_head(str(folder))
    assert str(info.value) == (
        f"{str(folder)!r} has 3 labels (num_labels/id2label: 0 helpfulness, 1 correctness, 2 coherence); rmserve reads "
        "one reward from them: give --label-index I (0 ≤ I < 3) for one label, or --label-weights w1,...,w3 for their "
        "weighted sum"
    )


# --- swaps keep the head ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "settings", "served", "problem"),
    [
        (CLASSIFIER, HeadSettings(), RewardHead("classifier"), None),
        (THREE, HeadSettings(label_index=1), RewardHead("multi-label", label_index=1), None),
        (THREE, HeadSettings(), RewardHead("classifier"),
         "has 3 labels (num_labels/id2label), so the multi-label head; the served model has the classifier head, and "
         "a swap keeps the head (the fingerprint and what the rewards mean); start a server on this checkpoint instead"),
        (CLASSIFIER, HeadSettings(label_weights=(1.0, -1.0)), RewardHead("multi-label", label_weights=(1.0, -1.0)),
         "has 1 label (num_labels/id2label), so the classifier head; the served model has the multi-label (weights "
         "1, -1) head, and a swap keeps the head (the fingerprint and what the rewards mean); start a server on this "
         "checkpoint instead"),
        ({"architectures": ["LlamaForSequenceClassification"], "num_labels": 2}, HeadSettings(label_index=2),
         RewardHead("multi-label", label_index=2),
         "has 2 labels (num_labels/id2label); --label-index 2 is out of range (0 … 1)"),
        (CLASSIFIER, HeadSettings(choice="lm-logit"), RewardHead("lm-logit", token_id=0),
         "has architectures ['LlamaForSequenceClassification']; the lm-logit head reads the LM head of a causal LM "
         "(*ForCausalLM or *LMHeadModel); a *ForSequenceClassification is served with the classifier or multi-label "
         "head (leave out --head)"),
    ],
)
def test_a_swap_keeps_the_served_head(config, settings, served, problem):
    assert swap_head_problem(config, settings, served) == problem


def test_a_head_change_names_both_heads():
    assert head_change(RewardHead("lm-logit", token_id=0), RewardHead("lm-logit", token_id=5)) == (
        "has the lm-logit (token id 5) head; the served model has the lm-logit (token id 0) head, and a swap keeps "
        "the head (the fingerprint and what the rewards mean); start a server on this checkpoint instead"
    )
    assert head_change(RewardHead("classifier"), RewardHead("classifier")) is None


# --- the fingerprint -------------------------------------------------------------------------


DEFAULT_FINGERPRINT = "49cd52fdd2c84d1c"
"""``model_fingerprint(folder, "TEMPLATE", "float32")`` of :func:`_fingerprint_folder`, computed by
rmserve before heads were recorded (commit 08dddba): a default classifier must keep it."""

NO_TEMPLATE_FINGERPRINT = "97083b140ecce35f"
"""The same folder's ``model_fingerprint(folder, None)`` before heads were recorded."""


def _fingerprint_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "fp"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}\n')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}\n')
    return folder


def test_a_default_classifier_keeps_its_fingerprint_from_before_heads(tmp_path):
    folder = _fingerprint_folder(tmp_path)
    assert model_fingerprint(folder, "TEMPLATE", "float32") == DEFAULT_FINGERPRINT
    assert model_fingerprint(folder, "TEMPLATE", "float32", RewardHead("classifier")) == DEFAULT_FINGERPRINT
    assert model_fingerprint(folder, None) == model_fingerprint(folder, None, None, RewardHead("classifier")) == NO_TEMPLATE_FINGERPRINT


def test_the_fingerprint_covers_the_head_and_its_settings(tmp_path):
    folder = _fingerprint_folder(tmp_path)
    heads = {
        RewardHead("multi-label", label_index=1): "1150f0996bf89112",
        RewardHead("multi-label", label_weights=(0.5, 1.0, -2.0)): "810d11bfb72678ef",
        RewardHead("lm-logit", token_id=0): "e19929373fc9fb30",
    }
    assert {head: model_fingerprint(folder, "TEMPLATE", "float32", head) for head in heads} == heads
    others = {
        model_fingerprint(folder, "TEMPLATE", "float32", head)
        for head in (RewardHead("multi-label", label_index=2), RewardHead("multi-label", label_weights=(0.5, 1.0, 2.0)),
                     RewardHead("lm-logit", token_id=1))
    }
    assert len(others | set(heads.values()) | {DEFAULT_FINGERPRINT}) == 7  # every setting changes it
    # a weight is hashed as a float: 1 and 1.0 are one weight
    assert model_fingerprint(folder, "TEMPLATE", "float32", RewardHead("multi-label", label_weights=(0.5, 1, -2))) == (
        heads[RewardHead("multi-label", label_weights=(0.5, 1.0, -2.0))])


def test_code_files_enter_the_fingerprint_of_the_heads_that_run_them(tmp_path):
    folder = _fingerprint_folder(tmp_path)
    heads = (RewardHead("remote-code"), RewardHead("reward-token", token_id=6), RewardHead("token-value"))
    before = [model_fingerprint(folder, "TEMPLATE", "float32", head) for head in heads]
    (folder / "configuration_x.py").write_text("# the checkpoint's own code\n")
    after = [model_fingerprint(folder, "TEMPLATE", "float32", head) for head in heads]
    # remote-code runs its model class, reward-token its config class; vLLM runs no code of a token-value folder
    assert [b != a for b, a in zip(before, after, strict=True)] == [True, True, False]


OLD_RECORD_LINE = (
    b'{"benchmark":"rm-bench","domain":"chat","id":"1","num_chosen":1,"rewards":[0.5,-0.25],'
    b'"num_tokens":[12,11],"num_cached_tokens":[0,8],"model":"rm","fingerprint":"49cd52fdd2c84d1c"}\n'
)
"""A score file line written by rmserve before heads were recorded (no ``scorer``)."""


def test_a_score_file_from_before_heads_resumes_under_the_default_classifier(tmp_path):
    folder = _fingerprint_folder(tmp_path)
    path = tmp_path / "scores.jsonl"
    path.write_bytes(OLD_RECORD_LINE)
    served = model_fingerprint(folder, "TEMPLATE", "float32", RewardHead("classifier"))
    group = Group("rm-bench", "chat", "2", (Message("user", "hi"),), ("a", "b"), 1)
    result = GroupResult(id="rm-bench/chat/2", rewards=(1.0, 2.0), num_tokens=(5, 6), num_cached_tokens=(0, 4))
    scorer = Scorer(engine="vllm", attention="CPU_ATTN", head=RewardHead("classifier"))
    with ScoreFileWriter(path) as writer:
        assert writer.check_model(model="rm", fingerprint=served) is False  # resumed, nothing discarded
        assert writer.scored_keys() == {GroupKey("rm-bench", "chat", "1")}
        writer.append(record_from_result(group, result, model="rm", fingerprint=served, scorer=scorer))
    records = read_scores(path).records
    assert [r.scorer for r in records] == [None, scorer]
    assert path.read_bytes().startswith(OLD_RECORD_LINE)
    assert path.read_bytes()[len(OLD_RECORD_LINE):].endswith(
        b',"scorer":{"engine":"vllm","attention":"CPU_ATTN","head":{"name":"classifier"}}}\n')


# --- the records ------------------------------------------------------------------------------


def test_model_info_and_records_say_what_scored():
    info = ModelInfo(name="rm", max_model_len=8, dtype="float32", fingerprint="f", engine="hf",
                     head=RewardHead("multi-label", label_weights=(0.5, 0.5)), attention="sdpa")
    assert msgspec.json.encode(info).endswith(
        b'"compat":"none","head":{"name":"multi-label","label_weights":[0.5,0.5]},"attention":"sdpa"}')
    assert info.scorer() == Scorer(engine="hf", attention="sdpa", head=RewardHead("multi-label", label_weights=(0.5, 0.5)))
    no_attention = msgspec.structs.replace(info, attention=msgspec.UNSET)
    assert no_attention.scorer() == Scorer(engine="hf", attention="unknown", head=info.head)
    bare = ModelInfo(name="rm", max_model_len=8, dtype="float32", fingerprint="f", engine="fake")
    assert bare.scorer() is None
    record = ScoreRecord("rm-bench", "chat", "1", 1, (1.0,), scorer=info.scorer())
    assert msgspec.json.decode(encode(record), type=ScoreRecord) == record
    assert RewardHead("multi-label", label_index=2).describe() == "multi-label (label 2)"


# --- before an engine starts ------------------------------------------------------------------


def test_serve_refuses_a_multi_label_folder_without_a_label_rule(tmp_path):
    from rmserve.cli import app

    folder = _config_folder(tmp_path, THREE, "three-labels")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    result = CliRunner().invoke(app, ["serve", str(folder)], env={"COLUMNS": "400"}, terminal_width=400)
    assert result.exit_code == 2
    assert ("Error: Invalid value for 'MODEL': checkpoint 'three-labels/config.json': has 3 labels (num_labels/id2label); rmserve reads one "
            "reward from them: give --label-index I (0 ≤ I < 3) for one label, or --label-weights w1,...,w3 for their "
            "weighted sum") in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["serve", str(folder), "--label-index", "3"], env={"COLUMNS": "400"},
                                terminal_width=400)
    assert result.exit_code == 2
    assert "has 3 labels (num_labels/id2label); --label-index 3 is out of range (0 … 2)" in " ".join(result.output.split())


# --- the tensors a head reads ----------------------------------------------------------------


def _safetensors_file(path: Path, names: list[str]) -> None:
    """A safetensors file as the format defines it (8 bytes of little-endian header length, the
    JSON header, the data), one float32 each, written without torch or safetensors."""
    import struct

    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * len(names)))


def test_the_tensor_names_are_read_from_the_headers_or_the_index(tmp_path):
    from rmserve.server.config import checkpoint_weight_names

    one = tmp_path / "one"
    one.mkdir()
    _safetensors_file(one / "model-00001-of-00002.safetensors", ["model.embed_tokens.weight", "score.0.weight"])
    _safetensors_file(one / "model-00002-of-00002.safetensors", ["score.0.bias"])
    assert checkpoint_weight_names(str(one)) == {"model.embed_tokens.weight", "score.0.weight", "score.0.bias"}
    (one / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "x.safetensors", "b": "y"}}))
    assert checkpoint_weight_names(str(one)) == {"a", "b"}  # the index, when there is one
    assert checkpoint_weight_names(str(tmp_path / "missing")) is None
    assert checkpoint_weight_names("org/a-hub-id") is None
    (tmp_path / "empty").mkdir()
    assert checkpoint_weight_names(str(tmp_path / "empty")) is None  # no safetensors: not checked before the load
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x05")
    assert checkpoint_weight_names(str(tmp_path / "bad")) is None
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\xff" * 64)  # a header longer than the file
    assert checkpoint_weight_names(str(tmp_path / "bad")) is None


def test_an_mlp_score_head_is_read_only_by_the_head_that_reads_it():
    from rmserve.server.kinds.heads import mlp_score_problem

    mlp = frozenset(["model.norm.weight", *MLP_TENSORS])
    assert mlp_score_problem(RewardHead("mlp-value"), mlp) is None
    assert mlp_score_problem(RewardHead("classifier"), mlp) == (
        "has a two-layer MLP score head (score.0.weight, score.0.bias, score.2.weight, score.2.bias) and no "
        "score.weight, which the classifier head reads (transformers would initialise it at random): serve it with "
        "--head mlp-value --engine hf")
    assert mlp_score_problem(RewardHead("multi-label", label_index=0), mlp).startswith("has a two-layer MLP score head")
    assert mlp_score_problem(RewardHead("classifier"), mlp | {"score.weight"}) is None  # a score head as well
    assert mlp_score_problem(RewardHead("classifier"), frozenset(["score.weight"])) is None
    assert mlp_score_problem(RewardHead("mlp-value"), frozenset(["score.weight", "score.0.weight"])) == (
        "has no score.0.bias, score.2.weight, score.2.bias; the mlp-value head reads a two-layer MLP score head "
        "(score.0.weight, score.0.bias, score.2.weight, score.2.bias)")
    assert mlp_score_problem(RewardHead("mlp-value"), None) is None  # names unknown (a hub id): checked at load
    assert mlp_score_problem(RewardHead("lm-logit", token_id=0), mlp) is None
    grm = frozenset(["model.norm.weight", "v_head.summary.0.weight", "v_head.summary.0.bias"])
    assert mlp_score_problem(RewardHead("value-head"), grm) is None
    assert mlp_score_problem(RewardHead("classifier"), grm) == (
        "has a value head (v_head.summary.*) and no score.weight, which the classifier head reads (transformers would "
        "initialise it at random): serve it with --head value-head --engine hf")
    assert mlp_score_problem(RewardHead("value-head"), mlp) == (
        "has no v_head.summary.* tensors; the value-head head reads a value head of that name (GRM's)")


def test_a_refused_head_names_the_head_its_config_or_files_give(tmp_path):
    from rmserve.server.kinds.heads import head_hint

    grm = {"architectures": ["GRewardModel"]}
    assert head_hint("has architectures ['GRewardModel']; the mlp-value head reads …", grm,
                     HeadSettings(choice="mlp-value"), None) == "; its config gives the value-head head: leave out --head"
    # the message already names the head to use: nothing added
    assert head_hint("has 3 labels …: serve it with --head multi-label and …", THREE, HeadSettings(choice="classifier"),
                     None) == ""
    decoder = {"architectures": ["Gemma2Model"]}
    assert head_hint("has architectures ['Gemma2Model'] …", decoder, HeadSettings(), tmp_path) == ""
    for name in ("regression_layer.pt", "gating_layer.pt"):
        (tmp_path / name).write_bytes(b"")
    assert head_hint("has architectures ['Gemma2Model'] …", decoder, HeadSettings(), tmp_path) == (
        "; regression_layer.pt and gating_layer.pt lie beside it: add --head label-distribution")
    assert head_hint("has architectures ['Gemma2Model'] …", decoder, HeadSettings(), None) == ""  # a hub id: unknown
