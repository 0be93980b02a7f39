"""A generative judge served by an OpenAI-compatible chat-completions endpoint.

:class:`OpenAIJudgeEngine` implements :class:`~rmserve.server.engines.protocol.JudgeEngine` over HTTP:
``rmserve serve MODEL --kind judge --judge-url URL [--judge-model NAME]`` judges with a model
running elsewhere — a ``vllm serve`` on another machine, or a hosted API — instead of loading
one. The protocols (prompts, readers, credit) are the same as for a local judge
(:mod:`rmserve.server.kinds.judge_protocols`); only where the text comes from differs.

Wire (OpenAI chat-completions API, which vLLM's API server speaks):

* ``start``: ``GET {judge_url}/models``; the model (``judge_model``, else MODEL) must be
  listed by ``id``. The server's ``max_model_len`` is read when it reports one (vLLM does;
  hosted APIs do not: then ``EngineConfig.max_model_len`` when set, else 0 = unknown). Then
  one probe call (:meth:`OpenAIJudgeEngine._probe`): the first of the judge's probe
  conversations (:func:`~rmserve.server.kinds.judge_probe.probe_calls`, the one with a system
  message when the settings send one) with ``max_tokens`` 1, so an endpoint that refuses the
  judge's calls (a template without a system role answers 400, a key allowed to list but not
  to call answers 401) fails the start with an error naming the option that fixes it, not the
  run at its first group. Its reply's ``model`` (a hosted API names the snapshot behind an
  alias there) is the engine's version in ``ModelInfo.judge_engine``.
* ``judge_group``: one ``POST {judge_url}/chat/completions`` per call, all calls of a group
  at once, with ``messages``, ``temperature`` and ``top_p`` (:attr:`OpenAIJudgeEngine.sampling`:
  0 and 1, greedy), ``max_tokens`` (``judge_max_tokens``) and ``n`` 1, and with ``--judge-thinking on|off``
  ``chat_template_kwargs: {"enable_thinking": true|false}`` (vLLM's field; a server that does
  not know it may refuse the request); the endpoint applies the model's chat template and its
  generation prompt. At most ``OpenAIClientConfig.max_concurrency`` requests are in flight
  across the engine. A cancelled group (client gone) closes its connections, which makes a
  vLLM server abort those requests. ``cached_tokens`` is read from
  ``usage.prompt_tokens_details`` (a vLLM server reports it only when started with
  ``--enable-prompt-tokens-details``; else 0).
* API key: the environment variable named by ``judge_api_key_env``, read at ``start``, sent
  as ``Authorization: Bearer …``; unset or empty sends no header. The key is never logged nor
  put in an error message.

Replies without text: a reasoning model may spend ``max_tokens`` thinking and reply
``"content": null`` with ``finish_reason`` ``length``. The call's text is then ``""``: one call
without a verdict (cut, when ``length``), never an error of the request. A reasoning the
server returns apart (``message.reasoning_content``, or ``message.reasoning`` in newer vLLM
and other servers) is kept in :attr:`JudgeOutput.reasoning` and never read for a verdict.

Retries: a reply 429 or 5xx, a dropped connection or a timeout is retried up to
``max_attempts`` attempts in all (:class:`OpenAIClientConfig`), waiting the reply's
``Retry-After`` (seconds or an HTTP date) when it has one, else an exponential backoff
(``backoff_s`` doubling up to ``max_backoff_s``). A ``Retry-After`` longer than
``max_retry_wait_s`` ends the retries. Then :class:`~rmserve.errors.EngineError` names the
URL and the last status (or connection error). Other 4xx replies are not retried.

A prompt too long for the model: a 400 whose error says the context length is exceeded
(OpenAI's ``context_length_exceeded``, vLLM's "maximum context length" message, and vLLM's
"max_tokens must be at least 1, got 0" that it answers when the prompt fills the whole
context) raises :class:`~rmserve.errors.SequenceTooLong` (field ``messages``), so the group is
answered as too long and the run goes on. Note that vLLM cuts ``max_tokens`` to the room the
prompt leaves: a call whose prompt leaves fewer than ``judge_max_tokens`` tokens comes back
shorter with ``finish_reason`` ``length`` (an output cut at the length limit, as the readers
treat it).

Fingerprint: a remote model's weights cannot be hashed, so the fingerprint
(:func:`endpoint_fingerprint`) hashes what identifies the endpoint — its URL, the model name,
the model's ``root`` and ``created`` when the listing gives them — and the judge settings that
change the scores (protocol, compat, max tokens, seed, system prompt, and the thinking switch
when set). **Different weights put
behind the same URL and name (a redeploy) are invisible to it**: scores of two such models
share a fingerprint. vLLM stamps ``created`` with the time of the listing request, so a
``created`` within :data:`LISTING_TIME_SLACK_S` of the reply's ``Date`` is left out.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from rmserve.errors import EngineError, EngineNotReady, InvalidRequest, SequenceTooLong, ServerFault
from rmserve.fingerprint import FINGERPRINT_HEX_CHARS
from rmserve.schema import JUDGE_KIND, JudgeEngineInfo, JudgeSampling, Message, ModelInfo
from rmserve.server.config import EngineConfig
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge_probe import ProbeCall, probe_calls, system_role_refused
from rmserve.server.kinds.judge_protocols import JudgeOutput
from rmserve.server.engines.protocol import LoadedModel, gather_or_abort

logger = logging.getLogger(__name__)

ENGINE_NAME = "openai"
"""``ModelInfo.engine`` of a judge served by an OpenAI-compatible endpoint."""

REMOTE_DTYPE = "remote"
"""``ModelInfo.dtype`` of a remote judge: the endpoint does not say how it computes."""

REMOTE_BATCH_INVARIANCE = (
    "unknown: the endpoint does not say how it batches the calls (a vLLM server with default settings is not "
    "batch-invariant; VLLM_BATCH_INVARIANT=1 on a supported GPU makes it so)"
)
"""``JudgeEngineInfo.batch_invariant_note`` of a judge behind an endpoint (``batch_invariant`` None)."""

PROBE_REQUEST_ID = "rmserve-probe"
"""``X-Request-Id`` of the start-up probe calls (``-1`` for the call without a system message)."""

@dataclass(frozen=True)
class OpenAIClientConfig:
    """How the engine talks to the endpoint: concurrency, timeouts and retries.

    Attributes:
        max_concurrency: requests in flight at most across one engine (every group
            together), ≥ 1. Default 16: enough to keep a vLLM server's batch full with a
            ranking or rating workload; lower it for a hosted API with a small rate limit.
        max_attempts: attempts per call at most, the first included, ≥ 1 (default 5), on a
            429 or 5xx reply, a dropped connection or a timeout.
        connect_timeout_s: seconds to get a connection (pool wait and connect), > 0; default 10.
        read_timeout_s: seconds of silence while waiting for a reply before the attempt
            fails (and is retried), > 0; default 600, since a call generating 2,048 tokens on
            a busy server may take minutes. There is no total limit per call beyond these.
        backoff_s: wait after the first failed attempt without ``Retry-After``, ≥ 0 seconds;
            doubles per attempt (default 0.5).
        max_backoff_s: cap of that wait, ≥ 0 seconds (default 30).
        max_retry_wait_s: a ``Retry-After`` longer than this ends the retries at once,
            ≥ 0 seconds (default 120).
    """

    max_concurrency: int = 16
    max_attempts: int = 5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retry_wait_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} must be an integer ≥ 1")
        for name in ("connect_timeout_s", "read_timeout_s", "backoff_s", "max_backoff_s", "max_retry_wait_s"):
            value = getattr(self, name)
            positive = name.endswith("timeout_s")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
                raise ValueError(f"{name}: {value!r} must be a number {'>' if positive else '≥'} 0 (seconds)")

    def timeout(self) -> aiohttp.ClientTimeout:
        """The session's timeouts: connect and read bounds, no total bound."""
        return aiohttp.ClientTimeout(
            total=None,
            connect=self.connect_timeout_s,
            sock_connect=self.connect_timeout_s,
            sock_read=self.read_timeout_s,
        )


LISTING_TIME_SLACK_S = 300.0
"""A model's ``created`` this close to the listing reply's ``Date`` (seconds) is taken for the
time of the listing (vLLM stamps it so) and left out of the fingerprint."""

_RETRY_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
_ERROR_TEXT_CHARS = 1000
_TOO_LONG_PATTERNS = (
    re.compile(r"maximum context length", re.IGNORECASE),
    re.compile(r"context[_ ]length[_ ]exceeded", re.IGNORECASE),
    re.compile(r"prompt is too long", re.IGNORECASE),
    re.compile(r"max_tokens must be at least 1, got 0"),
)
_REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Fields of a chat-completion message that carry a reasoning returned apart, first found wins."""
_CONTEXT_LIMIT = re.compile(r"maximum context length is (\d+)", re.IGNORECASE)
_PROMPT_TOKENS = re.compile(r"(?:contains at least|resulted in|requested) (\d+)", re.IGNORECASE)


class RemoteCallError(Exception):
    """One failed attempt (internal): the status (None for a connection error) and a description."""

    def __init__(self, status: int | None, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


def endpoint_fingerprint(
    url: str, model: str, listing: Mapping[str, Any], settings: Mapping[str, Any], *, listing_time: float | None = None
) -> str:
    """Fingerprint of a judge behind an OpenAI-compatible endpoint.

    SHA-256 over labelled, length-prefixed sections: ``kind`` ``judge-openai``, the URL (a
    trailing ``/`` dropped), the model name, the listing's ``root`` and ``created`` when
    present (``created`` left out when within :data:`LISTING_TIME_SLACK_S` seconds of
    ``listing_time``, the Unix time of the listing reply), then each ``settings`` item in key
    order. Hex, the first :data:`~rmserve.fingerprint.FINGERPRINT_HEX_CHARS` characters.

    The weights behind the endpoint are not covered: a model replaced behind the same URL and
    name keeps the fingerprint.
    """
    created = listing.get("created")
    if isinstance(created, (int, float)) and listing_time is not None and abs(created - listing_time) <= LISTING_TIME_SLACK_S:
        created = None
    sections: list[tuple[str, Any]] = [
        ("kind", "judge-openai"),
        ("url", url.rstrip("/")),
        ("model", model),
        ("root", listing.get("root")),
        ("created", created),
    ]
    sections += sorted(settings.items())
    digest = hashlib.sha256()
    for label, value in sections:
        data = b"" if value is None else str(value).encode()
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:FINGERPRINT_HEX_CHARS]


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header value in seconds (≥ 0): delay-seconds or an HTTP date; None
    when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _error_text(body: str, secret: str | None = None) -> str:
    """The ``error.message`` of an OpenAI error body (or the body), at most 1,000 characters
    (longer ones end in ``…``), with every occurrence of ``secret`` (the API key, should the
    server echo it) replaced by ``***``."""
    if secret:
        body = body.replace(secret, "***")
    text = body
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            err = parsed.get("error", parsed)
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                text = err["message"]
                if err.get("code") == "context_length_exceeded":
                    text += " (context_length_exceeded)"
            elif isinstance(err, str):
                text = err
    except ValueError:
        pass
    return text if len(text) <= _ERROR_TEXT_CHARS else text[:_ERROR_TEXT_CHARS] + "…"


def is_too_long(status: int, body: str) -> bool:
    """True when a reply says the prompt does not fit the model's context (status 400 or 413)."""
    return status in (400, 413) and any(p.search(body) for p in _TOO_LONG_PATTERNS)


class OpenAIJudgeEngine:
    """A :class:`~rmserve.server.engines.protocol.JudgeEngine` over an OpenAI-compatible chat endpoint.

    Built as ``OpenAIJudgeEngine(config)`` (the registry's signature); ``client`` tunes the
    HTTP client. One ``aiohttp`` session serves the engine from ``start`` to
    ``shutdown``. See the module docstring for the wire, retries and the fingerprint.

    Args:
        config: ``judge_url`` (required, base URL ending in ``/v1``), ``judge_model`` or
            ``model`` (the model name at the endpoint), ``judge_api_key_env``,
            ``judge_max_tokens``, ``judge_thinking``, ``protocol``, ``compat``; ``served_model_name`` names the
            model in ``ModelInfo`` (default: the endpoint's model name).
        client: concurrency, timeouts and retries (:class:`OpenAIClientConfig`).
        sleep: how the engine waits between attempts (``asyncio.sleep``; tests pass a recorder).

    Raises:
        ValueError: ``config.judge_url`` is unset.
    """

    kind = ENGINE_NAME

    def __init__(
        self,
        config: EngineConfig,
        client: OpenAIClientConfig | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not config.judge_url:
            raise ValueError("judge_url: the OpenAI judge engine needs --judge-url URL (base URL ending in /v1)")
        self.config = config
        self.client = client or OpenAIClientConfig()
        self.url = config.judge_url.rstrip("/")
        self.model = config.judge_model or config.model
        self.max_tokens = config.judge_max_tokens
        self.sampling = JudgeSampling(max_tokens=int(config.judge_max_tokens))
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self._semaphore = asyncio.Semaphore(self.client.max_concurrency)
        self._info: ModelInfo | None = None
        self._closing = False
        self._key: str | None = None
        self._auth: dict[str, str] = {}
        self.start_time_s: float | None = None

    def __repr__(self) -> str:  # never shows the API key
        return f"OpenAIJudgeEngine(url={self.url!r}, model={self.model!r})"

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> LoadedModel:
        """Open the session, check the model is listed at ``{judge_url}/models`` and describe it.

        Returns:
            ``LoadedModel(info)`` with ``info.kind == "judge"``, ``engine == "openai"``,
            ``max_model_len`` the server's (or ``config.max_model_len``, or 0 = unknown),
            ``judge_sampling`` (:attr:`sampling`) and ``judge_engine`` (``openai``, the probe
            reply's model id, batch invariance unknown), no renderer and no checkpoint folder.
            A second call returns the same record.

        Raises:
            EngineNotReady: the engine was shut down.
            ServerFault: the endpoint cannot be reached (names the URL and ``--judge-url``),
                refuses the key (names the environment variable and ``--judge-api-key-env``,
                not the key), answers something other than a model list, does not list the
                model (names ``judge_url``, ``judge_model``, ``--judge-model`` and the models it
                lists), or refuses the probe call (:meth:`_probe`).
        """
        if self._closing:
            raise EngineNotReady("the OpenAI judge engine is shut down")
        if self._info is not None:
            return LoadedModel(info=self._info)
        began = time.monotonic()
        self._key = os.environ.get(self.config.judge_api_key_env) or None
        self._auth = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        try:
            return self._started(await self._describe(), began)
        except BaseException:
            session, self._session = self._session, None
            if session is not None:
                await session.close()
            raise

    async def _describe(self) -> ModelInfo:
        """Open the session, read the listing and build the model's info (see :meth:`start`)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.client.timeout(), connector=aiohttp.TCPConnector(limit=self.client.max_concurrency)
            )
        listing_url = f"{self.url}/models"
        try:
            async with self._session.get(listing_url, headers=self._auth) as reply:
                body = await reply.text()
                status = reply.status
                date = reply.headers.get("Date")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ServerFault(
                f"judge_url: cannot reach the judge endpoint {listing_url}: {type(exc).__name__}: {exc}; check "
                f"{URL_FIX}",
                field="judge_url",
            ) from exc
        if status in (401, 403):
            raise ServerFault(
                f"judge_url: {listing_url} refused the API key (HTTP {status}); {self._key_fix()}: "
                f"{_error_text(body, self._key)}",
                field="judge_api_key_env",
            )
        if status != 200:
            raise ServerFault(
                f"judge_url: {listing_url} answered HTTP {status} (check {URL_FIX}): {_error_text(body, self._key)}",
                field="judge_url",
            )
        entries = _model_entries(body)
        if entries is None:
            raise ServerFault(
                f"judge_url: {listing_url} did not answer an OpenAI model list ({{'data': [{{'id': …}}]}}; check "
                f"{URL_FIX}): {_error_text(body, self._key)}",
                field="judge_url",
            )
        entry = next((e for e in entries if e.get("id") == self.model), None)
        if entry is None:
            listed = ", ".join(repr(e.get("id")) for e in entries) or "no model"
            raise ServerFault(
                f"judge_model: {self.model!r} is not served at judge_url {self.url} (it lists {listed}); "
                "pass --judge-model with one of these",
                field="judge_model",
                value=self.model,
                limit=tuple(e.get("id") for e in entries),
            )
        reported = entry.get("max_model_len")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
            max_model_len = reported
        else:
            max_model_len = self.config.max_model_len or 0
        listing_time = None
        if date:
            try:
                listing_time = email.utils.parsedate_to_datetime(date).timestamp()
            except (TypeError, ValueError, IndexError):
                listing_time = None
        settings = {
            "protocol": self.config.protocol,
            "compat": self.config.compat,
            "judge_max_tokens": self.config.judge_max_tokens,
            "judge_seed": self.config.judge_seed,
            "judge_system_prompt": self.config.judge_system_prompt,
        }
        if self.config.judge_thinking is not None:
            settings["judge_thinking"] = self.config.judge_thinking
        fingerprint = endpoint_fingerprint(
            self.url, self.model, entry, settings, listing_time=listing_time if listing_time is not None else time.time()
        )
        answered = await self._probe()
        root = entry.get("root")
        version = answered if not isinstance(root, str) or root in ("", answered) else f"{answered} (root {root})"
        return ModelInfo(
            name=self.config.served_model_name or self.model,
            max_model_len=max_model_len,
            dtype=REMOTE_DTYPE,
            fingerprint=fingerprint,
            engine=ENGINE_NAME,
            kind=JUDGE_KIND,
            mode=self.config.protocol,
            compat=self.config.compat,
            judge_sampling=self.sampling,
            judge_engine=JudgeEngineInfo(ENGINE_NAME, version, None, REMOTE_BATCH_INVARIANCE),
        )

    def _key_fix(self) -> str:
        """How to give the endpoint a valid key (names the variable, never the key)."""
        return (
            f"set the environment variable {self.config.judge_api_key_env} to a valid key, or name the variable "
            "that holds one with --judge-api-key-env"
        )

    async def _probe(self) -> str:
        """The start-up probe call: the first probe conversation
        (:func:`~rmserve.server.kinds.judge_probe.probe_calls`: the one with a system message
        when the settings send one) with ``max_tokens`` 1 (429, 5xx and connection errors
        retried with the backoff of every call, :meth:`_probe_post`).

        Returns:
            The ``model`` the reply names (the listed name when it names none).

        Raises:
            ServerFault: the endpoint refuses it: a 400 to the system message when the same call
                with the instructions in the user turn (sent as a second probe) is accepted →
                field ``judge_system_prompt``, naming ``--no-judge-system-prompt``; 401/403 →
                ``judge_api_key_env`` (:meth:`_key_fix`); 404 → ``judge_model``, naming
                ``--judge-model``; any other refusal, or no reply after the retries →
                ``judge_url`` with the status and the endpoint's reason.
        """
        call = probe_calls(JudgeSettings.from_engine_config(self.config))[0]
        status, text = await self._probe_post(call.messages, PROBE_REQUEST_ID)
        if status == 200:
            return _reply_model(text) or self.model
        detail = f"HTTP {status}: {_error_text(text, self._key)}" if status is not None else text
        if status == 400 and call.merged is not None:
            merged_status, _ = await self._probe_post(call.merged, f"{PROBE_REQUEST_ID}-1")
            if merged_status == 200:
                raise system_role_refused(f"the judge endpoint {self.url} (model {self.model!r})", call.protocol, detail)
        raise self._probe_refused(call, status, detail)

    def _probe_refused(self, call: ProbeCall, status: int | None, detail: str) -> ServerFault:
        """The start-up error of a refused probe call (see :meth:`_probe`)."""
        where = f"{self.url}/chat/completions"
        what = f"the judge's {call.protocol} call (roles {call.roles}, max_tokens 1)"
        if status is None:
            return ServerFault(f"judge_url: cannot reach {where} for {what}: {detail}; check {URL_FIX}", field="judge_url")
        if status in (401, 403):
            return ServerFault(
                f"judge_api_key_env: {where} refused {what} (HTTP {status}) although it listed the models; "
                f"{self._key_fix()}: {detail}",
                field="judge_api_key_env",
            )
        if status == 404:
            return ServerFault(
                f"judge_model: {where} does not serve model {self.model!r} for {what} ({detail}); pass --judge-model "
                "with a model the endpoint serves",
                field="judge_model",
                value=self.model,
            )
        return ServerFault(
            f"judge_url: {where} refused {what} ({detail}); every call of this judge would be refused so: check "
            f"--judge-model, {URL_FIX}",
            field="judge_url",
        )

    async def _probe_post(self, messages: Sequence[Message], request_id: str) -> tuple[int | None, str]:
        """POST one probe call (``max_tokens`` 1): ``(status, body)`` of the first reply that is
        not 429 or 5xx, else of the last attempt, or ``(None, reason)`` when no reply came; at
        most ``client.max_attempts`` attempts, waiting the backoff of every call between them
        (a ``Retry-After``, capped at ``client.max_retry_wait_s``, when the reply gives one)."""
        assert self._session is not None
        url = f"{self.url}/chat/completions"
        body = {**self._body(messages), "max_tokens": 1}
        headers = {**self._auth, "X-Request-Id": request_id}
        status: int | None = None
        text = ""
        for attempt in range(1, self.client.max_attempts + 1):
            retry_after = None
            try:
                async with self._session.post(url, json=body, headers=headers) as reply:
                    status, text = reply.status, await reply.text()
                    retry_after = retry_after_seconds(reply.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                status, text = None, f"{type(exc).__name__}: {exc}"
            if status is not None and status not in _RETRY_STATUSES:
                return status, text
            if attempt < self.client.max_attempts:
                wait = min(self.client.backoff_s * 2 ** (attempt - 1), self.client.max_backoff_s)
                await self._sleep(min(retry_after, self.client.max_retry_wait_s) if retry_after is not None else wait)
        return status, text

    def _started(self, info: ModelInfo, began: float) -> LoadedModel:
        self._info = info
        self.start_time_s = time.monotonic() - began
        logger.info(
            "OpenAI judge endpoint %s serves %r (max_model_len %s), checked in %.2f s",
            self.url, self.model, info.max_model_len or "unknown", self.start_time_s,
        )
        return LoadedModel(info=info)

    def info(self) -> ModelInfo:
        """What ``start`` found.

        Raises:
            EngineNotReady: not started, or shut down.
        """
        if self._closing:
            raise EngineNotReady("the OpenAI judge engine is shut down")
        if self._info is None:
            raise EngineNotReady("the OpenAI judge engine is not started")
        return self._info

    async def shutdown(self) -> None:
        """Close the HTTP session; calls still in flight fail with ``EngineNotReady``. Idempotent."""
        self._closing = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # --- judging ------------------------------------------------------------------------

    async def judge_group(
        self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0
    ) -> list[JudgeOutput]:
        """One chat completion per call, the calls of the group sent concurrently.

        ``priority`` is accepted and ignored (an OpenAI-compatible endpoint has no such field).

        Args:
            calls: per call, the chat messages (role, content) to send.
            request_id: prefix of the ``X-Request-Id`` header of each call (``{request_id}-{i}``).

        Returns:
            One :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput` per call, in order:
            ``choices[0].message.content`` (``""`` when null), ``usage.prompt_tokens``,
            ``usage.completion_tokens``, ``choices[0].finish_reason``,
            ``usage.prompt_tokens_details.cached_tokens`` (0 when the endpoint omits it) and
            the reasoning returned apart (``reasoning_content`` or ``reasoning``, else None).

        Raises:
            InvalidRequest: no calls, or a call with no message (field ``calls[i]``).
            SequenceTooLong: the endpoint says call ``i``'s prompt does not fit the model's
                context (field ``messages``, limit the max length when known); the other
                calls of the group are cancelled.
            EngineNotReady: not started, or shut down.
            EngineError: a call failed after the retries, or was refused, or the reply lacks
                a field above (names the URL and the last status).
        """
        self.info()
        if not calls:
            raise InvalidRequest("calls: a judge group needs at least one call", field="calls", value=0, limit=1)
        for i, call in enumerate(calls):
            if not call:
                raise InvalidRequest(f"calls[{i}] has no message", field=f"calls[{i}]", value=0, limit=1)
        return await gather_or_abort([self._call(i, call, f"{request_id}-{i}") for i, call in enumerate(calls)])

    def _body(self, messages: Sequence[Message]) -> dict[str, Any]:
        sampling = self.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": _number(sampling.temperature),
            "top_p": _number(sampling.top_p),
            "max_tokens": sampling.max_tokens,
            "n": 1,
        }
        if self.config.judge_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.config.judge_thinking == "on"}
        return body

    async def _call(self, index: int, messages: Sequence[Message], request_id: str) -> JudgeOutput:
        url = f"{self.url}/chat/completions"
        body = self._body(messages)
        last: RemoteCallError | None = None
        for attempt in range(1, self.client.max_attempts + 1):
            try:
                async with self._semaphore:
                    return await self._attempt(index, url, body, request_id)
            except RemoteCallError as exc:
                last = exc
            if attempt == self.client.max_attempts:
                break
            wait = min(self.client.backoff_s * 2 ** (attempt - 1), self.client.max_backoff_s)
            if last.retry_after_s is not None:
                if last.retry_after_s > self.client.max_retry_wait_s:
                    raise EngineError(
                        f"judge endpoint {url}: call {index} got HTTP {last.status} asking to retry after "
                        f"{last.retry_after_s:.0f} s, over the {self.client.max_retry_wait_s:.0f} s limit: {last.detail}"
                    )
                wait = last.retry_after_s
            logger.warning(
                "judge endpoint %s: call %s attempt %d/%d failed (%s); retrying in %.2f s",
                url, request_id, attempt, self.client.max_attempts, last.detail, wait,
            )
            await self._sleep(wait)
        assert last is not None
        status = f"HTTP {last.status}" if last.status is not None else "no reply"
        raise EngineError(
            f"judge endpoint {url}: call {index} failed after {self.client.max_attempts} attempts; "
            f"last: {status}: {last.detail}"
        )

    async def _attempt(self, index: int, url: str, body: dict[str, Any], request_id: str) -> JudgeOutput:
        session = self._session
        if session is None or self._closing:
            raise EngineNotReady("the OpenAI judge engine is shut down")
        headers = {**self._auth, "X-Request-Id": request_id}
        try:
            async with session.post(url, json=body, headers=headers) as reply:
                text = await reply.text()
                status = reply.status
                retry_after = retry_after_seconds(reply.headers.get("Retry-After"))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            if self._closing:
                raise EngineNotReady("the OpenAI judge engine is shut down") from exc
            raise RemoteCallError(None, f"{type(exc).__name__}: {exc}") from exc
        if status == 200:
            return _judge_output(url, index, text)
        if is_too_long(status, text):
            limit = self._info.max_model_len if self._info and self._info.max_model_len else None
            found = _CONTEXT_LIMIT.search(text)
            if found:
                limit = int(found.group(1))
            value = _PROMPT_TOKENS.search(text)
            raise SequenceTooLong(
                f"messages: judge call {index}'s prompt does not fit the judge model's context"
                f"{f' of {limit} tokens' if limit else ''} with room for one generated token "
                f"({url} answered HTTP {status}: {_error_text(text, self._key)})",
                field="messages",
                value=int(value.group(1)) if value else None,
                limit=limit,
            )
        if status in _RETRY_STATUSES:
            raise RemoteCallError(status, _error_text(text, self._key), retry_after)
        raise EngineError(f"judge endpoint {url}: call {index} refused with HTTP {status}: {_error_text(text, self._key)}")


URL_FIX = "--judge-url (the endpoint's base URL, ending in /v1) and that the server is up"
"""The option named when the endpoint cannot be reached or does not answer as one."""


def _number(value: float) -> int | float:
    """A sampling value as the request body writes it: whole numbers as integers (``0``, ``1``)."""
    return int(value) if float(value).is_integer() else float(value)


def _reply_model(body: str) -> str | None:
    """The ``model`` a chat-completion reply names, or None when it names none."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) and model else None


def _model_entries(body: str) -> list[dict[str, Any]] | None:
    """The ``data`` entries of a model list body; None when it is not one."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        return None
    return data


def _judge_output(url: str, index: int, text: str) -> JudgeOutput:
    """The :class:`JudgeOutput` of one chat-completion reply body.

    ``message.content`` null (a reasoning model cut at ``max_tokens`` before it answered) is
    the text ``""``; ``message.reasoning_content`` (vLLM, DeepSeek) or ``message.reasoning``
    (newer vLLM, OpenRouter), when a string, is the reasoning.

    Raises:
        EngineError: the body is not JSON, or ``choices[0].message.content`` is neither a
            string nor null, or a reasoning field is neither, or it lacks
            ``choices[0].finish_reason``, ``usage.prompt_tokens`` or ``usage.completion_tokens``
            (names the URL, the call and the field).
    """
    def bad(field: str) -> EngineError:
        return EngineError(f"judge endpoint {url}: call {index}'s reply has no valid {field}: {_error_text(text)}")

    try:
        reply = json.loads(text)
    except ValueError as exc:
        raise bad("JSON body") from exc
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise bad("choices[0].message")
    content = message.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        raise bad("choices[0].message.content")
    reasoning = None
    for name in _REASONING_FIELDS:
        value = message.get(name)
        if value is not None and not isinstance(value, str):
            raise bad(f"choices[0].message.{name}")
        if reasoning is None:
            reasoning = value
    finish = choices[0].get("finish_reason")
    if not isinstance(finish, str):
        raise bad("choices[0].finish_reason")
    usage = reply.get("usage")
    if not isinstance(usage, dict):
        raise bad("usage")
    counts = {}
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"usage.{name}")
        counts[name] = value
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = 0
    elif isinstance(cached, bool) or not isinstance(cached, int) or cached < 0:
        raise bad("usage.prompt_tokens_details.cached_tokens")
    return JudgeOutput(
        text=content,
        prompt_tokens=counts["prompt_tokens"],
        completion_tokens=counts["completion_tokens"],
        finish_reason=finish,
        cached_tokens=cached,
        reasoning=reasoning,
    )
