"""Configuration of the rmserve client: time limits, concurrency, retries, priority hints.

:class:`Timeouts`, :class:`Concurrency` and :class:`Retry` are frozen dataclasses checked on
construction (``ValueError`` names the field and the bound);
:class:`~rmserve.client.client.RewardClient` takes one of each. :data:`PRIORITIES` are the
values of its ``priority`` hint.
:class:`Waiting` is what :meth:`~rmserve.client.client.RewardClient.wait_until_ready` reports
after each probe that did not answer 200.

No torch or vllm here: this module must import on a machine without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp

from rmserve import errors
from rmserve.client.errors import connection_reason

__all__ = ["DEFAULT_MAX_RETRY_AFTER_S", "PRIORITIES", "Concurrency", "Retry", "Timeouts", "Waiting"]


def check_positive(owner: str, name: str, value: float, *, upper: float | None = None) -> None:
    """Check that ``owner.name`` is a finite number > 0 (and ≤ ``upper`` when given).

    Raises:
        ValueError: a bool, a non-number, a non-finite value, one ≤ 0 or one above ``upper``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a finite number > 0, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{owner}.{name} must be ≤ {upper:g}, got {value!r}")


def check_int(owner: str, name: str, value: int, *, lower: int) -> None:
    """Check that ``owner.name`` is an integer ≥ ``lower``.

    Raises:
        ValueError: a bool, a non-integer or one below ``lower``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < lower:
        raise ValueError(f"{owner}.{name} must be an integer ≥ {lower}, got {value!r}")


PRIORITIES = ("interactive", "batch")
"""Priority hints: ``interactive`` (an eval someone waits for) or ``batch`` (a sweep)."""


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
        check_positive("Timeouts", "total_s", self.total_s)
        check_positive("Timeouts", "connect_s", self.connect_s, upper=self.total_s)
        check_positive("Timeouts", "sock_read_s", self.sock_read_s, upper=self.total_s)
        check_positive("Timeouts", "probe_s", self.probe_s)

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
        check_int("Concurrency", "max_groups_in_flight", self.max_groups_in_flight, lower=1)
        check_int("Concurrency", "groups_per_request", self.groups_per_request, lower=1)
        if self.groups_per_request > self.max_groups_in_flight:
            raise ValueError(
                f"Concurrency.groups_per_request must be ≤ max_groups_in_flight "
                f"({self.max_groups_in_flight}), got {self.groups_per_request}"
            )
        if self.pool_limit is not None:
            check_int("Concurrency", "pool_limit", self.pool_limit, lower=self.max_requests_in_flight)
        check_positive("Concurrency", "keepalive_s", self.keepalive_s)

    @property
    def max_requests_in_flight(self) -> int:
        """``max_groups_in_flight // groups_per_request``: full requests that fit the bound."""
        return self.max_groups_in_flight // self.groups_per_request

    @property
    def connection_limit(self) -> int:
        """The connector's pool size: ``pool_limit`` or, by default, the requests in flight."""
        return self.pool_limit if self.pool_limit is not None else self.max_requests_in_flight


DEFAULT_MAX_RETRY_AFTER_S = 60.0
"""The longest wait a client takes from a reply's ``Retry-After`` by default, seconds
(:attr:`Retry.max_retry_after_s`; ``--wait-retry-after-s`` on the commands)."""


@dataclass(frozen=True)
class Retry:
    """Retry policy for retryable failures (connection errors, timeouts, 429, 503).

    The wait before retry ``n`` (1 = the first retry) is the reply's ``Retry-After`` when
    it has one, at most ``max_retry_after_s`` (:meth:`retry_after_wait_s`), else
    ``min(max_delay_s, base_delay_s · 2**(n-1)) · (1 - jitter · u)`` with ``u`` uniform in
    [0, 1) (exponential backoff, "equal"-style jitter when jitter=0.5).
    """

    max_attempts: int = 5
    """Attempts per request, the first included. Default 5; ≥ 1 (1 = never retry)."""

    base_delay_s: float = 0.5
    """Backoff before the first retry, before jitter. Default 0.5; > 0."""

    max_delay_s: float = 30.0
    """Cap of the exponential backoff. Default 30; ≥ ``base_delay_s``."""

    jitter: float = 0.5
    """Fraction of each backoff drawn at random, in [0, 1]. Default 0.5."""

    max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S
    """Longest wait taken from a reply's ``Retry-After``, seconds: a longer one (a server asking
    for ``86400``, a day) is cut to this, and the client logs a warning naming both. Default
    60; > 0."""

    def __post_init__(self) -> None:
        check_int("Retry", "max_attempts", self.max_attempts, lower=1)
        check_positive("Retry", "base_delay_s", self.base_delay_s)
        check_positive("Retry", "max_delay_s", self.max_delay_s)
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(
                f"Retry.max_delay_s must be ≥ base_delay_s ({self.base_delay_s:g}), got {self.max_delay_s!r}"
            )
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter <= 1:
            raise ValueError(f"Retry.jitter must be in [0, 1], got {self.jitter!r}")
        check_positive("Retry", "max_retry_after_s", self.max_retry_after_s)

    def retry_after_wait_s(self, retry_after_s: float) -> float:
        """The wait taken for a reply's ``Retry-After`` of ``retry_after_s`` seconds (≥ 0):
        ``min(retry_after_s, max_retry_after_s)``."""
        return min(retry_after_s, self.max_retry_after_s)

    def backoff_s(self, retry_number: int, u: float) -> float:
        """Wait before retry ``retry_number`` (≥ 1) given a uniform draw ``u`` in [0, 1)."""
        full_s = min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry_number - 1))
        return full_s * (1.0 - self.jitter * u)


@dataclass(frozen=True)
class Waiting:
    """Where a :meth:`~rmserve.client.client.RewardClient.wait_until_ready` stands after a
    probe that did not answer 200.

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
