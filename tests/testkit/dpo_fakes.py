"""Fakes for the DPO path: a character tokenizer with merges, a log-prob engine, checkpoints.

- :class:`FakeDPOTokenizer`: :class:`~testkit.fakes.FakeTokenizer` (token id = code point; the
  template writes ``BOS``, then per turn a role marker, the content and ``EOS``) plus an EOS
  id, a vocabulary, optional pair merges (``(a, b) → id``, applied left to right, to provoke
  the BPE boundary fix) and template variants: ``bos=False`` (no BOS written, no BOS token)
  and ``closing`` (a text written after the last turn when it is a user turn, so the prompt
  text is not a prefix of the full text).
- :class:`FakeLogprobEngine`: a :class:`~rmserve.server.engines.protocol.LogprobEngine` whose
  log-probability of answer token ``t`` is ``-t * scale``, so every reward is hand arithmetic.
  The scale of a fake checkpoint folder is its ``config.json`` key :data:`FAKE_SCALE_KEY`.
- :func:`write_fake_causal_checkpoint`: a folder that passes the swap's file checks for kind
  ``dpo`` (or, with ``architecture=``, one that does not); :func:`fake_tokenizer_loader` loads
  its tokenizer (``tokenizer.json`` names it: ``tok-v1``, ``tok-v2`` with one token more, or ``tok-nobos``
  without BOS).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rmserve.server.engines.protocol import AnswerLogprobs, LoadedModel, PrefixCacheStats, local_checkpoint
from testkit.fakes import BOS_ID, EOS_ID, ROLE_IDS, FakeTokenizer, fake_cached_tokens, fake_tokenizer_json

from rmserve.errors import EngineError, EngineNotReady
from rmserve.schema import ModelInfo

FAKE_SCALE_KEY = "fake_logprob_scale"
"""``config.json`` key of a fake causal checkpoint: log p(token t) = ``-t * scale``."""

FAKE_LOGPROB_MAX_LEN = 64
"""``max_model_len`` every :class:`FakeLogprobEngine` reports."""


class FakeDPOTokenizer(FakeTokenizer):
    """:class:`FakeTokenizer` with what the DPO renderer and engine use (see module doc).

    Args:
        merges: ``(id_a, id_b) → id`` merged wherever ``a`` is directly followed by ``b``.
        bos: False = a tokenizer without BOS whose template writes none.
        closing: text the template writes after a conversation that ends with a user turn.
        extra_tokens: tokens added to the vocabulary (a different tokenizer).
    """

    eos_token_id = EOS_ID
    pad_token_id = 0
    unk_token_id = None

    def __init__(self, *, merges: dict[tuple[int, int], int] | None = None, bos: bool = True, closing: str = "",
                 extra_tokens: Sequence[str] = ()) -> None:
        self.merges = dict(merges or {})
        self.bos_token_id = BOS_ID if bos else None
        self.closing = closing
        self.extra_tokens = tuple(extra_tokens)

    def apply_chat_template(self, conversations, *, chat_template=None, tokenize=False, add_generation_prompt=False):
        texts = super().apply_chat_template(conversations, chat_template=chat_template, tokenize=tokenize,
                                            add_generation_prompt=add_generation_prompt)
        single = isinstance(texts, str)
        batch = [conversations] if single else conversations
        out = []
        for conversation, text in zip(batch, [texts] if single else texts, strict=True):
            if self.bos_token_id is None:
                text = text[1:]
            if self.closing and conversation[-1]["role"] == "user":
                text += self.closing
            out.append(text)
        return out[0] if single else out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = super().encode(text, add_special_tokens)
        out: list[int] = []
        for token in ids:
            if out and (out[-1], token) in self.merges:
                out[-1] = self.merges[(out[-1], token)]
            else:
                out.append(token)
        return out

    def get_vocab(self) -> dict[str, int]:
        vocab = {chr(i): i for i in range(256)}
        vocab.update({f"<merge {a} {b}>": m for (a, b), m in self.merges.items()})
        vocab.update({token: 1000 + k for k, token in enumerate(self.extra_tokens)})
        return vocab


TOKENIZERS: dict[str, FakeDPOTokenizer] = {
    "tok-v1": FakeDPOTokenizer(),
    "tok-v2": FakeDPOTokenizer(extra_tokens=("<|tool|>",)),
    "tok-nobos": FakeDPOTokenizer(bos=False),
}
"""Fake tokenizers by the name a fake checkpoint's ``tokenizer.json`` gives."""


def fake_tokenizer_loader(model: str) -> FakeDPOTokenizer:
    """The tokenizer a fake causal checkpoint folder names (``tokenizer.json``)."""
    name = json.loads((Path(model) / "tokenizer.json").read_text())["fake_tokenizer"]
    return TOKENIZERS[name]


def write_fake_causal_checkpoint(folder, scale: float, *, tokenizer: str = "tok-v1",
                                 architecture: str = "FakeForCausalLM") -> Path:
    """A fake checkpoint folder: ``config.json`` (``architecture``, :data:`FAKE_SCALE_KEY`),
    ``tokenizer.json`` naming ``tokenizer``, placeholder weights that differ with ``scale``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [architecture], FAKE_SCALE_KEY: scale, "num_labels": 1, "hidden_size": 8}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(fake_tokenizer_json(tokenizer))
    (folder / "model.safetensors").write_text(f"fake causal weights: scale {scale!r}")
    return folder


def _read_scale(path: str) -> float:
    return float(json.loads((Path(path) / "config.json").read_text())[FAKE_SCALE_KEY])


@dataclass
class FakeLogprobEngine:
    """In-memory :class:`~rmserve.server.engines.protocol.LogprobEngine`: ``log p(t) = -t * scale``.

    Built as ``FakeLogprobEngine(config, model)`` (the factory signature); the scale is read
    from the model folder at :meth:`start`. ``num_cached_tokens`` follows
    :func:`~testkit.fakes.fake_cached_tokens` (block size 4). ``max_model_len`` is what
    :meth:`info` reports (default :data:`FAKE_LOGPROB_MAX_LEN`).

    Attributes:
        calls: ``(request_id, token_ids, answer_starts)`` of every ``answer_logprobs`` call.
        fail_with: raised by ``answer_logprobs`` when set.
        reloads / restarts: paths, in order; resets: ``reset_prefix_cache`` calls.
    """

    config: object
    model: str
    max_model_len: int = FAKE_LOGPROB_MAX_LEN
    scale: float = 0.0
    started: bool = False
    fail_with: BaseException | None = None
    start_error: BaseException | None = None
    calls: list[tuple[str, tuple[tuple[int, ...], ...], tuple[int, ...]]] = field(default_factory=list)
    reloads: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    resets: int = 0
    shutdowns: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0

    def _loaded(self) -> LoadedModel:
        return LoadedModel(self.info(), None, local_checkpoint(self.model))

    async def start(self) -> LoadedModel:
        if self.start_error is not None:
            raise self.start_error
        self.scale = await asyncio.to_thread(_read_scale, self.model)
        self.started = True
        return await asyncio.to_thread(self._loaded)

    def info(self) -> ModelInfo:
        return ModelInfo(name=Path(self.model).name, max_model_len=self.max_model_len, dtype="float32",
                         fingerprint=f"fp-{Path(self.model).name}", engine="fake")

    async def answer_logprobs(self, token_ids, answer_starts, request_id, priority=0):
        if not self.started:
            raise EngineNotReady("fake log-prob engine not started")
        group = tuple(tuple(ids) for ids in token_ids)
        self.calls.append((request_id, group, tuple(answer_starts)))
        await asyncio.sleep(0)
        if self.fail_with is not None:
            raise self.fail_with
        out = []
        for i, (ids, start) in enumerate(zip(group, answer_starts, strict=True)):
            cached = fake_cached_tokens(group, i, 4)
            out.append(AnswerLogprobs(tuple(-t * self.scale for t in ids[start:]), cached))
            self.query_tokens += len(ids)
            self.hit_tokens += cached
        return out

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(query_tokens=self.query_tokens, hit_tokens=self.hit_tokens)

    async def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return True

    async def reload_weights(self, path: str) -> LoadedModel:
        self.reloads.append(path)
        self.scale = await asyncio.to_thread(_read_scale, path)
        self.model = path
        return await asyncio.to_thread(self._loaded)

    async def restart(self, path: str) -> LoadedModel:
        self.restarts.append(path)
        self.started = False
        try:
            self.scale = await asyncio.to_thread(_read_scale, path)
        except (OSError, KeyError, ValueError) as exc:
            raise EngineError(f"fake causal checkpoint {Path(path).name!r} does not start: {exc}") from exc
        self.model = path
        self.started = True
        return await asyncio.to_thread(self._loaded)

    async def shutdown(self) -> None:
        self.started = False
        self.shutdowns += 1


@dataclass
class FakeEngines:
    """A factory for :class:`~rmserve.server.engines.dpo_pair.DPOEngine` that keeps what it built, by model
    (each engine reporting ``max_model_len``)."""

    built: dict[str, FakeLogprobEngine] = field(default_factory=dict)
    max_model_len: int = FAKE_LOGPROB_MAX_LEN

    def __call__(self, config, model: str) -> FakeLogprobEngine:
        engine = FakeLogprobEngine(config, model, self.max_model_len)
        self.built[model] = engine
        return engine


def role(name: str) -> int:
    """The fake template's role-marker id."""
    return ROLE_IDS[name]


__all__ = [
    "BOS_ID", "EOS_ID", "FAKE_LOGPROB_MAX_LEN", "FAKE_SCALE_KEY", "FakeDPOTokenizer", "FakeEngines",
    "FakeLogprobEngine", "TOKENIZERS", "fake_tokenizer_loader", "role", "write_fake_causal_checkpoint",
]
