"""JSON bytes ↔ schema records for the HTTP layer.

The only place the server turns request bodies into records and records into reply bodies.
Decoding is strict (msgspec: no coercion, unknown fields rejected); every problem becomes an
:class:`~rmserve.errors.InvalidRequest` whose ``field`` is the path of the offending value
in the request, e.g. ``groups[2].responses`` or ``groups[0].messages[1].content``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rmserve.errors import InvalidRequest, RMServeError, field_path, validation_reason
from rmserve.schema import LoadModelRequest, LoadModelResponse, ModelInfo, ModelList, ScoreRequest, ScoreResponse

MIN_TRUNCATION_TOKENS = 2
"""Smallest ``truncation.max_tokens`` accepted (a scored sequence needs at least 2 tokens)."""

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(ScoreRequest)
_load_decoder = msgspec.json.Decoder(LoadModelRequest)

def _validation_error(exc: msgspec.ValidationError) -> InvalidRequest:
    """Map a msgspec validation error to :class:`InvalidRequest` with a dotted field path."""
    field = field_path(exc)
    where = f" at {field}" if field else " at the top level"
    return InvalidRequest(f"invalid request body: {validation_reason(exc)}{where}", field=field)


def decode_score_request(body: bytes, *, max_model_len: int) -> ScoreRequest:
    """Decode and validate a ``POST /v1/score`` body.

    Args:
        body: the raw request body (UTF-8 JSON).
        max_model_len: the served model's max sequence length in tokens; bounds
            ``truncation.max_tokens``.

    Returns:
        The :class:`~rmserve.schema.ScoreRequest`, checked beyond its type: at least one
        group; group ids non-empty and unique within the request; exactly one of
        ``messages`` / ``prompt`` per group; ``messages`` non-empty with a ``user`` last
        turn; at least one response per group; ``MIN_TRUNCATION_TOKENS ≤
        truncation.max_tokens ≤ max_model_len``.

    Raises:
        InvalidRequest: malformed JSON (``field`` None) or a schema violation (``field`` is
            the path of the offending value).
    """
    try:
        request = _request_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    validate_score_request(request, max_model_len=max_model_len)
    return request


def validate_score_request(request: ScoreRequest, *, max_model_len: int) -> None:
    """Check the rules a type cannot express; see :func:`decode_score_request`.

    Raises:
        InvalidRequest: naming the first offending field and, where one applies, the limit.
    """
    if not request.groups:
        raise InvalidRequest("groups must hold at least one group", field="groups", value=0, limit=1)
    seen: dict[str, int] = {}
    for gi, group in enumerate(request.groups):
        where = f"groups[{gi}]"
        if not group.id:
            raise InvalidRequest(f"{where}.id must be a non-empty string", field=f"{where}.id")
        first = seen.setdefault(group.id, gi)
        if first != gi:
            raise InvalidRequest(
                f"{where}.id {group.id!r} repeats groups[{first}].id; ids must be unique within a request",
                field=f"{where}.id",
                value=group.id,
            )
        has_messages = group.messages is not None
        has_prompt = group.prompt is not None
        if has_messages == has_prompt:
            state = "both" if has_messages else "neither"
            raise InvalidRequest(
                f"{where} (id {group.id!r}) must have exactly one of 'messages' or 'prompt', got {state}",
                field=f"{where}.messages",
            )
        if group.messages is not None:
            if not group.messages:
                raise InvalidRequest(
                    f"{where}.messages (id {group.id!r}) must hold at least one turn",
                    field=f"{where}.messages",
                    value=0,
                    limit=1,
                )
            for mi, message in enumerate(group.messages):
                if not message.role:
                    raise InvalidRequest(
                        f"{where}.messages[{mi}].role (id {group.id!r}) must be a non-empty string",
                        field=f"{where}.messages[{mi}].role",
                    )
            last = len(group.messages) - 1
            if group.messages[last].role != "user":
                raise InvalidRequest(
                    f"{where}.messages[{last}].role (id {group.id!r}) is {group.messages[last].role!r}; "
                    "the last turn must be 'user' (the responses answer it)",
                    field=f"{where}.messages[{last}].role",
                    value=group.messages[last].role,
                )
        if not group.responses:
            raise InvalidRequest(
                f"{where}.responses (id {group.id!r}) must hold at least one response",
                field=f"{where}.responses",
                value=0,
                limit=1,
            )
    truncation = request.truncation
    if truncation is not None and not MIN_TRUNCATION_TOKENS <= truncation.max_tokens <= max_model_len:
        raise InvalidRequest(
            f"truncation.max_tokens is {truncation.max_tokens}; it must be between "
            f"{MIN_TRUNCATION_TOKENS} and the model's max length {max_model_len}",
            field="truncation.max_tokens",
            value=truncation.max_tokens,
            limit=max_model_len,
        )


def decode_load_request(body: bytes) -> LoadModelRequest:
    """Decode and validate a ``POST /v1/models/load`` body.

    Raises:
        InvalidRequest: malformed JSON, a missing/unknown field, or an empty ``name`` /
            ``path`` (the field is named).
    """
    try:
        request = _load_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    for name in ("name", "path"):
        if not getattr(request, name).strip():
            raise InvalidRequest(f"{name} must be a non-empty string", field=name)
    return request


def encode_score_response(response: ScoreResponse) -> bytes:
    """Serialise a ``POST /v1/score`` reply."""
    return _encoder.encode(response)


def encode_models(infos: list[ModelInfo]) -> bytes:
    """Serialise the ``GET /v1/models`` reply: ``{"models": [ModelInfo, …]}``."""
    return _encoder.encode(ModelList(models=tuple(infos)))


def encode_load_response(infos: list[ModelInfo], swap_kind: str) -> bytes:
    """Serialise the ``POST /v1/models/load`` reply: ``{"models": [ModelInfo], "swap_kind": …}``."""
    return _encoder.encode(LoadModelResponse(models=tuple(infos), swap_kind=swap_kind))


def encode_health(status: str) -> bytes:
    """Serialise the ``GET /health`` reply: ``{"status": "ready" | "loading" | "failed" | "stopping" | "restarting"}``."""
    return _encoder.encode({"status": status})


def encode_error(exc: RMServeError) -> bytes:
    """Serialise an error reply: ``{"error": {"type", "message", "field"}}``."""
    return _encoder.encode(exc.to_wire())


def encode_error_fields(type_: str, message: str, field: str | None = None) -> bytes:
    """Serialise an error reply for an HTTP-level fault that has no rmserve error class."""
    body: dict[str, Any] = {"error": {"type": type_, "message": message, "field": field}}
    return _encoder.encode(body)
