"""Error types shared by loaders, metrics, server and client.

Every error carries a stable ``type`` string and, for client faults, the offending
``field`` (a dotted/indexed path such as ``groups[3].responses[1]``), ``value`` and
``limit``. The server maps ``status`` to HTTP with one middleware and writes the body
:meth:`RMServeError.to_wire` gives (an :class:`~rmserve.schema.ErrorBody`,
``{"error": {"type", "message", "field"}}``); the client decodes the same record and maps
the status and ``type`` back to these same classes (:func:`from_wire`). Loader and metric
input errors (:class:`DataError`) additionally name the file and the record/line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from rmserve.schema import ErrorBody, ErrorDetail, LimitDetail


class RMServeError(Exception):
    """Base of every rmserve error. ``status`` is the HTTP status it maps to.

    Attributes:
        message: what went wrong (the exception text).
        field: path of the offending value (``groups[3].responses[1]``), or None.
        value, limit: the offending value and the bound it broke, where one applies (kept
            in the process; only ``type``, ``message`` and ``field`` travel on the wire, and
            for :class:`OverLimit` its limit).
        retry_after_s: for a retryable error read from a server reply, the wait in seconds
            the reply's ``Retry-After`` header asked for; None when it had none, and on
            errors raised locally.
        quoted: lines quoted after the message, as they were written (the last lines of a
            server's log, say): ``str(exc)`` is the message and then these, one per line; the
            command line prints the message as its one ``error:`` line and these below it,
            unfolded. Never sent on the wire.
    """

    type: str = "internal_error"
    status: int = 500
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        limit: Any = None,
        retry_after_s: float | None = None,
        quoted: tuple[str, ...] | list[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.quoted = tuple(quoted)

    def __str__(self) -> str:
        """The message, then the :attr:`quoted` lines, one per line."""
        return "\n".join((self.message, *self.quoted))

    def __init_subclass__(
        cls, *, type: str | None = None, status: int | None = None, retryable: bool | None = None, **kwargs: Any
    ) -> None:
        """Set a subclass's ``type``, ``status`` and ``retryable`` from its class keywords
        (``class Forbidden(ClientFault, type="forbidden", status=403)``); one left out is
        inherited."""
        super().__init_subclass__(**kwargs)
        if type is not None:
            cls.type = type
        if status is not None:
            cls.status = status
        if retryable is not None:
            cls.retryable = retryable

    def to_wire(self) -> ErrorBody:
        """The error reply's body record: ``{"error": {"type", "message", "field"}}``."""
        return ErrorBody(error=ErrorDetail(type=self.type, message=self.message, field=self.field))


# --- client faults: the request is wrong; retrying the same request cannot succeed -------


class ClientFault(RMServeError, type="invalid_request", status=400):
    """The caller sent something invalid (4xx). Never retried."""


class InvalidRequest(ClientFault):
    """Malformed JSON or a schema violation (400)."""


class Unauthorized(ClientFault, type="unauthorized", status=401):
    """Missing or wrong admin token (401)."""


class Forbidden(ClientFault, type="forbidden", status=403):
    """A path or action outside what the server allows (403)."""


class Conflict(ClientFault, type="conflict", status=409):
    """The action conflicts with the server's state (409): another checkpoint swap is in
    progress, or the checkpoint's architecture/tokenizer differs from the loaded model's."""


class InvalidCheckpoint(ClientFault, type="invalid_checkpoint", status=422):
    """A checkpoint folder that cannot be served, found from its files before any engine
    touches it (422): unreadable or wrong config (architecture, label count), no tokenizer
    files, no weights or a missing shard."""


class ModelNotFound(ClientFault, type="model_not_found", status=404):
    """The request named a model this server does not serve (404)."""


class SequenceTooLong(ClientFault, type="sequence_too_long", status=413):
    """A tokenized sequence exceeds the model's max length and no truncation was asked (413)."""


class BodyTooLarge(ClientFault, type="body_too_large", status=413):
    """The request body exceeds the server's size limit (413)."""


class OverLimit(ClientFault, type="request_over_limit", status=413):
    """The request alone holds more than one of its user's or the server's limits allows at
    once — more prompt tokens than the user's whole ``tokens_per_minute``, more groups than a
    ``max_inflight_groups`` — so it can never be admitted, however long it waits (413, no
    ``Retry-After``). The fix is smaller requests (fewer groups each) or a larger limit.

    Unlike other errors its limit travels on the wire (``error.limit``, a
    :class:`~rmserve.schema.LimitDetail`), so a client can split the request to fit.

    Args:
        message: names the limit, its value, what the request holds and the fix.
        limit_name: :attr:`~rmserve.schema.LimitDetail.name` (``user.tokens_per_minute`` …).
        unit: ``tokens`` or ``groups``.
        limit: the limit, in ``unit``.
        value: what the request holds, in ``unit``.
        field: the offending field (``groups``).

    A reply without ``error.limit`` (another server) gives ``limit_name`` and ``unit`` None.
    """

    def __init__(
        self,
        message: str,
        *,
        limit_name: str | None = None,
        unit: str | None = None,
        limit: int | None = None,
        value: int | None = None,
        field: str | None = "groups",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, field=field, value=value, limit=limit, retry_after_s=retry_after_s)
        self.limit_name = limit_name
        self.unit = unit

    def to_wire(self) -> ErrorBody:
        """``{"error": {"type", "message", "field", "limit": {"name", "unit", "limit", "requested"}}}``
        (``limit`` left out when the error does not know it)."""
        if self.limit_name is None or self.unit is None or self.limit is None or self.value is None:
            return super().to_wire()
        detail = LimitDetail(name=self.limit_name, unit=self.unit, limit=self.limit, requested=self.value)
        return ErrorBody(error=ErrorDetail(type=self.type, message=self.message, field=self.field, limit=detail))


# --- server faults ----------------------------------------------------------------------


class ServerFault(RMServeError, type="internal_error", status=500):
    """The server could not do the work (5xx)."""


class EngineNotReady(ServerFault, type="engine_not_ready", status=503, retryable=True):
    """The engine is loading, swapping or shutting down (503); retry later."""


class Overloaded(ServerFault, type="overloaded", status=429, retryable=True):
    """Too many requests in flight (429); retry later."""


class EngineError(ServerFault, type="engine_error"):
    """The engine failed on a request (500)."""


class StartRefused(ServerFault, type="start_refused"):
    """A server this command started refused its model or options at start (it exited with
    status 2: :data:`SERVE_REFUSED_EXIT`); the message quotes the server's reason. Raised on the
    client side only (:class:`~rmserve.pipelines.launch.ServerProcess`); a command ends with
    status 2 for it, as for any other bad option."""


SERVE_REFUSED_EXIT = 2
"""``rmserve serve``'s exit status when the engine refused the model or options at start (an
error naming the option: ``field`` set) or a port could not be bound; 1 is any other failure."""


class ConnectionFailed(ServerFault, type="connection_failed", status=503, retryable=True):
    """The client could not reach the server, or a reply did not arrive in time (retryable).

    Raised by the client only (never sent on the wire) once its retries are spent; the
    transport error is chained as ``__cause__``.
    """


class FingerprintMismatch(RMServeError, type="fingerprint_mismatch", status=409):
    """Stored scores belong to a different model than the server now serves (409).

    Raised by the client when resuming a score file, or when the server's model changes
    during a run. Never retried.
    """


# --- offline data faults ----------------------------------------------------------------


class GroupNotScored(RMServeError, type="group_not_scored", status=422):
    """A group the server answered with a response it could not score, under ``--strict``
    (client-side: the run stops after recording the group). Without ``--strict`` such a group
    is counted as the official code counts it and the run goes on."""


class DataError(RMServeError, type="data_error", status=400):
    """A dataset or score file is invalid. The message names file, line or record index, id and field.

    ``line`` is a 1-based line of a text file (JSONL); ``record`` a 0-based index into a list
    of records (JSON array, parquet).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        record: int | None = None,
        record_id: str | None = None,
        field: str | None = None,
        value: Any = None,
        limit: Any = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if record is not None:
            where.append(f"record {record}")
        if record_id is not None:
            where.append(f"id {record_id!r}")
        if field is not None:
            where.append(f"field {field!r}")
        full = f"{': '.join([', '.join(where), message]) if where else message}"
        super().__init__(full, field=field, value=value, limit=limit)
        self.reason = message
        """The message without the location (file, line, record, id, field) in front."""
        self.path = path
        self.line = line
        self.record = record
        self.record_id = record_id


_WIRE_TYPES: dict[str, type[RMServeError]] = {
    cls.type: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        Forbidden,
        Conflict,
        InvalidCheckpoint,
        ModelNotFound,
        SequenceTooLong,
        BodyTooLarge,
        OverLimit,
        EngineNotReady,
        Overloaded,
        EngineError,
        ServerFault,
    )
}


FOREIGN_BODY_CHARS = 200
"""Most characters of a reply body that is not an :class:`~rmserve.schema.ErrorBody` (an
HTML page from a proxy, say) quoted in the error message; a longer body is cut and the
message says how long it was."""


def from_wire(status: int, body: bytes, *, retry_after_s: float | None = None) -> RMServeError:
    """Rebuild the error a non-200 server reply describes.

    Args:
        status: the reply's HTTP status.
        body: the raw reply body; an :class:`~rmserve.schema.ErrorBody` from an rmserve
            server, anything else (an empty or HTML body from a proxy) otherwise.
        retry_after_s: the reply's ``Retry-After`` in seconds, or None; kept on the error.

    Returns:
        The error, with ``status`` set to the reply's (an :class:`OverLimit` also with its
        ``error.limit``). The class is chosen by
        ``error.type`` when the body is an ``ErrorBody`` of a known type, else by status:
        429 → :class:`Overloaded`, 503 → :class:`EngineNotReady` (both retryable), other
        4xx → :class:`ClientFault`, else :class:`ServerFault`. The message and field are the
        body's; a foreign body is quoted in the message (at most ``FOREIGN_BODY_CHARS``
        characters, its full length named when cut).
    """
    try:
        detail: ErrorDetail | None = msgspec.json.decode(body, type=ErrorBody).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        detail = None
    if detail is not None:
        type_, message, field = detail.type, detail.message or f"HTTP {status}", detail.field
    else:
        text = body.decode("utf-8", "replace")
        if not text:
            message = f"HTTP {status} with an empty body"
        elif len(text) > FOREIGN_BODY_CHARS:
            message = f"HTTP {status}: {text[:FOREIGN_BODY_CHARS]}… (body cut, {len(text)} characters)"
        else:
            message = f"HTTP {status}: {text}"
        type_, field = "", None
    cls = _WIRE_TYPES.get(type_)
    if cls is None:
        if status == 429:
            cls = Overloaded
        elif status == 503:
            cls = EngineNotReady
        elif 400 <= status < 500:
            cls = ClientFault
        else:
            cls = ServerFault
    exc = cls(message, field=field, retry_after_s=retry_after_s)
    if isinstance(exc, OverLimit) and detail is not None and detail.limit is not msgspec.UNSET:
        exc.limit_name, exc.unit = detail.limit.name, detail.limit.unit
        exc.limit, exc.value = detail.limit.limit, detail.limit.requested
    exc.status = status
    return exc


# --- msgspec validation messages ---------------------------------------------------------

_MSGSPEC_AT = " - at `$"
_MSGSPEC_NAMED = (
    re.compile(r"^Object missing required field `(?P<name>[^`]+)`$"),
    re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$"),
)


def validation_reason(exc: msgspec.ValidationError) -> str:
    """The message of a msgspec validation error without its trailing location.

    msgspec ends a message with ``" - at `$<path>`"`` when the fault lies below the root
    (``"Expected `float`, got `str` - at `$.rewards[0]`"``); this returns the part before it
    (``"Expected `float`, got `str`"``), or the whole text when there is no location.
    """
    text = plain_reason(str(exc))
    cut = text.rfind(_MSGSPEC_AT)
    return text[:cut] if cut >= 0 and text.endswith("`") else text


_VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic (behind typer's option parsing) puts before the message of a validator that
raised ``ValueError`` or failed an ``assert``."""


def plain_reason(message: str) -> str:
    """A user message without a validation library's prefix: ``"Value error, 'x' is not one
    of …"`` → ``"'x' is not one of …"``. Other messages are returned unchanged."""
    for prefix in _VALIDATOR_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def field_path(exc: msgspec.ValidationError) -> str | None:
    """The path of the offending value of a msgspec validation error, or None at the root.

    The location msgspec appends (``$.groups[2].responses``, ``$[0].score_chosen``,
    ``$[...]`` for a dict value) loses its ``$`` and leading dot; for a missing or unknown
    field the field's name is appended, so ``"Object missing required field `id` - at
    `$.groups[0]`"`` gives ``"groups[0].id"`` and a missing field at the root gives ``"id"``.
    """
    text = str(exc)
    cut = text.rfind(_MSGSPEC_AT)
    path = ""
    if cut >= 0 and text.endswith("`"):
        path = text[cut + len(_MSGSPEC_AT) : -1].lstrip(".")
    reason = validation_reason(exc)
    for pattern in _MSGSPEC_NAMED:
        named = pattern.match(reason)
        if named:
            name = named.group("name")
            path = f"{path}.{name}" if path else name
            break
    return path or None


def name_some(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` of ``items`` for a message, comma-separated, then ``and N more``
    when there are more: ``"a, b, c, d, e and 2 more"``."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
