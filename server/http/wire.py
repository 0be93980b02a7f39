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
    ClassifyRequest,
    ClassifyResponse,
    ErrorBody,
    ErrorDetail,
    GetRewardRequest,
    GetRewardResponse,
    HealthReply,
    HealthStatus,
    LoadModelRequest,
    ReleaseModelRequest,
    LoadModelResponse,
    ModelInfo,
    ModelList,
    PoolingRequest,
    PoolingResponse,
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
_classify_decoder = msgspec.json.Decoder(ClassifyRequest)
_pooling_decoder = msgspec.json.Decoder(PoolingRequest)
_get_reward_decoder = msgspec.json.Decoder(GetRewardRequest)


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


def decode_score_request(body: bytes, *, max_model_len: int | None = None) -> ScoreRequest:
    """Decode and validate a ``POST /v1/score`` body.

    Args:
        body: the raw request body (UTF-8 JSON).
        max_model_len: the served model's max sequence length in tokens; bounds
            ``truncation.max_tokens``. None when the model is not chosen yet (the body
            names it): the caller checks that bound with :func:`check_truncation` once it is.

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


def validate_score_request(request: ScoreRequest, *, max_model_len: int | None = None) -> None:
    """Check the rules a type cannot express; see :func:`decode_score_request`.

    The one owner of the request rules: the renderer trusts a request that passed here, and
    its entry points for groups that did not come through a request body call
    :func:`check_request_group` and :func:`check_truncation` themselves.

    Raises:
        InvalidRequest: naming the first offending field and, where one applies, the limit.
            With ``max_model_len`` None, ``truncation`` is not checked here (its message
            names the model's max length): the caller runs :func:`check_truncation` once
            the model is chosen.
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
    if max_model_len is not None:
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


def decode_classify_request(body: bytes) -> ClassifyRequest:
    """Decode and validate a ``POST /classify`` body (vLLM's classification request, text or
    token-id form).

    Returns:
        The :class:`~rmserve.schema.ClassifyRequest`, checked beyond its type by
        :func:`check_pooling_inputs` and :func:`check_pooling_options`.

    Raises:
        InvalidRequest: malformed JSON, an unknown or wrong-typed field (named: vLLM's chat
            form, ``messages``, is one), or a rule below broken.
    """
    request: ClassifyRequest = _decode_body(_classify_decoder, body)
    check_pooling_inputs(request.input)
    check_pooling_options(request)
    return request


def decode_pooling_request(body: bytes) -> PoolingRequest:
    """Decode and validate a ``POST /pooling`` body: :func:`decode_classify_request`'s rules,
    and ``task`` None or ``classify``, ``encoding_format`` ``float``, ``dimensions`` None (the
    only output a one-label sequence classifier has).

    Raises:
        InvalidRequest: naming the field, as :func:`decode_classify_request`.
    """
    request: PoolingRequest = _decode_body(_pooling_decoder, body)
    check_pooling_inputs(request.input)
    check_pooling_options(request)
    if request.task not in (None, "classify"):
        raise InvalidRequest(
            f"task is {request.task!r}; this server's sequence classifier serves only 'classify' (or leave it out)",
            field="task", value=request.task,
        )
    if request.encoding_format != "float":
        raise InvalidRequest(
            f"encoding_format is {request.encoding_format!r}; this server answers only 'float'",
            field="encoding_format", value=request.encoding_format,
        )
    if request.dimensions is not None:
        raise InvalidRequest(
            "dimensions applies to embedding models; a sequence classifier has one value per class: leave it out",
            field="dimensions", value=request.dimensions,
        )
    return request


def check_pooling_inputs(value: str | list) -> list[str] | list[list[int]]:
    """The inputs of a vLLM-compatible request as a list of one kind: texts or token-id lists.

    ``"text"`` → one text; ``["a", "b"]`` → texts; ``[1, 2, 3]`` → one token-id list;
    ``[[1, 2], [3]]`` → token-id lists (vLLM's four forms).

    Raises:
        InvalidRequest: an empty list (field ``input``), a list mixing kinds (field
            ``input[i]``, the first element of another kind than ``input[0]``), an empty
            token-id list or a negative token id (``input[i]`` / ``input[i][j]``).
    """
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequest("input must hold at least one text or token-id list", field="input", value=0, limit=1)
    first = value[0]
    kind = str if isinstance(first, str) else int if isinstance(first, int) else list
    names = {str: "a text", int: "a token id", list: "a token-id list"}
    for i, item in enumerate(value):
        item_kind = str if isinstance(item, str) else int if isinstance(item, int) else list
        if item_kind is not kind:
            raise InvalidRequest(
                f"input[{i}] is {names[item_kind]} but input[0] is {names[kind]}; input is one text, "
                "a list of texts, one token-id list or a list of token-id lists",
                field=f"input[{i}]",
            )
    sequences = [value] if kind is int else value
    if kind is str:
        return list(sequences)
    for i, ids in enumerate(sequences):
        where = "input" if kind is int else f"input[{i}]"
        if not ids:
            raise InvalidRequest(f"{where} is an empty token-id list", field=where, value=0, limit=1)
        for j, token in enumerate(ids):
            if token < 0:
                raise InvalidRequest(f"{where}[{j}] is {token}; token ids are ≥ 0", field=f"{where}[{j}]", value=token)
    return [list(ids) for ids in sequences]


def check_pooling_options(request: ClassifyRequest) -> None:
    """The option rules of a vLLM-compatible request: ``truncate_prompt_tokens`` is ``-1`` or
    ≥ :data:`MIN_TRUNCATION_TOKENS` (its upper bound, the model's max length, is checked once
    the model is chosen: :func:`pooling_truncation`); ``priority`` is 0.

    Raises:
        InvalidRequest: naming the field and the limit.
    """
    cut = request.truncate_prompt_tokens
    if cut is not None and cut != -1 and cut < MIN_TRUNCATION_TOKENS:
        raise InvalidRequest(
            f"truncate_prompt_tokens is {cut}; it must be -1 (the model's max length) or between "
            f"{MIN_TRUNCATION_TOKENS} and the model's max length",
            field="truncate_prompt_tokens", value=cut, limit=MIN_TRUNCATION_TOKENS,
        )
    if request.priority != 0:
        raise InvalidRequest(
            f"priority is {request.priority}; this server orders requests by its fair queue: send the header "
            "X-RMServe-Priority: interactive or batch instead, and leave priority out (or 0)",
            field="priority", value=request.priority,
        )


def pooling_truncation(request: ClassifyRequest, *, max_model_len: int, default_side: str) -> Truncation | None:
    """The :class:`~rmserve.schema.Truncation` a vLLM-compatible request asks for: None without
    ``truncate_prompt_tokens``; ``-1`` keeps ``max_model_len`` tokens; the side is
    ``truncation_side``, else ``default_side`` (the tokenizer's).

    Raises:
        InvalidRequest: ``truncate_prompt_tokens`` over ``max_model_len`` (field
            ``truncate_prompt_tokens``, limit ``max_model_len``), as vLLM refuses it.
    """
    cut = request.truncate_prompt_tokens
    if cut is None:
        return None
    if cut > max_model_len:
        raise InvalidRequest(
            f"truncate_prompt_tokens is {cut}; it must be at most the model's max length {max_model_len}",
            field="truncate_prompt_tokens", value=cut, limit=max_model_len,
        )
    side = request.truncation_side or default_side
    return Truncation(side="left" if side == "left" else "right", max_tokens=max_model_len if cut == -1 else cut)


def decode_get_reward_request(body: bytes) -> GetRewardRequest:
    """Decode and validate a ``POST /get_reward`` body (OpenRLHF's remote reward model:
    ``{"query": [text, …], "prompts": [text, …], "labels": […]}``).

    Returns:
        The :class:`~rmserve.schema.GetRewardRequest`: at least one query; ``prompts`` and
        ``labels`` each None or one per query.

    Raises:
        InvalidRequest: malformed JSON, a missing, unknown or wrong-typed field (named: a
            ``query`` that is one text rather than a list is ``query``), an empty ``query``,
            or ``prompts`` / ``labels`` of another length (naming the field and the length).
    """
    request: GetRewardRequest = _decode_body(_get_reward_decoder, body)
    if not request.query:
        raise InvalidRequest("query must hold at least one text", field="query", value=0, limit=1)
    for name in ("prompts", "labels"):
        values = getattr(request, name)
        if values is not None and len(values) != len(request.query):
            raise InvalidRequest(
                f"{name} holds {len(values)} entries for {len(request.query)} queries; send one per query (or leave it out)",
                field=name, value=len(values), limit=len(request.query),
            )
    return request


def encode_get_reward_response(response: GetRewardResponse) -> bytes:
    """Serialise a ``POST /get_reward`` reply."""
    return _encoder.encode(response)


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


def encode_pooling_response(response: ClassifyResponse | PoolingResponse) -> bytes:
    """Serialise a ``POST /classify`` or ``POST /pooling`` reply."""
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
