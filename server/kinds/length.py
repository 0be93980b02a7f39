"""The length kind: the sanity baseline that rewards a response by its length in tokens.

Reward of response ``j`` = ``len(tokenizer(responses[j], add_special_tokens=False)["input_ids"])``
with ``--length-sign longest`` (the default), or minus it with ``shortest``: the response text
alone — no prompt, no chat template, no BOS/EOS — tokenized by the served model's tokenizer
(transformers, loaded alone by :class:`~rmserve.server.engines.length.LengthEngine`). An
empty response counts 0 tokens. There is no length limit and no truncation (a request asking
truncation is refused); ``num_tokens[j]`` is the same count, ``num_cached_tokens`` 0.

Everything else is the classifier's (:mod:`rmserve.server.kinds.classifier`): one engine call
per group, the result-cache key of the token ids sent, one reward per response. A length
server is never swapped to another checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from rmserve.server.kinds.base import PreparedGroup
from rmserve.server.kinds.classifier import ClassifierKind, prepared_group
from rmserve.server.render.chat import RenderedGroup, Renderer

from rmserve.errors import InvalidCheckpoint, InvalidRequest
from rmserve.schema import LENGTH_KIND, ModelInfo, ModelKind, ScoreRequest

SWAP_REFUSAL = (
    "checkpoint swap is not supported for the length baseline (kind length): it loads only a tokenizer; "
    "restart the server on the other tokenizer"
)
"""The 422 ``invalid_checkpoint`` message of ``POST /v1/models/load`` on a length server."""


def response_token_ids(tokenizer, responses: tuple[str, ...]) -> tuple[list[int], ...]:
    """Each response's own token ids: ``tokenizer(response, add_special_tokens=False)``, in order."""
    if not responses:
        return ()
    return tuple(list(ids) for ids in tokenizer(list(responses), add_special_tokens=False)["input_ids"])


class LengthKind(ClassifierKind):
    """The :class:`~rmserve.server.kinds.base.RewardKind` of the length baseline (see the
    module docstring); the sign is the engine's (``EngineConfig.length_sign``)."""

    name: ModelKind = LENGTH_KIND
    swap_refusal: str | None = SWAP_REFUSAL

    def check_request(self, request: ScoreRequest) -> None:
        """Refuse truncation (the count is of the whole response).

        Raises:
            InvalidRequest: field ``truncation``.
        """
        if request.truncation is not None:
            raise InvalidRequest(
                "truncation: the length baseline counts whole responses and does not truncate; drop --truncation",
                field="truncation",
            )

    def prepare(
        self, request: ScoreRequest, checked: None, info: ModelInfo, renderer: Renderer | None
    ) -> list[PreparedGroup]:
        """Every group's responses tokenized alone (:func:`response_token_ids`) with the
        renderer's tokenizer; cost = their tokens."""
        assert renderer is not None
        return [
            prepared_group(info.fingerprint, RenderedGroup(
                id=wire.id, token_ids=response_token_ids(renderer.tokenizer, wire.responses), prompt_tokens=0,
            ))
            for wire in request.groups
        ]

    def check_checkpoint(self, folder: Path, served: ModelInfo | None = None) -> None:
        """A length server is never swapped (:attr:`swap_refusal`)."""
        raise InvalidCheckpoint(SWAP_REFUSAL, field="path")
