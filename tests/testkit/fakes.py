"""A fake engine and a fake renderer for server (and client) tests: no model, no torch.

:class:`FakeEngine` implements :class:`rmserve.server.engines.protocol.RewardEngine` with rewards and
prefix-cache counts computed from the token ids, so a test can work out every number by hand:

- ``reward = sum(ids) % 1000 / 100``
- ``num_cached_tokens``: 0 for the first sequence of a group; for a later one, its longest
  common prefix with any earlier sequence of the group, capped at ``len(ids) - 1`` (the last
  token is always recomputed), rounded down to a multiple of ``block_size``.
- ``extras``: ``FakeEngine.extras_of(ids)`` when that hook is set, else none (as a classifier).

Its :meth:`FakeEngine.start` returns a :class:`~rmserve.server.engines.protocol.LoadedModel` with no
renderer (the app is given :class:`FakeRenderer` or a factory).

:class:`FakeRenderer` is the real :class:`rmserve.server.render.chat.Renderer` over
:class:`FakeTokenizer`, a character tokenizer (token id = Unicode code point) whose "chat
template" writes ``BOS`` once, then per turn a role marker, the content and ``EOS``::

    ids = [1] + Σ_turns ([ROLE_IDS[role]] + [ord(c) for c in content] + [2])

so a sequence is ``1 + Σ_turns (len(content) + 2)`` tokens. The renderer's own length policy
(``SequenceTooLong``, truncation, empty responses) applies unchanged.

Import as ``from testkit.fakes import …`` from any test folder.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rmserve.server.engines.protocol import ExtraValue, LoadedModel, PrefixCacheStats, SequenceScore, local_checkpoint
from rmserve.server.render.chat import Renderer

from rmserve.errors import EngineNotReady
from rmserve.schema import ModelInfo

BOS_ID = 1
EOS_ID = 2
ROLE_IDS: dict[str, int] = {"system": 3, "user": 4, "assistant": 5}
"""Token id of each role marker; other roles make the fake template fail (as the demo template does)."""

FAKE_MODEL = ModelInfo(name="fake-rm", max_model_len=64, dtype="float32", fingerprint="fp-fake-1", engine="fake")


def fake_reward(token_ids: Sequence[int]) -> float:
    """The reward :class:`FakeEngine` gives a sequence: ``sum(ids) % 1000 / 100``."""
    return sum(token_ids) % 1000 / 100


def fake_cached_tokens(group: Sequence[Sequence[int]], index: int, block_size: int) -> int:
    """Prefix-cache hit tokens :class:`FakeEngine` reports for ``group[index]`` (see module doc)."""
    if index == 0:
        return 0
    ids = group[index]
    best = 0
    for earlier in group[:index]:
        n = 0
        for a, b in zip(ids, earlier):
            if a != b:
                break
            n += 1
        best = max(best, n)
    best = min(best, len(ids) - 1)
    return best // block_size * block_size


@dataclass
class FakeEngine:
    """In-memory :class:`~rmserve.server.engines.protocol.RewardEngine` with test hooks.

    Attributes:
        model: what :meth:`info` reports.
        block_size: prefix-cache block size in tokens.
        start_gate: when set, :meth:`start` waits for it (to observe the loading state).
        score_gate: when set, :meth:`score_group` waits for it after recording the call.
        fail_with: raised by :meth:`score_group` (after recording the call) when not None.
        start_error: raised by :meth:`start` when not None.
        calls: ``(request_id, token_ids)`` of every ``score_group`` call, in call order.
        cancelled: request ids whose ``score_group`` was cancelled (the engine's abort).
        entered: set whenever a ``score_group`` call has been recorded.
        checkpoint_dir: the loaded fake checkpoint folder (None: the model is not a local
            folder); reported in the :class:`LoadedModel` records.
        extras_of: when set, the per-response extras of a sequence, from its token ids.
    """

    model: ModelInfo = FAKE_MODEL
    block_size: int = 4
    start_gate: asyncio.Event | None = None
    score_gate: asyncio.Event | None = None
    fail_with: BaseException | None = None
    start_error: BaseException | None = None
    calls: list[tuple[str, tuple[tuple[int, ...], ...]]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    started: bool = False
    shutdown_calls: int = 0
    queries_tokens: int = 0
    hits_tokens: int = 0
    reward_offset: float = 0.0
    checkpoint_dir: object = None
    extras_of: Callable[[tuple[int, ...]], Mapping[str, ExtraValue]] | None = None

    async def start(self) -> LoadedModel:
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        self.started = True
        return self.loaded()

    def loaded(self) -> LoadedModel:
        """What is loaded now: :attr:`model`, no renderer, :attr:`checkpoint_dir` resolved."""
        return LoadedModel(info=self.model, checkpoint_dir=local_checkpoint(self.checkpoint_dir))

    def info(self) -> ModelInfo:
        return self.model

    async def score_group(
        self, token_ids: Sequence[Sequence[int]], request_id: str, *, answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        if not self.started:
            raise EngineNotReady("fake engine not started")
        group = tuple(tuple(ids) for ids in token_ids)
        self.calls.append((request_id, group))
        self.entered.set()
        try:
            if self.score_gate is not None:
                await self.score_gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        if self.fail_with is not None:
            raise self.fail_with
        scores = [
            SequenceScore(reward=fake_reward(ids) + self.reward_offset,
                          num_cached_tokens=fake_cached_tokens(group, i, self.block_size),
                          extras=dict(self.extras_of(ids)) if self.extras_of is not None else {})
            for i, ids in enumerate(group)
        ]
        self.queries_tokens += sum(len(ids) for ids in group)
        self.hits_tokens += sum(s.num_cached_tokens for s in scores)
        return scores

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative tokens queried / hit (:class:`~rmserve.server.engines.protocol.SupportsPrefixCacheStats`)."""
        return PrefixCacheStats(query_tokens=self.queries_tokens, hit_tokens=self.hits_tokens)

    async def shutdown(self) -> None:
        self.started = False
        self.shutdown_calls += 1


class FakeTokenizer:
    """The subset of a transformers tokenizer :class:`Renderer` uses, character-level.

    ``apply_chat_template`` writes control characters for the special tokens (U+0001 BOS,
    U+0002 EOS, U+0003–U+0005 role markers), so ``encode`` can map every character to its
    code point and the ids equal those in the module docstring.
    """

    chat_template = "fake: BOS, then per turn role marker + content + EOS"
    bos_token_id = BOS_ID

    def apply_chat_template(self, conversations, *, chat_template=None, tokenize=False, add_generation_prompt=False):
        from jinja2 import TemplateError

        single = bool(conversations) and isinstance(conversations[0], dict)
        batch = [conversations] if single else conversations
        texts = []
        for conversation in batch:
            parts = [chr(BOS_ID)]
            for turn in conversation:
                role = turn["role"]
                if role not in ROLE_IDS:
                    raise TemplateError(f"unknown role {role}; expected system, user or assistant")
                parts.append(chr(ROLE_IDS[role]) + turn["content"] + chr(EOS_ID))
            texts.append("".join(parts))
        assert not tokenize and not add_generation_prompt
        return texts[0] if single else texts

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Code points; with ``add_special_tokens`` a BOS first (as a Llama tokenizer adds one:
        a chat-rendered text tokenized that way would then start with two BOS, which the
        renderer refuses)."""
        return ([BOS_ID] if add_special_tokens else []) + [ord(c) for c in text]

    def __len__(self) -> int:
        """Every Unicode code point is a token id."""
        return 0x110000


class FakeRenderer(Renderer):
    """The real :class:`Renderer` over :class:`FakeTokenizer`, with hooks for loop-blocking tests.

    Args:
        max_model_len: longest sequence accepted, tokens.
        gate: when given, :meth:`render_request` waits (in its thread) until it is set, at most
            ``gate_timeout_s``; ``gate_timed_out`` records whether that limit was hit.
    """

    def __init__(self, max_model_len: int = FAKE_MODEL.max_model_len, *, gate: threading.Event | None = None,
                 gate_timeout_s: float = 30.0) -> None:
        super().__init__(FakeTokenizer(), max_model_len=max_model_len)
        self.gate = gate
        self.gate_timeout_s = gate_timeout_s
        self.gate_timed_out = False
        self.render_entered = threading.Event()
        self.thread_ids: list[int] = []

    def render_request(self, request, **options):
        self.thread_ids.append(threading.get_ident())
        self.render_entered.set()
        if self.gate is not None and not self.gate.wait(self.gate_timeout_s):
            self.gate_timed_out = True
        return super().render_request(request, **options)


def fake_ids(messages: Sequence[tuple[str, str]], response: str) -> list[int]:
    """Token ids :class:`FakeRenderer` produces for ``messages`` + ``response`` (for test arithmetic)."""
    ids = [BOS_ID]
    for role, content in [*messages, ("assistant", response)]:
        ids += [ROLE_IDS[role], *map(ord, content), EOS_ID]
    return ids


FAKE_OFFSET_KEY = "fake_reward_offset"
"""``config.json`` key of a fake checkpoint: the reward offset its "weights" add."""

FAKE_MAX_LEN_KEY = "fake_max_model_len"
"""``config.json`` key of a fake checkpoint: the ``max_model_len`` a restart on it reports
(absent = :data:`FAKE_MODEL`'s)."""


FAKE_WEIGHTS_FILE = "model.safetensors"
"""The placeholder weights file of a fake checkpoint (text naming the offset; no tensors)."""


def fake_tokenizer_json(tokenizer: str) -> str:
    """The ``tokenizer.json`` text of a fake checkpoint written with ``tokenizer=``: a JSON object."""
    import json

    return json.dumps({"fake_tokenizer": tokenizer})


def write_fake_checkpoint(folder, reward_offset: float, *, tokenizer: str = "tok-v1", hidden_size: int = 8,
                          max_model_len: int | None = None, num_labels: int = 1):
    """A fake checkpoint folder that passes the server's file checks; returns it as a ``Path``.

    Files: ``config.json`` (a one-label ``FakeForSequenceClassification`` unless
    ``num_labels`` says otherwise, ``hidden_size``, :data:`FAKE_OFFSET_KEY`, and
    :data:`FAKE_MAX_LEN_KEY` when given), ``tokenizer.json`` (:func:`fake_tokenizer_json`
    of ``tokenizer``: two values give two different tokenizers) and :data:`FAKE_WEIGHTS_FILE`
    (placeholder bytes that differ with ``reward_offset``).
    """
    import json
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["FakeForSequenceClassification"], "hidden_size": hidden_size,
              "num_labels": num_labels, FAKE_OFFSET_KEY: reward_offset}
    if max_model_len is not None:
        config[FAKE_MAX_LEN_KEY] = max_model_len
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(fake_tokenizer_json(tokenizer))
    (folder / FAKE_WEIGHTS_FILE).write_text(f"fake weights: reward offset {reward_offset!r}")
    return folder


@dataclass
class ReloadableFakeEngine(FakeEngine):
    """:class:`FakeEngine` with :class:`~rmserve.server.engines.protocol.SupportsWeightReload`.

    ``reload_weights(path)`` reads the reward offset from the checkpoint's ``config.json``
    (reward = ``fake_reward(ids) + offset``) and reports the real
    :func:`~rmserve.fingerprint.model_fingerprint` of the folder.

    Attributes:
        reload_gate: when set, a reload waits for it half-way (the offset is already NaN,
            so any request scored mid-swap would be visible). Read when the reload gets
            there, so a test may put a new gate in place for the next reload.
        reload_entered: set when a reload starts.
        reloads: paths reloaded, in order; resets: ``reset_prefix_cache`` calls.
        mixed: scores computed while a reload was in progress (must stay 0).
        failing_reloads: this many of the next reloads fail half-way (after the gate) with
            :class:`~rmserve.errors.EngineError`, leaving the offset NaN and the fingerprint
            and checkpoint folder the old ones: half-replaced weights under the old name.
    """

    reload_gate: asyncio.Event | None = None
    reload_entered: asyncio.Event = field(default_factory=asyncio.Event)
    reloads: list[str] = field(default_factory=list)
    resets: int = 0
    mixed: int = 0
    reloading: bool = False
    failing_reloads: int = 0

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        scores = await super().score_group(token_ids, request_id)
        if self.reloading:
            self.mixed += 1
        return scores

    async def reload_weights(self, path: str) -> LoadedModel:
        import json
        from pathlib import Path

        from rmserve.fingerprint import model_fingerprint

        self.reloading = True
        self.reloads.append(path)
        self.reload_entered.set()
        try:
            self.reward_offset = float("nan")  # half-loaded weights
            if self.reload_gate is not None:
                await self.reload_gate.wait()
            if self.failing_reloads > 0:
                from rmserve.errors import EngineError

                self.failing_reloads -= 1
                raise EngineError(f"fake reload of {Path(path).name!r} failed half-way")
            offset = json.loads((Path(path) / "config.json").read_text())[FAKE_OFFSET_KEY]
            self.reward_offset = float(offset)
            self.checkpoint_dir = path
            self.model = ModelInfo(name=self.model.name, max_model_len=self.model.max_model_len, dtype=self.model.dtype,
                                   fingerprint=model_fingerprint(path, None), engine=self.model.engine)
            return self.loaded()
        finally:
            self.reloading = False

    async def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return True


@dataclass
class RestartableFakeEngine(ReloadableFakeEngine):
    """:class:`ReloadableFakeEngine` with :class:`~rmserve.server.engines.protocol.SupportsRestart`.

    ``restart(path)`` "shuts the model down" (scoring raises EngineNotReady until it ends),
    then "starts" the fake checkpoint: reward offset from :data:`FAKE_OFFSET_KEY`,
    ``max_model_len`` from :data:`FAKE_MAX_LEN_KEY` (else :data:`FAKE_MODEL`'s), the real
    :func:`~rmserve.fingerprint.model_fingerprint` of the folder.

    Attributes:
        restarts: paths restarted on, in order.
        restart_gate: when set, a restart waits for it while no model is loaded.
        restart_entered: set when a restart starts.
        failing_paths: restarting on one of these raises EngineError (the checkpoint does
            not start); no model is loaded afterwards, as with the real engines.
    """

    restarts: list[str] = field(default_factory=list)
    restart_gate: asyncio.Event | None = None
    restart_entered: asyncio.Event = field(default_factory=asyncio.Event)
    failing_paths: set[str] = field(default_factory=set)

    async def restart(self, path: str) -> LoadedModel:
        import json
        from pathlib import Path

        from rmserve.fingerprint import model_fingerprint

        from rmserve.errors import EngineError

        self.restarts.append(path)
        self.started = False  # the old model is shut down first
        self.restart_entered.set()
        if self.restart_gate is not None:
            await self.restart_gate.wait()
        if path in self.failing_paths:
            raise EngineError(f"fake checkpoint {Path(path).name!r} does not start")
        config = json.loads((Path(path) / "config.json").read_text())
        self.reward_offset = float(config[FAKE_OFFSET_KEY])
        self.checkpoint_dir = path
        max_model_len = int(config.get(FAKE_MAX_LEN_KEY, FAKE_MODEL.max_model_len))
        self.model = ModelInfo(name=self.model.name, max_model_len=max_model_len, dtype=self.model.dtype,
                               fingerprint=model_fingerprint(path, None), engine=self.model.engine)
        self.started = True
        return self.loaded()


class PriorityEngine(FakeEngine):
    """The fake engine, recording the ``priority`` each group reached it with (``priorities``)."""

    def __init__(self) -> None:
        super().__init__()
        self.priorities: list[int] = []

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        self.priorities.append(priority)
        return await super().score_group(token_ids, request_id, answer_starts=answer_starts, priority=priority)
