"""Decoding and validation of ``POST /v1/score`` bodies, and reply encoding (no server)."""

from __future__ import annotations

import orjson
import pytest
from rmserve.server.http import wire

from rmserve import __version__
from rmserve.errors import EngineNotReady, InvalidRequest
from rmserve.schema import (
    ErrorBody,
    ErrorDetail,
    GroupResult,
    HealthReply,
    Message,
    ModelInfo,
    ModelList,
    RequestGroup,
    ScoreRequest,
    ScoreResponse,
    Truncation,
    decode,
)

MAX_LEN = 64


def body(groups, **extra) -> bytes:
    return orjson.dumps({"groups": groups, **extra})


def group(id_="g", *, prompt="hi", responses=("a", "b"), **extra):
    out = {"id": id_, "responses": list(responses), **extra}
    if prompt is not None:
        out["prompt"] = prompt
    return out


def invalid(data: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        wire.decode_score_request(data, max_model_len=MAX_LEN)
    assert info.value.status == 400
    assert info.value.type == "invalid_request"
    return info.value


def test_valid_request_decodes_to_records():
    data = body(
        [
            group("a", prompt="hi", responses=["x", ""]),
            {"id": "b", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
             "responses": ["r"]},
        ],
        model="m",
        truncation={"side": "left", "max_tokens": 8},
    )
    assert wire.decode_score_request(data, max_model_len=MAX_LEN) == ScoreRequest(
        groups=(
            RequestGroup(id="a", responses=("x", ""), prompt="hi"),
            RequestGroup(id="b", responses=("r",), messages=(Message("system", "s"), Message("user", "q"))),
        ),
        model="m",
        truncation=Truncation(side="left", max_tokens=8),
    )


@pytest.mark.parametrize("data", [b"{", b"", b'{"groups": []} x', b"\xff", b"{'groups': []}"])
def test_malformed_json_has_no_field(data):
    err = invalid(data)
    assert err.field is None
    assert "not valid JSON" in err.message


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        (b"[]", None, "Expected `object`, got `array`"),
        (b"{}", "groups", "missing required field `groups`"),
        (body([{"id": "a", "prompt": "p"}]), "groups[0].responses", "missing required field `responses`"),
        (body([group("a"), group("b", responses=["x", 1])]), "groups[1].responses[1]", "Expected `str`, got `int`"),
        (body([group("a", extra_field=1)]), "groups[0].extra_field", "unknown field `extra_field`"),
        (body([group("a")], truncation={"side": "up", "max_tokens": 8}), "truncation.side", "Invalid enum value"),
        (body([group("a", prompt=None, messages=[{"role": "user"}])]), "groups[0].messages[0].content", "missing"),
        (body([group(5)]), "groups[0].id", "Expected `str`, got `int`"),
        (body([group("a")], model=3), "model", "Expected `str | null`, got `int`"),
    ],
)
def test_schema_violation_names_the_field(data, field, fragment):
    err = invalid(data)
    assert err.field == field
    assert fragment in err.message
    assert (field or "top level") in err.message


def test_empty_groups_list():
    err = invalid(body([]))
    assert (err.field, err.limit) == ("groups", 1)


def test_empty_responses_list_names_the_group():
    err = invalid(body([group("a"), group("b"), group("c", responses=[])]))
    assert err.field == "groups[2].responses"
    assert "'c'" in err.message


def test_group_ids_must_be_unique():
    err = invalid(body([group("a"), group("b"), group("a")]))
    assert err.field == "groups[2].id"
    assert "groups[0].id" in err.message


def test_group_id_must_be_non_empty():
    assert invalid(body([group("")])).field == "groups[0].id"


@pytest.mark.parametrize(
    ("extra", "state"),
    [({"prompt": None}, "neither"), ({"messages": [{"role": "user", "content": "q"}]}, "both")],
)
def test_exactly_one_of_messages_or_prompt(extra, state):
    g = group("a")
    g.update(extra)
    if g.get("prompt") is None:
        del g["prompt"]
    err = invalid(body([g]))
    assert err.field == "groups[0].messages"
    assert state in err.message


def test_messages_must_end_with_a_user_turn():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    err = invalid(body([group("a", prompt=None, messages=msgs)]))
    assert err.field == "groups[0].messages[1].role"
    assert "'assistant'" in err.message


def test_messages_must_not_be_empty():
    assert invalid(body([group("a", prompt=None, messages=[])])).field == "groups[0].messages"


def test_role_must_not_be_empty():
    msgs = [{"role": "", "content": "s"}, {"role": "user", "content": "q"}]
    assert invalid(body([group("a", prompt=None, messages=msgs)])).field == "groups[0].messages[0].role"


@pytest.mark.parametrize("max_tokens", [1, MAX_LEN + 1])
def test_truncation_bounds(max_tokens):
    err = invalid(body([group("a")], truncation={"side": "right", "max_tokens": max_tokens}))
    assert err.field == "truncation.max_tokens"
    assert str(MAX_LEN) in err.message


# One row per request rule: the body, then the error's field, value, limit and whole message.
RULES = [
    (body([]), "groups", 0, 1, "groups must hold at least one group"),
    (body([group("")]), "groups[0].id", None, None, "groups[0].id must be a non-empty string"),
    (
        body([group("a"), group("a")]), "groups[1].id", "a", None,
        "groups[1].id 'a' repeats groups[0].id; ids must be unique within a request",
    ),
    (
        body([group("a", prompt=None)]), "groups[0].messages", None, None,
        "groups[0] (id 'a') must have exactly one of 'messages' or 'prompt', got neither",
    ),
    (
        body([group("a", messages=[{"role": "user", "content": "q"}])]), "groups[0].messages", None, None,
        "groups[0] (id 'a') must have exactly one of 'messages' or 'prompt', got both",
    ),
    (
        body([group("a", prompt=None, messages=[])]), "groups[0].messages", 0, 1,
        "groups[0].messages (id 'a') must hold at least one turn",
    ),
    (
        body([group("a", prompt=None, messages=[{"role": "", "content": "q"}])]), "groups[0].messages[0].role",
        None, None, "groups[0].messages[0].role (id 'a') must be a non-empty string",
    ),
    (
        body([group("a", prompt=None, messages=[{"role": "user", "content": "q"}, {"role": "system", "content": "s"}])]),
        "groups[0].messages[1].role", "system", None,
        "groups[0].messages[1].role (id 'a') is 'system'; the last turn must be 'user' (the responses answer it)",
    ),
    (
        body([group("a"), group("b", responses=[])]), "groups[1].responses", 0, 1,
        "groups[1].responses (id 'b') must hold at least one response",
    ),
    (
        body([group("a")], truncation={"side": "left", "max_tokens": 1}), "truncation.max_tokens", 1, 2,
        f"truncation.max_tokens is 1; it must be between 2 and the model's max length {MAX_LEN}",
    ),
    (
        body([group("a")], truncation={"side": "left", "max_tokens": MAX_LEN + 1}), "truncation.max_tokens",
        MAX_LEN + 1, MAX_LEN, f"truncation.max_tokens is {MAX_LEN + 1}; it must be between 2 and the model's max length {MAX_LEN}",
    ),
]


@pytest.mark.parametrize(("data", "field", "value", "limit", "message"), RULES, ids=[r[1] + "-" + str(i) for i, r in enumerate(RULES)])
def test_each_rule_has_one_message_naming_field_and_limit(data, field, value, limit, message):
    err = invalid(data)
    assert (err.field, err.value, err.limit) == (field, value, limit)
    assert err.message == message


def test_group_and_truncation_checks_are_the_request_validation():
    # The checks the renderer runs on loose groups raise exactly what a request body gets.
    bad = RequestGroup(id="q", responses=(), prompt="p")
    with pytest.raises(InvalidRequest) as direct:
        wire.check_request_group(bad, 3)
    assert (direct.value.field, direct.value.message) == (
        "groups[3].responses", "groups[3].responses (id 'q') must hold at least one response"
    )
    with pytest.raises(InvalidRequest) as direct:
        wire.check_truncation(Truncation(side="right", max_tokens=MAX_LEN + 5), max_model_len=MAX_LEN)
    assert (direct.value.value, direct.value.limit) == (MAX_LEN + 5, MAX_LEN)
    wire.check_truncation(None, max_model_len=MAX_LEN)
    wire.check_truncation(Truncation(side="right", max_tokens=2), max_model_len=MAX_LEN)


@pytest.mark.parametrize("max_tokens", [2, MAX_LEN])
def test_truncation_bounds_inclusive(max_tokens):
    request = wire.decode_score_request(
        body([group("a")], truncation={"side": "right", "max_tokens": max_tokens}), max_model_len=MAX_LEN
    )
    assert request.truncation == Truncation(side="right", max_tokens=max_tokens)


def test_score_response_round_trip():
    reply = ScoreResponse(
        model="m",
        fingerprint="fp",
        results=(
            GroupResult(id="a", rewards=(1.5, -0.25), num_tokens=(9, 9), num_cached_tokens=(0, 4)),
            GroupResult(id="b", rewards=(2.0,), num_tokens=(8,), num_cached_tokens=(0,), truncated_tokens=(3,)),
        ),
    )
    data = wire.encode_score_response(reply)
    assert orjson.loads(data)["results"][0] == {
        "id": "a", "rewards": [1.5, -0.25], "num_tokens": [9, 9], "num_cached_tokens": [0, 4],
    }
    assert decode(data, ScoreResponse) == reply


def test_models_and_error_bodies():
    info = ModelInfo(name="m", max_model_len=64, dtype="float32", fingerprint="fp", engine="fake")
    assert decode(wire.encode_models([info]), ModelList) == ModelList(models=(info,))
    err = InvalidRequest("bad", field="groups[0].id")
    assert orjson.loads(wire.encode_error(err)) == {
        "error": {"type": "invalid_request", "message": "bad", "field": "groups[0].id"}
    }
    assert orjson.loads(wire.encode_health("loading")) == {"status": "loading", "version": __version__}


def test_error_and_health_bytes_are_the_records_encoding():
    # The exact bytes (key order, null field) clients have always read.
    assert wire.encode_error(InvalidRequest("bad", field="groups[0].id")) == (
        b'{"error":{"type":"invalid_request","message":"bad","field":"groups[0].id"}}'
    )
    assert wire.encode_error(EngineNotReady("loading; retry later")) == (
        b'{"error":{"type":"engine_not_ready","message":"loading; retry later","field":null}}'
    )
    assert wire.encode_error_fields("not_found", "Not Found: GET /nope") == (
        b'{"error":{"type":"not_found","message":"Not Found: GET /nope","field":null}}'
    )
    assert wire.encode_health("ready") == b'{"status":"ready","version":"' + __version__.encode() + b'"}'
    # ... and they decode through the records the client uses.
    assert decode(wire.encode_error(InvalidRequest("bad", field="f")), ErrorBody) == ErrorBody(
        ErrorDetail(type="invalid_request", message="bad", field="f")
    )
    assert decode(wire.encode_health("restarting"), HealthReply) == HealthReply(status="restarting", version=__version__)


def test_health_reply_of_a_server_without_version_decodes_with_empty_version():
    assert decode(b'{"status":"ready"}', HealthReply) == HealthReply(status="ready", version="")
