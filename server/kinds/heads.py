"""The reward heads of a sequence classifier: which head of a checkpoint the reward is read
from, which engines serve it, and how the reward is read.

A head is found from the checkpoint's config (its ``architectures`` and label count), or named
with ``--head``; :data:`HEADS` is the registry (one :class:`HeadRule` per head, the table of
``docs/kinds.md``):

====================  ==============================================  ===========  ==================================
head                  checkpoint                                      engines      reward
====================  ==============================================  ===========  ==================================
``classifier``        ``*ForSequenceClassification``, 1 label         vllm, hf     ``logits[0]`` at the last token
``multi-label``       ``*ForSequenceClassification``, ``num_labels``  vllm, hf     ``logits[I]`` (``--label-index``) or
                      > 1                                                          Σ wᵢ·logitsᵢ (``--label-weights``)
``lm-logit``          ``*ForCausalLM`` (only with ``--head``)         vllm, hf     the LM-head logit of vocabulary id
                                                                                   ``--head-token-id`` (default 0) at
                                                                                   the last position
``remote-code``       its own modeling code (``auto_map`` for         hf           the model's output: ``score``
                      ``AutoModelForSequenceClassification``), run                  (gated multi-objective), else its
                      only with ``--trust-remote-code``                            one logit; ``rewards`` → extras
``token-value``       ``Qwen2ForRewardModel`` (a value per token:     vllm         the value at the last token
                      an MLP score head at every position)
``reward-token``      ``InternLM2ForRewardModel`` (a value per        vllm         the value at the reward token
                      token; ``reward_token_id`` in its config;                    ``reward_token_id``, appended to
                      its config class is its own code:                            every sequence
                      ``--trust-remote-code``)
``mlp-value``         ``INFORMForSequenceClassification`` (an MLP     hf           ``W₂·relu(W₀·h + b₀) + b₂`` at the
                      score head ``score.0``/``score.2``, no code                  last token
                      shipped: INF-ORM's card gives the class)
``value-head``        ``GRewardModel`` (a decoder and a value head    hf           the value head's output at the
                      ``v_head.summary``: linear layers, ReLU                      last token
                      between; GRM's class is the official
                      harness's code)
``label-distribution``  a decoder beside ``regression_layer.pt`` and  hf           Σₖ bₖ·(Σⱼ gⱼ·pⱼₖ): the expected
                      ``gating_layer.pt`` (LDL-Reward; only with                   score (bins bₖ from 0 to 1) of
                      ``--head``)                                                  the gated mixture of the
                                                                                   objectives' score distributions
====================  ==============================================  ===========  ==================================

:func:`resolve_head` turns a config and the server's :class:`HeadSettings` into the served
:class:`~rmserve.schema.RewardHead` or a :class:`HeadProblem` whose message starts with
``has`` (the start checks prefix the model, the swap checks the folder's ``config.json``);
:func:`read_reward` reads one reward from an engine's per-label values. A causal LM is never
taken for an ``lm-logit`` head unless asked: any causal LM has an LM head, and most are
policies, not reward models. A checkpoint that ships its own reward model class is served by
that code only when the server was started with ``--trust-remote-code`` (it runs the folder's
Python files); without it the start, or a swap, is refused naming the flag.

No torch, no transformers: the CLI, the swap checks and both engines use this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmserve.schema import (
    CLASSIFIER_HEAD,
    CLASSIFIER_REWARD_HEAD,
    HEAD_NAMES,
    LM_LOGIT_HEAD,
    MULTI_LABEL_HEAD,
    REMOTE_CODE_HEAD,
    TOKEN_VALUE_HEAD,
    REWARD_TOKEN_HEAD,
    MLP_VALUE_HEAD,
    VALUE_HEAD,
    LABEL_DISTRIBUTION_HEAD,
    HeadName,
    RewardHead,
)

CAUSAL_LM_SUFFIXES: tuple[str, ...] = ("ForCausalLM", "LMHeadModel")
"""Architecture name endings of a causal LM with an LM head (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""

CLASSIFIER_SUFFIX = "ForSequenceClassification"
"""Architecture name ending of a sequence classifier (``LlamaForSequenceClassification``)."""

TRANSFORMERS_DEFAULT_NUM_LABELS = 2
"""What transformers' ``PretrainedConfig`` assumes when a config names neither ``id2label`` nor ``num_labels``."""

DEFAULT_HEAD_TOKEN_ID = 0
"""The vocabulary id an ``lm-logit`` head reads when ``--head-token-id`` is not given (the id
Llama-3.1-Nemotron-70B-Reward-HF's card reads)."""

REMOTE_CLASSIFIER_KEY = "AutoModelForSequenceClassification"
"""The ``auto_map`` entry of a checkpoint whose reward model class is its own code
(``"modeling_x.MyRewardModel"``), as ArmoRM-Llama3-8B-v0.1 ships it."""

TOKEN_VALUE_ARCHITECTURES: tuple[str, ...] = ("Qwen2ForRewardModel",)
"""Architectures whose model gives one value per token (vLLM's ``token_classify`` task), the
sequence's reward being the last token's: the ``token-value`` head. vLLM implements them; the
per-token output is asked to read the prefix cache (it then holds the computed positions only, the
last one the last token's: :func:`~rmserve.server.engines.vllm_compat.pooling_params`)."""

REWARD_TOKEN_ARCHITECTURES: tuple[str, ...] = ("InternLM2ForRewardModel",)
"""Architectures whose reward is a per-token value read at a reward token the scorer appends to
every sequence (``reward_token_id`` in the config; InternLM2's reward models append it in their
``get_score``): the ``reward-token`` head. Without the token the value is read at the
conversation's last token, a silently wrong reward."""

MLP_VALUE_ARCHITECTURES: tuple[str, ...] = ("INFORMForSequenceClassification",)
"""Architectures of a classifier whose score head is a two-layer MLP (``score.0``: hidden →
hidden, ReLU, ``score.2``: hidden → 1, both with bias) read at the last token, for which the
checkpoint ships no code (INF-ORM-Llama3.1-70B: its card and reward-bench's
``rewardbench/models/inform.py`` define the class over ``LlamaModel``): the ``mlp-value`` head.
transformers' own ``*ForSequenceClassification`` would find no ``score.weight`` in such a
checkpoint and initialise one at random, a silently wrong reward."""

MLP_SCORE_WEIGHTS: tuple[str, ...] = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")
"""The tensors of an ``mlp-value`` head's MLP, as the checkpoint names them."""

VALUE_HEAD_ARCHITECTURES: tuple[str, ...] = ("GRewardModel",)
"""Architectures of a decoder with a value head ``v_head.summary`` read at the last token (the GRM
reward models, Ray2333/GRM-*: allenai/reward-bench ``rewardbench/models/grm.py`` defines the
class, a causal LM's decoder and ``ValueHead``; the checkpoints ship no code): the
``value-head`` head."""

LABEL_DISTRIBUTION_FILES: tuple[str, ...] = ("regression_layer.pt", "gating_layer.pt")
"""The files of a ``label-distribution`` head beside its decoder (LDL-Reward-Gemma-2-27B-v0.1, per
allenai/reward-bench ``rewardbench/models/ldlreward.py``): the state dicts of its regression layers
(``network.N``: linear layers, LeakyReLU between; one score distribution of
:data:`LABEL_DISTRIBUTION_BINS` bins per objective) and of its gating layers (one weight per
objective)."""

LABEL_DISTRIBUTION_BINS = 10
"""Bins of each objective's score distribution in a ``label-distribution`` head; bin k stands
for the score k / (bins − 1)."""

VALUE_HEAD_PREFIX = "v_head.summary."
"""The name prefix of a ``value-head`` head's tensors: ``v_head.summary.weight``/``.bias`` (one
linear layer) or ``v_head.summary.{0,2,4,…}.weight``/``.bias`` (linear layers, a ReLU between
each two)."""

PER_TOKEN_HEADS: tuple[HeadName, ...] = (TOKEN_VALUE_HEAD, REWARD_TOKEN_HEAD)
"""Heads read from a per-token output (vLLM's ``token_classify`` task, its last row) of an
architecture vLLM implements as a pooling model: nothing is converted at load."""

OBJECTIVES_EXTRA = "objective_{index}"
"""Extras name of a ``remote-code`` model's per-objective rewards (its output's ``rewards``,
one column per objective): ``objective_0``, ``objective_1``, …"""

LOGIT_TRANSFORM_KEYS: tuple[str, ...] = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config keys of models that transform their LM-head logits after the projection (Gemma 2/3
soft-capping, Cohere and Granite scaling). An ``lm-logit`` head reads the raw projection
``hidden · W[id]`` (vLLM's converted score head computes exactly that), so such a model is refused
rather than scored off its own logits."""


@dataclass(frozen=True)
class HeadRule:
    """One head of the registry (:data:`HEADS`).

    Attributes:
        name: the head (``--head NAME``).
        checkpoint: which checkpoints have it (architecture and config markers), in words.
        engines: the engines that serve it (registered names).
        reward: how the reward is read, in words.
        examples: public reward models of this head.
        detected: whether it is found from the config alone (else only with ``--head``).
    """

    name: HeadName
    checkpoint: str
    engines: tuple[str, ...]
    reward: str
    examples: tuple[str, ...]
    detected: bool = True


HEADS: dict[HeadName, HeadRule] = {
    CLASSIFIER_HEAD: HeadRule(
        CLASSIFIER_HEAD,
        "a *ForSequenceClassification with one label",
        ("vllm", "hf"),
        "the label's logit at the last token (no activation)",
        ("Skywork-Reward-V2-Llama-3.1-8B", "Skywork-Reward-V2-Qwen3-8B"),
    ),
    MULTI_LABEL_HEAD: HeadRule(
        MULTI_LABEL_HEAD,
        "a *ForSequenceClassification with num_labels > 1",
        ("vllm", "hf"),
        "one label's logit at the last token (--label-index I) or the weighted sum of the labels' logits "
        "(--label-weights w1,...)",
        ("attribute reward models (helpfulness, correctness, ...)",),
    ),
    LM_LOGIT_HEAD: HeadRule(
        LM_LOGIT_HEAD,
        "a *ForCausalLM, named with --head lm-logit",
        ("vllm", "hf"),
        "the LM-head logit of one vocabulary id (--head-token-id N, default 0) at the last position "
        "(vLLM: the LM-head row becomes a one-label score head at load)",
        ("Llama-3.1-Nemotron-70B-Reward-HF",),
        detected=False,
    ),
    REMOTE_CODE_HEAD: HeadRule(
        REMOTE_CODE_HEAD,
        f"a checkpoint with its own modeling code (auto_map: {REMOTE_CLASSIFIER_KEY}), with --trust-remote-code",
        ("hf",),
        "the model's own output at the sequence: its score (a gated sum of objective rewards) when it returns one, "
        "else its one logit; per-objective rewards (its rewards output) kept as extras objective_0, objective_1, ...",
        ("ArmoRM-Llama3-8B-v0.1", "QRM-Llama3.1-8B", "GRM-Llama3-8B-rewardmodel-ft"),
    ),
    TOKEN_VALUE_HEAD: HeadRule(
        TOKEN_VALUE_HEAD,
        f"a per-token value model ({', '.join(TOKEN_VALUE_ARCHITECTURES)})",
        ("vllm",),
        "the head's value at the last token (vLLM's token_classify output, its last row; the prompt read from the "
        "prefix cache)",
        ("Qwen2.5-Math-RM-72B",),
    ),
    REWARD_TOKEN_HEAD: HeadRule(
        REWARD_TOKEN_HEAD,
        f"a per-token value model read at a reward token ({', '.join(REWARD_TOKEN_ARCHITECTURES)}, reward_token_id)",
        ("vllm",),
        "the head's value at the reward token (reward_token_id), appended to every sequence (vLLM's token_classify "
        "output, its last row; the prompt read from the prefix cache)",
        ("internlm2-7b-reward", "internlm2-20b-reward"),
    ),
    MLP_VALUE_HEAD: HeadRule(
        MLP_VALUE_HEAD,
        f"a classifier whose score head is a two-layer MLP ({', '.join(MLP_VALUE_ARCHITECTURES)}: score.0, ReLU, "
        "score.2), shipping no code for it",
        ("hf",),
        "the MLP's value at the last token: W2 relu(W0 h + b0) + b2, the decoder and both layers from the "
        "checkpoint's tensors",
        ("INF-ORM-Llama3.1-70B",),
    ),
    VALUE_HEAD: HeadRule(
        VALUE_HEAD,
        f"a decoder with a value head ({', '.join(VALUE_HEAD_ARCHITECTURES)}: {VALUE_HEAD_PREFIX}* tensors, linear "
        "layers with ReLU between), shipping no code for it",
        ("hf",),
        "the value head's output at the last token, the decoder and the head from the checkpoint's tensors",
        ("GRM-llama3-8B-sftreg", "GRM-Gemma2-2B-sftreg", "GRM-llama3.2-3B-sftreg"),
    ),
    LABEL_DISTRIBUTION_HEAD: HeadRule(
        LABEL_DISTRIBUTION_HEAD,
        f"a decoder beside {' and '.join(LABEL_DISTRIBUTION_FILES)} (LDL-Reward), named with --head "
        f"{LABEL_DISTRIBUTION_HEAD}",
        ("hf",),
        "the expected score (bins from 0 to 1) of the objectives' score distributions mixed by the gate, at the last "
        "token",
        ("LDL-Reward-Gemma-2-27B-v0.1",),
        detected=False,
    ),
}
"""Head name → its rule, in :data:`~rmserve.schema.HEAD_NAMES` order."""

assert tuple(HEADS) == HEAD_NAMES


@dataclass(frozen=True)
class HeadSettings:
    """What a server was asked about heads (``EngineConfig``: ``--head``, ``--label-index``,
    ``--label-weights``, ``--head-token-id``); checked against a checkpoint by :func:`resolve_head`.

    Attributes:
        choice: the head named with ``--head``; None = found from the config.
        label_index: the label read, for a multi-label head.
        label_weights: the weights of the labels' sum, for a multi-label head.
        token_id: the vocabulary id read, for an ``lm-logit`` head (None = :data:`DEFAULT_HEAD_TOKEN_ID`).
        trust_remote_code: ``--trust-remote-code``: a checkpoint's own modeling code may run
            (the ``remote-code`` head); off, such a checkpoint is refused naming the flag.
    """

    choice: HeadName | None = None
    label_index: int | None = None
    label_weights: tuple[float, ...] | None = None
    token_id: int | None = None
    trust_remote_code: bool = False


class HeadProblem(ValueError):
    """A checkpoint's config and the head settings do not give a head rmserve serves; the
    message starts with ``has`` (the caller prefixes the model or file it names)."""


def is_causal_lm_architecture(name: object) -> bool:
    """True for an architecture name ending in one of :data:`CAUSAL_LM_SUFFIXES`."""
    return isinstance(name, str) and name.endswith(CAUSAL_LM_SUFFIXES)


def is_classifier_architecture(name: object) -> bool:
    """True for an architecture name ending in :data:`CLASSIFIER_SUFFIX`."""
    return isinstance(name, str) and name.endswith(CLASSIFIER_SUFFIX)


def num_labels(config: Mapping[str, Any]) -> int:
    """The number of labels transformers gives a model with this config (``config.json``
    content, or ``AutoConfig(...).to_dict()``).

    ``len(id2label)`` when ``id2label`` is a mapping (transformers derives ``num_labels`` from it;
    an ``AutoConfig``'s ``to_dict()`` always holds it), else ``num_labels``, else
    :data:`TRANSFORMERS_DEFAULT_NUM_LABELS`.
    """
    id2label = config.get("id2label")
    if isinstance(id2label, dict):
        return len(id2label)
    value = config.get("num_labels")
    return int(value) if isinstance(value, int) else TRANSFORMERS_DEFAULT_NUM_LABELS


def label_names(config: Mapping[str, Any]) -> list[str] | None:
    """The labels' names from ``id2label`` in index order, or None when it has none or only
    transformers' placeholders (``LABEL_0``, ``LABEL_1``, …)."""
    id2label = config.get("id2label")
    if not isinstance(id2label, dict):
        return None
    try:
        names = [str(id2label[key]) for key in sorted(id2label, key=lambda k: int(k))]
    except (TypeError, ValueError):
        return None
    if all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None
    return names


def known_heads() -> str:
    """The heads rmserve knows, in words, for messages (each with the checkpoint it fits)."""
    return "; ".join(f"{rule.name} ({rule.checkpoint})" for rule in HEADS.values())


def remote_classifier(config: Mapping[str, Any]) -> str | None:
    """The class a checkpoint's own code defines for :data:`REMOTE_CLASSIFIER_KEY` in its
    ``auto_map`` (``"modeling_x.MyRewardModel"``, a hub reference ``"repo--modeling_x.C"`` as
    given), or None when it has none."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, Mapping):
        return None
    value = auto_map.get(REMOTE_CLASSIFIER_KEY)
    if isinstance(value, (list, tuple)):  # [model class, None] in some configs
        value = next((v for v in value if isinstance(v, str)), None)
    return value if isinstance(value, str) and value else None


def detect_head(config: Mapping[str, Any]) -> HeadName | None:
    """The head found from the config alone: ``remote-code`` for a checkpoint whose
    ``auto_map`` names its own :data:`REMOTE_CLASSIFIER_KEY` class (served only with
    ``--trust-remote-code``), ``classifier`` for a ``*ForSequenceClassification`` with one
    label, ``multi-label`` with more; None for anything else (a causal LM is an ``lm-logit``
    head only when named with ``--head``)."""
    if remote_classifier(config) is not None:
        return REMOTE_CODE_HEAD
    architectures = list(config.get("architectures") or [])
    if any(a in TOKEN_VALUE_ARCHITECTURES for a in architectures):
        return TOKEN_VALUE_HEAD
    if any(a in REWARD_TOKEN_ARCHITECTURES for a in architectures):
        return REWARD_TOKEN_HEAD
    if any(a in MLP_VALUE_ARCHITECTURES for a in architectures):
        return MLP_VALUE_HEAD
    if any(a in VALUE_HEAD_ARCHITECTURES for a in architectures):
        return VALUE_HEAD
    if not any(is_classifier_architecture(a) for a in architectures):
        return None
    return CLASSIFIER_HEAD if num_labels(config) == 1 else MULTI_LABEL_HEAD


def _vocab_size(config: Mapping[str, Any]) -> int | None:
    for source in (config, config.get("text_config") or {}):
        value = source.get("vocab_size") if isinstance(source, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def resolve_head(config: Mapping[str, Any], settings: HeadSettings = HeadSettings()) -> RewardHead:
    """The head a model with this config is served with under ``settings``.

    Rules: with ``settings.choice`` None the head is :func:`detect_head`'s; a named head must fit
    the checkpoint (``classifier``: a one-label ``*ForSequenceClassification``;
    ``multi-label``: one with ``num_labels`` > 1; ``lm-logit``: a causal LM whose logits are
    not transformed after the projection, :data:`LOGIT_TRANSFORM_KEYS`). A multi-label head
    needs exactly one of ``label_index`` (0 ≤ I < num_labels) and ``label_weights`` (one per
    label); an ``lm-logit`` head's token id must be below ``vocab_size``.

    Args:
        config: the model config as a mapping (``config.json`` content or ``AutoConfig.to_dict()``).
        settings: what the server was asked.

    Returns:
        The :class:`~rmserve.schema.RewardHead` (:data:`~rmserve.schema.CLASSIFIER_REWARD_HEAD` for the
            one-label classifier).

    Raises:
        HeadProblem: the message starts with ``has``, names what was found (architectures, label
            count, vocabulary size), the rule and the fix (the heads rmserve knows and
            ``--head`` for an unknown head; ``--label-index`` / ``--label-weights`` for several
            labels; the label count for an index out of range).
    """
    architectures = list(config.get("architectures") or [])
    name = settings.choice or detect_head(config)
    if name is None:
        raise HeadProblem(_unknown_head(architectures, config))
    if name == LM_LOGIT_HEAD:
        return _lm_logit_head(architectures, config, settings)
    if name == REMOTE_CODE_HEAD:
        return _remote_code_head(architectures, config, settings)
    if name == TOKEN_VALUE_HEAD:
        return _token_value_head(architectures, config, settings)
    if name == REWARD_TOKEN_HEAD:
        return _reward_token_head(architectures, config, settings)
    if name == MLP_VALUE_HEAD:
        return _mlp_value_head(architectures, settings)
    if name in (VALUE_HEAD, LABEL_DISTRIBUTION_HEAD):
        _refuse_settings(settings, f"has a {'value' if name == VALUE_HEAD else 'label-distribution'} head whose one "
                         "value is the reward", name)
        return RewardHead(name)
    if not any(is_classifier_architecture(a) for a in architectures):
        hint = (
            f"; for a causal LM whose reward is one LM-head logit use --head {LM_LOGIT_HEAD}"
            if any(is_causal_lm_architecture(a) for a in architectures) else ""
        )
        raise HeadProblem(
            f"has architectures {architectures!r}; the {name} head needs a *ForSequenceClassification{hint}"
        )
    labels = num_labels(config)
    if name == CLASSIFIER_HEAD:
        if labels != 1:
            raise HeadProblem(
                f"has {labels_found(config)}; the {CLASSIFIER_HEAD} head reads exactly 1: serve it with --head "
                f"{MULTI_LABEL_HEAD} and --label-index I or --label-weights w1,...,w{labels}"
            )
        if settings.label_index is not None or settings.label_weights is not None:
            raise HeadProblem(
                f"has {labels_found(config)}: its logit is the reward; --label-index and --label-weights are for a "
                f"{MULTI_LABEL_HEAD} head (num_labels > 1): drop them"
            )
        return CLASSIFIER_REWARD_HEAD
    return _multi_label_head(config, labels, settings)


def _unknown_head(architectures: list[str], config: Mapping[str, Any]) -> str:
    """The problem of a config whose head is not found, naming the architectures, the heads
    rmserve knows and ``--head``."""
    if any(is_causal_lm_architecture(a) for a in architectures):
        fix = (
            f"a causal LM whose reward is one LM-head logit (as Llama-3.1-Nemotron-70B-Reward-HF) is served "
            f"with --head {LM_LOGIT_HEAD} [--head-token-id N]; to score a DPO policy by its implicit reward use "
            "--kind dpo with --ref-model REF or --ref-free avg|sum|norm"
        )
    elif "auto_map" in config:
        fix = (
            f"it ships its own modeling code (auto_map) but no {REMOTE_CLASSIFIER_KEY} class, which the "
            f"{REMOTE_CODE_HEAD} head runs"
        )
    else:
        fix = "give --head NAME when the checkpoint has one of them"
    return (
        f"has architectures {architectures!r}, whose reward head rmserve does not know; the heads it knows: "
        f"{known_heads()}; {fix}"
    )


def _remote_code_head(architectures: list[str], config: Mapping[str, Any], settings: HeadSettings) -> RewardHead:
    """The ``remote-code`` head: the checkpoint must name its own classifier class in
    ``auto_map`` and the server must trust remote code; no label or token settings apply."""
    target = remote_classifier(config)
    if target is None:
        raise HeadProblem(
            f"has architectures {architectures!r} and no auto_map entry {REMOTE_CLASSIFIER_KEY}; the "
            f"{REMOTE_CODE_HEAD} head runs a checkpoint's own reward model class (leave out --head for a "
            "*ForSequenceClassification)"
        )
    if not settings.trust_remote_code:
        native = (
            f"; or --head {CLASSIFIER_HEAD} / {MULTI_LABEL_HEAD} to read it as transformers' own "
            f"{next(a for a in architectures if is_classifier_architecture(a))} instead (none of its code)"
            if any(is_classifier_architecture(a) for a in architectures) else ""
        )
        raise HeadProblem(
            f"has its own modeling code (auto_map {REMOTE_CLASSIFIER_KEY}: {target}), which rmserve runs only "
            f"when the server is started with --trust-remote-code (it executes the checkpoint's Python files; "
            f"off by default), on the transformers engine (--engine hf: vLLM runs no checkpoint code){native}"
        )
    _refuse_settings(settings, f"has its own reward model class ({target}), whose output is the reward", REMOTE_CODE_HEAD)
    return RewardHead(REMOTE_CODE_HEAD)


def _refuse_settings(settings: HeadSettings, found: str, head: HeadName) -> None:
    """Refuse the label and token options for a head whose model gives the reward itself:
    ``found`` (``has …``) says why, then the options given and ``drop``.

    Raises:
        HeadProblem: any of ``--label-index``, ``--label-weights``, ``--head-token-id`` given.
    """
    given = [flag for flag, value in (("--label-index", settings.label_index), ("--label-weights", settings.label_weights),
                                      ("--head-token-id", settings.token_id)) if value is not None]
    if given:
        raise HeadProblem(
            f"{found}: {', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to the {head} head; drop "
            f"{'it' if len(given) == 1 else 'them'}"
        )


def _token_value_head(architectures: list[str], config: Mapping[str, Any], settings: HeadSettings) -> RewardHead:
    """The ``token-value`` head: one of :data:`TOKEN_VALUE_ARCHITECTURES` with one label; no
    label or token settings apply."""
    if not any(a in TOKEN_VALUE_ARCHITECTURES for a in architectures):
        raise HeadProblem(
            f"has architectures {architectures!r}; the {TOKEN_VALUE_HEAD} head reads a per-token value model "
            f"({', '.join(TOKEN_VALUE_ARCHITECTURES)})"
        )
    labels = num_labels(config)
    if labels != 1:
        raise HeadProblem(f"has {labels_found(config)}; the {TOKEN_VALUE_HEAD} head reads exactly 1 value per token")
    _refuse_settings(settings, f"has a per-token value head ({architectures[0]}) whose last value is the reward", TOKEN_VALUE_HEAD)
    return RewardHead(TOKEN_VALUE_HEAD)


def _reward_token_head(architectures: list[str], config: Mapping[str, Any], settings: HeadSettings) -> RewardHead:
    """The ``reward-token`` head: one of :data:`REWARD_TOKEN_ARCHITECTURES` whose config names a
    ``reward_token_id`` in its vocabulary; a config class of the checkpoint's own code
    (``auto_map`` ``AutoConfig``) needs ``--trust-remote-code``."""
    if not any(a in REWARD_TOKEN_ARCHITECTURES for a in architectures):
        raise HeadProblem(
            f"has architectures {architectures!r}; the {REWARD_TOKEN_HEAD} head reads a model scored at a reward token "
            f"({', '.join(REWARD_TOKEN_ARCHITECTURES)})"
        )
    token = config.get("reward_token_id")
    vocab = _vocab_size(config)
    if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (vocab is not None and token >= vocab):
        where = f" (0 … {vocab - 1})" if vocab is not None else ""
        raise HeadProblem(
            f"has reward_token_id {token!r}; the {REWARD_TOKEN_HEAD} head appends that token to every sequence and "
            f"reads the reward there, so the config must name a token id of its vocabulary{where}"
        )
    _refuse_settings(settings, f"has a reward token (reward_token_id {token}) at which the reward is read", REWARD_TOKEN_HEAD)
    auto_map = config.get("auto_map")
    own_config = auto_map.get("AutoConfig") if isinstance(auto_map, Mapping) else None
    if own_config is not None and not settings.trust_remote_code:
        raise HeadProblem(
            f"has its own configuration class (auto_map AutoConfig: {own_config}), which transformers runs to read "
            "the config and the tokenizer only when the server is started with --trust-remote-code (it executes the "
            "checkpoint's Python files; off by default; vLLM runs the model itself)"
        )
    return RewardHead(REWARD_TOKEN_HEAD, token_id=token)


def _mlp_value_head(architectures: list[str], settings: HeadSettings) -> RewardHead:
    """The ``mlp-value`` head: a ``*ForSequenceClassification`` (found for
    :data:`MLP_VALUE_ARCHITECTURES`, or named with ``--head``); its config's label count does
    not apply (the MLP's last layer has one row, checked on the tensors at load); no label or
    token settings apply."""
    if not any(is_classifier_architecture(a) for a in architectures):
        raise HeadProblem(
            f"has architectures {architectures!r}; the {MLP_VALUE_HEAD} head reads a classifier whose score head is a "
            f"two-layer MLP ({', '.join(MLP_SCORE_WEIGHTS)}), a *ForSequenceClassification"
        )
    _refuse_settings(settings, "has an MLP score head whose one value is the reward", MLP_VALUE_HEAD)
    return RewardHead(MLP_VALUE_HEAD)


def value_head_weights(weight_names: frozenset[str]) -> list[str]:
    """The names of a checkpoint's ``value-head`` tensors (:data:`VALUE_HEAD_PREFIX`), sorted."""
    return sorted(name for name in weight_names if name.startswith(VALUE_HEAD_PREFIX))


def mlp_score_problem(head: RewardHead, weight_names: frozenset[str] | None) -> str | None:
    """Why a checkpoint whose tensors are named ``weight_names`` cannot be served with ``head``
    (None when it can, or when the names are unknown): a ``classifier`` or ``multi-label`` head
    over a checkpoint holding an MLP score head (:data:`MLP_SCORE_WEIGHTS`) and no
    ``score.weight`` (transformers would initialise that one at random), or an ``mlp-value``
    head over a checkpoint without the MLP's tensors; the same for a value head
    (:data:`VALUE_HEAD_PREFIX`) and the ``value-head`` head. The message starts with ``has``."""
    if weight_names is None:
        return None
    mlp = all(name in weight_names for name in MLP_SCORE_WEIGHTS)
    if head.name in (CLASSIFIER_HEAD, MULTI_LABEL_HEAD) and mlp and "score.weight" not in weight_names:
        return (
            f"has a two-layer MLP score head ({', '.join(MLP_SCORE_WEIGHTS)}) and no score.weight, which the "
            f"{head.name} head reads (transformers would initialise it at random): serve it with --head {MLP_VALUE_HEAD} "
            "--engine hf"
        )
    if head.name == MLP_VALUE_HEAD and not mlp:
        missing = [name for name in MLP_SCORE_WEIGHTS if name not in weight_names]
        return f"has no {', '.join(missing)}; the {MLP_VALUE_HEAD} head reads a two-layer MLP score head ({', '.join(MLP_SCORE_WEIGHTS)})"
    value = value_head_weights(weight_names)
    if head.name in (CLASSIFIER_HEAD, MULTI_LABEL_HEAD) and value and "score.weight" not in weight_names:
        return (
            f"has a value head ({VALUE_HEAD_PREFIX}*) and no score.weight, which the {head.name} head reads "
            f"(transformers would initialise it at random): serve it with --head {VALUE_HEAD} --engine hf"
        )
    if head.name == VALUE_HEAD and not value:
        return f"has no {VALUE_HEAD_PREFIX}* tensors; the {VALUE_HEAD} head reads a value head of that name (GRM's)"
    return None


def engine_problem(head: RewardHead, engine: str) -> str | None:
    """Why ``engine`` (a registered engine name) cannot serve ``head``; None when it can
    (:attr:`HeadRule.engines`). Names the engines that can and the flag."""
    engines = HEADS[head.name].engines
    if engine in engines:
        return None
    why = {
        REMOTE_CODE_HEAD: "vLLM does not run a checkpoint's own modeling code",
        TOKEN_VALUE_HEAD: "transformers has no class for the architecture; vLLM implements it",
        REWARD_TOKEN_HEAD: "transformers has no class for the architecture; vLLM implements it",
        MLP_VALUE_HEAD: "vLLM has no MLP score head over a decoder; transformers runs the decoder and the MLP from the "
                        "checkpoint's tensors",
        VALUE_HEAD: "vLLM has no value head over a decoder; transformers runs the decoder and the head from the "
                    "checkpoint's tensors",
        LABEL_DISTRIBUTION_HEAD: "vLLM has no such head over a decoder; transformers runs the decoder and the head "
                                 "from the checkpoint's files",
    }.get(head.name, "the other engines do not read it")
    return f"the {head.name} head is served by the {' or '.join(engines)} engine only ({why}): add --engine {engines[0]}"


def labels_found(config: Mapping[str, Any]) -> str:
    """``3 labels (num_labels/id2label: 0 helpfulness, 1 correctness, 2 coherence)``: the label
    count of a config as messages name it, with the labels' names when ``id2label`` has real ones."""
    labels = num_labels(config)
    names = label_names(config)
    listed = f": {', '.join(f'{i} {n}' for i, n in enumerate(names))}" if names else ""
    return f"{labels} label{'s' if labels != 1 else ''} (num_labels/id2label{listed})"


def _multi_label_head(config: Mapping[str, Any], labels: int, settings: HeadSettings) -> RewardHead:
    found = labels_found(config)
    if labels < 2:
        raise HeadProblem(
            f"has {found}; the {MULTI_LABEL_HEAD} head needs num_labels > 1: serve it with the {CLASSIFIER_HEAD} "
            "head (leave out --head, --label-index and --label-weights)"
        )
    if settings.label_index is None and settings.label_weights is None:
        raise HeadProblem(
            f"has {found}; rmserve reads one reward from them: give --label-index I (0 ≤ I < {labels}) for one "
            f"label, or --label-weights w1,...,w{labels} for their weighted sum"
        )
    if settings.label_index is not None:
        index = settings.label_index
        if not 0 <= index < labels:
            raise HeadProblem(f"has {found}; --label-index {index} is out of range (0 … {labels - 1})")
        return RewardHead(MULTI_LABEL_HEAD, label_index=index)
    weights = tuple(settings.label_weights or ())
    if len(weights) != labels:
        raise HeadProblem(
            f"has {found}; --label-weights gives {len(weights)} weight{'s' if len(weights) != 1 else ''}: it "
            f"needs one per label, {labels}"
        )
    return RewardHead(MULTI_LABEL_HEAD, label_weights=weights)


def _lm_logit_head(architectures: list[str], config: Mapping[str, Any], settings: HeadSettings) -> RewardHead:
    if not any(is_causal_lm_architecture(a) for a in architectures):
        hint = "; a *ForSequenceClassification is served with the classifier or multi-label head (leave out --head)" if any(
            is_classifier_architecture(a) for a in architectures) else ""
        raise HeadProblem(
            f"has architectures {architectures!r}; the {LM_LOGIT_HEAD} head reads the LM head of a causal LM "
            f"(*ForCausalLM or *LMHeadModel){hint}"
        )
    transformed = {key: config[key] for key in LOGIT_TRANSFORM_KEYS if config.get(key) not in (None, 1, 1.0)}
    if transformed:
        detail = ", ".join(f"{k}={v!r}" for k, v in transformed.items())
        raise HeadProblem(
            f"has {detail}: the model transforms its logits after the LM-head projection, and the "
            f"{LM_LOGIT_HEAD} head reads the projection itself (hidden · W[id]); rmserve does not serve it"
        )
    token = DEFAULT_HEAD_TOKEN_ID if settings.token_id is None else settings.token_id
    vocab = _vocab_size(config)
    if vocab is None:
        raise HeadProblem(f"has no vocab_size; the {LM_LOGIT_HEAD} head cannot check --head-token-id {token}")
    if not 0 <= token < vocab:
        raise HeadProblem(f"has vocab_size {vocab}; --head-token-id {token} is out of range (0 … {vocab - 1})")
    return RewardHead(LM_LOGIT_HEAD, token_id=token)


def head_change(served: RewardHead, new: RewardHead | str, found: str = "") -> str | None:
    """Why a checkpoint whose head is ``new`` (a resolved head, or only its name) cannot replace
    one served with ``served`` in a swap; None when the heads are the same (name and settings:
    the server's settings resolve both). Names both heads, what was found (``found``, e.g.
    ``3 labels``) and the way out (a server started on the new checkpoint)."""
    new_name = new if isinstance(new, str) else new.name
    if new_name == served.name and (isinstance(new, str) or new == served):
        return None
    what = new if isinstance(new, str) else new.describe()
    return (
        f"has {f'{found}, so ' if found else ''}the {what} head; the served model has the {served.describe()} head, "
        "and a swap keeps the head (the fingerprint and what the rewards mean); start a server on this checkpoint "
        "instead"
    )


def swap_head_problem(config: Mapping[str, Any], settings: HeadSettings, served: RewardHead) -> str | None:
    """Why a checkpoint with this config cannot replace the model served with the head
    ``served``, under the server's head settings; None when it can.

    The folder's head is found as at start (``settings.choice``, else :func:`detect_head`): a
    different head is refused naming both (:func:`head_change`); the same head must resolve
    (:func:`resolve_head`: its label index, weights or token id fit the folder) to the served
    head's settings.

    Returns:
        The problem, starting with ``has``.
    """
    name = settings.choice or detect_head(config)
    if name is not None and name != served.name:
        found = (f"its own reward model class ({remote_classifier(config)})" if name == REMOTE_CODE_HEAD
                 else labels_found(config))
        return head_change(served, name, found)
    try:
        new = resolve_head(config, settings)
    except HeadProblem as problem:
        return str(problem)
    return head_change(served, new)


def head_hint(problem: str, config: Mapping[str, Any], settings: HeadSettings, folder: Path | None) -> str:
    """What a refused head's message (``problem``, from :func:`resolve_head`) adds, or ``""``:
    ``--head`` named another head than the one the config gives (``; its config gives the X head:
    leave out --head``), or no head is found but :data:`LABEL_DISTRIBUTION_FILES` lie in the
    checkpoint ``folder`` (``; … lie beside it: add --head label-distribution``)."""
    found = detect_head(config)
    if settings.choice is not None and found not in (None, settings.choice) and f"--head {found}" not in problem:
        return f"; its config gives the {found} head: leave out --head"
    if settings.choice is None and folder is not None and all((folder / n).is_file() for n in LABEL_DISTRIBUTION_FILES):
        return f"; {' and '.join(LABEL_DISTRIBUTION_FILES)} lie beside it: add --head {LABEL_DISTRIBUTION_HEAD}"
    return ""


def read_reward(head: RewardHead, values: Sequence[float]) -> float:
    """The reward of one sequence from the engine's values at its last token: the head's one
    value (``classifier``, ``lm-logit``: the converted score head's), the label at
    ``label_index`` or the weighted sum ``Σ wᵢ·vᵢ`` (``multi-label``, summed in float64).

    Args:
        head: the served head.
        values: the score head's outputs, label order (one for ``classifier`` and ``lm-logit``,
            ``num_labels`` for ``multi-label``).

    Raises:
        ValueError: not as many values as the head reads (one, or the label count the index or
            weights need), naming both counts.
    """
    if head.name == MULTI_LABEL_HEAD:
        if head.label_index is not None:
            if not 0 <= head.label_index < len(values):
                raise ValueError(f"the engine gave {len(values)} label values; label_index {head.label_index} is out of range")
            return float(values[head.label_index])
        weights = head.label_weights or ()
        if len(values) != len(weights):
            raise ValueError(f"the engine gave {len(values)} label values for {len(weights)} label weights")
        return math.fsum(float(w) * float(v) for w, v in zip(weights, values, strict=True))
    if len(values) != 1:
        raise ValueError(f"the engine gave {len(values)} values; the {head.name} head reads exactly one")
    return float(values[0])


def parse_label_weights(text: str) -> tuple[float, ...]:
    """``w1,w2,…`` as floats (spaces around a weight allowed).

    Raises:
        ValueError: an empty list, an entry that is not a number, or a weight that is NaN or ±inf
            (naming the entry and its position).
    """
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise ValueError(f"label_weights: {text!r} must be numbers separated by commas (e.g. 0.5,0.3,0.2)")
    weights = []
    for i, part in enumerate(parts):
        try:
            weight = float(part)
        except ValueError:
            raise ValueError(f"label_weights: weight {i} ({part!r}) of {text!r} is not a number") from None
        if not math.isfinite(weight):
            raise ValueError(f"label_weights: weight {i} ({part!r}) of {text!r} must be finite")
        weights.append(weight)
    return tuple(weights)
