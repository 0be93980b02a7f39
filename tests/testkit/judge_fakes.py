"""A fake generative judge (:class:`rmserve.server.engines.protocol.JudgeEngine`) and judge test groups.

:class:`FakeJudgeEngine` answers every call by a rule a test can work out by hand: it
prefers answers holding the word ``GOOD``.

- 4-way ranking (the prompt shows ``[The Start of Assistant X's Answer]`` blocks): ``"I pick
  [[X]]"`` for the first letter whose answer holds ``GOOD``; ``"no idea"`` when none does.
- rating (``[Response]`` … ``[Your judgement]``): ``"Rating: 8"`` when the response holds
  ``GOOD``, else ``"Rating: 3"``.
- pairwise (``<|The Start of Assistant A's Answer|>``): ``\\boxed{A>B}`` when only A holds
  ``GOOD``, ``\\boxed{B>A}`` when only B does, ``\\boxed{A=B}`` otherwise.

``reply_of`` replaces the rule. Token counts follow a character tokenizer (as
:mod:`testkit.fakes`): ``prompt_tokens = 1 + Σ_messages (len(content) + 2)``;
``completion_tokens = len(text)``; ``cached_tokens``: 0 for a group's first call, else the
longest common prefix (in characters of ``role + content`` joined) with an earlier call of the
same ``judge_group``, capped at ``prompt_tokens - 1`` and rounded down to ``block_size``.
A text longer than ``max_tokens`` is cut there with finish reason ``length``. A call with
``prompt_tokens >= max_model_len`` raises :class:`~rmserve.errors.SequenceTooLong` (field
``messages``) before anything is generated.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rmserve.server.kinds.judge_protocols import JudgeOutput
from rmserve.server.engines.protocol import LoadedModel, PrefixCacheStats

from rmserve.errors import EngineNotReady, SequenceTooLong
from rmserve.schema import Group, Message, ModelInfo, RMBENCH_STYLES

FAKE_JUDGE_MODEL = ModelInfo(name="fake-judge", max_model_len=100_000, dtype="float32", fingerprint="fp-judge-1",
                             engine="fake")


def fake_prompt_tokens(messages: Sequence[Message]) -> int:
    """``1 + Σ (len(content) + 2)``: the fake judge's templated prompt length."""
    return 1 + sum(len(m.content) + 2 for m in messages)


def _flat(messages: Sequence[Message]) -> str:
    return "".join(m.role + m.content for m in messages)


def fake_verdict(messages: Sequence[Message]) -> str:
    """The fake judge's text for one call (see the module docstring)."""
    text = messages[-1].content
    if "[The Start of Assistant A's Answer]" in text:
        for letter in "ABCD":
            match = re.search(
                rf"\[The Start of Assistant {letter}'s Answer\]\n(.*?)\n\[The End of Assistant {letter}'s Answer\]",
                text, re.S,
            )
            if match and "GOOD" in match.group(1):
                return f"I pick [[{letter}]]"
        return "no idea"
    if "<|The Start of Assistant A's Answer|>" in text:
        a = text.split("<|The Start of Assistant A's Answer|>")[1].split("<|The End of Assistant A's Answer|>")[0]
        b = text.split("<|The Start of Assistant B's Answer|>")[1].split("<|The End of Assistant B's Answer|>")[0]
        if ("GOOD" in a) == ("GOOD" in b):
            return "\\boxed{A=B}"
        return "\\boxed{A>B}" if "GOOD" in a else "\\boxed{B>A}"
    response = text.split("[Response]\n")[1].split("\n\n[Your judgement]")[0]
    return "Rating: 8" if "GOOD" in response else "Rating: 3"


@dataclass
class FakeJudgeEngine:
    """In-memory :class:`~rmserve.server.engines.protocol.JudgeEngine` with test hooks.

    Attributes:
        model: what :meth:`info` reports.
        max_tokens: generated characters per call at most.
        block_size: prefix-cache block size (characters).
        reply_of: when set, the text of a call from its messages (replaces :func:`fake_verdict`).
        gate: when set, :meth:`judge_group` waits for it after recording the call.
        fail_with: raised by :meth:`judge_group` (after recording the call) when not None.
        calls: ``(request_id, calls)`` of every :meth:`judge_group` call.
        cancelled: request ids whose :meth:`judge_group` was cancelled.
    """

    model: ModelInfo = FAKE_JUDGE_MODEL
    max_tokens: int = 64
    block_size: int = 4
    reply_of: Callable[[Sequence[Message]], str] | None = None
    gate: asyncio.Event | None = None
    fail_with: BaseException | None = None
    calls: list[tuple[str, tuple[tuple[Message, ...], ...]]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    started: bool = False
    shutdown_calls: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0

    async def start(self) -> LoadedModel:
        self.started = True
        return LoadedModel(info=self.model)

    def info(self) -> ModelInfo:
        return self.model

    async def judge_group(self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0) -> list[JudgeOutput]:
        if not self.started:
            raise EngineNotReady("fake judge not started")
        group = tuple(tuple(c) for c in calls)
        self.calls.append((request_id, group))
        self.entered.set()
        for messages in group:
            tokens = fake_prompt_tokens(messages)
            if tokens >= self.model.max_model_len:
                raise SequenceTooLong(
                    f"a judge prompt is {tokens} tokens, leaving no room to generate within "
                    f"max_model_len={self.model.max_model_len}",
                    field="messages", value=tokens, limit=self.model.max_model_len,
                )
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        if self.fail_with is not None:
            raise self.fail_with
        outputs = []
        for k, messages in enumerate(group):
            text = (self.reply_of or fake_verdict)(messages)
            finish = "stop"
            if len(text) > self.max_tokens:
                text, finish = text[: self.max_tokens], "length"
            prompt = fake_prompt_tokens(messages)
            cached = 0
            flat = _flat(messages)
            for earlier in group[:k]:
                other = _flat(earlier)
                n = 0
                for x, y in zip(flat, other):
                    if x != y:
                        break
                    n += 1
                cached = max(cached, n)
            cached = min(cached, prompt - 1) // self.block_size * self.block_size
            outputs.append(JudgeOutput(text=text, prompt_tokens=prompt, completion_tokens=len(text),
                                       finish_reason=finish, cached_tokens=cached))
            self.query_tokens += prompt
            self.hit_tokens += cached
        return outputs

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(query_tokens=self.query_tokens, hit_tokens=self.hit_tokens)

    async def shutdown(self) -> None:
        self.started = False
        self.shutdown_calls += 1


def rb2_group(subset: str, gid: str, *, correct: int = 1, rejected: int = 3, good: bool = True,
              question: str = "What is two plus two?") -> Group:
    """A RewardBench 2 group: ``correct`` correct answers (holding ``GOOD`` when ``good``) then
    ``rejected`` rejected ones."""
    chosen = tuple(f"{'GOOD ' if good else ''}answer four #{k}" for k in range(correct))
    others = tuple(f"answer {5 + k}" for k in range(rejected))
    return Group(benchmark="rewardbench2", domain=subset, id=gid, messages=(Message("user", question),),
                 responses=chosen + others, num_chosen=correct)


def rmbench_group(domain: str, gid: str, *, good: bool = True, question: str = "Say hello.") -> Group:
    """An RM-Bench group: 3 chosen answers (holding ``GOOD`` when ``good``), 3 rejected, with styles."""
    chosen = tuple(f"{'GOOD ' if good else ''}hello {style}" for style in RMBENCH_STYLES)
    rejected = tuple(f"bye {style}" for style in RMBENCH_STYLES)
    return Group(benchmark="rm-bench", domain=domain, id=gid, messages=(Message("user", question),),
                 responses=chosen + rejected, num_chosen=3, styles=RMBENCH_STYLES + RMBENCH_STYLES)
