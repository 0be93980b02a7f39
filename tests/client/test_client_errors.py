"""The status + error.type → error class table of the client, one case per row, no network."""

from __future__ import annotations

import email.utils

import msgspec
import pytest
from rmserve.client.errors import error_from_reply, parse_retry_after

from rmserve import errors
from rmserve.schema import ErrorBody, ErrorDetail, encode


def _body(type_: str, message: str = "msg", field: str | None = None) -> bytes:
    return msgspec.json.encode({"error": {"type": type_, "message": message, "field": field}})


# (status, error.type, expected class, retryable) — the server's table read backwards.
ROWS = [
    (400, "invalid_request", errors.InvalidRequest, False),
    (401, "unauthorized", errors.Unauthorized, False),
    (403, "forbidden", errors.Forbidden, False),
    (409, "conflict", errors.Conflict, False),
    (404, "model_not_found", errors.ModelNotFound, False),
    (413, "sequence_too_long", errors.SequenceTooLong, False),
    (413, "body_too_large", errors.BodyTooLarge, False),
    (503, "engine_not_ready", errors.EngineNotReady, True),
    (429, "overloaded", errors.Overloaded, True),
    (500, "engine_error", errors.EngineError, False),
    (500, "internal_error", errors.ServerFault, False),
    # Types the client does not know: the status decides.
    (429, "something_new", errors.Overloaded, True),
    (503, "something_new", errors.EngineNotReady, True),
    (404, "not_found", errors.ClientFault, False),
    (405, "method_not_allowed", errors.ClientFault, False),
    (502, "bad_gateway", errors.ServerFault, False),
]


@pytest.mark.parametrize(("status", "type_", "cls", "retryable"), ROWS, ids=[f"{r[0]}-{r[1]}" for r in ROWS])
def test_status_and_type_map_to_class(status, type_, cls, retryable):
    exc = error_from_reply(status, _body(type_, "the message", "groups[2].responses"))
    assert type(exc) is cls
    assert exc.status == status
    assert exc.retryable is retryable
    assert exc.message == "the message"
    assert exc.field == "groups[2].responses"
    assert exc.retry_after_s is None


def test_non_json_body_maps_by_status_and_keeps_text():
    exc = error_from_reply(502, b"<html>Bad Gateway</html>")
    assert type(exc) is errors.ServerFault
    assert exc.message == "HTTP 502: <html>Bad Gateway</html>"
    exc = error_from_reply(503, b"")
    assert type(exc) is errors.EngineNotReady and exc.retryable
    assert exc.message == "HTTP 503 with an empty body"


def test_long_foreign_body_is_cut_and_its_length_named():
    page = b"<html>" + b"x" * 494 + b"</html>"  # 507 characters
    exc = error_from_reply(500, page)
    assert exc.message == "HTTP 500: <html>" + "x" * 194 + "… (body cut, 507 characters)"
    assert errors.FOREIGN_BODY_CHARS == 200


@pytest.mark.parametrize(
    ("status", "body", "cls", "message"),
    [
        # JSON, but not an rmserve error body: the status decides and the body is quoted.
        (502, b'{"error": "upstream down"}', errors.ServerFault, 'HTTP 502: {"error": "upstream down"}'),
        (400, b'{"detail": "bad"}', errors.ClientFault, 'HTTP 400: {"detail": "bad"}'),
        # An error body without message or field still picks the class by type.
        (413, b'{"error": {"type": "sequence_too_long"}}', errors.SequenceTooLong, "HTTP 413"),
    ],
)
def test_bodies_that_are_not_the_full_record(status, body, cls, message):
    exc = error_from_reply(status, body)
    assert type(exc) is cls
    assert (exc.status, exc.message, exc.field) == (status, message, None)


def test_error_body_record_matches_the_hand_written_shape():
    # _body above writes the wire shape by hand; the record the server encodes must agree.
    exc = errors.SequenceTooLong("too long", field="groups[0].responses[1]")
    assert encode(exc.to_wire()) == _body("sequence_too_long", "too long", "groups[0].responses[1]")
    assert exc.to_wire() == ErrorBody(ErrorDetail("sequence_too_long", "too long", "groups[0].responses[1]"))


def test_retry_after_header_is_attached_in_seconds():
    exc = error_from_reply(429, _body("overloaded"), retry_after="7")
    assert exc.retry_after_s == 7.0
    assert errors.from_wire(503, _body("engine_not_ready"), retry_after_s=2.5).retry_after_s == 2.5


def test_retry_after_is_declared_on_every_error():
    # Errors raised locally carry no server-requested wait.
    assert errors.ConnectionFailed("x").retry_after_s is None
    assert errors.InvalidRequest("x").retry_after_s is None
    assert errors.DataError("x", path="f.jsonl", line=3).retry_after_s is None
    assert errors.Overloaded("x", retry_after_s=4.0).retry_after_s == 4.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("3", 3.0),
        ("0.5", 0.5),
        ("-4", 0.0),
        ("soon", None),
        ("nan", None),
    ],
)
def test_parse_retry_after_seconds(header, expected):
    assert parse_retry_after(header) == expected


def test_parse_retry_after_http_date():
    # An HTTP date 10 s after a fixed "now" (1_000_000 s after the epoch).
    header = email.utils.formatdate(1_000_010, usegmt=True)
    assert parse_retry_after(header, now_s=1_000_000.0) == pytest.approx(10.0)
    assert parse_retry_after(header, now_s=1_000_020.0) == 0.0


def test_client_only_errors_are_typed():
    assert errors.ConnectionFailed("x").retryable is True
    assert isinstance(errors.ConnectionFailed("x"), errors.ServerFault)
    assert errors.FingerprintMismatch("x").retryable is False
