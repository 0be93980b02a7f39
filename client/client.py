"""Async HTTP client for the rmserve scoring server.

:class:`RewardClient` speaks the wire schema of :mod:`rmserve.schema` over one
``aiohttp.ClientSession``: ``GET /health``, ``GET /v1/models`` and ``POST /v1/score``.
:meth:`RewardClient.score_stream` keeps a bounded number of groups in flight and yields one
:class:`~rmserve.schema.ScoreRecord` per group as its reply arrives (completion order).
Its settings are :mod:`rmserve.client.config`; the groups sent, the reply checks and the
records built are :mod:`rmserve.client.records`.

Failures are the :mod:`rmserve.errors` classes: a non-200 reply is rebuilt by
:func:`~rmserve.client.errors.error_from_reply` (status + ``error.type`` → class, the same
table the server maps from); transport failures become
:class:`~rmserve.errors.ConnectionFailed`. Only retryable errors (connection failures,
timeouts, 429, 503) are retried, with exponential backoff and jitter, honouring
``Retry-After`` up to :attr:`~rmserve.client.config.Retry.max_retry_after_s` (a longer wait is
cut to it, with a warning on the ``rmserve.client`` logger). Client faults (4xx) are raised
after exactly one attempt.

No torch or vllm here: this module must import on a machine without them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import aiohttp
import msgspec
import yarl

from rmserve import errors
from rmserve.client.config import PRIORITIES, Concurrency, Retry, Timeouts, Waiting, check_positive
from rmserve.client.errors import connection_reason, error_from_reply
from rmserve.client.records import check_reply, record_from_result, refused_record, request_group
from rmserve.schema import (
    JUDGE_KIND,
    Group,
    HealthReply,
    LoadModelRequest,
    LoadModelResponse,
    ReleaseModelRequest,
    ModelInfo,
    ModelList,
    ScoreKind,
    ScoreRecord,
    ScoreRequest,
    ScoreResponse,
    Truncation,
    encode,
)

__all__ = ["CONNECT_GRACE_S", "PRIORITY_HEADER", "RewardClient"]


PRIORITY_HEADER = "X-RMServe-Priority"
"""Request header carrying the caller's priority hint (the server's fair queue reads it)."""

NO_TOKEN_HINT = "give --token-file FILE or set RMSERVE_TOKEN"
"""How a command-line user gives a token (:class:`RewardClient`'s ``no_token_hint`` default)."""


logger = logging.getLogger("rmserve.client")

CONNECT_GRACE_S = 4.0
"""How long :meth:`RewardClient.wait_until_ready` retries a server that does not accept
connections before saying so, seconds: long enough for a server that is just starting to
listen, short enough that a wrong address fails at once."""

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
        timeouts, concurrency, retry: see :class:`~rmserve.client.config.Timeouts`,
            :class:`~rmserve.client.config.Concurrency`, :class:`~rmserve.client.config.Retry`.
        sleep: the coroutine used to wait between retries (a test seam; default
            ``asyncio.sleep``).
        rng: the random source of the backoff jitter.
        token: bearer token sent as ``Authorization: Bearer`` with every request (a server
            started with a users file needs it); None sends none. A 401/403 reply is raised
            as :class:`~rmserve.errors.Unauthorized` / :class:`~rmserve.errors.Forbidden`,
            never retried.
        priority: ``interactive`` or ``batch``, sent on every request as the
            ``X-RMServe-Priority`` header; None sends no header (the server takes ``batch``).
        no_token_hint: how this client's user gives a token, appended to the message of a
            401 when no token was sent (the command line's flags by default; a Python caller
            names its own argument).

    Attributes:
        attempts: HTTP requests sent so far (retries included).
        retries: retries done so far.
        cache_groups, cache_tokens: groups (and their prompt tokens) of the replies so far that
            the server answered from its result cache (``from_result_cache``: no engine work),
            counted by :meth:`score` as each reply arrives (so before :meth:`score_stream`
            yields their records); a caller leaves them out of its throughput.

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
        no_token_hint: str = NO_TOKEN_HINT,
    ) -> None:
        self.no_token_hint = no_token_hint
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
        self.cache_groups = 0
        self.cache_tokens = 0
        self._fit_groups: int | None = None
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
                    error.message = f"{error.message} (this client sent no token: {self.no_token_hint})"
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
                if exc.retry_after_s is None:
                    delay_s = self.retry.backoff_s(attempt, self._rng.random())
                else:
                    delay_s = self.retry.retry_after_wait_s(exc.retry_after_s)
                    if delay_s < exc.retry_after_s:
                        logger.warning(
                            "%s %s: the server asked to wait %g s before retrying (Retry-After); waiting %g s instead, "
                            "the client's cap (max_retry_after_s, --wait-retry-after-s)",
                            method, self._url(path), exc.retry_after_s, delay_s,
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
                :class:`~rmserve.client.config.Waiting` (for a status line; the client prints
                nothing).

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
        check_positive("wait_until_ready", "timeout_s", timeout_s)
        check_positive("wait_until_ready", "connect_grace_s", connect_grace_s)
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
        check_positive("load_checkpoint", "timeout_s", timeout_s)
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
        and ``styles`` (:func:`~rmserve.client.records.request_group`). ``fingerprint``: the
        model fingerprint the caller expects; the server refuses to score with any other (409,
        see Raises).

        Returns:
            The reply, with its results re-ordered to match ``groups`` and checked by
            :func:`~rmserve.client.records.check_reply`.

        Raises:
            rmserve.errors.InvalidRequest: no groups, or two groups with the same key.
            rmserve.errors.ClientFault: the server rejected the request (400/404/413 …),
                after one attempt; :class:`~rmserve.errors.OverLimit` (413) when the request
                alone is over a whole limit of the user or the server (its ``limit_name``,
                ``unit``, ``limit`` and ``value`` say which and by how much).
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
        for result in results:
            if result.from_result_cache:
                self.cache_groups += 1
                self.cache_tokens += sum(result.num_tokens)
        return ScoreResponse(model=reply.model, fingerprint=reply.fingerprint, results=results, scorer=reply.scorer)

    @property
    def groups_per_request(self) -> int:
        """Groups put in one ``POST /v1/score`` by :meth:`score_stream`:
        ``Concurrency.groups_per_request``, or fewer once the server has refused a request as
        over one of its limits (413 ``request_over_limit``)."""
        return min(self.concurrency.groups_per_request, self._fit_groups or self.concurrency.groups_per_request)

    def _fit(self, n: int, refusal: errors.OverLimit) -> int:
        """Groups per request that should fit the limit ``refusal`` names, for a refused request
        of ``n`` > 1 groups: ``limit`` for a group limit, ``⌊n · limit / requested⌋`` for the
        token budget, half of ``n`` when the reply did not say; always in [1, n − 1]. Later
        requests hold no more (:attr:`groups_per_request`)."""
        if refusal.unit == "groups" and refusal.limit:
            size = refusal.limit
        elif refusal.unit == "tokens" and refusal.limit and refusal.value:
            size = n * refusal.limit // refusal.value
        else:
            size = n // 2
        size = max(1, min(size, n - 1))
        if self._fit_groups is None or size < self._fit_groups:
            self._fit_groups = size
            what = (
                f"{refusal.limit_name} is {refusal.limit:,} {refusal.unit}, the request held {refusal.value:,}"
                if refusal.limit_name is not None and refusal.limit is not None and refusal.value is not None
                else refusal.message
            )
            logger.warning(
                "the server refused a request of %d groups as over one of its limits (%s): sending at most %d "
                "groups per request from now on", n, what, size,
            )
        return size

    async def _score_records(
        self,
        groups: Sequence[Group],
        *,
        truncation: Truncation | None,
        model: str | None,
        expect_fingerprint: str | None,
        kind: ScoreKind | None = None,
    ) -> list[ScoreRecord]:
        judge = kind is not None and kind.kind == JUDGE_KIND
        reply = await self.score(groups, truncation=truncation, model=model, judge=judge, fingerprint=expect_fingerprint)
        if expect_fingerprint is not None and reply.fingerprint != expect_fingerprint:
            raise errors.FingerprintMismatch(
                f"the server's model changed during the run: fingerprint {reply.fingerprint!r} "
                f"({reply.model}), expected {expect_fingerprint!r}",
                field="fingerprint",
            )
        return [
            record_from_result(g, r, model=reply.model, fingerprint=reply.fingerprint, truncation=truncation, kind=kind,
                               scorer=reply.scorer)
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
        served: ModelInfo | None = None,
    ) -> AsyncIterator[ScoreRecord]:
        """Score ``groups`` with at most ``Concurrency.max_groups_in_flight`` in flight.

        Groups are taken from ``groups`` lazily, batched ``Concurrency.groups_per_request``
        per request, and one :class:`~rmserve.schema.ScoreRecord` per group is yielded as its
        request completes (completion order, not input order). When a request fails for
        good, the records of requests that already completed are yielded first, the other
        requests are cancelled, then the error is raised. Closing the iterator early cancels
        the requests in flight.

        **Requests that fit the server's limits.** A request refused as over a whole limit of
        its user or the server (413 ``request_over_limit``, :class:`~rmserve.errors.OverLimit`:
        more prompt tokens than the user's ``tokens_per_minute``, more groups than a
        ``max_inflight_groups``) is split and its parts sent again: ``limit`` groups each for a
        group limit, ``⌊n · limit / requested⌋`` of its ``n`` groups for the token budget (the
        request's mean cost per group), always fewer than ``n``. Later requests hold at most as
        many groups as the last split (:attr:`groups_per_request`), and a warning names the
        limit. A single group refused so (its tokens alone over the budget) is yielded as an
        unscored record (:func:`~rmserve.client.records.refused_record`) when ``served`` is
        given, and the stream goes on; without ``served`` the refusal is raised.

        Args:
            groups: the groups; keys must be unique.
            truncation, model: sent with every request (see :class:`ScoreRequest`).
            expect_fingerprint: when set, every request carries it (the server refuses to
                score with another model: 409) and a reply with another fingerprint raises
                :class:`~rmserve.errors.FingerprintMismatch` (the server's model changed).
            kind: what kind of score the server's rewards are (``ScoreKind.of(model_info)``),
                written into every record; None: a classifier. Kind ``judge`` also sends each
                group's ``num_chosen`` and ``styles``.
            served: the model the run scores with (its ``/v1/models`` entry): a group refused on
                its own as over a limit is recorded under its name and fingerprint (or
                ``expect_fingerprint``). None: such a refusal is raised.

        Raises:
            rmserve.errors.InvalidRequest: a group key seen twice.
            rmserve.errors.OverLimit: a single group over a limit, without ``served``.
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

        source = unique(groups)
        resend: deque[tuple[Group, ...]] = deque()  # parts of refused requests, sent before new groups
        order: dict[asyncio.Task[list[ScoreRecord]], int] = {}
        sent: dict[asyncio.Task[list[ScoreRecord]], tuple[Group, ...]] = {}
        pending: set[asyncio.Task[list[ScoreRecord]]] = set()
        exhausted = False

        def next_batch() -> tuple[Group, ...] | None:
            nonlocal exhausted
            if resend:
                return resend.popleft()
            if exhausted:
                return None
            batch = tuple(itertools.islice(source, self.groups_per_request))
            exhausted = len(batch) < self.groups_per_request
            return batch or None

        try:
            while True:
                while len(pending) < self.concurrency.max_requests_in_flight:
                    batch = next_batch()
                    if batch is None:
                        break
                    task = asyncio.create_task(
                        self._score_records(
                            batch, truncation=truncation, model=model, expect_fingerprint=expect_fingerprint,
                            kind=kind,
                        )
                    )
                    order[task] = len(order)
                    sent[task] = batch
                    pending.add(task)
                if not pending:
                    return
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failure: BaseException | None = None
                for task in sorted(done, key=order.__getitem__):
                    del order[task]
                    batch = sent.pop(task)
                    exc = task.exception()
                    if isinstance(exc, errors.OverLimit) and len(batch) > 1:
                        resend.extend(_batched(batch, self._fit(len(batch), exc)))
                        continue
                    if isinstance(exc, errors.OverLimit) and served is not None:
                        yield refused_record(
                            batch[0], exc, model=served.name, fingerprint=expect_fingerprint or served.fingerprint,
                            truncation=truncation, kind=kind,
                        )
                        continue
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
