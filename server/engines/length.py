"""The length baseline's engine: a tokenizer and no weights.

:class:`LengthEngine` loads only the tokenizer of ``config.model`` (a folder or hub id,
transformers ``AutoTokenizer``) and answers, per sequence of token ids it is given, the
reward ``len(token_ids)`` for ``length_sign="longest"`` or ``-len(token_ids)`` for
``shortest``. The length kind (:mod:`rmserve.server.kinds.length`) sends it each response's
own tokens; the engine only counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rmserve.server.config import EngineConfig
from rmserve.server.engines.protocol import LoadedModel, SequenceScore, local_checkpoint
from rmserve.server.render.chat import Renderer

from rmserve.errors import EngineNotReady, ServerFault
from rmserve.fingerprint import length_fingerprint
from rmserve.schema import LENGTH_KIND, ModelInfo

PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
"""The chat template of a tokenizer that has none (the length kind renders no template; the
renderer only carries the tokenizer)."""

UNBOUNDED_LEN = 1 << 30
"""``max_model_len`` of a length server without ``--max-model-len``: it runs no model."""


class LengthEngine:
    """Counts tokens (see the module docstring).

    Args:
        config: a ``kind="length"`` config (``model``, ``length_sign``, ``max_model_len``).

    ``info().engine`` is ``tokenizer``, ``dtype`` ``none``; the fingerprint is
    :func:`rmserve.fingerprint.length_fingerprint` (tokenizer files and sign).
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._info: ModelInfo | None = None

    async def start(self) -> LoadedModel:
        """Load the tokenizer (in a worker thread) and describe the baseline.

        Raises:
            ServerFault: the tokenizer cannot be loaded.
        """
        return await asyncio.to_thread(self._load)

    def _load(self) -> LoadedModel:
        from transformers import AutoTokenizer

        cfg = self.config
        try:
            tokenizer: Any = AutoTokenizer.from_pretrained(cfg.model)
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"cannot load the tokenizer of {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        template = getattr(tokenizer, "chat_template", None)
        max_len = cfg.max_model_len or UNBOUNDED_LEN
        renderer = Renderer(tokenizer, max_model_len=max_len,
                            chat_template=None if isinstance(template, str) else PLAIN_TEMPLATE)
        self._info = ModelInfo(
            name=cfg.name, max_model_len=max_len, dtype="none", engine="tokenizer",
            fingerprint=length_fingerprint(cfg.model, cfg.length_sign), kind=LENGTH_KIND, mode=cfg.length_sign,
        )
        return LoadedModel(info=self._info, renderer=renderer, checkpoint_dir=local_checkpoint(cfg.model))

    def info(self) -> ModelInfo:
        """What is served (valid after ``start``)."""
        if self._info is None:
            raise EngineNotReady("the length engine is not started")
        return self._info

    async def score_group(
        self,
        token_ids: Sequence[Sequence[int]],
        request_id: str,
        *,
        answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        """Per sequence, its token count (``longest``) or minus it (``shortest``), as a float;
        no prefix cache (``num_cached_tokens`` 0). ``answer_starts`` and ``priority`` are ignored.

        Raises:
            EngineNotReady: not started, or shut down.
        """
        if self._info is None:
            raise EngineNotReady("the length engine is not started")
        sign = -1.0 if self.config.length_sign == "shortest" else 1.0
        return [SequenceScore(reward=sign * len(ids), num_cached_tokens=0) for ids in token_ids]

    async def shutdown(self) -> None:
        """Forget the tokenizer; idempotent."""
        self._info = None
