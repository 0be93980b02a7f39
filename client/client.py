"""Async HTTP client for the rmserve scoring server.

:class:`RewardClient` speaks the wire schema of :mod:`rmserve.schema` over one
``aiohttp.ClientSession``: ``GET /health``, ``GET /v1/models`` and ``POST /v1/score``.
:meth:`RewardClient.score_stream` keeps a bounded number of groups in flight and yields one
:class:`~rmserve.schema.ScoreRecord` per group as its reply arrives (completion order).

Failures are the :mod:`rmserve.errors` classes: a non-200 reply is rebuilt by
:func:`error_from_reply` (status + ``error.type`` → class, the same table the server maps
from); transport failures become :class:`~rmserve.errors.ConnectionFailed`. Only retryable
errors (connection failures, timeouts, 429, 503) are retried, with exponential backoff and
jitter, honouring ``Retry-After``. Client faults (4xx) are raised after exactly one attempt.

No torch or vllm here: this module must import on a machine without them.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import msgspec
import yarl

from rmserve import errors
from rmserve.schema import (
    Group,
    GroupResult,
    HealthReply,
    LoadModelRequest,
    LoadModelResponse,
    ReleaseModelRequest,
    ModelInfo,
    ModelList,
    RequestGroup,
    ScoreKind,
    ScoreRecord,
    ScoreRequest,
    ScoreResponse,
    Truncation,
    encode,
)

__all__ = [
    "CONNECT_GRACE_S",
    "Concurrency",
    "RewardClient",
    "Retry",
    "Timeouts",
    "Waiting",
    "connection_reason",
    "error_from_reply",
    "record_from_result",
]


def _check_positive(owner: str, name: str, value: float, *, upper: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a finite number > 0, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{owner}.{name} must be ≤ {upper:g}, got {value!r}")


def _check_int(owner: str, name: str, value: int, *, lower: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lower:
        raise ValueError(f"{owner}.{name} must be an integer ≥ {lower}, got {value!r}")


PRIORITY_HEADER = "X-RMServe-Priority"
"""Request header carrying the caller's priority hint (the server's fair queue reads it)."""

PRIORITIES = ("interactive", "batch")
"""Priority hints: ``interactive`` (an eval someone waits for) or ``batch`` (a sweep)."""

CONNECT_GRACE_S = 4.0
"""How long :meth:`RewardClient.wait_until_ready` retries a server that does not accept
connections before saying so, seconds: long enough for a server that is just starting to
listen, short enough that a wrong address fails at once."""


def connection_reason(exc: BaseException) -> str:
    """Why a request got no reply, in words: ``connection refused``, ``no reply within 5 s`` …

    ``exc`` is a :class:`~rmserve.errors.ConnectionFailed` (its chained transport error is
    read) or the transport error itself.
    """
    cause = exc.__cause__ if isinstance(exc, errors.ConnectionFailed) and exc.__cause__ is not None else exc
    if isinstance(cause, aiohttp.ClientConnectorError):
        os_error = cause.os_error
        if isinstance(os_error, ConnectionRefusedError) or getattr(os_error, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        return os_error.strerror or str(os_error) or type(os_error).__name__
    if isinstance(cause, TimeoutError):
        return "no reply in time"
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return str(exc) if isinstance(exc, errors.RMServeError) else f"{type(cause).__name__}: {cause}"


@dataclass(frozen=True)
class Waiting:
    """Where a :meth:`RewardClient.wait_until_ready` stands after a probe that did not answer 200.

    Attributes:
        url: the ``/health`` URL probed.
        elapsed_s: seconds since the wait began.
        last: the probe's failure: :class:`~rmserve.errors.ConnectionFailed` (nothing
            answered) or :class:`~rmserve.errors.EngineNotReady` (503, loading).
        retry_for_s: seconds the wait goes on before giving up, from now.
    """

    url: str
    elapsed_s: float
    last: errors.RMServeError
    retry_for_s: float

    @property
    def answering(self) -> bool:
        """Whether the server answered (503) rather than not at all."""
        return not isinstance(self.last, errors.ConnectionFailed)

    def sentence(self) -> str:
        """``waiting for URL: connection refused, retrying for 4 s`` or ``waiting for URL:
        engine not ready (the engine is still loading) after 10 s, waiting up to 590 s more``."""
        if self.answering:
            return (
                f"waiting for {self.url}: engine not ready ({self.last.message}) after {self.elapsed_s:.0f} s, "
                f"waiting up to {self.retry_for_s:.0f} s more"
            )
        return f"waiting for {self.url}: {connection_reason(self.last)}, retrying for {self.retry_for_s:.0f} s"


# --- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class Timeouts:
    """Per-request time limits, in seconds. Every aiohttp timeout field is set from these.

    A scoring reply arrives in one piece once the server has scored the whole request, so
    ``sock_read_s`` bounds the server's queueing plus scoring time for one request.
    """

    connect_s: float = 10.0
    """Seconds to get a connection: pool wait plus TCP connect (aiohttp ``connect`` and
    ``sock_connect``). Default 10; > 0, ≤ ``total_s``."""

    sock_read_s: float = 600.0
    """Longest silence while reading a reply (aiohttp ``sock_read``). Default 600; > 0,
    ≤ ``total_s``."""

    total_s: float = 900.0
    """Whole request, connect to last byte (aiohttp ``total``). Default 900; > 0."""

    probe_s: float = 10.0
    """Whole-request limit for the cheap calls, ``/health`` and ``/v1/models``. Default 10;
    > 0."""

    def __post_init__(self) -> None:
        _check_positive("Timeouts", "total_s", self.total_s)
        _check_positive("Timeouts", "connect_s", self.connect_s, upper=self.total_s)
        _check_positive("Timeouts", "sock_read_s", self.sock_read_s, upper=self.total_s)
        _check_positive("Timeouts", "probe_s", self.probe_s)

    def for_scoring(self) -> aiohttp.ClientTimeout:
        """The aiohttp timeout of a ``POST /v1/score`` request (every field set)."""
        return aiohttp.ClientTimeout(
            total=self.total_s,
            connect=self.connect_s,
            sock_connect=self.connect_s,
            sock_read=self.sock_read_s,
        )

    def for_probe(self) -> aiohttp.ClientTimeout:
        """The aiohttp timeout of ``/health`` and ``/v1/models`` (every field set)."""
        short_s = min(self.probe_s, self.connect_s)
        return aiohttp.ClientTimeout(
            total=self.probe_s, connect=short_s, sock_connect=short_s, sock_read=self.probe_s
        )


@dataclass(frozen=True)
class Concurrency:
    """How much work the client keeps in flight and how it holds connections."""

    max_groups_in_flight: int = 32
    """Most groups sent and not yet answered, across all requests. Default 32; ≥ 1."""

    groups_per_request: int = 1
    """Groups batched into one ``POST /v1/score``. Default 1 (each group's reply streams
    out alone); ≥ 1, ≤ ``max_groups_in_flight``."""

    pool_limit: int | None = None
    """Most open connections of a session this client creates; default (None) is the number
    of requests in flight, so no request waits for a connection. ≥ that number when set."""

    keepalive_s: float = 15.0
    """Seconds an idle connection stays open for reuse (aiohttp ``keepalive_timeout``);
    keep it below the server's keep-alive. Default 15; > 0."""

    def __post_init__(self) -> None:
        _check_int("Concurrency", "max_groups_in_flight", self.max_groups_in_flight, lower=1)
        _check_int("Concurrency", "groups_per_request", self.groups_per_request, lower=1)
        if self.groups_per_request > self.max_groups_in_flight:
            raise ValueError(
                f"Concurrency.groups_per_request must be ≤ max_groups_in_flight "
                f"({self.max_groups_in_flight}), got {self.groups_per_request}"
            )
        if self.pool_limit is not None:
            _check_int("Concurrency", "pool_limit", self.pool_limit, lower=self.max_requests_in_flight)
        _check_positive("Concurrency", "keepalive_s", self.keepalive_s)

    @property
    def max_requests_in_flight(self) -> int:
        """``max_groups_in_flight // groups_per_request``: full requests that fit the bound."""
        return self.max_groups_in_flight // self.groups_per_request

    @property
    def connection_limit(self) -> int:
        """The connector's pool size: ``pool_limit`` or, by default, the requests in flight."""
        return self.pool_limit if self.pool_limit is not None else self.max_requests_in_flight


@dataclass(frozen=True)
class Retry:
    """Retry policy for retryable failures (connection errors, timeouts, 429, 503).

    The wait before retry ``n`` (1 = the first retry) is the reply's ``Retry-After`` when
    it has one, else ``min(max_delay_s, base_delay_s · 2**(n-1)) · (1 - jitter · u)`` with
    ``u`` uniform in [0, 1) (exponential backoff, "equal"-style jitter when jitter=0.5).
    """

    max_attempts: int = 5
    """Attempts per request, the first included. Default 5; ≥ 1 (1 = never retry)."""

    base_delay_s: float = 0.5
    """Backoff before the first retry, before jitter. Default 0.5; > 0."""

    max_delay_s: float = 30.0
    """Cap of the exponential backoff. Default 30; ≥ ``base_delay_s``."""

    jitter: float = 0.5
    """Fraction of each backoff drawn at random, in [0, 1]. Default 0.5."""

    def __post_init__(self) -> None:
        _check_int("Retry", "max_attempts", self.max_attempts, lower=1)
        _check_positive("Retry", "base_delay_s", self.base_delay_s)
        _check_positive("Retry", "max_delay_s", self.max_delay_s)
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(
                f"Retry.max_delay_s must be ≥ base_delay_s ({self.base_delay_s:g}), got {self.max_delay_s!r}"
            )
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter <= 1:
            raise ValueError(f"Retry.jitter must be in [0, 1], got {self.jitter!r}")

    def backoff_s(self, retry_number: int, u: float) -> float:
        """Wait before retry ``retry_number`` (≥ 1) given a uniform draw ``u`` in [0, 1)."""
        full_s = min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry_number - 1))
        return full_s * (1.0 - self.jitter * u)


# --- error mapping ----------------------------------------------------------------------


def error_from_reply(status: int, body: bytes, *, retry_after: str | None = None) -> errors.RMServeError:
    """The :mod:`rmserve.errors` instance a non-200 reply stands for.

    The body is decoded as the :class:`~rmserve.schema.ErrorBody` record the server writes
    (``{"error": {"type", "message", "field"}}``) when it is one; the class is chosen by
    :func:`rmserve.errors.from_wire` (``error.type`` first, then the status: 429/503
    retryable, other 4xx client fault, else server fault). The ``Retry-After`` header, parsed
    to seconds by :func:`parse_retry_after`, becomes the error's ``retry_after_s`` (None
    without one).
    """
    return errors.from_wire(status, body, retry_after_s=parse_retry_after(retry_after))


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3).

    Returns None for a missing or unreadable header; a date in the past gives 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now_s is None else now_s)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


# --- records ------------------------------------------------------------------------------


def request_group(group: Group, *, judge: bool = False) -> RequestGroup:
    """The wire form of ``group``: id ``str(group.key)``, its messages and responses; for a
    generative judge (``judge``: the server's kind is ``judge``) also ``num_chosen`` and
    ``styles``, which its prompts need. Other kinds never get them, so their requests are
    unchanged."""
    if judge:
        return RequestGroup(id=str(group.key), responses=group.responses, messages=group.messages,
                            num_chosen=group.num_chosen, styles=group.styles)
    return RequestGroup(id=str(group.key), responses=group.responses, messages=group.messages)


def record_from_result(
    group: Group,
    result: GroupResult,
    *,
    model: str,
    fingerprint: str,
    truncation: Truncation | None = None,
    kind: ScoreKind | None = None,
) -> ScoreRecord:
    """The stored record of one scored group: key, rewards (null where a response could not be
    scored, with its :class:`~rmserve.schema.ResponseError` in ``errors``), token counts, the
    engine's per-response ``extras`` (unchanged), model identity, the truncation it was scored
    under and, from ``kind`` (:meth:`ScoreKind.of` the run's :class:`ModelInfo`; None: a
    classifier), what kind of score the rewards are; a generative judge's ``judge`` record
    (its calls, texts and the group's score) is copied unchanged."""
    kind = kind or ScoreKind()
    return ScoreRecord(
        benchmark=group.benchmark,
        domain=group.domain,
        id=group.id,
        num_chosen=group.num_chosen,
        rewards=result.rewards,
        num_tokens=result.num_tokens,
        num_cached_tokens=result.num_cached_tokens,
        model=model,
        fingerprint=fingerprint,
        truncated_tokens=result.truncated_tokens,
        styles=group.styles,
        errors=result.errors,
        truncation=truncation,
        extras=result.extras,
        kind=kind.kind,
        mode=kind.mode,
        ref_model=kind.ref_model,
        compat=kind.compat,
        judge=result.judge,
    )


def check_reply(groups: Sequence[Group], reply: ScoreResponse) -> tuple[GroupResult, ...]:
    """The reply's results in the order of ``groups``, after checking they match.

    Raises:
        rmserve.errors.ServerFault: a result count different from the groups sent, an id
            sent but not answered, an id answered but not sent or answered twice, or a
            ``rewards``/``num_tokens``/``num_cached_tokens``/``truncated_tokens``/``errors``
            length (or that of one of the ``extras``) that differs from the group's number of
            responses, or a null reward
            without an error for that response (or an error beside a reward).
    """
    if len(reply.results) != len(groups):
        raise errors.ServerFault(
            f"reply holds {len(reply.results)} results for {len(groups)} groups sent", field="results"
        )
    by_id: dict[str, GroupResult] = {}
    for i, result in enumerate(reply.results):
        if result.id in by_id:
            raise errors.ServerFault(f"reply answers group {result.id!r} twice", field=f"results[{i}].id")
        by_id[result.id] = result
    ordered = []
    for group in groups:
        wire_id = str(group.key)
        result = by_id.pop(wire_id, None)
        if result is None:
            unexpected = sorted(by_id)[:3]
            raise errors.ServerFault(
                f"reply has no result for group {wire_id!r} (unexpected ids: {unexpected})", field="results"
            )
        n = len(group.responses)
        for name in ("rewards", "num_tokens", "num_cached_tokens", "truncated_tokens", "errors"):
            values = getattr(result, name)
            if values is not None and len(values) != n:
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {len(values)} {name} for {n} responses",
                    field=f"results[{wire_id}].{name}",
                    value=len(values),
                    limit=n,
                )
        for name, values in (result.extras or {}).items():
            if len(values) != n:
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {len(values)} extras[{name!r}] values for {n} responses",
                    field=f"results[{wire_id}].extras.{name}",
                    value=len(values),
                    limit=n,
                )
        reasons = result.errors or (None,) * n
        for j, (reward, reason) in enumerate(zip(result.rewards, reasons)):
            if (reward is None) != (reason is not None):
                state = "a null reward without an error" if reward is None else "both a reward and an error"
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {state} for response {j}", field=f"results[{wire_id}].rewards[{j}]"
                )
        ordered.append(result)
    return tuple(ordered)


def _batched(groups: Iterable[Group], size: int) -> Iterator[tuple[Group, ...]]:
    it = iter(groups)
    while batch := tuple(itertools.islice(it, size)):
        yield batch


# --- the client ---------------------------------------------------------------------------


class RewardClient:
    """Async client of one rmserve server.

    Use as ``async with RewardClient(url) as client: ...``; the client opens one
    ``aiohttp.ClientSession`` (pool size and keep-alive from ``concurrency``) and closes it on
    exit. Passing ``session`` reuses that session instead (tests aim it at an in-process
    app); the client then neither configures its connector nor closes it, but still applies
    ``timeouts`` to every request.

    Args:
        base_url: ``http://host:port`` (a path prefix is kept).
        session: an open session to use instead of creating one.
        timeouts, concurrency, retry: see :class:`Timeouts`, :class:`Concurrency`,
            :class:`Retry`.
        sleep: the coroutine used to wait between retries (a test seam; default
            ``asyncio.sleep``).
        rng: the random source of the backoff jitter.
        token: bearer token sent as ``Authorization: Bearer`` with every request (a server
            started with a users file needs it); None sends none. A 401/403 reply is raised
            as :class:`~rmserve.errors.Unauthorized` / :class:`~rmserve.errors.Forbidden`,
            never retried.
        priority: ``interactive`` or ``batch``, sent on every request as the
            ``X-RMServe-Priority`` header; None sends no header (the server takes ``batch``).

    Attributes:
        attempts: HTTP requests sent so far (retries included).
        retries: retries done so far.

    Raises:
        ValueError: ``base_url`` is not an absolute http(s) URL, or ``priority`` is another value.
    """

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeouts: Timeouts = Timeouts(),
        concurrency: Concurrency = Concurrency(),
        retry: Retry = Retry(),
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        token: str | None = None,
        priority: str | None = None,
    ) -> None:
        if priority is not None and priority not in PRIORITIES:
            raise ValueError(f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
        self.priority = priority
        url = yarl.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"server URL must be http(s)://host[:port], got {base_url!r}")
        self.base_url = url
        self.timeouts = timeouts
        self.concurrency = concurrency
        self.retry = retry
        self._session = session
        self._owns_session = False
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._token = token
        self.attempts = 0
        self.retries = 0

    def __repr__(self) -> str:
        return (
            f"RewardClient({str(self.base_url)!r}, timeouts={self.timeouts!r}, "
            f"concurrency={self.concurrency!r}, retry={self.retry!r})"
        )

    async def __aenter__(self) -> RewardClient:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency.connection_limit,
                limit_per_host=self.concurrency.connection_limit,
                keepalive_timeout=self.concurrency.keepalive_s,
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeouts.for_scoring())
            self._owns_session = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None
            self._owns_session = False

    # --- transport --------------------------------------------------------------------

    def _url(self, path: str) -> yarl.URL:
        return self.base_url.joinpath(path.lstrip("/"))

    async def _send_once(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None,
        timeout: aiohttp.ClientTimeout,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """One HTTP exchange: the body of a 200 reply, else the mapped error raised."""
        if self._session is None:
            raise RuntimeError("RewardClient is not open: use 'async with RewardClient(...) as client'")
        url = self._url(path)
        headers = dict(headers or {})
        if self._token is not None and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self._token}"
        if self.priority is not None:
            headers[PRIORITY_HEADER] = self.priority
        if data is not None:
            headers["Content-Type"] = "application/json"
        self.attempts += 1
        try:
            async with self._session.request(method, url, data=data, headers=headers, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status == 200:
                    return body
                error = error_from_reply(resp.status, body, retry_after=resp.headers.get("Retry-After"))
                if resp.status == 401 and self._token is None and "Authorization" not in headers:
                    error.message = f"{error.message} (this client sent no token: give --token-file FILE or set RMSERVE_TOKEN)"
                    error.args = (error.message,)
                raise error
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__}: {exc})"
            raise errors.ConnectionFailed(f"{method} {url} {what}") from exc

    async def _send(self, method: str, path: str, **request: Any) -> bytes:
        """:meth:`_send_once` (same keyword arguments) with the retry policy applied to retryable errors."""
        for attempt in itertools.count(1):
            try:
                return await self._send_once(method, path, **request)
            except errors.RMServeError as exc:
                if not exc.retryable or attempt >= self.retry.max_attempts:
                    raise
                delay_s = (
                    exc.retry_after_s
                    if exc.retry_after_s is not None
                    else self.retry.backoff_s(attempt, self._rng.random())
                )
            self.retries += 1
            await self._sleep(delay_s)
        raise AssertionError("unreachable")  # pragma: no cover

    # --- endpoints --------------------------------------------------------------------

    async def health(self) -> HealthReply:
        """``GET /health`` once, no retries.

        Returns:
            The :class:`~rmserve.schema.HealthReply` of a 200 reply: ``status`` ``ready`` and
            the server's rmserve ``version`` (``""`` from a server that does not send it).

        Raises:
            rmserve.errors.EngineNotReady: 503, the engine is loading, restarting or shutting
                down.
            rmserve.errors.ConnectionFailed: nothing answered within ``Timeouts.probe_s``.
            rmserve.errors.ServerFault: a 200 reply that is not a ``HealthReply``.
            rmserve.errors.RMServeError: any other non-200 reply, mapped by status and type.
        """
        body = await self._send_once("GET", "/health", data=None, timeout=self.timeouts.for_probe())
        try:
            return msgspec.json.decode(body, type=HealthReply)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise errors.ServerFault(f"GET /health: invalid reply ({exc})") from None

    async def wait_until_ready(
        self,
        timeout_s: float,
        *,
        poll_interval_s: float = 0.5,
        wait_for_server: bool = False,
        connect_grace_s: float = CONNECT_GRACE_S,
        on_wait: Callable[[Waiting], None] | None = None,
    ) -> HealthReply:
        """Poll ``/health`` until it answers 200.

        A server that answers 503 (engine loading, restarting) is waited for, up to
        ``timeout_s`` seconds in all. A failure to connect (refused, unreachable, no reply
        within ``Timeouts.probe_s``) means no server answers at this address: it is retried
        for ``connect_grace_s`` seconds (a server just started may not listen yet), counted
        from the first failure in a row, then raised. With ``wait_for_server`` it is waited
        for like a 503, up to ``timeout_s``. Anything else is raised at once.

        Args:
            timeout_s: longest wait in all, seconds; > 0.
            poll_interval_s: pause between probes, seconds.
            wait_for_server: keep waiting while nothing answers (a server being started
                elsewhere). Default False.
            connect_grace_s: how long a failure to connect is retried without
                ``wait_for_server``, seconds. Default :data:`CONNECT_GRACE_S`; > 0.
            on_wait: called after every probe that did not answer 200, with a
                :class:`Waiting` (for a status line; the client prints nothing).

        Returns:
            The ready server's :class:`~rmserve.schema.HealthReply` (see :meth:`health`).

        Raises:
            rmserve.errors.ConnectionFailed: nothing answered for ``connect_grace_s``
                (without ``wait_for_server``); names the address and the reason
                (``connection refused`` …).
            rmserve.errors.EngineNotReady: not ready after ``timeout_s`` (names the URL and the
                last failure).
            ValueError: ``timeout_s`` or ``connect_grace_s`` not > 0.
        """
        _check_positive("wait_until_ready", "timeout_s", timeout_s)
        _check_positive("wait_until_ready", "connect_grace_s", connect_grace_s)
        started = time.monotonic()
        deadline = started + timeout_s
        unreachable_since: float | None = None
        health_url = self._url("/health")
        while True:
            try:
                return await self.health()
            except errors.RMServeError as exc:
                if not exc.retryable:
                    raise
                last = exc
            now = time.monotonic()
            reachable = not isinstance(last, errors.ConnectionFailed)
            if reachable:
                unreachable_since = None
            elif unreachable_since is None:
                unreachable_since = now
            remaining_s = deadline - now
            if not reachable and (remaining_s <= 0 or (not wait_for_server and now - unreachable_since >= connect_grace_s)):
                raise errors.ConnectionFailed(
                    f"nothing answers at {health_url}: {connection_reason(last)} (retried for "
                    f"{now - unreachable_since:.1f} s); start the server or check the address"
                    + ("" if wait_for_server else " (--wait-for-server waits for a server that is still being started)")
                ) from last.__cause__
            if remaining_s <= 0:
                raise errors.EngineNotReady(
                    f"server {self.base_url} not ready after {timeout_s:g} s (last: {last.type}: {last})"
                )
            if on_wait is not None:
                limit_s = remaining_s if reachable or wait_for_server else connect_grace_s - (now - unreachable_since)
                on_wait(Waiting(url=str(health_url), elapsed_s=now - started, last=last, retry_for_s=max(0.0, limit_s)))
            await asyncio.sleep(min(poll_interval_s, remaining_s))

    async def models(self) -> tuple[ModelInfo, ...]:
        """``GET /v1/models``: what the server scores with (name, max length, fingerprint …).

        Returns:
            The ``models`` of the :class:`~rmserve.schema.ModelList` reply (at least one).

        Raises:
            rmserve.errors.ServerFault: the reply is not a ModelList, or lists no model.
            rmserve.errors.RMServeError: a non-200 reply (after retries for 429/503).
        """
        body = await self._send("GET", "/v1/models", data=None, timeout=self.timeouts.for_probe())
        try:
            reply = msgspec.json.decode(body, type=ModelList)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise errors.ServerFault(f"GET /v1/models: invalid reply ({exc})", field="models") from None
        if not reply.models:
            raise errors.ServerFault("GET /v1/models: the server lists no model", field="models")
        return reply.models

    async def load_checkpoint(
        self, name: str, path: str, *, admin_token: str, timeout_s: float = 1800.0, force: bool = False
    ) -> ModelInfo:
        """``POST /v1/models/load``: make the server score with the checkpoint folder ``path``.

        The server swaps the weights in place (same architecture and tokenizer) or restarts
        its engine; ``path`` is resolved on the server's file system and must lie under one
        of its ``--checkpoint-root`` folders. :meth:`load_checkpoint_reply` (same arguments)
        also returns how the checkpoint was loaded.

        Args:
            name: the model name the server reports afterwards.
            path: the checkpoint folder, as the server sees it.
            admin_token: the server's admin token (sent as ``Authorization: Bearer``).
            timeout_s: limit of the whole load, seconds (> 0; default 1800).
            force: swap even though another user holds the model's lease or has pinned work
                in flight on it (admins only; their later requests get 409). Default False.

        Returns:
            The :class:`~rmserve.schema.ModelInfo` now served (new fingerprint, swap count;
            ``lease_holder``: the caller).

        Raises:
            rmserve.errors.Unauthorized: 401, missing or wrong token.
            rmserve.errors.Forbidden: 403, swaps disabled, ``path`` outside the roots, or
                ``force`` by a user who is not an admin.
            rmserve.errors.Conflict: 409, another swap in progress, a refused checkpoint, or
                another user's lease or pinned work (the message names them).
            rmserve.errors.RMServeError: any other failure (after retries for 429/503).
        """
        reply = await self.load_checkpoint_reply(name, path, admin_token=admin_token, timeout_s=timeout_s, force=force)
        return reply.models[0]

    async def load_checkpoint_reply(
        self,
        name: str,
        path: str,
        *,
        admin_token: str,
        timeout_s: float = 1800.0,
        force: bool = False,
        model: str | None = None,
    ) -> LoadModelResponse:
        """:meth:`load_checkpoint`, returning the whole reply: the model now served and
        ``swap_kind`` (``reload``: weights into the running engine; ``restart``: the engine
        restarted on the checkpoint).

        Args:
            model: which served model the checkpoint replaces, sent as the body's ``model``
                field only when given; None (default) sends no such field (the server's only
                model). Other arguments as for :meth:`load_checkpoint`.

        Returns:
            The :class:`~rmserve.schema.LoadModelResponse` (exactly one model).

        Raises:
            As :meth:`load_checkpoint`; rmserve.errors.ServerFault: the reply is not a load
            reply with exactly one model.
        """
        _check_positive("load_checkpoint", "timeout_s", timeout_s)
        body = encode(LoadModelRequest(name=name, path=path, force=force, model=model))
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(10.0, timeout_s))
        reply_body = await self._send(
            "POST", "/v1/models/load", data=body, timeout=timeout, headers={"Authorization": f"Bearer {admin_token}"}
        )
        try:
            reply = msgspec.json.decode(reply_body, type=LoadModelResponse)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise errors.ServerFault(f"POST /v1/models/load: invalid reply ({exc})", field="models") from None
        if len(reply.models) != 1:
            raise errors.ServerFault(f"POST /v1/models/load: expected one model, got {len(reply.models)}", field="models")
        return reply

    async def release_checkpoint(self, name: str, *, admin_token: str) -> ModelInfo:
        """``POST /v1/models/release``: end the caller's lease on the served model ``name``.

        Returns:
            The :class:`~rmserve.schema.ModelInfo` served (no ``lease_holder`` any more).

        Raises:
            rmserve.errors.Conflict: 409, no lease is held on it.
            rmserve.errors.Forbidden: 403, the lease is another user's (the message names
                the holder) and the caller is not an admin.
            rmserve.errors.ModelNotFound: 404, ``name`` is not the served model.
            rmserve.errors.RMServeError: any other failure (after retries for 429/503).
        """
        body = encode(ReleaseModelRequest(name=name))
        reply_body = await self._send(
            "POST", "/v1/models/release", data=body, timeout=self.timeouts.for_probe(),
            headers={"Authorization": f"Bearer {admin_token}"},
        )
        try:
            reply = msgspec.json.decode(reply_body, type=ModelList)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise errors.ServerFault(f"POST /v1/models/release: invalid reply ({exc})", field="models") from None
        if len(reply.models) != 1:
            raise errors.ServerFault(
                f"POST /v1/models/release: expected one model, got {len(reply.models)}", field="models"
            )
        return reply.models[0]

    async def score(
        self,
        groups: Sequence[Group],
        *,
        truncation: Truncation | None = None,
        model: str | None = None,
        judge: bool = False,
        fingerprint: str | None = None,
    ) -> ScoreResponse:
        """``POST /v1/score`` for ``groups`` (one request, retried when retryable).

        ``judge``: the server is a generative judge; each group then carries ``num_chosen``
        and ``styles`` (:func:`request_group`). ``fingerprint``: the model fingerprint the
        caller expects; the server refuses to score with any other (409, see Raises).

        Returns:
            The reply, with its results re-ordered to match ``groups`` and checked by
            :func:`check_reply`.

        Raises:
            rmserve.errors.InvalidRequest: no groups, or two groups with the same key.
            rmserve.errors.ClientFault: the server rejected the request (400/404/413 …),
                after one attempt.
            rmserve.errors.ServerFault: a 5xx reply, or a reply that does not match.
            rmserve.errors.ConnectionFailed: no reply after ``Retry.max_attempts`` attempts.
            rmserve.errors.FingerprintMismatch: the server serves another fingerprint than
                ``fingerprint`` (its 409 ``conflict`` on field ``fingerprint``, which names
                both, the model and who swapped it; nothing was scored).
        """
        if not groups:
            raise errors.InvalidRequest("no groups to score", field="groups", value=0, limit=1)
        seen: dict[str, int] = {}
        for i, group in enumerate(groups):
            wire_id = str(group.key)
            if wire_id in seen:
                raise errors.InvalidRequest(
                    f"group {wire_id!r} appears twice (positions {seen[wire_id]} and {i})", field=f"groups[{i}].id"
                )
            seen[wire_id] = i
        request = ScoreRequest(
            groups=tuple(request_group(g, judge=judge) for g in groups), model=model, truncation=truncation,
            fingerprint=fingerprint,
        )
        try:
            body = await self._send("POST", "/v1/score", data=encode(request), timeout=self.timeouts.for_scoring())
        except errors.Conflict as exc:
            if exc.field != "fingerprint":
                raise
            raise errors.FingerprintMismatch(
                f"the server refused to score with another model than the expected one: {exc.message}",
                field="fingerprint",
                value=fingerprint,
            ) from exc
        try:
            reply = msgspec.json.decode(body, type=ScoreResponse)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise errors.ServerFault(f"POST /v1/score: invalid reply ({exc})") from None
        results = check_reply(groups, reply)
        return ScoreResponse(model=reply.model, fingerprint=reply.fingerprint, results=results)

    async def _score_records(
        self,
        groups: Sequence[Group],
        *,
        truncation: Truncation | None,
        model: str | None,
        expect_fingerprint: str | None,
        kind: ScoreKind | None = None,
    ) -> list[ScoreRecord]:
        judge = kind is not None and kind.kind == "judge"
        reply = await self.score(groups, truncation=truncation, model=model, judge=judge, fingerprint=expect_fingerprint)
        if expect_fingerprint is not None and reply.fingerprint != expect_fingerprint:
            raise errors.FingerprintMismatch(
                f"the server's model changed during the run: fingerprint {reply.fingerprint!r} "
                f"({reply.model}), expected {expect_fingerprint!r}",
                field="fingerprint",
            )
        return [
            record_from_result(g, r, model=reply.model, fingerprint=reply.fingerprint, truncation=truncation, kind=kind)
            for g, r in zip(groups, reply.results, strict=True)
        ]

    async def score_stream(
        self,
        groups: Iterable[Group],
        *,
        truncation: Truncation | None = None,
        model: str | None = None,
        expect_fingerprint: str | None = None,
        kind: ScoreKind | None = None,
    ) -> AsyncIterator[ScoreRecord]:
        """Score ``groups`` with at most ``Concurrency.max_groups_in_flight`` in flight.

        Groups are taken from ``groups`` lazily, batched ``Concurrency.groups_per_request``
        per request, and one :class:`~rmserve.schema.ScoreRecord` per group is yielded as its
        request completes (completion order, not input order). When a request fails for
        good, the records of requests that already completed are yielded first, the other
        requests are cancelled, then the error is raised. Closing the iterator early cancels
        the requests in flight.

        Args:
            groups: the groups; keys must be unique.
            truncation, model: sent with every request (see :class:`ScoreRequest`).
            expect_fingerprint: when set, every request carries it (the server refuses to
                score with another model: 409) and a reply with another fingerprint raises
                :class:`~rmserve.errors.FingerprintMismatch` (the server's model changed).
            kind: what kind of score the server's rewards are (``ScoreKind.of(model_info)``),
                written into every record; None: a classifier. Kind ``judge`` also sends each
                group's ``num_chosen`` and ``styles``.

        Raises:
            rmserve.errors.InvalidRequest: a group key seen twice.
            The errors of :meth:`score`, and FingerprintMismatch as above.
        """
        seen: set[str] = set()

        def unique(source: Iterable[Group]) -> Iterator[Group]:
            for group in source:
                wire_id = str(group.key)
                if wire_id in seen:
                    raise errors.InvalidRequest(f"group {wire_id!r} appears twice in the input", field="groups.id")
                seen.add(wire_id)
                yield group

        batches = _batched(unique(groups), self.concurrency.groups_per_request)
        order: dict[asyncio.Task[list[ScoreRecord]], int] = {}
        pending: set[asyncio.Task[list[ScoreRecord]]] = set()
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < self.concurrency.max_requests_in_flight:
                    batch = next(batches, None)
                    if batch is None:
                        exhausted = True
                        break
                    task = asyncio.create_task(
                        self._score_records(
                            batch, truncation=truncation, model=model, expect_fingerprint=expect_fingerprint,
                            kind=kind,
                        )
                    )
                    order[task] = len(order)
                    pending.add(task)
                if not pending:
                    return
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failure: BaseException | None = None
                for task in sorted(done, key=order.__getitem__):
                    del order[task]
                    exc = task.exception()
                    if exc is not None:
                        failure = failure or exc
                        continue
                    for record in task.result():
                        yield record
                if failure is not None:
                    raise failure
        finally:
            # ``order`` also holds tasks finished in the last wait but not handled when the
            # caller stopped iterating; gathering them collects their errors too.
            for task in order:
                task.cancel()
            if order:
                await asyncio.gather(*order, return_exceptions=True)
