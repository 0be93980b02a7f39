"""``rmserve eval``: score a benchmark through a running server, resumably, then report.

This module's :func:`evaluate` is the **scoring pipeline** (data → server → score file →
figures). It is not :func:`rmserve.metrics.evaluation.evaluate`, which only computes figures from
scores already on disk; this pipeline calls the metrics stage at its end.

:func:`evaluate` loads the benchmark, waits for the server, reads its model fingerprint,
skips the groups already in the score file ``OUT/scores.jsonl`` (same model only), streams
the rest through :class:`~rmserve.client.client.RewardClient` while appending one record per
group, and then hands the records to the metrics stage (:mod:`rmserve.metrics.evaluation`), which
computes every figure and writes ``results.json``, ``table.md`` and the heatmaps. Nothing here
computes a figure.

A run killed at any point keeps every group already answered; running the same command
again scores exactly the groups that are missing. A run that stops before its first group is
scored leaves no score file behind.

Waiting for the server (:func:`wait_for_server`): a server that answers 503 (engine loading)
is waited for up to ``ready_timeout_s``; an address where nothing accepts connections fails
after a few seconds, naming it (``wait_for_server`` waits for it instead). A status line on
stderr says what is waited for; scoring shows a progress bar on a terminal and a plain
progress line every few seconds elsewhere (:mod:`rmserve.pipelines.progress`).

With a score store (``EvalConfig.store``: SQLite, :mod:`rmserve.client.score_store`) the groups
stored under the server's fingerprint by any earlier run are not sent either. Keeping the score
file and the store in step (what is done, what is copied where, the final rewrite of the score
file in data order) is :class:`~rmserve.client.score_log.ScoreLog`'s job; see that module for
the rules. :func:`evaluate_from_store` answers a whole run from the store, without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from rmserve.client.client import RewardClient
from rmserve.client.config import DEFAULT_MAX_RETRY_AFTER_S, PRIORITIES, Concurrency, Retry, Timeouts, Waiting
from rmserve.client.score_file import SCORES_FILENAME, read_scores
from rmserve.client.score_log import Resumed, ScoreLog, groups_text, stale_groups
from rmserve.client.score_store import ScoreStore

from rmserve import errors
from rmserve.pipelines.progress import EngineBar, ProgressLine, StatusLine, duration_text
from rmserve.pipelines.outcome import TruncationSummary, Unscored, strict_stop, truncation_summary, unscored
from rmserve.schema import BENCHMARKS, Group, GroupKey, HealthReply, ModelInfo, ScoreKind, ScoreRecord, Truncation

if TYPE_CHECKING:  # the metrics stage (numpy) is imported when a run reports, not before
    from rmserve.metrics.evaluation import Evaluation

    from rmserve.datasets import Dataset

logger = logging.getLogger("rmserve.client")


@dataclass(frozen=True)
class EvalConfig:
    """Settings of one scoring pipeline run (``rmserve eval``; ``rmserve run`` fills ``server_url``)."""

    bench: str
    """Benchmark: ``rm-bench`` or ``rewardbench2``."""

    data: str
    """Benchmark data: a file or folder path, or a hub dataset id."""

    out_dir: Path
    """Output folder: ``scores.jsonl`` (resumable), ``results.json``, ``table.md``, heatmaps."""

    server_url: str | None = None
    """Base URL of the scoring server, ``http(s)://host:port``. Required by :func:`evaluate`."""

    max_in_flight: int = 32
    """Most groups sent and not yet answered. Default 32; 1–4096."""

    groups_per_request: int = 1
    """Groups per ``POST /v1/score``. Default 1; 1–``max_in_flight``."""

    timeout_s: float = 900.0
    """Limit of one scoring request, seconds (connect to last byte). Default 900; > 0."""

    ready_timeout_s: float = 600.0
    """How long to wait for the server's ``/health`` to answer 200 while it answers 503 (engine
    loading), seconds. Default 600; > 0."""

    wait_for_server: bool = False
    """Also wait (up to ``ready_timeout_s``) while nothing answers at ``server_url`` (a server
    still being started). Default False: a refused connection fails after a few seconds of
    retries (:data:`~rmserve.client.client.CONNECT_GRACE_S`), naming the address."""

    max_attempts: int = 5
    """Attempts per request on connection errors, timeouts, 429 and 503. Default 5; ≥ 1."""

    max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S
    """Longest wait taken from a reply's ``Retry-After`` before a retry, seconds
    (:attr:`~rmserve.client.config.Retry.max_retry_after_s`: a longer one is cut to it, with a
    warning). Default 60; > 0."""

    only: tuple[str, ...] | None = None
    """Score only these domains (RM-Bench) or subsets (RewardBench 2). Default: all present."""

    model: str | None = None
    """Model name to request and to pick from ``/v1/models``; default: the server's only model."""

    overwrite: bool = False
    """Empty a score file holding a different model's scores instead of refusing. Default False."""

    fsync: bool = False
    """fsync the score file after every group (guards against machine crashes). Default False."""

    quiet: bool = False
    """No status or progress lines on stderr. Default False: a status line while waiting for
    the server, then a progress bar on a terminal, or a plain progress line every few seconds
    elsewhere."""

    resamples: int = 1000
    """Bootstrap resamples for the intervals (0 = none). Default 1000."""

    seed: int = 0
    """Bootstrap seed. Default 0."""

    truncation: Truncation | None = None
    """Cut sequences over ``truncation.max_tokens`` from ``truncation.side`` instead of leaving
    them unscored (sent with every request; the cut is recorded per response and summarised).
    Default None: no truncation — a sequence over the model's max length is not scored, and its
    group is named at the end."""

    strict: bool = False
    """Stop at the first group that cannot be scored (after recording it) instead of finishing
    the run. Default False."""

    token: str | None = field(default=None, repr=False)
    """Bearer token sent to the server (a server with a users file needs one); None: none."""

    store: Path | None = None
    """Score store file (SQLite, :mod:`rmserve.client.score_store`) shared across runs: groups it
    holds under the server's fingerprint are not sent again, new ones are added. Default None:
    no store (only ``OUT/scores.jsonl``)."""

    priority: str = "interactive"
    """Priority hint sent with every request (header ``X-RMServe-Priority``): ``interactive``
    (someone waits for this eval) or ``batch``; the server's fair queue and engine use it."""

    more_servers: tuple[str, ...] = ()
    """Further servers serving the same model (replicas): the groups are spread over
    ``server_url`` and these, each server taking the next group as it has room
    (``max_in_flight`` is then split evenly between the servers). A server reporting another fingerprint is left out (a note says
    so); a server lost during the run leaves its unanswered groups to the others. Default: none."""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {self.priority!r}")
        if self.bench not in BENCHMARKS:
            raise ValueError(f"bench must be one of {', '.join(BENCHMARKS)}, got {self.bench!r}")
        if not str(self.data):
            raise ValueError("data must be a path or hub id, got an empty string")
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.store is not None:
            if not str(self.store):
                raise ValueError("store must be a file path when given, got an empty string")
            object.__setattr__(self, "store", Path(self.store))
        for name, lower, upper in (("max_in_flight", 1, 4096), ("groups_per_request", 1, self.max_in_flight), ("max_attempts", 1, 100)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lower <= value <= upper:
                raise ValueError(f"{name} must be an integer in [{lower}, {upper}], got {value!r}")
        for name in ("timeout_s", "ready_timeout_s", "max_retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.only is not None:
            object.__setattr__(self, "only", tuple(self.only))
            if not self.only:
                raise ValueError("only must name at least one domain/subset when given")
        if self.server_url is not None:
            # The same check RewardClient makes, here so the CLI reports it as bad input.
            RewardClient(self.server_url)
        object.__setattr__(self, "more_servers", tuple(self.more_servers))
        for url in self.more_servers:
            RewardClient(url)
        if self.more_servers and self.server_url is None:
            raise ValueError("more_servers needs server_url")
        if len({self.server_url, *self.more_servers}) != 1 + len(self.more_servers):
            raise ValueError("server: a URL is given twice")

    def client_settings(self) -> tuple[Timeouts, Concurrency, Retry]:
        """The client's timeouts, concurrency and retry policy for this run."""
        timeouts = Timeouts(connect_s=min(10.0, self.timeout_s), sock_read_s=self.timeout_s, total_s=self.timeout_s)
        concurrency = Concurrency(max_groups_in_flight=self.max_in_flight, groups_per_request=self.groups_per_request)
        return timeouts, concurrency, Retry(max_attempts=self.max_attempts, max_retry_after_s=self.max_retry_after_s)


@dataclass(frozen=True)
class EvalResult:
    """What one scoring pipeline run produced.

    Attributes:
        evaluation: the metrics stage's :class:`~rmserve.metrics.evaluation.Evaluation`.
        table_md: the Markdown report the metrics stage rendered (also in ``table.md``).
        results: the JSON dict the metrics stage wrote to ``results.json``.
        paths: every file the metrics stage wrote.
        scores_path: the score file (``OUT/scores.jsonl``).
        model: the server's model (name, fingerprint, engine …).
        n_groups: groups of the benchmark data evaluated.
        n_scored: groups scored by this run.
        n_resumed: groups found already scored in the score file (before any copied from
            the score store).
        missing: canonical domains/subsets absent from the data (e.g. RM-Bench ``math``).
        notes: sentences about the run (resume, repaired file, ignored records, missing parts,
            unscored groups, truncation).
        n_from_store: groups answered from the score store (SQLite, ``EvalConfig.store``)
            instead of the server.
        unscored: the data groups with a response the server could not score (counted as
            losses by the metrics, as the official code counts them).
        truncation: what the requested truncation cut (None without truncation).
        notes_shown: how many of the first ``notes`` were already written to stderr before
            scoring started (:func:`show_notes`); the command prints the rest at the end.
    """

    evaluation: Evaluation
    table_md: str
    results: dict[str, Any]
    paths: tuple[Path, ...]
    scores_path: Path
    model: ModelInfo
    n_groups: int
    n_scored: int
    n_resumed: int
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    n_from_store: int = 0
    unscored: Unscored | None = None
    truncation: TruncationSummary | None = None
    notes_shown: int = 0


def pick_model(models: Sequence[ModelInfo], name: str | None) -> ModelInfo:
    """The model to score with: the one named ``name``, else the server's only model.

    Raises:
        rmserve.errors.ModelNotFound: ``name`` is not served, or the server serves several
            and none was named.
    """
    if name is not None:
        for info in models:
            if info.name == name:
                return info
        raise errors.ModelNotFound(
            f"the server does not serve {name!r}; it serves {', '.join(m.name for m in models)}",
            field="model",
            value=name,
        )
    if len(models) > 1:
        raise errors.ModelNotFound(
            f"the server serves several models ({', '.join(m.name for m in models)}); name one with --model",
            field="model",
        )
    return models[0]


def progress_bar(total: int, initial: int, quiet: bool, label: str = "scoring") -> EngineBar | ProgressLine:
    """The scoring progress display: a tqdm bar on a terminal
    (:class:`~rmserve.pipelines.progress.EngineBar`), a
    :class:`~rmserve.pipelines.progress.ProgressLine` every few seconds elsewhere, nothing
    with ``quiet``. Both take ``update(n)``, ``set_postfix_str(text, refresh=False)``,
    ``close()`` and ``cached`` (groups answered from the server's result cache, set by
    :func:`show_rate`), and both count their rate and ETA over the engine's work only."""
    if not sys.stderr.isatty():
        return ProgressLine(total, initial, label=label, quiet=quiet)
    return EngineBar(total, initial, label=label, quiet=quiet, stream=sys.stderr)


async def wait_for_server(
    client: RewardClient,
    timeout_s: float,
    *,
    quiet: bool,
    wait_for_server: bool = False,
    poll_interval_s: float = 0.5,
) -> HealthReply:
    """``client.wait_until_ready`` with a status line on stderr while it waits.

    The line (:class:`~rmserve.pipelines.progress.StatusLine`) says what the wait is on:
    ``waiting for URL/health: connection refused, retrying for 4 s`` or ``… engine not ready
    (…) after 10 s, waiting up to 590 s more``; when the server turns ready after a wait, ``URL/health
    ready after 212 s``. Nothing is written when the first probe answers 200, or with ``quiet``.

    Raises:
        The errors of :meth:`~rmserve.client.client.RewardClient.wait_until_ready`.
    """
    status = StatusLine(quiet=quiet)
    started = time.monotonic()

    def on_wait(waiting: Waiting) -> None:
        status.show(waiting.sentence(), kind="loading" if waiting.answering else "unreachable")

    try:
        health = await client.wait_until_ready(
            timeout_s, poll_interval_s=poll_interval_s, wait_for_server=wait_for_server, on_wait=on_wait
        )
    except BaseException:
        status.end()
        raise
    status.finish(f"{client.base_url.joinpath('health')} ready after {duration_text(time.monotonic() - started)}")
    return health


def show_rate(bar: Any, started: float, engine_tokens: int, cache_groups: int) -> None:
    """Give the progress display (:func:`progress_bar`) the tokens per second over groups the
    engine scored (``engine_tokens`` since ``started``, monotonic seconds) and how many groups
    came from the server's result cache: they are left out of every rate and ETA the display
    shows (its ``cached``) and named in its postfix (``40 from the result cache, 25 tok/s (engine
    work only)``). Call it before the display's ``update`` for the group just done."""
    elapsed_s = max(time.monotonic() - started, 1e-9)
    text = f"{engine_tokens / elapsed_s:,.0f} tok/s"
    if cache_groups:
        text = f"{cache_groups:,} from the result cache, {text} (engine work only)"
    bar.cached = cache_groups
    bar.set_postfix_str(text, refresh=False)


async def _report(
    config: EvalConfig,
    dataset: Dataset,
    records: list[ScoreRecord],
    *,
    resumed: Resumed,
    scores_path: Path,
    notes: list[str],
    n_scored: int,
) -> EvalResult:
    """Hand ``records`` (data order) to the metrics stage and gather the run's result."""
    from rmserve.metrics.evaluation import MetricsConfig, evaluate_records
    from rmserve.metrics.outputs import write_outputs
    from rmserve.metrics.render_json import result_dict
    from rmserve.metrics.render_markdown import render_markdown

    unscored_groups = unscored(records)
    cut = truncation_summary(records)
    sentence = unscored_groups.sentence(str(scores_path))
    notes = [*notes, *([sentence] if sentence else []), *([cut.sentence()] if cut else [])]
    for note in notes:
        logger.info("%s", note)
    metrics_config = MetricsConfig(
        resamples=config.resamples, seed=config.seed, benchmark=config.bench, excluded=dataset.excluded
    )
    evaluation = await asyncio.to_thread(evaluate_records, records, metrics_config, source=str(scores_path))
    paths = await asyncio.to_thread(write_outputs, evaluation, config.out_dir)
    return EvalResult(
        evaluation=evaluation,
        table_md=render_markdown(evaluation),
        results=result_dict(evaluation),
        paths=tuple(paths),
        scores_path=scores_path,
        model=resumed.model,
        n_groups=len(dataset.groups),
        n_scored=n_scored,
        n_resumed=resumed.n_resumed,
        missing=dataset.missing,
        notes=tuple(notes),
        n_from_store=resumed.n_from_store,
        unscored=unscored_groups,
        truncation=cut,
    )


async def _load_data(config: EvalConfig) -> tuple[Dataset, list[str]]:
    """The benchmark data and the first notes about it.

    Raises:
        rmserve.errors.DataError: bad benchmark data.
    """
    from rmserve.datasets import load_benchmark

    dataset = await asyncio.to_thread(load_benchmark, config.bench, config.data, config.only)
    notes: list[str] = []
    if dataset.missing:
        notes.append(f"not in the data ({dataset.source}): {', '.join(dataset.missing)}")
    return dataset, notes


async def evaluate_async(config: EvalConfig, *, session: aiohttp.ClientSession | None = None) -> EvalResult:
    """:func:`evaluate` on the running event loop; ``session`` reuses an open aiohttp session."""
    if config.server_url is None:
        raise ValueError("server_url is required to evaluate")
    dataset, notes = await _load_data(config)
    scores_path = config.out_dir / SCORES_FILENAME
    timeouts, concurrency, retry = config.client_settings()
    with _no_empty_outputs(scores_path):
        async with RewardClient(
            config.server_url, session=session, timeouts=timeouts, concurrency=concurrency, retry=retry,
            token=config.token,
            priority=config.priority,
        ) as client:
            # Nothing is opened or created before the server has answered.
            health = await wait_for_server(
                client, config.ready_timeout_s, quiet=config.quiet, wait_for_server=config.wait_for_server
            )
            info = pick_model(await client.models(), config.model)
            replicas = await _replicas(config, session, info, notes)
            try:
                with contextlib.ExitStack() as stack:
                    store = stack.enter_context(ScoreStore(config.store)) if config.store is not None else None
                    with ScoreLog(scores_path, store=store, fsync=config.fsync) as log:
                        resumed = log.resume(info, dataset.groups, overwrite=config.overwrite, truncation=config.truncation)
                        notes += log.notes
                        pending = log.missing()
                        if resumed.n_resumed:
                            notes.append(f"resumed: {groups_text(resumed.n_resumed)} already in {scores_path}, {len(pending)} to score")
                        if resumed.n_extra:
                            notes.append(f"{resumed.n_extra} stored groups are not in this data and are left out of the figures")
                        notes_shown = 0
                        if pending:
                            notes_shown = show_notes(notes)
                            notes += await _score_groups(
                                [client, *replicas], log, pending, info, config, len(dataset.groups),
                                server_version=health.version,
                            )
                        records = log.records()
                        log.finish()
            finally:
                for replica in replicas:
                    await replica.__aexit__(None, None, None)
    result = await _report(
        config, dataset, records, resumed=resumed, scores_path=scores_path, notes=notes, n_scored=len(pending)
    )
    return replace(result, notes_shown=notes_shown)


async def _replicas(
    config: EvalConfig, session: aiohttp.ClientSession | None, info: ModelInfo, notes: list[str]
) -> list[RewardClient]:
    """Open clients of ``config.more_servers`` that serve ``info``'s fingerprint; a server that
    does not answer within ``ready_timeout_s`` or serves another model is left out, with a note."""
    timeouts, concurrency, retry = config.client_settings()
    opened: list[RewardClient] = []
    for url in config.more_servers:
        client = RewardClient(url, session=session, timeouts=timeouts, concurrency=concurrency, retry=retry,
                              token=config.token, priority=config.priority)
        await client.__aenter__()
        try:
            await wait_for_server(client, config.ready_timeout_s, quiet=True, wait_for_server=config.wait_for_server)
            other = pick_model(await client.models(), config.model)
        except errors.RMServeError as exc:
            notes.append(f"{url} left out: {exc.message}")
            await client.__aexit__(None, None, None)
            continue
        if other.fingerprint != info.fingerprint:
            notes.append(f"{url} left out: it serves fingerprint {other.fingerprint} ({other.name}), "
                         f"{config.server_url} serves {info.fingerprint}")
            await client.__aexit__(None, None, None)
            continue
        opened.append(client)
    return opened


def _url(client: RewardClient) -> str:
    """A client's server as the user wrote it (``http://host:port``, no trailing slash)."""
    return str(client.base_url).rstrip("/")


async def _score_groups(
    clients: Sequence[RewardClient],
    log: ScoreLog,
    pending: Sequence[Group],
    info: ModelInfo,
    config: EvalConfig,
    n_total: int,
    *,
    server_version: str = "",
) -> list[str]:
    """Stream ``pending`` through one or more servers serving ``info``'s fingerprint, appending
    each record to ``log`` as it arrives; returns notes (with several servers: groups per
    server, servers lost).

    Every request is pinned to ``info.fingerprint``: when a server's model is swapped during
    the run, it refuses the next request (409) and the run stops with
    :class:`~rmserve.errors.FingerprintMismatch` whose message adds what is kept and how to
    resume; the records already appended stay in the score file.

    Requests a server refuses as over a whole limit of the user (413 ``request_over_limit``:
    more prompt tokens than its ``tokens_per_minute``) are split by the client until they fit
    (:meth:`~rmserve.client.client.RewardClient.score_stream`); a group that alone is over the
    budget is recorded as not scored (``request_over_limit``) and the run goes on.

    With several servers, each one's stream (up to ``max_in_flight`` / number of servers
    groups, rounded up) takes its next group from one shared queue, so a faster server takes
    more. A server whose stream fails with a retryable error (it stopped answering, after the
    client's retries) is dropped; the groups it took and did not answer go back to the queue
    and the other servers score them in a next round. With one server, that error ends the run
    (records kept). Groups the servers answered from their result cache are left out of the
    rates shown.

    Raises:
        rmserve.errors.ConnectionFailed: every one of several servers was lost (what was
            answered is kept).
        rmserve.errors.FingerprintMismatch: a server's model changed (message as above).
        The errors of :meth:`~rmserve.client.client.RewardClient.score_stream`.
    """
    several = len(clients) > 1
    if several:
        # max_in_flight is the run's whole window: each server gets its share, so a small
        # benchmark is not taken whole by the first server's stream.
        window = max(config.groups_per_request, -(-config.max_in_flight // len(clients)))
        for client in clients:
            client.concurrency = replace(client.concurrency, max_groups_in_flight=window)
    bar = progress_bar(n_total, n_total - len(pending), config.quiet)
    started = time.monotonic()
    cache_before = [(c.cache_groups, c.cache_tokens) for c in clients]
    queue: deque[Group] = deque(pending)
    alive = list(clients)
    per_server = {_url(c): 0 for c in clients}
    lost: list[str] = []
    tokens = 0
    kept = n_total - len(pending)

    def from_cache() -> tuple[int, int]:
        """Groups and prompt tokens the servers answered from their result cache in this run."""
        return (sum(c.cache_groups - g for c, (g, _) in zip(clients, cache_before, strict=True)),
                sum(c.cache_tokens - t for c, (_, t) in zip(clients, cache_before, strict=True)))

    async def drain(client: RewardClient) -> None:
        nonlocal tokens, kept
        taken: dict[GroupKey, Group] = {}

        def take():
            while queue:
                group = queue.popleft()
                taken[group.key] = group
                yield group

        stream = client.score_stream(take(), truncation=config.truncation, model=config.model,
                                     expect_fingerprint=info.fingerprint, kind=ScoreKind.of(info), served=info)
        try:
            async with contextlib.aclosing(stream):
                async for record in stream:
                    taken.pop(record.key, None)
                    log.append(record, server_version=server_version)
                    kept += 1
                    per_server[_url(client)] += 1
                    if config.strict and not record.scored:
                        raise strict_stop(
                            record,
                            kept=f"recorded in {log.path}; without --strict the run goes on and counts it as the "
                            "official code does",
                        )
                    tokens += sum(record.num_tokens)
                    cache_groups, cache_tokens = from_cache()
                    show_rate(bar, started, tokens - cache_tokens, cache_groups)
                    bar.update(1)
        except errors.RMServeError as exc:
            if not several or not exc.retryable:
                raise
            queue.extendleft(reversed(list(taken.values())))
            alive.remove(client)
            sentence = (f"{_url(client)} was lost ({type(exc).__name__}: {exc.message}); its {len(taken)} "
                        "unanswered groups went to the other servers")
            lost.append(sentence)
            logger.warning("%s", sentence)

    tasks: list[asyncio.Task[None]] = []
    try:
        while queue:
            if not alive:
                raise errors.ConnectionFailed(
                    f"every server was lost ({'; '.join(lost)}); {n_total - len(queue)} of {n_total} groups are kept in "
                    f"{log.path}: run the same command again to score the other {len(queue)}"
                )
            tasks = [asyncio.create_task(drain(c)) for c in list(alive)]
            done, rest = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
    except errors.FingerprintMismatch as exc:
        raise errors.FingerprintMismatch(
            f"{exc.message}. This run stopped: {kept} of {n_total} groups scored with fingerprint "
            f"{info.fingerprint} are kept in {log.path}; run the same command again once the server serves "
            f"fingerprint {info.fingerprint} again to score the other {n_total - kept} (the kept ones are not "
            "scored again), or use another --out for the new model",
            field="fingerprint",
            value=info.fingerprint,
        ) from exc
    finally:
        for task in tasks:  # the caller was cancelled (Ctrl-C): no stream outlives the run
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
        cached, _ = from_cache()
        if cached:
            logger.info(
                "%d of the %d groups scored were answered from the server's result cache (the same model scored "
                "them before); the rates leave them out", cached, kept - (n_total - len(pending)))
    if not several:
        return []
    where = ", ".join(f"{url} {n}" for url, n in per_server.items())
    return [f"groups scored per server: {where}", *lost]


def show_notes(notes: Sequence[str]) -> int:
    """Write each of ``notes`` to stderr as ``note: …`` now, before scoring starts (what was
    resumed, what the data lacks: worth knowing before a long run, not after); returns how many
    were written, :attr:`EvalResult.notes_shown`."""
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return len(notes)


@contextlib.contextmanager
def _no_empty_outputs(scores_path: Path):
    """Remove, on the way out, a score file this block created and left empty, and its folder
    when this block created it and it is empty: a run that scored no group leaves no output
    behind. A file that existed before is left as it is (a resumed file stays)."""
    created_dirs = []
    for folder in (scores_path.parent, *scores_path.parent.parents):
        if folder.exists():
            break
        created_dirs.append(folder)
    created_file = not scores_path.exists()
    try:
        yield
    finally:
        if created_file:
            with contextlib.suppress(OSError):
                if scores_path.stat().st_size == 0:
                    scores_path.unlink()
        for folder in created_dirs:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


async def evaluate_from_store_async(config: EvalConfig, info: ModelInfo) -> EvalResult | None:
    """:func:`evaluate_from_store` on the running event loop."""
    if config.store is None:
        raise ValueError("store is required to evaluate from the score store")
    dataset, notes = await _load_data(config)
    scores_path = config.out_dir / SCORES_FILENAME
    with ScoreStore(config.store) as store:
        keys = [g.key for g in dataset.groups]
        if not set(keys) <= store.stored_keys(info.fingerprint, config.bench):
            return None
        # Checked before the score file is touched: a group the run would score again (another
        # truncation, a longer max_model_len, …) means a server, and no file is written here.
        if stale_groups(store.records(info.fingerprint, keys=keys), config.truncation, info.max_model_len).keys:
            return None
        with ScoreLog(scores_path, store=store, fsync=config.fsync) as log:
            resumed = log.resume(info, dataset.groups, overwrite=config.overwrite, truncation=config.truncation)
            if log.missing():  # a stored group that failed under other options is scored again
                return None
            notes += log.notes
            records = log.records()
            log.finish()
    return await _report(config, dataset, records, resumed=resumed, scores_path=scores_path, notes=notes, n_scored=0)


async def evaluate_from_file_async(
    config: EvalConfig, fingerprint: str, model_info: Callable[[str], ModelInfo]
) -> EvalResult | None:
    """:func:`evaluate_from_file` on the running event loop."""
    dataset, notes = await _load_data(config)
    scores_path = config.out_dir / SCORES_FILENAME
    if not scores_path.is_file():
        return None
    existing = await asyncio.to_thread(read_scores, scores_path)
    if existing.fingerprint != fingerprint or existing.model is None:
        return None
    by_key = {r.key: r for r in existing.records}
    if any(group.key not in by_key for group in dataset.groups):
        return None
    info = model_info(existing.model)
    # A group the run would score again (another truncation, a longer max_model_len, …) means a
    # server: the rule of ScoreLog.resume.
    if stale_groups((by_key[g.key] for g in dataset.groups), config.truncation, info.max_model_len or None).keys:
        return None
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(ScoreStore(config.store)) if config.store is not None else None
        with ScoreLog(scores_path, store=store, fsync=config.fsync) as log:
            resumed = log.resume(info, dataset.groups, overwrite=False, truncation=config.truncation)
            if log.missing():  # the file changed since it was read
                return None
            notes += log.notes
            records = log.records()
            log.finish()
    return await _report(config, dataset, records, resumed=resumed, scores_path=scores_path, notes=notes, n_scored=0)


def evaluate_from_file(
    config: EvalConfig, fingerprint: str, model_info: Callable[[str], ModelInfo]
) -> EvalResult | None:
    """Report ``config.bench`` from the score file ``OUT/scores.jsonl`` alone, no server, when
    it already holds every data group under ``fingerprint``.

    Used by ``rmserve run`` for a finished run: ``fingerprint`` is the one the server would
    report, computed locally. A group recorded as not scored counts as done only when a run
    would not score it again (:func:`~rmserve.client.score_log.stale_groups`, as
    :meth:`~rmserve.client.score_log.ScoreLog.resume` decides: the same truncation, a limit not
    raised since, …; the limit is ``model_info``'s ``max_model_len``). With a
    score store the file's records are added to it, as :func:`evaluate` does.

    Args:
        config: the run (``server_url`` is not used).
        fingerprint: the model fingerprint the file's records must carry.
        model_info: builds the reported :class:`ModelInfo` from the model name the records carry.

    Returns:
        The :class:`EvalResult` (``n_scored`` 0), or None when the file is absent, holds
        another fingerprint, or lacks a group (nothing is written then).

    Raises:
        rmserve.errors.DataError: bad benchmark data, an invalid score file or score store.
    """
    return asyncio.run(evaluate_from_file_async(config, fingerprint, model_info))


def evaluate_from_store(config: EvalConfig, info: ModelInfo) -> EvalResult | None:
    """Report ``config.bench`` for the model ``info`` from the score store alone, no server.

    Used by ``rmserve run`` for a checkpoint whose fingerprint the score store (SQLite)
    remembers. The score file ``OUT/scores.jsonl`` and the figures are written exactly as
    :func:`evaluate` would.

    Args:
        config: the run; ``config.store`` must be set (``server_url`` is not used).
        info: the model (``info.fingerprint`` selects the stored scores; name and the rest
            are reported as given).

    Returns:
        The :class:`EvalResult` (``n_scored`` 0), or None when some data group is not stored
        under ``info.fingerprint`` (nothing is written then).

    Raises:
        ValueError: ``config.store`` is None.
        rmserve.errors.DataError: bad benchmark data, an invalid score file or score store.
        rmserve.errors.FingerprintMismatch: the score file holds another model's scores and
            ``overwrite`` is False.
    """
    return asyncio.run(evaluate_from_store_async(config, info))


def evaluate(config: EvalConfig, *, session: aiohttp.ClientSession | None = None) -> EvalResult:
    """Score ``config.bench`` on the server at ``config.server_url`` and report the figures.

    Steps: load the data → wait for ``/health`` (a 503 up to ``ready_timeout_s``; a refused
    connection a few seconds unless ``wait_for_server``; a status line on stderr meanwhile) →
    read the model fingerprint from ``/v1/models`` → open the score file ``OUT/scores.jsonl``
    and check it against the fingerprint → with a score store, copy the groups it holds under
    that fingerprint into the score file → score the groups the score file lacks (at most
    ``max_in_flight`` in flight; a progress bar on a terminal, a progress line every few
    seconds elsewhere) → with a score store, rewrite the score file from it (the data's groups, data
    order) → compute and write the figures with :mod:`rmserve.metrics.evaluation` and
    :mod:`rmserve.metrics.outputs`. The file/store steps are :class:`~rmserve.client.score_log.ScoreLog`'s.

    Returns:
        An :class:`EvalResult` (table, results dict, paths, counts, notes).

    Raises:
        ValueError: ``server_url`` missing.
        rmserve.errors.DataError: bad benchmark data, or an invalid score file (names line)
            or score store (names it; :class:`~rmserve.client.score_store.ScoreConflict` when it
            holds other rewards for a group than the score file).
        rmserve.errors.FingerprintMismatch: the score file holds another model's scores and
            ``overwrite`` is False, or the server's model changed during the run.
        rmserve.errors.ConnectionFailed: nothing answers at ``server_url`` (names the address
            and the reason, e.g. connection refused), after a few seconds of retries.
        rmserve.errors.EngineNotReady: the server was not ready within ``ready_timeout_s``.
        rmserve.errors.RMServeError: a scoring request failed for good (the records of the
            groups answered before it are kept).

    A run that stops before its first group is scored leaves no score file behind (one that
    existed before is left as it was).
    """
    return asyncio.run(evaluate_async(config, session=session))
