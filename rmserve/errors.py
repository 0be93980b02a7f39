"""Error types shared by loaders, metrics, server and client.

Every error carries a stable ``type`` string and, for client faults, the offending
``field`` (a dotted/indexed path such as ``groups[3].responses[1]``), ``value`` and
``limit``. The server maps ``status`` to HTTP with one middleware
(``{"error": {"type", "message", "field"}}``); the client maps the status and ``type`` back
to these same classes (:func:`from_wire`). Loader and metric input errors
(:class:`DataError`) additionally name the file and the record/line.
"""

from __future__ import annotations

from typing import Any


class RMServeError(Exception):
    """Base of every rmserve error. ``status`` is the HTTP status it maps to."""

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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        self.limit = limit

    def to_wire(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": {"type", "message", "field"}}``."""
        return {"error": {"type": self.type, "message": self.message, "field": self.field}}


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


def from_wire(status: int, body: Any) -> RMServeError:
    """Rebuild the error a server reply describes.

    ``body`` is the decoded JSON (or anything else when the reply was not JSON). The class is
    chosen by ``error.type`` when known, else by status: 429/503 → retryable, other 4xx →
    :class:`ClientFault`, 5xx → :class:`ServerFault`.
    """
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        type_ = str(err.get("type", ""))
        message = str(err.get("message", ""))
        field = err.get("field")
    else:
        type_, message, field = "", f"HTTP {status}: {str(body)[:200]}", None
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
    exc = cls(message or f"HTTP {status}", field=field)
    exc.status = status
    return exc
