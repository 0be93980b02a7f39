"""JSON bytes ↔ schema records for the HTTP layer.

The only place the server turns request bodies into records and records into reply bodies.
Decoding is strict (msgspec: no coercion, unknown fields rejected); every problem becomes an
:class:`~rmserve.errors.InvalidRequest` whose ``field`` is the path of the offending value
in the request, e.g. ``groups[2].responses`` or ``groups[0].messages[1].content``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rmserve import __version__
from rmserve.errors import InvalidRequest, RMServeError, field_path, validation_reason
from rmserve.schema import (
    ErrorBody,
    ErrorDetail,
    HealthReply,
    HealthStatus,
    LoadModelRequest,
    ReleaseModelRequest,
    LoadModelResponse,
    ModelInfo,
    ModelList,
    RequestGroup,
    ScoreRequest,
    ScoreResponse,
    Truncation,
)

MIN_TRUNCATION_TOKENS = 2
"""Smallest ``truncation.max_tokens`` accepted (a scored sequence needs at least 2 tokens)."""

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(ScoreRequest)
_load_decoder = msgspec.json.Decoder(LoadModelRequest)
_release_decoder = msgspec.json.Decoder(ReleaseModelRequest)


def _validation_error(exc: msgspec.ValidationError) -> InvalidRequest:
    """Map a msgspec validation error to :class:`InvalidRequest` with a dotted field path."""
    field = field_path(exc)
    where = f" at {field}" if field else " at the top level"
    return InvalidRequest(f"invalid request body: {validation_reason(exc)}{where}", field=field)


def _decode_body(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """``body`` decoded by ``decoder`` into its record type.

    Raises:
        InvalidRequest: a schema violation (``field`` is the offending value's path) or
            malformed JSON (``field`` None).
    """
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


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
    request: ScoreRequest = _decode_body(_request_decoder, body)
    validate_score_request(request, max_model_len=max_model_len)
    return request


def validate_score_request(request: ScoreRequest, *, max_model_len: int) -> None:
    """Check the rules a type cannot express; see :func:`decode_score_request`.

    The one owner of the request rules: the renderer trusts a request that passed here, and
    its entry points for groups that did not come through a request body call
    :func:`check_request_group` and :func:`check_truncation` themselves.

    Raises:
        InvalidRequest: naming the first offending field and, where one applies, the limit.
    """
    if not request.groups:
        raise InvalidRequest("groups must hold at least one group", field="groups", value=0, limit=1)
    seen: dict[str, int] = {}
    for gi, group in enumerate(request.groups):
        first = seen.setdefault(group.id, gi) if group.id else gi
        if first != gi:
            raise InvalidRequest(
                f"groups[{gi}].id {group.id!r} repeats groups[{first}].id; ids must be unique within a request",
                field=f"groups[{gi}].id",
                value=group.id,
            )
        check_request_group(group, gi)
    check_truncation(request.truncation, max_model_len=max_model_len)


def check_request_group(group: RequestGroup, index: int) -> None:
    """Check one group on its own: a non-empty id; exactly one of ``messages`` / ``prompt``;
    ``messages`` non-empty, every role non-empty and the last one ``user``; at least one
    response.

    Args:
        group: the group.
        index: its position in the request; error fields read ``groups[index]…``.

    Raises:
        InvalidRequest: naming the offending field (and the group id), with ``limit`` 1 for
            an empty ``messages`` or ``responses``.
    """
    where = f"groups[{index}]"
    if not group.id:
        raise InvalidRequest(f"{where}.id must be a non-empty string", field=f"{where}.id")
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


def check_truncation(truncation: Truncation | None, *, max_model_len: int) -> None:
    """Check ``MIN_TRUNCATION_TOKENS ≤ truncation.max_tokens ≤ max_model_len`` (None passes).

    Raises:
        InvalidRequest: field ``truncation.max_tokens``; ``limit`` is the bound that was
            crossed (``MIN_TRUNCATION_TOKENS`` below, ``max_model_len`` above) and the
            message names both.
    """
    if truncation is None or MIN_TRUNCATION_TOKENS <= truncation.max_tokens <= max_model_len:
        return
    crossed = MIN_TRUNCATION_TOKENS if truncation.max_tokens < MIN_TRUNCATION_TOKENS else max_model_len
    raise InvalidRequest(
        f"truncation.max_tokens is {truncation.max_tokens}; it must be between "
        f"{MIN_TRUNCATION_TOKENS} and the model's max length {max_model_len}",
        field="truncation.max_tokens",
        value=truncation.max_tokens,
        limit=crossed,
    )


def decode_load_request(body: bytes) -> LoadModelRequest:
    """Decode and validate a ``POST /v1/models/load`` body.

    Raises:
        InvalidRequest: malformed JSON, a missing/unknown field, or an empty ``name`` /
            ``path`` (the field is named).
    """
    request: LoadModelRequest = _decode_body(_load_decoder, body)
    for name in ("name", "path"):
        if not getattr(request, name).strip():
            raise InvalidRequest(f"{name} must be a non-empty string", field=name)
    return request


def decode_release_request(body: bytes) -> ReleaseModelRequest:
    """Decode and validate a ``POST /v1/models/release`` body.

    Raises:
        InvalidRequest: malformed JSON, a missing/unknown field, or an empty ``name``.
    """
    request: ReleaseModelRequest = _decode_body(_release_decoder, body)
    if not request.name.strip():
        raise InvalidRequest("name must be a non-empty string", field="name")
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


def encode_health(status: HealthStatus) -> bytes:
    """Serialise the ``GET /health`` reply, a :class:`~rmserve.schema.HealthReply`:
    ``{"status": …, "version": <rmserve version>}``."""
    return _encoder.encode(HealthReply(status=status, version=__version__))


def encode_error(exc: RMServeError) -> bytes:
    """Serialise an error reply, :meth:`RMServeError.to_wire`'s
    :class:`~rmserve.schema.ErrorBody`: ``{"error": {"type", "message", "field"}}``."""
    return _encoder.encode(exc.to_wire())


def encode_error_fields(type_: str, message: str, field: str | None = None) -> bytes:
    """Serialise an error reply (:class:`~rmserve.schema.ErrorBody`) for an HTTP-level fault
    that has no rmserve error class (unknown path, wrong method)."""
    return _encoder.encode(ErrorBody(error=ErrorDetail(type=type_, message=message, field=field)))
