"""``rmserve sweep``: score every checkpoint of a training run on one or more servers.

For each checkpoint, in step order: every server is asked to load it in place
(``POST /v1/models/load``), every server must then report the same model fingerprint, and
the benchmark groups not yet in the score store under that fingerprint are spread over the
servers, each new group going to the server with the fewest outstanding requests. Records
go into the SQLite score store (:mod:`rmserve.client.score_store`) as they arrive, so a sweep
killed at any point resumes where it stopped: a checkpoint whose groups are all stored is
not loaded again, and no stored group is scored twice.

A server that stops answering is taken out of the rotation, its groups go back in the
queue, and it is polled until it answers again (``server_wait_s``); it is then loaded with
the current checkpoint again (a restarted server serves its start-up model) and rejoins once
its fingerprint matches. A reply with another fingerprint is never stored.

The figures, tables and plots are computed afterwards from the store by
:mod:`rmserve.metrics.sweep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from rmserve.client.client import RewardClient
from rmserve.client.config import DEFAULT_MAX_RETRY_AFTER_S, PRIORITIES, Concurrency, Retry, Timeouts
from rmserve.client.records import record_from_result, refused_record
from rmserve.pipelines.evaluate import progress_bar, show_rate, wait_for_server
from rmserve.pipelines.progress import duration_text
from rmserve.pipelines.outcome import strict_stop, unscored
from rmserve.client.score_log import stale_groups
from rmserve.client.score_store import ScoreStore, checkpoint_signature

from rmserve import errors
from rmserve.schema import (
    BENCHMARKS,
    CLASSIFIER_KIND,
    JUDGE_KIND,
    Group,
    ModelInfo,
    RewardHead,
    ScoreKind,
    ScoreRecord,
    Truncation,
)

logger = logging.getLogger("rmserve.sweep")

_STEP = re.compile(r"(\d+)")

SPREADS = ("groups", "checkpoints")
"""The values of :attr:`SweepConfig.spread`."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """One checkpoint of a sweep: its training step (from the folder name) and folder."""

    step: int
    path: Path

    @property
    def name(self) -> str:
        """The folder name (``step-1000``), used as the served model name."""
        return self.path.name


def checkpoint_step(path: str | Path) -> int:
    """The training step of a checkpoint folder: the last integer in its name.

    ``step-1000`` → 1000, ``checkpoint-500`` → 500, ``global_step200`` → 200.

    Raises:
        ValueError: the name holds no digits (names the folder).
    """
    numbers = _STEP.findall(Path(path).name)
    if not numbers:
        raise ValueError(f"checkpoints: cannot read a step from {str(path)!r} (no number in its name)")
    return int(numbers[-1])


def order_checkpoints(paths: Sequence[str | Path]) -> list[Checkpoint]:
    """The checkpoint folders sorted by step.

    Raises:
        ValueError: no folders; a path that is not a folder; a name without a step; two
            folders with the same step (both named).
    """
    if not paths:
        raise ValueError("checkpoints: no checkpoint folder given")
    by_step: dict[int, Path] = {}
    for raw in paths:
        path = Path(raw).expanduser().absolute()
        if not path.is_dir():
            raise ValueError(f"checkpoints: {str(raw)!r} is not a folder")
        step = checkpoint_step(path)
        if step in by_step and by_step[step] != path:
            raise ValueError(f"checkpoints: {str(by_step[step])!r} and {str(path)!r} both have step {step}")
        by_step[step] = path
    return [Checkpoint(step, path) for step, path in sorted(by_step.items())]


@dataclass(frozen=True)
class SweepConfig:
    """Settings of one sweep (``rmserve sweep``)."""

    servers: tuple[str, ...]
    """Base URLs of the scoring servers (at least one; each started with an admin token and a
    ``--checkpoint-root`` holding the checkpoints)."""

    checkpoints: tuple[Path, ...]
    """Checkpoint folders (any order; sorted by the step in their names)."""

    data: tuple[tuple[str, str], ...]
    """(benchmark, data path or hub id) pairs, one per benchmark, scored in this order."""

    out_dir: Path
    """Output folder: ``sweep.csv``, ``sweep.json``, ``summary.md``, plots, per-checkpoint exports."""

    store: Path
    """The SQLite score store shared by runs (see :mod:`rmserve.client.score_store`)."""

    token: str | None = field(default=None, repr=False)
    """Bearer token sent with every request (servers with a users file need one); None: none."""

    admin_token: str | None = None
    """The servers' admin token for ``POST /v1/models/load``; needed unless every checkpoint is stored."""

    max_in_flight: int = 32
    """Most groups outstanding per server. Default 32; 1–4096."""

    timeout_s: float = 900.0
    """Limit of one scoring request, seconds. Default 900; > 0."""

    load_timeout_s: float = 1800.0
    """Limit of one checkpoint load on one server, seconds. Default 1800; > 0."""

    server_wait_s: float = 600.0
    """How long to wait for a server that is loading, or that stopped answering during the
    sweep, before giving up on it, seconds. Default 600; > 0."""

    max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S
    """Longest wait taken from a reply's ``Retry-After`` before a retry, seconds
    (:attr:`~rmserve.client.config.Retry.max_retry_after_s`: a longer one is cut to it, with a
    warning). Default 60; > 0."""

    wait_for_server: bool = False
    """At the start, also wait (up to ``server_wait_s``) for a server that does not accept
    connections yet. Default False: a refused connection at the start fails after a few
    seconds, naming the address (a server that stops answering during the sweep is always
    waited for)."""

    only: tuple[str, ...] | None = None
    """Only these domains (RM-Bench) / subsets (RewardBench 2), named as the tables name them
    (any case; RM-Bench ``safety`` is both safety domains; :func:`rmserve.datasets.select_parts`);
    each benchmark keeps the names that are its own. Default: all."""

    resamples: int = 1000
    """Bootstrap resamples for intervals and paired differences (≥ 1). Default 1000."""

    seed: int = 0
    """Bootstrap seed. Default 0."""

    quiet: bool = False
    """No status or progress lines on stderr. Default False (a bar on a terminal, a plain
    line every few seconds elsewhere)."""

    truncation: Truncation | None = None
    """Cut sequences over ``truncation.max_tokens`` from ``truncation.side`` (sent with every
    request, recorded per group). Default None: an over-length sequence is not scored."""

    strict: bool = False
    """Stop at the first group that cannot be scored (after storing it). Default False: the
    sweep finishes and names such groups per checkpoint."""

    priority: str = "batch"
    """Priority hint sent with every request (header ``X-RMServe-Priority``): ``batch`` (a
    sweep) or ``interactive``; the server's fair queue and engine use it."""

    spread: str = "groups"
    """How the work is spread over several servers: ``groups`` (every server loads each
    checkpoint in turn and its groups go to the least busy) or ``checkpoints`` (each server
    takes the next checkpoint not started and scores it alone; a checkpoint whose server is lost
    goes to the next free one, which scores only its groups not stored yet). Default ``groups``;
    the Ray driver uses ``checkpoints`` (one swap per checkpoint, not one per server)."""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {self.priority!r}")
        if self.spread not in SPREADS:
            raise ValueError(f"spread must be one of {', '.join(SPREADS)}, got {self.spread!r}")
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "checkpoints", tuple(Path(p) for p in self.checkpoints))
        object.__setattr__(self, "data", tuple((b, str(d)) for b, d in self.data))
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "store", Path(self.store))
        if not self.servers:
            raise ValueError("server: give at least one server URL")
        if len(set(self.servers)) != len(self.servers):
            raise ValueError("server: a URL is given twice")
        for url in self.servers:
            RewardClient(url)  # raises ValueError naming a bad URL
        if not self.data:
            raise ValueError("bench: give at least one benchmark")
        benches = [b for b, _ in self.data]
        for bench in benches:
            if bench not in BENCHMARKS:
                raise ValueError(f"bench: {bench!r} is not one of {', '.join(BENCHMARKS)}")
        if len(set(benches)) != len(benches):
            raise ValueError("bench: a benchmark is given twice")
        if isinstance(self.max_in_flight, bool) or not isinstance(self.max_in_flight, int) or not 1 <= self.max_in_flight <= 4096:
            raise ValueError(f"max_in_flight must be an integer in [1, 4096], got {self.max_in_flight!r}")
        for name in ("timeout_s", "load_timeout_s", "server_wait_s", "max_retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not isinstance(self.resamples, int) or self.resamples < 1:
            raise ValueError(f"resamples must be an integer ≥ 1 (paired differences need them), got {self.resamples!r}")
        if self.only is not None:
            object.__setattr__(self, "only", tuple(self.only))


@dataclass
class CheckpointRun:
    """What the sweep did for one checkpoint.

    Attributes:
        checkpoint: the checkpoint.
        fingerprint: the model fingerprint all servers reported for it.
        model: the model name served.
        n_groups: benchmark groups (all benchmarks).
        n_scored: groups scored in this run.
        n_stored: groups found in the store.
        loaded: whether the servers were asked to load it (False when fully stored).
        per_server: server URL → groups it scored for this checkpoint in this run.
        n_unscored: groups of the checkpoint with a response that could not be scored (all
            benchmarks; counted by the figures as the official code counts them).
        n_from_cache: of ``n_scored``, the groups the servers answered from their result cache
            (no engine work: left out of every rate).
        scoring_s: seconds from the first scoring request for this checkpoint to its last
            answer (0 when nothing was scored).
    """

    checkpoint: Checkpoint
    fingerprint: str
    model: str
    n_groups: int
    n_scored: int
    n_stored: int
    loaded: bool
    per_server: dict[str, int] = field(default_factory=dict)
    n_unscored: int = 0
    n_from_cache: int = 0
    scoring_s: float = 0.0

    @property
    def n_engine(self) -> int:
        """Groups the engines scored for this checkpoint in this run (``n_scored`` less the cached)."""
        return self.n_scored - self.n_from_cache

    def line(self) -> str:
        """What the sweep did for this checkpoint, one line: ``step-20 (step 20, fingerprint F):
        60 scored (URL 60), 0 from the store; 40 by the engine in 12 s (3.3 groups/s), 20 from
        the servers' result cache`` (the rate counts the engine's groups only; the last two parts
        only when something was scored)."""
        where = ", ".join(f"{url} {n}" for url, n in self.per_server.items() if n)
        text = (
            f"{self.checkpoint.name} (step {self.checkpoint.step}, fingerprint {self.fingerprint}): "
            f"{self.n_scored} scored{f' ({where})' if where else ''}, {self.n_stored} from the store"
        )
        if self.n_scored:
            text += f"; {engine_work(self.n_engine, self.scoring_s, self.n_from_cache)}"
        return text


def engine_work(engine_groups: int, seconds: float, from_cache: int, *, wall: bool = False) -> str:
    """``40 by the engine in 12 s (3.3 groups/s), 20 from the servers' result cache``: the rate
    is the engine's groups over ``seconds``; groups answered from the result cache are named,
    never counted in it (no cache part when there were none); ``none by the engine, 20 from the
    servers' result cache`` when the engine scored none. ``wall``: ``seconds`` is wall time over
    several servers working at once (``in 19 s of wall time``)."""
    if engine_groups == 0:
        return f"none by the engine, {from_cache} from the servers' result cache" if from_cache else "none by the engine"
    rate = engine_groups / seconds if seconds > 0 else 0.0
    when = f"{duration_text(seconds)} of wall time" if wall else duration_text(seconds)
    text = f"{engine_groups} by the engine in {when} ({rate:.1f} groups/s)"
    return f"{text}, {from_cache} from the servers' result cache" if from_cache else text


def summary_line(runs: Sequence[CheckpointRun], wall_s: float | None = None) -> str:
    """The sweep in one line: ``sweep: 120 groups scored over 3 checkpoints, 60 from the store;
    80 by the engine in 30 s (2.7 groups/s), 40 from the servers' result cache`` (groups summed
    over the checkpoints; the rate counts the engine's groups only). The seconds are the
    checkpoints' scoring seconds summed, or ``wall_s`` when given: checkpoints scored at the same
    time on several servers (``…in 19 s of wall time (20.4 groups/s)``)."""
    scored = sum(r.n_scored for r in runs)
    stored = sum(r.n_stored for r in runs)
    text = (f"sweep: {scored} groups scored over {len(runs)} checkpoint{'s' if len(runs) != 1 else ''}, "
            f"{stored} from the store")
    if scored:
        seconds = wall_s if wall_s is not None else sum(r.scoring_s for r in runs)
        text += "; " + engine_work(sum(r.n_engine for r in runs), seconds, sum(r.n_from_cache for r in runs),
                                   wall=wall_s is not None)
    return text


@dataclass
class SweepTally:
    """What a sweep has kept so far, filled in while it runs (so a failed sweep can say whether
    running it again resumes anything).

    Attributes:
        groups_kept: groups of this sweep's checkpoints in the score store: those found stored
            when a checkpoint came up, plus those this sweep stored since.
    """

    groups_kept: int = 0


@dataclass(frozen=True)
class SweepResult:
    """What a sweep produced: one :class:`CheckpointRun` per checkpoint (step order), the
    files written, refused servers and notes."""

    runs: tuple[CheckpointRun, ...]
    paths: tuple[Path, ...]
    summary_md: str
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    document: Mapping[str, Any] | None = None
    """The ``sweep.json`` document as written."""
    wall_s: float | None = None
    """Spread by checkpoints: seconds from the first checkpoint's start to the last one's end,
    the checkpoints scored at the same time on several servers (None otherwise: the
    checkpoints' own seconds add up)."""


# --- servers ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Server:
    """One server in the rotation and the sweep's view of it."""

    url: str
    client: RewardClient
    outstanding: int = 0
    serving: str | None = None
    """Fingerprint verified for the current checkpoint; None = out of the rotation."""
    refused: bool = False
    recovery: asyncio.Task[None] | None = None
    """The server's current recovery (see :meth:`_Sweep._start_recovery`); None = none."""
    scored: int = 0


@dataclass(frozen=True)
class _Scored:
    """What :meth:`_Sweep._score` did for one checkpoint."""

    per_server: dict[str, int]
    """Server URL → groups it scored."""
    from_cache: int
    """Groups the servers answered from their result cache."""
    seconds: float
    """Seconds from the first request to the last answer."""


class _Refused(errors.FingerprintMismatch):
    """A server loaded the checkpoint but reports another fingerprint."""


async def _load(server: _Server, checkpoint: Checkpoint, config: SweepConfig) -> ModelInfo:
    if config.admin_token is None:
        raise errors.Unauthorized(
            f"checkpoint {checkpoint.name} must be loaded on {server.url}, but no admin token was given "
            "(--admin-token-file or RMSERVE_ADMIN_TOKEN)",
            field="admin_token",
        )
    logger.info("loading %s on %s", checkpoint.name, server.url)
    try:
        return await server.client.load_checkpoint(
            checkpoint.name, str(checkpoint.path), admin_token=config.admin_token, timeout_s=config.load_timeout_s
        )
    except errors.Conflict as exc:
        if exc.field is not None:  # a refused checkpoint (path): nothing to add
            raise
        raise errors.Conflict(
            f"{server.url} refused to load checkpoint {checkpoint.name}: {exc.message}. Every group scored so far "
            "is kept in the score store; run the same command again to resume without scoring them again",
        ) from exc


def _refusal(server: _Server, checkpoint: Checkpoint, got: str, expected: str, source: str) -> _Refused:
    return _Refused(
        f"server {server.url} reports fingerprint {got} for checkpoint {checkpoint.name} ({checkpoint.path}), "
        f"but {source} reports {expected}: its scores are not accepted (a different checkpoint copy, tokenizer or "
        "chat template on that server?)",
        field="fingerprint",
        value=got,
    )


# --- the sweep --------------------------------------------------------------------------


class _Sweep:
    """State of one sweep run; see :func:`sweep`."""

    def __init__(
        self, config: SweepConfig, db: ScoreStore | None, datasets: dict[str, Any], tally: SweepTally | None = None
    ) -> None:
        self.config = config
        self._db = db
        self.tally = tally if tally is not None else SweepTally()
        self.datasets = datasets
        self.groups: list[Group] = [g for ds in datasets.values() for g in ds.groups]
        timeouts = Timeouts(connect_s=min(10.0, config.timeout_s), sock_read_s=config.timeout_s, total_s=config.timeout_s)
        concurrency = Concurrency(max_groups_in_flight=config.max_in_flight, groups_per_request=1)
        # Few attempts per request: a server that keeps failing is handled by the sweep
        # (out of the rotation, polled, loaded again), not by long client-side retries.
        retry = Retry(max_attempts=2, max_retry_after_s=config.max_retry_after_s)
        self.servers = [
            _Server(url, RewardClient(url, timeouts=timeouts, concurrency=concurrency, retry=retry, token=config.token,
                                      priority=config.priority))
            for url in config.servers
        ]
        self.notes: list[str] = []
        self.refused: list[str] = []
        self.dtype: str | None = None
        self.kind = ScoreKind()
        """What kind of score the servers give (from the first server's ``/v1/models``): a DPO
        server swaps the policy and keeps its reference, mode and compat."""
        self.head: RewardHead | None = None
        """The reward head the servers read (first server's ``/v1/models``; a swap keeps it)."""
        self.max_model_len: int | None = None
        """The first server's context limit at the start (tokens): a checkpoint found complete in
        the store is loaded after all when a response of it was over a shorter one."""
        self.template_override: str | None = None
        """The digest of the chat template the servers were started with (``--chat-template``),
        None when they render with each checkpoint's own."""
        self._ref_signature: str | None = None
        self.pinned: dict[Path, str] = {}
        """Checkpoint folder → the fingerprint it was first loaded under in this sweep (shared
        by the workers of a sweep spread by checkpoints: a checkpoint moved to another server
        must be scored under the same fingerprint)."""
        self.recoveries: dict[asyncio.Task[None], _Server] = {}
        """Recovery tasks whose outcome is not handled yet → the server each was started for.
        A server's ``recovery`` may already be a newer task than one listed here."""

    async def __aenter__(self) -> _Sweep:
        for server in self.servers:
            await server.client.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._drop_recoveries()
        for server in self.servers:
            await server.client.__aexit__(None, None, None)

    @property
    def db(self) -> ScoreStore:
        """The score store (opened by :func:`sweep_async` once the servers have answered)."""
        if self._db is None:
            raise RuntimeError("the sweep's score store is not open yet")
        return self._db

    @db.setter
    def db(self, db: ScoreStore) -> None:
        self._db = db

    def _active(self) -> list[_Server]:
        return [s for s in self.servers if not s.refused]

    async def prepare(self) -> None:
        """Wait for the servers and read the dtype they compute in (part of every fingerprint).

        Servers computing in another dtype than the first are refused (their scores would
        carry other fingerprints).

        A status line on stderr says what is waited for (unless ``quiet``).

        Raises:
            rmserve.errors.ConnectionFailed: nothing answers at a server's address (after a
                few seconds; unless ``wait_for_server``).
            rmserve.errors.EngineNotReady: a server is not ready within ``server_wait_s``.
        """
        infos = []
        for server in self.servers:
            await wait_for_server(
                server.client, self.config.server_wait_s, quiet=self.config.quiet,
                wait_for_server=self.config.wait_for_server, poll_interval_s=1.0,
            )
            infos.append((await server.client.models())[0])
        self.dtype = infos[0].dtype
        self.kind = ScoreKind.of(infos[0])
        self.max_model_len = infos[0].max_model_len
        self.head = None if infos[0].head is msgspec.UNSET else infos[0].head
        override = infos[0].chat_template_override
        self.template_override = None if override is msgspec.UNSET else override
        for server, info in zip(self.servers, infos, strict=True):
            if info.dtype != self.dtype:
                self._refuse(server, _Refused(
                    f"server {server.url} computes in {info.dtype}, server {self.servers[0].url} in {self.dtype}: "
                    "its scores are not accepted (start every server with the same --dtype)",
                    field="dtype", value=info.dtype,
                ))

    # -- one checkpoint ------------------------------------------------------------------

    def _signature(self, checkpoint: Checkpoint) -> str | None:
        """The score store's key for ``checkpoint`` as these servers score it, or None (no memo).

        A classifier: the folder's :func:`checkpoint_signature` with the servers' reward head
        and, when they render with a template given at their start, that template's digest
        (both from the first server's ``/v1/models``: a memo made under another head or
        template is never taken for this one). A DPO server:
        :func:`rmserve.fingerprint.dpo_fingerprint` of the folder's signature, the reference's
        (when ``ref_model`` is a folder here; a reference this process cannot hash gives None:
        the checkpoint is loaded and only its stored groups are skipped), the mode and compat,
        so one policy folder scored under two modes or references keeps two memos.
        """
        from rmserve.fingerprint import dpo_fingerprint

        signature = checkpoint_signature(
            checkpoint.path, self.dtype, head=self.head, chat_template_override=self.template_override
        )
        kind = self.kind
        if kind.kind == CLASSIFIER_KIND:
            return signature
        reference = None
        if kind.ref_model is not None:
            if not Path(kind.ref_model).is_dir():
                return None
            if self._ref_signature is None:  # the reference stays loaded: hashed once per sweep
                self._ref_signature = checkpoint_signature(kind.ref_model, self.dtype)
            reference = self._ref_signature
        if kind.mode is None or (kind.mode == "reference") != (reference is not None):
            return None
        return dpo_fingerprint(signature, reference, kind.mode, kind.compat)

    async def run_checkpoint(self, checkpoint: Checkpoint) -> CheckpointRun:
        signature = self._signature(checkpoint)
        known = self.db.fingerprint_for(signature) if signature is not None else None
        if known is not None:
            missing = self._missing(known, self.max_model_len)
            if not missing:
                self.tally.groups_kept += len(self.groups)
                return _stored_run(self.db, checkpoint, known, self.groups)[0]
        fingerprint, model, max_model_len = await self._load_everywhere(checkpoint, known)
        first = self.pinned.setdefault(checkpoint.path, fingerprint)
        if first != fingerprint:  # spread over servers: the one that started it reported another
            raise _refusal(self.servers[0], checkpoint, fingerprint, first, "the server that started it")
        if signature is not None:
            self.db.remember_checkpoint(signature, path=str(checkpoint.path), fingerprint=fingerprint, model=model)
        missing = self._missing(fingerprint, max_model_len)
        n_stored = len(self.groups) - len(missing)
        self.tally.groups_kept += n_stored
        if n_stored:
            logger.info("%s: %d groups already stored, %d to score", checkpoint.name, n_stored, len(missing))
        scored = await self._score(checkpoint, fingerprint, missing)
        self.db.flush()
        return CheckpointRun(
            checkpoint, fingerprint, model, len(self.groups), len(missing), n_stored, loaded=True,
            per_server=scored.per_server, n_from_cache=scored.from_cache, scoring_s=scored.seconds,
        )

    def _cache_counts(self) -> tuple[int, int]:
        """Groups and prompt tokens the servers have answered from their result cache so far
        (summed over every server's client)."""
        return (sum(s.client.cache_groups for s in self.servers), sum(s.client.cache_tokens for s in self.servers))

    def _missing(self, fingerprint: str, max_model_len: int | None) -> list[Group]:
        """:func:`missing_groups` of this sweep's groups."""
        return missing_groups(self.db, fingerprint, self.groups, self.config.truncation, max_model_len)

    async def _load_everywhere(self, checkpoint: Checkpoint, known: str | None) -> tuple[str, str, int]:
        """Load ``checkpoint`` on every active server; return (fingerprint, model name, the
        first loading server's max_model_len).

        The reference fingerprint is that of the first server (in ``--server`` order) that
        loads it; a server reporting another is refused for the rest of the sweep. Servers
        that do not answer are polled in the background and join once loaded; when none
        answers, this waits up to ``server_wait_s`` for one.
        """
        servers = self._active()
        for server in servers:
            server.serving = None
        await self._drop_recoveries()
        deadline = time.monotonic() + self.config.server_wait_s
        while True:
            outcomes = await asyncio.gather(*(_load(s, checkpoint, self.config) for s in servers), return_exceptions=True)
            reference: tuple[str, str, str, int] | None = None  # fingerprint, model, url, max_model_len
            down: list[_Server] = []
            failures: list[str] = []
            for server, outcome in zip(servers, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, errors.RMServeError) or not outcome.retryable:
                        raise outcome
                    down.append(server)
                    failures.append(f"{server.url}: {outcome}")
                    continue
                if reference is None:
                    reference = (outcome.fingerprint, outcome.name, server.url, outcome.max_model_len)
                if outcome.fingerprint != reference[0]:
                    self._refuse(
                        server, _refusal(server, checkpoint, outcome.fingerprint, reference[0], f"server {reference[2]}")
                    )
                    continue
                server.serving = outcome.fingerprint
            if reference is not None:
                break
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise errors.ConnectionFailed(f"no server could load checkpoint {checkpoint.name}: " + "; ".join(failures))
            logger.warning("no server could load %s yet (%s); waiting", checkpoint.name, "; ".join(failures))
            await _first_ready(down, remaining_s)
            servers = down
        for server in down:
            self._start_recovery(server, checkpoint, reference[0])
        if known is not None and known != reference[0]:
            self.notes.append(
                f"{checkpoint.name}: the servers report fingerprint {reference[0]}, the store had {known} for this "
                "folder (another chat template or tokenizer?); scored under the new fingerprint"
            )
        return reference[0], reference[1], reference[3]

    def _refuse(self, server: _Server, refusal: _Refused) -> None:
        """Take ``server`` out of the sweep for good; the message goes to the log and to
        :attr:`SweepResult.refused` (the CLI prints it).

        Raises:
            _Refused: ``refusal`` itself, when no server is left.
        """
        server.refused = True
        server.serving = None
        message = str(refusal)
        self.refused.append(message)
        logger.error("refused: %s", message)
        if not self._active():
            raise refusal

    # -- recovery --------------------------------------------------------------------------

    def _start_recovery(self, server: _Server, checkpoint: Checkpoint, fingerprint: str | None) -> None:
        """Take ``server`` out of the rotation and recover it in the background: poll it
        until it answers, load ``checkpoint`` on it, check ``fingerprint``.

        At most one recovery runs per server, and none for a refused server. A recovery that
        has finished but whose outcome is not handled yet (it completed in the same wait as
        the failure that calls this) does not count as running: the server failed again
        after it was started, so a new one is started, and :meth:`_recovery_done` treats the
        finished one as stale.
        """
        server.serving = None
        if server.refused or (server.recovery is not None and not server.recovery.done()):
            return
        task = asyncio.create_task(self._recover(server, checkpoint, fingerprint))
        server.recovery = task
        self.recoveries[task] = server

    async def _drop_recoveries(self) -> None:
        """Cancel every recovery and forget their outcomes (a new checkpoint loads anew)."""
        tasks = list(self.recoveries)
        self.recoveries.clear()
        for server in self.servers:
            server.recovery = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _recover(self, server: _Server, checkpoint: Checkpoint, fingerprint: str | None) -> None:
        logger.warning("%s stopped answering; waiting up to %g s for it", server.url, self.config.server_wait_s)
        await server.client.wait_until_ready(self.config.server_wait_s, poll_interval_s=1.0, wait_for_server=True)
        info = await _load(server, checkpoint, self.config)
        if fingerprint is not None and info.fingerprint != fingerprint:
            self._refuse(server, _refusal(server, checkpoint, info.fingerprint, fingerprint, "the other servers"))
            return
        server.serving = info.fingerprint
        logger.info("%s is back, serving %s", server.url, checkpoint.name)

    # -- scoring -------------------------------------------------------------------------

    async def _score(self, checkpoint: Checkpoint, fingerprint: str, groups: list[Group]) -> _Scored:
        """Score ``groups`` over the servers serving ``fingerprint``, least outstanding first.

        Returns server URL → groups it scored, how many came from the servers' result cache
        and the seconds it took. The progress display's rate and ETA leave the cached groups
        out (:func:`~rmserve.pipelines.evaluate.show_rate`). A retryable failure puts the group
        back in the queue and the server into recovery (:meth:`_start_recovery`).

        Raises:
            rmserve.errors.ConnectionFailed: no server is left (every group scored is stored).
            The first error that ends the sweep (a refused request, a refused load, every
            server refused), once every task finished in the same wait has been handled.
        """
        queue: deque[Group] = deque(groups)
        in_flight: dict[asyncio.Task[ScoreRecord], tuple[_Server, Group]] = {}
        per_server = {s.url: 0 for s in self.servers}
        window = self.config.max_in_flight
        bar = progress_bar(len(self.groups), len(self.groups) - len(groups), self.config.quiet, checkpoint.name)
        started = time.monotonic()
        cache_groups, cache_tokens = self._cache_counts()
        tokens = 0
        rotation = 0
        try:
            while queue or in_flight:
                ready = [s for s in self._active() if s.serving == fingerprint]
                while queue and ready:
                    # Least outstanding requests first; ties go round-robin.
                    rotation += 1
                    order = sorted(
                        range(len(ready)), key=lambda i: (ready[i].outstanding, (i - rotation) % len(ready))
                    )
                    server = ready[order[0]]
                    if server.outstanding >= window:
                        break
                    group = queue.popleft()
                    server.outstanding += 1
                    task = asyncio.create_task(self._score_one(server, group, fingerprint, checkpoint.name))
                    in_flight[task] = (server, group)
                # Every recovery whose outcome is not handled yet, finished or not.
                waiters: set[asyncio.Future[Any]] = {*in_flight, *self.recoveries}
                if not waiters:
                    raise errors.ConnectionFailed(
                        f"no server is left to score checkpoint {checkpoint.name} "
                        f"({len(queue)} groups not scored; everything scored is in {self.config.store})"
                    )
                # Every task of one wait is handled before an error that ends the sweep is
                # raised, so what is stored does not depend on the order they come in.
                fatal: BaseException | None = None
                for task in await _wait_first(waiters):
                    if task not in in_flight:
                        try:
                            self._recovery_done(task)
                        except errors.RMServeError as error:
                            fatal = fatal or error
                        continue
                    server, group = in_flight.pop(task)
                    server.outstanding -= 1
                    exc = task.exception()
                    if exc is None:
                        record = task.result()
                        self.db.put(record)
                        self.tally.groups_kept += 1
                        server.scored += 1
                        per_server[server.url] += 1
                        tokens += sum(record.num_tokens)
                        now_groups, now_tokens = self._cache_counts()
                        show_rate(bar, started, tokens - (now_tokens - cache_tokens), now_groups - cache_groups)
                        bar.update(1)
                        if self.config.strict and not record.scored:
                            fatal = fatal or strict_stop(
                                record, kept=f"stored in {self.db.path}", prefix=f"{checkpoint.name}: "
                            )
                        continue
                    queue.appendleft(group)
                    if isinstance(exc, errors.FingerprintMismatch) or (
                        isinstance(exc, errors.RMServeError) and exc.retryable
                    ):
                        if server.serving is not None:
                            logger.warning("%s: %s; taking it out of the rotation", server.url, exc)
                        self._start_recovery(server, checkpoint, fingerprint)
                        continue
                    fatal = fatal or exc
                if fatal is not None:
                    raise fatal
        finally:
            bar.close()
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
            self.db.flush()
        from_cache = self._cache_counts()[0] - cache_groups
        return _Scored(per_server, from_cache, time.monotonic() - started if groups else 0.0)

    def _recovery_done(self, task: asyncio.Future[Any]) -> None:
        """Handle the outcome of a finished recovery ``task``.

        The server is the one the task was started for (kept in :attr:`recoveries`), not
        whichever server holds it now: a failure handled in the same wait may already have
        replaced the server's recovery with a newer one. A stale success is ignored (the
        newer recovery decides when the server rejoins); a failure counts either way, so
        the outcome does not depend on the order in which one wait's tasks are handled.

        Raises:
            _Refused: the server was refused and no server is left.
            rmserve.errors.ClientFault: the load was refused (token, checkpoint root, …).
        """
        server = self.recoveries.pop(task)
        current = server.recovery is task
        if current:
            server.recovery = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if not current:
                logger.debug("%s: a recovery finished after a newer failure; the newer recovery decides", server.url)
            return
        if isinstance(exc, errors.ClientFault):
            raise exc
        if not current and server.recovery is not None:
            server.recovery.cancel()  # the server is out for good; its outcome is handled as cancelled
            server.recovery = None
        if isinstance(exc, _Refused):
            if not self._active():
                raise exc
            return
        message = f"{server.url} did not come back within {self.config.server_wait_s:g} s ({type(exc).__name__}: {exc})"
        server.refused = True
        server.serving = None
        self.refused.append(message)
        logger.error("%s", message)

    async def _score_one(self, server: _Server, group: Group, fingerprint: str, model: str) -> ScoreRecord:
        """Score one group on ``server``; a group whose tokens alone exceed the user's budget
        (413 ``request_over_limit``) is an unscored record (:func:`~rmserve.client.records.refused_record`
        under the checkpoint's ``model`` name), as in ``eval``."""
        judge = {"judge": True} if self.kind is not None and self.kind.kind == JUDGE_KIND else {}
        try:
            reply = await server.client.score([group], truncation=self.config.truncation, fingerprint=fingerprint,
                                              **judge)
        except errors.OverLimit as refusal:
            return refused_record(group, refusal, model=model, fingerprint=fingerprint,
                                  truncation=self.config.truncation, kind=self.kind)
        if reply.fingerprint != fingerprint:
            raise errors.FingerprintMismatch(
                f"{server.url} answered with fingerprint {reply.fingerprint} ({reply.model}), expected {fingerprint}",
                field="fingerprint",
            )
        (result,) = reply.results
        return record_from_result(
            group, result, model=reply.model, fingerprint=reply.fingerprint, truncation=self.config.truncation,
            kind=self.kind, scorer=reply.scorer,
        )


async def _wait_first(waiters: Collection[asyncio.Future[Any]]) -> Collection[asyncio.Future[Any]]:
    """The ``waiters`` that are done once at least one is (``asyncio.wait``, FIRST_COMPLETED).

    The sweep handles them in the order returned, which ``asyncio.wait`` leaves unspecified;
    its handling must not depend on that order (tests replace this function to choose it).
    """
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    return done


async def _first_ready(servers: Sequence[_Server], timeout_s: float) -> None:
    """Return once one of ``servers`` answers ``/health`` (or ``timeout_s`` passes)."""
    waits = [
        asyncio.create_task(s.client.wait_until_ready(timeout_s, poll_interval_s=1.0, wait_for_server=True))
        for s in servers
    ]
    try:
        while waits:
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() is None for t in done):
                return
            waits = list(pending)
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


LostWatch = Callable[[str], Awaitable["str | None"]]
"""Given a server URL, an awaitable that returns once that server is lost for good or restarted
elsewhere: the restarted server's URL, or None (dropped). The Ray driver's
:meth:`~rmserve.cluster.ray_cluster.ReplicaSet.watch`."""


def _lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised by one server's worker, ends only that worker (the server is
    gone or refused; its checkpoint goes to another) rather than the sweep."""
    return isinstance(exc, errors.FingerprintMismatch) or (isinstance(exc, errors.RMServeError) and exc.retryable)


def _stored_run(
    db: ScoreStore, checkpoint: Checkpoint, fingerprint: str, groups: Sequence[Group]
) -> tuple[CheckpointRun, ScoreRecord | None]:
    """The run of ``checkpoint`` when every one of ``groups`` is stored under ``fingerprint``:
    nothing loaded or scored, the model named as its first group's stored record names it (the
    checkpoint's name without one); and that record (None without groups)."""
    stored = db.records(fingerprint, keys=[groups[0].key]) if groups else []
    model = stored[0].model if stored else checkpoint.name
    logger.info("%s: all %d groups stored (fingerprint %s)", checkpoint.name, len(groups), fingerprint)
    run = CheckpointRun(checkpoint, fingerprint, model, len(groups), 0, len(groups), loaded=False)
    return run, stored[0] if stored else None


def missing_groups(
    db: ScoreStore, fingerprint: str, groups: Sequence[Group], truncation: Truncation | None,
    max_model_len: int | None = None,
) -> list[Group]:
    """Of ``groups`` (data order), those not stored for ``fingerprint``, and those stored as not
    scored that a run with ``truncation`` on servers of ``max_model_len`` tokens (None: not
    known) scores again (:func:`~rmserve.client.score_log.stale_groups`, the rule of every
    resume); the new answer replaces the old one in the store."""
    stored = db.stored_keys(fingerprint)
    records = db.records(fingerprint, keys=[g.key for g in groups if g.key in stored])
    stale = stale_groups(records, truncation, max_model_len).keys
    return [g for g in groups if g.key not in stored or g.key in stale]


async def _load_datasets(config: SweepConfig) -> tuple[dict[str, Any], list[str]]:
    """Each benchmark's data (``config.data``, ``config.only``) and notes on what it lacks.

    Raises:
        rmserve.errors.DataError: bad benchmark data.
    """
    from rmserve.datasets import load_benchmark, select_parts

    datasets = {}
    notes: list[str] = []
    selected = select_parts([b for b, _ in config.data], config.only) if config.only is not None else {}
    for bench, data in config.data:
        dataset = await asyncio.to_thread(load_benchmark, bench, data, selected.get(bench))
        datasets[bench] = dataset
        if dataset.missing:
            notes.append(f"{bench}: not in the data ({dataset.source}): {', '.join(dataset.missing)}")
    return datasets, notes


def stored_checkpoints(
    config: SweepConfig, key_of: Callable[[Path], str | None], limit_of: Callable[[Path], int | None] | None = None
) -> dict[Path, str]:
    """The checkpoints of ``config`` a sweep would find complete in its store, without any
    server: checkpoint folder → fingerprint, for each folder whose key ``key_of(folder)`` (the
    store's checkpoint memo key for the servers that would load it:
    :func:`rmserve.pipelines.launch.store_key`; None: not known) the store remembers, with every
    group of the data stored under that fingerprint (:func:`missing_groups` empty; with
    ``limit_of(folder)``, the context limit the servers would give it, a group with a response
    over a shorter one is missing). A store file that does not exist yet gives ``{}`` and is
    not created.

    Raises:
        ValueError: bad checkpoints (:func:`order_checkpoints`).
        rmserve.errors.DataError: bad benchmark data.
    """
    checkpoints = order_checkpoints(config.checkpoints)
    if not Path(config.store).is_file():
        return {}
    datasets, _ = asyncio.run(_load_datasets(config))
    groups = [g for ds in datasets.values() for g in ds.groups]
    found = {}
    with ScoreStore(config.store) as db:
        for checkpoint in checkpoints:
            key = key_of(checkpoint.path)
            fingerprint = db.fingerprint_for(key) if key is not None else None
            if fingerprint is None:
                continue
            limit = limit_of(checkpoint.path) if limit_of is not None else None
            if not missing_groups(db, fingerprint, groups, config.truncation, limit):
                found[checkpoint.path] = fingerprint
    return found


class _Spread:
    """A sweep spread by checkpoints (:attr:`SweepConfig.spread` ``checkpoints``): one worker
    per server, each a one-server :class:`_Sweep` taking the next checkpoint not started.

    A worker whose server is lost (``watch`` says so, or its :class:`_Sweep` gives up on it
    after ``server_wait_s``) or refused puts its checkpoint back at the front of the queue;
    the next free worker loads it and scores only the groups not yet stored, under the
    fingerprint the checkpoint was first loaded with. A restarted server (``watch`` returns
    its new URL) gets a new worker. Workers wait while others still hold a checkpoint, so a
    checkpoint put back is never left without one.
    """

    def __init__(self, config: SweepConfig, datasets: dict[str, Any], tally: SweepTally | None,
                 watch: LostWatch | None) -> None:
        self.config = config
        self.datasets = datasets
        self.tally = tally if tally is not None else SweepTally()
        self.watch = watch
        self.states: list[_Sweep] = []
        self.pinned: dict[Path, str] = {}
        self.queue: deque[Checkpoint] = deque()
        self.busy = 0
        self.changed = asyncio.Event()
        self.finished: dict[Path, CheckpointRun] = {}
        self.partial: dict[Path, dict[str, int]] = {}
        self.lost: list[str] = []
        self.refused: list[str] = []
        self.notes: list[str] = []
        self.db: ScoreStore | None = None
        self.workers: set[asyncio.Task[None]] = set()
        self.wall_s: float | None = None
        """Seconds from the first checkpoint's start to the last one's end."""

    async def _state(self, url: str) -> _Sweep:
        state = _Sweep(replace(self.config, servers=(url,)), self.db, self.datasets, self.tally)
        state.pinned = self.pinned
        self.states.append(state)
        await state.__aenter__()
        return state

    async def run(self, checkpoints: Sequence[Checkpoint], stack: contextlib.ExitStack) -> ScoreStore:
        try:
            states = [await self._state(url) for url in self.config.servers]
            await asyncio.gather(*(state.prepare() for state in states))
            dtypes = {state.dtype for state in states}
            if len(dtypes) > 1:
                raise _Refused(
                    "the servers compute in different dtypes (" + ", ".join(f"{s.servers[0].url} {s.dtype}" for s in states)
                    + "): start every server with the same --dtype", field="dtype",
                )
            self.db = stack.enter_context(ScoreStore(self.config.store))
            for state in states:
                state.db = self.db
            self.queue.extend(checkpoints)
            started = time.monotonic()
            for state in states:
                self._spawn(state)
            while self.workers:
                done, _ = await asyncio.wait(self.workers, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    self.workers.discard(task)
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            self.wall_s = time.monotonic() - started
            if self.queue:
                raise errors.ConnectionFailed(
                    f"no server is left to score {', '.join(c.name for c in self.queue)} (lost: "
                    f"{'; '.join(self.lost + self.refused) or 'none'}); everything scored is in {self.config.store}"
                )
        finally:
            for task in self.workers:
                task.cancel()
            await asyncio.gather(*self.workers, return_exceptions=True)
            for state in self.states:
                self.notes.extend(state.notes)
                self.refused.extend(m for m in state.refused if m not in self.refused)
                await state.__aexit__(None, None, None)
        return self.db

    def _spawn(self, state: _Sweep) -> None:
        self.workers.add(asyncio.create_task(self._worker(state)))

    async def _worker(self, state: _Sweep) -> None:
        server = state.servers[0]
        while True:
            while not self.queue:
                if self.busy == 0:
                    self.changed.set()
                    return
                self.changed.clear()
                await self.changed.wait()
            checkpoint = self.queue.popleft()
            self.busy += 1
            before = server.scored
            job = asyncio.create_task(state.run_checkpoint(checkpoint))
            watch = asyncio.create_task(self.watch(server.url)) if self.watch is not None else None
            try:
                done, _ = await asyncio.wait({job} | ({watch} if watch else set()), return_when=asyncio.FIRST_COMPLETED)
                if job in done and job.exception() is None:
                    self.finished[checkpoint.path] = job.result()
                    continue
                if job in done and not _lost(job.exception()):  # type: ignore[arg-type]
                    raise job.exception()  # type: ignore[misc]
                reason = f"{type(job.exception()).__name__}: {job.exception()}" if job in done else "its replica was reported lost"
                if job not in done:
                    job.cancel()
                    await asyncio.gather(job, return_exceptions=True)
                new_url = watch.result() if watch is not None and watch in done else None
                moved = server.scored - before
                counts = self.partial.setdefault(checkpoint.path, {})
                counts[server.url] = counts.get(server.url, 0) + moved
                self.queue.appendleft(checkpoint)
                sentence = (f"{server.url} was lost during {checkpoint.name} after scoring {moved} of its groups "
                            f"({reason}); the checkpoint went back to the queue for the other servers")
                self.lost.append(sentence)
                logger.warning("%s", sentence)
                if new_url is not None:
                    await self._rejoin(server.url, new_url)
                return
            finally:
                self.busy -= 1
                self.changed.set()
                if watch is not None and not watch.done():
                    watch.cancel()
                    await asyncio.gather(watch, return_exceptions=True)

    async def _rejoin(self, old_url: str, new_url: str) -> None:
        """Give the restarted server at ``new_url`` a worker, once it answers with the same dtype."""
        state = await self._state(new_url)
        try:
            await state.prepare()
        except errors.RMServeError as exc:
            self.notes.append(f"{old_url} came back as {new_url} but did not answer ({exc}); left out")
            return
        if state.dtype != self.states[0].dtype:
            self.notes.append(f"{old_url} came back as {new_url} computing in {state.dtype}; left out")
            return
        self.notes.append(f"{old_url} came back as {new_url} (restarted) and rejoined the sweep")
        self._spawn(state)

    def runs(self, checkpoints: Sequence[Checkpoint]) -> list[CheckpointRun]:
        """One run per checkpoint (step order): the run that finished it, plus what lost
        servers scored of it before they were lost (counted as scored in this sweep, per server)."""
        runs = []
        for checkpoint in checkpoints:
            run = self.finished[checkpoint.path]
            for url, n in self.partial.get(checkpoint.path, {}).items():
                run.per_server[url] = run.per_server.get(url, 0) + n
                run.n_scored += n
                run.n_stored -= n
            runs.append(run)
        return runs


async def sweep_async(
    config: SweepConfig, *, tally: SweepTally | None = None, watch: LostWatch | None = None
) -> SweepResult:
    """:func:`sweep` on the running event loop; ``watch`` (spread by checkpoints only) says
    when a server is lost (:data:`LostWatch`)."""
    checkpoints = order_checkpoints(config.checkpoints)
    datasets, notes = await _load_datasets(config)
    runs: list[CheckpointRun] = []
    started = time.monotonic()
    lost: list[str] = []
    wall_s: float | None = None
    with contextlib.ExitStack() as stack:
        if config.spread == "checkpoints" and len(config.servers) > 1:
            spread = _Spread(config, datasets, tally, watch)
            try:
                db = await spread.run(checkpoints, stack)
            finally:
                lost = spread.lost
            wall_s = spread.wall_s
            runs = spread.runs(checkpoints)
            notes.extend(spread.notes)
            notes.extend(lost)
            refused = tuple(spread.refused)
            kind = spread.states[0].kind
        else:
            async with _Sweep(config, None, datasets, tally) as state:
                await state.prepare()
                # The store is opened once the servers have answered: a sweep that cannot reach
                # them creates nothing.
                db = state.db = stack.enter_context(ScoreStore(config.store))
                for checkpoint in checkpoints:
                    runs.append(await state.run_checkpoint(checkpoint))
                notes.extend(state.notes)
                refused = tuple(state.refused)
                kind = state.kind
        logger.info("%s (%.1f s in all)", summary_line(runs, wall_s), time.monotonic() - started)
        return await _report(config, datasets, runs, db, notes=notes, refused=refused, lost=lost, kind=kind,
                             wall_s=wall_s, servers=config.servers)


def sweep_from_store(config: SweepConfig, fingerprints: Mapping[Path, str]) -> SweepResult:
    """The sweep of ``config``'s checkpoints answered from the store alone, no server asked:
    ``fingerprints`` holds every checkpoint folder's fingerprint (:func:`stored_checkpoints`),
    each with all its groups stored. Files and result as :func:`sweep` writes them, every
    checkpoint ``loaded`` False; ``servers`` in ``sweep.json`` is empty.

    Raises:
        ValueError: a checkpoint of ``config`` missing from ``fingerprints``.
        rmserve.errors.ConnectionFailed: a checkpoint's groups are not all stored any more (the
            store changed since ``fingerprints`` was read): run the sweep on servers.
        rmserve.errors.DataError: bad benchmark data.
    """
    return asyncio.run(_sweep_from_store(config, fingerprints))


async def _sweep_from_store(config: SweepConfig, fingerprints: Mapping[Path, str]) -> SweepResult:
    checkpoints = order_checkpoints(config.checkpoints)
    absent = [c.name for c in checkpoints if c.path not in fingerprints]
    if absent:
        raise ValueError(f"fingerprints: no fingerprint for {', '.join(absent)}")
    datasets, notes = await _load_datasets(config)
    groups = [g for ds in datasets.values() for g in ds.groups]
    runs = []
    with ScoreStore(config.store) as db:
        kind = None
        for checkpoint in checkpoints:
            fingerprint = fingerprints[checkpoint.path]
            missing = missing_groups(db, fingerprint, groups, config.truncation)
            if missing:
                raise errors.ConnectionFailed(
                    f"{checkpoint.name}: {len(missing)} of its {len(groups)} groups are not in {config.store} under "
                    f"fingerprint {fingerprint} any more: score them on servers (the same command without the store "
                    "shortcut)"
                )
            run, first = _stored_run(db, checkpoint, fingerprint, groups)
            if kind is None and first is not None:
                kind = first.score_kind
            runs.append(run)
        logger.info("%s", summary_line(runs))
        return await _report(config, datasets, runs, db, notes=notes, refused=(), lost=[], kind=kind or ScoreKind(),
                             wall_s=None, servers=())


async def _report(
    config: SweepConfig,
    datasets: Mapping[str, Any],
    runs: list[CheckpointRun],
    db: ScoreStore,
    *,
    notes: list[str],
    refused: tuple[str, ...],
    lost: list[str],
    kind: ScoreKind,
    wall_s: float | None,
    servers: Sequence[str],
) -> SweepResult:
    """Export each checkpoint's records from the open store ``db``, write the sweep's files
    (:func:`rmserve.metrics.sweep.write_sweep`) and gather the result (``servers``: those the
    sweep scored on, none when answered from the store)."""
    from rmserve.metrics.sweep import SweepPoint, write_sweep

    points = []
    for run in runs:
        folder = config.out_dir / "checkpoints" / run.checkpoint.name
        folder.mkdir(parents=True, exist_ok=True)
        records = {}
        for bench, ds in datasets.items():
            keys = [g.key for g in ds.groups]
            records[bench] = db.records(run.fingerprint, benchmark=bench, keys=keys)
            export = folder / f"{bench}.scores.jsonl"
            db.export_jsonl(export, run.fingerprint, benchmark=bench, keys=keys)
            not_scored = unscored(records[bench])
            run.n_unscored += not_scored.count
            sentence = not_scored.sentence(str(export))
            if sentence:
                notes.append(f"{run.checkpoint.name} {bench}: {sentence}")
        points.append(
            SweepPoint(
                step=run.checkpoint.step,
                name=run.checkpoint.name,
                path=str(run.checkpoint.path),
                fingerprint=run.fingerprint,
                model=run.model,
                records=records,
            )
        )
    seen: dict[str, str] = {}
    for run in runs:
        first = seen.setdefault(run.fingerprint, run.checkpoint.name)
        if first != run.checkpoint.name:
            notes.append(
                f"{run.checkpoint.name} has the same content as {first} (fingerprint {run.fingerprint}); "
                "its figures are that checkpoint's"
            )
    extra = {
        "score_kind": {"kind": kind.kind, "mode": kind.mode, "ref_model": kind.ref_model, "compat": kind.compat},
        "servers": list(servers),
        "spread": config.spread,
        "servers_lost": lost,
        "groups_scored_per_server": {
            url: sum(run.per_server.get(url, 0) for run in runs)
            for url in dict.fromkeys([*servers, *(u for run in runs for u in run.per_server)])
        },
        "groups_scored": sum(run.n_scored for run in runs),
        "groups_from_store": sum(run.n_stored for run in runs),
        "groups_from_result_cache": sum(run.n_from_cache for run in runs),
        "scoring_wall_s": wall_s,
    }
    paths, summary, document = await asyncio.to_thread(
        write_sweep, points, list(datasets), config.out_dir, resamples=config.resamples, seed=config.seed,
        notes=notes, refused=refused, extra=extra, excluded={bench: ds.excluded for bench, ds in datasets.items()},
    )
    return SweepResult(
        runs=tuple(runs), paths=tuple(paths), summary_md=summary, refused=refused, notes=tuple(notes), document=document,
        wall_s=wall_s,
    )


async def served_models(config: SweepConfig) -> dict[str, ModelInfo]:
    """What each of ``config.servers`` serves now (its first model), for :func:`restore_models`;
    a server that does not answer is left out."""
    found = {}
    for url in config.servers:
        try:
            async with RewardClient(url, token=config.token) as client:
                found[url] = (await client.models())[0]
        except errors.RMServeError:
            continue
    return found


async def restore_models(
    config: SweepConfig, before: Mapping[str, ModelInfo], paths: Mapping[str, str]
) -> list[str]:
    """Load back on each server the model it served before the sweep (``before``, from
    :func:`served_models`; ``paths``: server → that model's folder as the server sees it): a
    sweep on a running set of replicas leaves it as it found it. A server already serving that
    fingerprint is left alone.

    Returns:
        One sentence per server loaded back or left on another model (a folder outside its
        checkpoint roots, a server that does not answer: named with the reason).
    """
    notes = []
    for url, info in before.items():
        path = paths.get(url)
        try:
            async with RewardClient(url, token=config.token) as client:
                now = (await client.models())[0]
                if now.fingerprint == info.fingerprint:
                    continue
                if path is None or config.admin_token is None:
                    raise errors.Unauthorized("its model's folder or the admin token is not known here")
                loaded = await client.load_checkpoint(info.name, path, admin_token=config.admin_token,
                                                      timeout_s=config.load_timeout_s)
        except errors.RMServeError as exc:
            notes.append(f"{url} still serves another checkpoint than before the sweep: loading {info.name} back "
                         f"failed ({exc.message})")
            continue
        if loaded.fingerprint != info.fingerprint:
            notes.append(f"{url} loaded {path} back as {info.name}, but it reports fingerprint {loaded.fingerprint}, "
                         f"not {info.fingerprint} as before the sweep")
            continue
        notes.append(f"{url} serves {info.name} again (fingerprint {info.fingerprint}), as before the sweep")
    return notes


def sweep(config: SweepConfig, *, tally: SweepTally | None = None, watch: LostWatch | None = None) -> SweepResult:
    """Score every checkpoint in ``config.checkpoints`` on the servers and report the sweep.

    Returns:
        A :class:`SweepResult`; the files are ``OUT/sweep.csv``, ``OUT/sweep.json``,
        ``OUT/summary.md``, one PNG per headline figure and
        ``OUT/checkpoints/<name>/<bench>.scores.jsonl`` (exports of the store).

    Raises:
        ValueError: bad checkpoints (see :func:`order_checkpoints`).
        rmserve.errors.DataError: bad benchmark data.
        rmserve.errors.Unauthorized / Forbidden: a load was refused (token, checkpoint root).
        rmserve.errors.FingerprintMismatch: every server was refused.
        rmserve.errors.ConnectionFailed: nothing answers at a server's address at the start
            (unless ``wait_for_server``), or no server left (all groups scored so far are stored).

    With ``config.spread == "checkpoints"`` and several servers, ``watch`` (when given) says
    when a server is lost, so its checkpoint moves at once (see :class:`_Spread`).

    ``tally``, when given, is filled in while the sweep runs (see :class:`SweepTally`), so a
    caller can tell after a failure whether anything was kept.
    """
    return asyncio.run(sweep_async(config, tally=tally, watch=watch))
