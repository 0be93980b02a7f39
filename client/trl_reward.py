"""A reward function for TRL's ``GRPOTrainer`` that scores with an rmserve server.

``GRPOTrainer(reward_funcs=[RMServeReward(server=URL)])`` makes the trainer's rewards those
of the reward model (RM) the server serves, the same RM ``rmserve eval`` scores on RM-Bench
and RewardBench 2. The contract of a TRL reward function (``trl`` 1.16,
``GRPOTrainer._calculate_rewards``): it is called with keyword arguments ``prompts``,
``completions`` and ``completion_ids`` (one entry per sample: B prompts × G generations), every
other dataset column, ``trainer_state`` (a ``transformers.TrainerState``), ``log_extra`` and
``log_metric``; it returns one float or ``None`` per sample (``None``: no reward for that
sample; TRL leaves it out of the sum and the logged means). A callable whose ``__call__`` is a
coroutine function is awaited on the trainer's own event loop, concurrently with the other
async reward functions: :class:`AsyncRMServeReward`. TRL logs each function's rewards under
its ``__name__`` (``rewards/NAME/mean``).

What is sent: samples are grouped by prompt (equal prompt text, or equal messages), one group
per prompt in order of first appearance, its completions in sample order, so the server
computes a prompt shared by the G generations once (prefix caching). A text prompt is one user
turn; a conversational prompt (a list of ``{"role", "content"}``) is sent as its messages
(the last must be a ``user`` turn), and a conversational completion must be one assistant
message, whose ``content`` is the response. The server renders the RM's own chat template and
tokenizer; ``completion_ids`` (the policy's tokens) are not used.

What comes back: the raw reward per sample, in sample order; ``None`` where the server could
not score that sample (over the RM's max length, a non-finite reward: a per-response error,
logged as a warning). Nothing is ever turned into 0: a failed connection, a timeout and any
HTTP error other than the retried 429/503 raise after
:class:`~rmserve.client.client.RewardClient`'s retries, and the training step fails.

The RM is pinned: the fingerprint of the first reply is kept (:attr:`RMServeReward.fingerprint`)
and every later request carries it, so a server that swapped its model answers 409 and the
call raises :class:`~rmserve.errors.FingerprintMismatch` (unless ``allow_fingerprint_change``:
then each change is logged and kept in :attr:`RMServeReward.fingerprints`). The RM that
trained a policy can then be named exactly.

The HTTP client runs on an event loop of its own, in a daemon thread started at the first
call, so the sync class works in any thread and the async one on any loop; :meth:`close` (or
``with``) ends it. No torch, vllm or trl import here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rmserve import errors
from rmserve.client.client import RewardClient
from rmserve.client.config import Concurrency, Retry, Timeouts, check_positive
from rmserve.schema import Group, Message, ScoreRecord

__all__ = ["AsyncRMServeReward", "RMServeReward", "ScoredSample", "TOKEN_ENV"]

logger = logging.getLogger("rmserve.trl")

TOKEN_ENV = "RMSERVE_TOKEN"
"""Environment variable read for the bearer token when none is given (as ``rmserve eval``)."""

BENCHMARK = "trl"
"""The ``benchmark`` part of the wire ids of the groups sent (``trl/prompt/N``)."""


class ScoredSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of the sample log (``log_path``): a scored sample and the RM that scored it.

    Attributes:
        step: ``trainer_state.global_step`` when TRL passed it, else None.
        prompt: the prompt as TRL passed it: a text, or its messages.
        completion: the response text scored.
        reward: the raw reward; None where the server could not score it (see ``error``).
        error: the server's reason for a None reward.
        model, fingerprint: the served model's name and fingerprint.
        time: Unix time of the reply, seconds.
    """

    step: int | None
    prompt: str | tuple[Message, ...]
    completion: str
    reward: float | None
    model: str
    fingerprint: str
    time: float
    error: str | None = None


def _messages(value: Any, what: str) -> tuple[Message, ...]:
    """``value`` (a list of ``{"role", "content"}``) as messages; ``what`` names it in errors.

    Raises:
        ValueError: not a non-empty list of dicts with string ``role`` and ``content``.
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{what} must be a text or a non-empty list of {{'role', 'content'}} messages, got {value!r}")
    out = []
    for k, turn in enumerate(value):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
            raise ValueError(
                f"{what}[{k}] must be a dict with string 'role' and 'content' (multimodal content is not "
                f"supported), got {turn!r}"
            )
        extra = sorted(key for key, v in turn.items() if key not in ("role", "content") and v not in (None, "", [], {}))
        if extra:
            raise ValueError(f"{what}[{k}] carries {extra}, which the reward model's request cannot hold")
        out.append(Message(role=turn["role"], content=turn["content"]))
    return tuple(out)


def sample_parts(prompt: Any, completion: Any, index: int) -> tuple[tuple[Message, ...], str]:
    """One sample as (the group's messages, the response text).

    A text prompt is one user turn; a conversational prompt its messages, ending with a user
    turn. A text completion is the response; a conversational one must be exactly one
    ``assistant`` message.

    Raises:
        ValueError: naming ``prompts[index]`` / ``completions[index]`` and what is wrong.
    """
    if isinstance(prompt, str):
        messages: tuple[Message, ...] = (Message(role="user", content=prompt),)
    else:
        messages = _messages(prompt, f"prompts[{index}]")
        if messages[-1].role != "user":
            raise ValueError(
                f"prompts[{index}] ends with a {messages[-1].role!r} turn; the completion must answer a 'user' turn"
            )
    if isinstance(completion, str):
        return messages, completion
    turns = _messages(completion, f"completions[{index}]")
    if len(turns) != 1 or turns[0].role != "assistant":
        roles = [t.role for t in turns]
        raise ValueError(
            f"completions[{index}] has the turns {roles}; a completion must be one 'assistant' message "
            "(tool calls and results cannot be scored by a reward model request)"
        )
    return messages, turns[0].content


def group_samples(prompts: Sequence[Any], completions: Sequence[Any]) -> tuple[list[Group], list[tuple[int, int]]]:
    """Samples grouped by prompt: one :class:`~rmserve.schema.Group` per distinct prompt (order
    of first appearance), its responses in sample order, and where each sample went.

    Returns:
        (the groups: ids ``trl/prompt/0``, ``trl/prompt/1`` …; for sample ``i``, its (group index,
        response index)).

    Raises:
        ValueError: ``prompts`` and ``completions`` of different lengths, or a sample
            :func:`sample_parts` refuses.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions; one prompt per completion")
    index: dict[tuple[Message, ...], int] = {}
    messages_of: list[tuple[Message, ...]] = []
    responses: list[list[str]] = []
    where: list[tuple[int, int]] = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        messages, response = sample_parts(prompt, completion, i)
        gi = index.setdefault(messages, len(messages_of))
        if gi == len(messages_of):
            messages_of.append(messages)
            responses.append([])
        where.append((gi, len(responses[gi])))
        responses[gi].append(response)
    groups = [
        Group(benchmark=BENCHMARK, domain="prompt", id=str(gi), messages=messages, responses=tuple(rs), num_chosen=0)
        for gi, (messages, rs) in enumerate(zip(messages_of, responses, strict=True))
    ]
    return groups, where


class _Runtime:
    """The client's event loop thread and its open :class:`RewardClient` (one per reward function)."""

    def __init__(self, make_client: Callable[[], RewardClient]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rmserve-reward", daemon=True)
        self.thread.start()
        self.client = asyncio.run_coroutine_threadsafe(self._open(make_client), self.loop).result()

    @staticmethod
    async def _open(make_client: Callable[[], RewardClient]) -> RewardClient:
        return await make_client().__aenter__()

    def submit(self, coro) -> Any:
        """``coro`` scheduled on the loop thread: its ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Close the client's session, stop the loop and its thread (idempotent)."""
        if self.loop.is_closed():
            return
        if self.loop.is_running():
            try:
                self.submit(self.client.__aexit__(None, None, None)).result(timeout=10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class RMServeReward:
    """A TRL reward function (synchronous ``__call__``) scoring with an rmserve server (see the
    module docstring).

    Args:
        server: the server's base URL, ``http://host:port``.
        token: bearer token of a server with a users file; None reads ``RMSERVE_TOKEN`` (unset:
            no token).
        timeout_s: limit of one scoring request, seconds (> 0; default 600), retries apart.
        model: the served model's name on a server of several (None: the only one).
        expect_fingerprint: the RM fingerprint the run must use; None takes the first reply's.
        allow_fingerprint_change: accept a server whose model changed between calls (each
            change logged and kept in :attr:`fingerprints`) instead of raising. Default False.
        name: the ``__name__`` TRL logs the rewards under. Default ``rmserve``.
        log_path: a JSONL file that receives a sample of the scored samples
            (:class:`ScoredSample` lines, appended); None: no log.
        log_rate: the fraction of samples logged, in [0, 1] (each drawn independently).
        log_seed: seed of that draw.
        priority: the fair-queue hint sent to the server (``interactive`` by default: the
            trainer waits for the rewards; ``batch``; None sends none).
        retry, concurrency: the :class:`RewardClient`'s settings (its defaults: 5 attempts with
            backoff for connection errors, 429 and 503; 32 groups in flight, one per request).

    Attributes:
        fingerprint: the RM fingerprint in use (None before the first reply, unless
            ``expect_fingerprint``).
        fingerprints: every fingerprint seen, in order.
        model_name: the served model's name from the last reply.
        calls: calls answered; samples: samples scored; unscored: samples answered None.

    Raises:
        ValueError: a bad ``server`` URL, ``timeout_s``, ``log_rate`` or ``priority``.
    """

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        timeout_s: float = 600.0,
        model: str | None = None,
        expect_fingerprint: str | None = None,
        allow_fingerprint_change: bool = False,
        name: str = "rmserve",
        log_path: str | os.PathLike[str] | None = None,
        log_rate: float = 1.0,
        log_seed: int = 0,
        priority: str | None = "interactive",
        retry: Retry = Retry(),
        concurrency: Concurrency = Concurrency(),
    ) -> None:
        check_positive("RMServeReward", "timeout_s", timeout_s)
        if isinstance(log_rate, bool) or not isinstance(log_rate, (int, float)) or not 0 <= log_rate <= 1:
            raise ValueError(f"RMServeReward.log_rate must be in [0, 1], got {log_rate!r}")
        self.server = server
        self._token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeouts = Timeouts(connect_s=min(10.0, timeout_s), sock_read_s=timeout_s, total_s=timeout_s,
                                 probe_s=min(10.0, timeout_s))
        self.model = model
        self.allow_fingerprint_change = allow_fingerprint_change
        self.__name__ = name
        self.log_path = Path(log_path) if log_path is not None else None
        self.log_rate = float(log_rate)
        self._rng = random.Random(log_seed)
        self.priority = priority
        self.retry = retry
        self.concurrency = concurrency
        self.fingerprint: str | None = expect_fingerprint
        self.fingerprints: list[str] = [expect_fingerprint] if expect_fingerprint is not None else []
        self.model_name: str | None = None
        self.calls = self.samples = self.unscored = 0
        self._lock = threading.Lock()
        self._runtime: _Runtime | None = None
        self._finalizer: weakref.finalize | None = None
        self._make_client()  # checks the URL and priority now, not at the first training step

    def __repr__(self) -> str:
        return f"{type(self).__name__}(server={self.server!r}, model={self.model!r}, fingerprint={self.fingerprint!r})"

    def _make_client(self) -> RewardClient:
        return RewardClient(self.server, timeouts=self.timeouts, retry=self.retry, concurrency=self.concurrency,
                            token=self._token, priority=self.priority,
                            no_token_hint=f"pass token=... to {type(self).__name__} or set {TOKEN_ENV}")

    # --- the runtime ------------------------------------------------------------------

    def _started(self) -> _Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = _Runtime(self._make_client)
                self._finalizer = weakref.finalize(self, self._runtime.close)
            return self._runtime

    def close(self) -> None:
        """End the client's session and its thread; a later call starts them again."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        if runtime is not None:
            runtime.close()

    def __enter__(self) -> RMServeReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_runtime=None, _finalizer=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # --- scoring ----------------------------------------------------------------------

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        """Score the samples: one reward (or None) per sample, in sample order.

        Args:
            prompts: one prompt per sample: a text, or a list of ``{"role", "content"}``.
            completions: one completion per sample: a text, or a list holding one assistant
                message.
            **kwargs: what else TRL passes (``completion_ids``, dataset columns, ``log_extra`` …);
                ``trainer_state.global_step`` is written into the sample log.

        Raises:
            ValueError: a sample that cannot be sent (:func:`sample_parts`).
            rmserve.errors.FingerprintMismatch: the server's RM is not the pinned one.
            rmserve.errors.ConnectionFailed: no reply after the retries.
            rmserve.errors.RMServeError: any other refused request (4xx, 5xx).
        """
        groups, where = group_samples(prompts, completions)
        if not groups:
            return []
        records = self._started().submit(self._score(groups)).result()
        return self._finish(prompts, completions, groups, where, records, kwargs)

    async def _score(self, groups: list[Group]) -> dict[str, ScoreRecord]:
        """On the loop thread: every group scored (pinned to :attr:`fingerprint` unless changes
        are allowed), by wire id."""
        client = self._runtime.client if self._runtime is not None else None
        assert client is not None
        pin = None if self.allow_fingerprint_change else self.fingerprint
        try:
            records = [r async for r in client.score_stream(groups, model=self.model, expect_fingerprint=pin)]
        except errors.FingerprintMismatch as exc:
            raise errors.FingerprintMismatch(
                f"the reward model changed during training: this reward function is pinned to fingerprint "
                f"{pin!r} ({exc.message}); restart the server on that model, or pass allow_fingerprint_change=True",
                field="fingerprint", value=pin,
            ) from exc
        return {str(record.key): record for record in records}

    def _finish(
        self, prompts: Sequence[Any], completions: Sequence[Any], groups: list[Group], where: list[tuple[int, int]],
        records: dict[str, ScoreRecord], kwargs: dict[str, Any],
    ) -> list[float | None]:
        """Rewards in sample order; the fingerprint kept or checked; the None rewards warned
        about; the sampled log written."""
        seen = {record.fingerprint for record in records.values()}
        if len(seen) != 1:
            raise errors.FingerprintMismatch(
                f"the server answered one call with several models (fingerprints {sorted(seen)}): it swapped its "
                "model mid-call", field="fingerprint",
            )
        (fingerprint,) = seen
        self._keep_fingerprint(fingerprint)
        ordered = [records[str(group.key)] for group in groups]
        self.model_name = ordered[0].model
        rewards: list[float | None] = []
        reasons: list[str | None] = []
        for gi, j in where:
            record = ordered[gi]
            rewards.append(record.rewards[j])
            error = record.errors[j] if record.errors is not None else None
            reasons.append(None if error is None else f"{error.type}: {error.message}")
        unscored = [i for i, r in enumerate(rewards) if r is None]
        self.calls += 1
        self.samples += len(rewards)
        self.unscored += len(unscored)
        if unscored:
            first = unscored[0]
            logger.warning("%s: %d of %d samples have no reward (None); first, sample %d: %s", self.__name__,
                           len(unscored), len(rewards), first, reasons[first])
        if self.log_path is not None and self.log_rate > 0:
            self._log(prompts, completions, rewards, reasons, kwargs.get("trainer_state"))
        return rewards

    def _keep_fingerprint(self, fingerprint: str) -> None:
        if self.fingerprint is None:
            self.fingerprint = fingerprint
            self.fingerprints.append(fingerprint)
            logger.info("%s: scoring with reward model fingerprint %s", self.__name__, fingerprint)
        elif fingerprint != self.fingerprint:
            if not self.allow_fingerprint_change:  # the pin makes the server refuse first; a server that ignores it
                raise errors.FingerprintMismatch(
                    f"the reward model changed during training: fingerprint {fingerprint!r}, pinned "
                    f"{self.fingerprint!r}; pass allow_fingerprint_change=True to accept it", field="fingerprint",
                )
            logger.warning("%s: the reward model changed: fingerprint %s (was %s)", self.__name__, fingerprint,
                           self.fingerprint)
            self.fingerprint = fingerprint
            self.fingerprints.append(fingerprint)

    def _log(self, prompts, completions, rewards, reasons, trainer_state) -> None:
        """Append the drawn samples to :attr:`log_path` (:class:`ScoredSample` lines)."""
        step = getattr(trainer_state, "global_step", None)
        now = time.time()
        lines = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            if self._rng.random() >= self.log_rate:
                continue
            messages, response = sample_parts(prompt, completion, i)
            sample = ScoredSample(
                step=step if isinstance(step, int) else None,
                prompt=prompt if isinstance(prompt, str) else messages, completion=response, reward=rewards[i],
                model=self.model_name or "", fingerprint=self.fingerprint or "", time=now, error=reasons[i],
            )
            lines.append(msgspec.json.encode(sample) + b"\n")
        if lines:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as out:
                out.write(b"".join(lines))


class AsyncRMServeReward(RMServeReward):
    """:class:`RMServeReward` with a coroutine ``__call__``: TRL awaits it on its own event loop,
    concurrently with its other async reward functions (same arguments, result and errors)."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        """As :meth:`RMServeReward.__call__`, awaited; the sample log is written in a thread."""
        groups, where = group_samples(prompts, completions)
        if not groups:
            return []
        runtime = await asyncio.to_thread(self._started)
        records = await asyncio.wrap_future(runtime.submit(self._score(groups)))
        return await asyncio.to_thread(self._finish, prompts, completions, groups, where, records, kwargs)
