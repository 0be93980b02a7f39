"""Inputs scored as they are, for the vLLM-compatible ``POST /classify`` and ``POST /pooling``.

A trainer pointed at vLLM's OpenAI-compatible server sends texts it has already rendered with
the reward model's chat template (or their token ids); this kind scores each one as given, one
sequence per group, through the one scoring path
(:func:`rmserve.server.kinds.scoring.score_request`: admission, user limits, pins, the fair
queue, the result cache and ``/metrics`` as for ``POST /v1/score``). It is the classifier kind
(:mod:`rmserve.server.kinds.classifier`) with another ``prepare``:

- a text is tokenized as vLLM's server tokenizes a text prompt, ``tokenizer.encode(text,
  add_special_tokens=True)`` (so the tokenizer's BOS comes first; ``add_special_tokens: false``
  leaves it out), with no chat template; token ids go to the engine unchanged (each must be
  below the tokenizer's size, else 400 naming ``input[i][j]``, as vLLM refuses them);
- a sequence over ``max_model_len`` is not scored and gets a per-input ``sequence_too_long``
  error naming the limit (vLLM answers 400 for the whole request: a trainer's batch would lose
  every other sample), unless ``truncate_prompt_tokens`` asked for a cut
  (:meth:`~rmserve.server.render.chat.Renderer.truncate`: a left cut keeps a leading BOS);
- an input whose tokens are empty (an empty text without special tokens) is refused with 400.

Only a classifier server serves these routes (:func:`check_served_kind`): a DPO policy, a judge
and the length baseline have no value vLLM's classify task would give; nor does a multi-label head
(:func:`check_served_head`: vLLM would answer every label).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import msgspec

from rmserve.server.kinds.base import PreparedGroup, RewardKind
from rmserve.server.kinds.classifier import ClassifierKind, prepared_group
from rmserve.server.render.chat import RenderedGroup, Renderer

from rmserve.errors import InvalidRequest
from rmserve.schema import (
    CLASSIFIER_KIND,
    MULTI_LABEL_HEAD,
    ActivationApplied,
    ModelInfo,
    RequestGroup,
    ResponseError,
    ScoreRequest,
    Truncation,
)


def check_served_kind(kind: RewardKind, route: str) -> None:
    """Refuse ``route`` on a server whose kind is not the sequence classifier.

    Raises:
        InvalidRequest: field ``model``, naming the served kind and ``POST /v1/score``.
    """
    if kind.name != CLASSIFIER_KIND:
        raise InvalidRequest(
            f"{route} serves sequence classifiers (kind classifier); this model is kind {kind.name}: "
            "use POST /v1/score",
            field="model", value=kind.name,
        )


def check_served_head(info: ModelInfo, route: str) -> None:
    """Refuse ``route`` (vLLM's ``/classify`` or ``/pooling``) for a multi-label head: vLLM's
    classify task answers every label (probabilities or logits), while this server reads one
    reward from them; answering that one value in vLLM's shape would be silently different.

    Raises:
        InvalidRequest: field ``model``, naming the head and the routes that answer its reward.
    """
    head = None if info.head is msgspec.UNSET else info.head
    if head is not None and head.name == MULTI_LABEL_HEAD:
        raise InvalidRequest(
            f"{route} answers as vLLM's classify task, which gives every label; this model has the "
            f"{head.describe()} head, which reads one reward from its labels: use POST /v1/score or POST /get_reward",
            field="model", value=head.name,
        )


def applied_activation(use_activation: bool | None, activation: bool | None) -> ActivationApplied:
    """``none`` (raw logits) when either switch is False, else ``sigmoid`` (vLLM's default for a
    one-label classifier)."""
    return "none" if use_activation is False or activation is False else "sigmoid"


def sigmoid(x: float) -> float:
    """σ(x) = 1 / (1 + e^(−x)), computed without overflow for either sign."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@lru_cache(maxsize=16)
def _labels(config_path: str, fingerprint: str) -> tuple[tuple[int, str], ...]:
    """``id2label`` of a checkpoint's ``config.json`` (cached per fingerprint); () without one."""
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    labels = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(labels, dict):
        return ()
    return tuple((int(k), str(v)) for k, v in labels.items() if str(k).lstrip("-").isdigit())


def label_of(checkpoint_dir: Path | None, fingerprint: str, index: int) -> str | None:
    """The checkpoint's ``id2label`` name of class ``index`` (vLLM's ``label``); None when the
    model is not a local folder or names no such class. Reads ``config.json`` (call it off the
    event loop)."""
    if checkpoint_dir is None:
        return None
    return dict(_labels(str(checkpoint_dir / "config.json"), fingerprint)).get(index)


def wire_request(inputs: Sequence[str] | Sequence[list[int]]) -> ScoreRequest:
    """The :class:`~rmserve.schema.ScoreRequest` the scoring path reads for these inputs: group
    ``str(i)`` holds input ``i`` as its one response (a text, or ``""`` for token ids), so the
    render threads' turn is charged the texts' characters and each result has one reward."""
    return ScoreRequest(groups=tuple(
        RequestGroup(id=str(i), prompt="", responses=(item if isinstance(item, str) else "",))
        for i, item in enumerate(inputs)
    ))


class RawInputKind(ClassifierKind):
    """The classifier kind over inputs scored as they are (see the module docstring); built per
    request, holding its inputs.

    Args:
        inputs: texts, or token-id lists (:func:`rmserve.server.http.wire.check_pooling_inputs`).
        add_special_tokens: tokenize texts with the tokenizer's special tokens.
        truncation: the cut asked (``truncate_prompt_tokens``), or None.
        checkpoint_dir: the served checkpoint's folder, for :attr:`labels` (None: no labels).

    Attributes:
        labels: after :meth:`prepare`, the ``id2label`` name of class 0 (None when unknown).
    """

    def __init__(
        self, inputs: Sequence[str] | Sequence[list[int]], *, add_special_tokens: bool = True,
        truncation: Truncation | None = None, checkpoint_dir: Path | None = None,
    ) -> None:
        self.inputs = list(inputs)
        self.add_special_tokens = add_special_tokens
        self.truncation = truncation
        self.checkpoint_dir = checkpoint_dir
        self.label: str | None = None

    def token_ids(self, renderer: Renderer) -> list[list[int]]:
        """Each input's token ids: texts tokenized (:meth:`Renderer.encode_texts`), ids as given.

        Raises:
            InvalidRequest: a token id at or over the tokenizer's size (``input[i][j]``), or an
                input with no token (``input[i]``).
        """
        if self.inputs and isinstance(self.inputs[0], str):
            sequences = renderer.encode_texts(self.inputs, add_special_tokens=self.add_special_tokens)
        else:
            sequences = [list(ids) for ids in self.inputs]
            size = renderer.vocab_size
            for i, ids in enumerate(sequences):
                over = next((j for j, token in enumerate(ids) if size is not None and token >= size), None)
                if over is not None:
                    raise InvalidRequest(
                        f"input[{i}][{over}] is token id {ids[over]}; the tokenizer has {size} (ids 0 … {size - 1})",
                        field=f"input[{i}][{over}]", value=ids[over], limit=size - 1,
                    )
        for i, ids in enumerate(sequences):
            if not ids:
                raise InvalidRequest(
                    f"input[{i}] has no token (an empty text without special tokens); nothing to score",
                    field=f"input[{i}]", value=0, limit=1,
                )
        return sequences

    def prepare(
        self, request: ScoreRequest, checked: None, info: ModelInfo, renderer: Renderer | None
    ) -> list[PreparedGroup]:
        """One group per input: its sequence, cut when asked, or marked ``sequence_too_long``
        when over ``max_model_len`` (runs on a render thread)."""
        assert renderer is not None
        self.label = label_of(self.checkpoint_dir, info.fingerprint, 0)
        limit = info.max_model_len
        groups = []
        for i, ids in enumerate(self.token_ids(renderer)):
            cuts = None
            errors = None
            if self.truncation is not None:
                (ids,), cuts, _ = renderer.truncate([ids], self.truncation)  # all of a raw input is its own
            elif len(ids) > limit:
                errors = (ResponseError(
                    "sequence_too_long", f"{len(ids):,} tokens, over max_model_len={limit:,}; "
                    "shorten it or send truncate_prompt_tokens",
                ),)
            rendered = RenderedGroup(id=str(i), token_ids=(ids,), prompt_tokens=len(ids),
                                     truncated_tokens=cuts, errors=errors)
            groups.append(prepared_group(info.fingerprint, rendered))
        return groups
