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
from typing import Any

import msgspec

from rmserve.schema import ErrorBody, ErrorDetail


class RMServeError(Exception):
    """Base of every rmserve error. ``status`` is the HTTP status it maps to.

    Attributes:
        message: what went wrong (the exception text).
        field: path of the offending value (``groups[3].responses[1]``), or None.
        value, limit: the offending value and the bound it broke, where one applies (kept
            in the process; only ``type``, ``message`` and ``field`` travel on the wire).
        retry_after_s: for a retryable error read from a server reply, the wait in seconds
            the reply's ``Retry-After`` header asked for; None when it had none, and on
            errors raised locally.
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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        self.limit = limit
        self.retry_after_s = retry_after_s

    def to_wire(self) -> ErrorBody:
        """The error reply's body record: ``{"error": {"type", "message", "field"}}``."""
        return ErrorBody(error=ErrorDetail(type=self.type, message=self.message, field=self.field))


# --- client faults: the request is wrong; retrying the same request cannot succeed -------


class ClientFault(RMServeError):
    """The caller sent something invalid (4xx). Never retried."""

    type = "invalid_request"
    status = 400


class InvalidRequest(ClientFault):
    """Malformed JSON or a schema violation (400)."""


class Unauthorized(ClientFault):
    """Missing or wrong admin token (401)."""

    type = "unauthorized"
    status = 401


class Forbidden(ClientFault):
    """A path or action outside what the server allows (403)."""

    type = "forbidden"
    status = 403


class Conflict(ClientFault):
    """The action conflicts with the server's state (409): another checkpoint swap is in
    progress, or the checkpoint's architecture/tokenizer differs from the loaded model's."""

    type = "conflict"
    status = 409


class InvalidCheckpoint(ClientFault):
    """A checkpoint folder that cannot be served, found from its files before any engine
    touches it (422): unreadable or wrong config (architecture, label count), no tokenizer
    files, no weights or a missing shard."""

    type = "invalid_checkpoint"
    status = 422


class ModelNotFound(ClientFault):
    """The request named a model this server does not serve (404)."""

    type = "model_not_found"
    status = 404


class SequenceTooLong(ClientFault):
    """A tokenized sequence exceeds the model's max length and no truncation was asked (413)."""

    type = "sequence_too_long"
    status = 413


class BodyTooLarge(ClientFault):
    """The request body exceeds the server's size limit (413)."""

    type = "body_too_large"
    status = 413


# --- server faults ----------------------------------------------------------------------


class ServerFault(RMServeError):
    """The server could not do the work (5xx)."""

    type = "internal_error"
    status = 500


class EngineNotReady(ServerFault):
    """The engine is loading, swapping or shutting down (503); retry later."""

    type = "engine_not_ready"
    status = 503
    retryable = True


class Overloaded(ServerFault):
    """Too many requests in flight (429); retry later."""

    type = "overloaded"
    status = 429
    retryable = True


class EngineError(ServerFault):
    """The engine failed on a request (500)."""

    type = "engine_error"


class ConnectionFailed(ServerFault):
    """The client could not reach the server, or a reply did not arrive in time (retryable).

    Raised by the client only (never sent on the wire) once its retries are spent; the
    transport error is chained as ``__cause__``.
    """

    type = "connection_failed"
    status = 503
    retryable = True


class FingerprintMismatch(RMServeError):
    """Stored scores belong to a different model than the server now serves (409).

    Raised by the client when resuming a score file, or when the server's model changes
    during a run. Never retried.
    """

    type = "fingerprint_mismatch"
    status = 409


# --- offline data faults ----------------------------------------------------------------


class GroupNotScored(RMServeError):
    """A group the server answered with a response it could not score, under ``--strict``
    (client-side: the run stops after recording the group). Without ``--strict`` such a group
    is counted as the official code counts it and the run goes on."""

    type = "group_not_scored"
    status = 422


class DataError(RMServeError):
    """A dataset or score file is invalid. The message names file, line or record index, id and field.

    ``line`` is a 1-based line of a text file (JSONL); ``record`` a 0-based index into a list
    of records (JSON array, parquet).
    """

    type = "data_error"
    status = 400

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
        The error, with ``status`` set to the reply's. The class is chosen by
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
