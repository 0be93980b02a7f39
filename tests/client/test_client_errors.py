"""The status + error.type → error class table of the client, one case per row, no network."""

from __future__ import annotations

import email.utils

import msgspec
import pytest
from rmserve.client.client import error_from_reply, parse_retry_after

from rmserve import errors


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
    assert "Bad Gateway" in exc.message and "502" in exc.message
    exc = error_from_reply(503, b"")
    assert type(exc) is errors.EngineNotReady and exc.retryable


def test_retry_after_header_is_attached_in_seconds():
    exc = error_from_reply(429, _body("overloaded"), retry_after="7")
    assert exc.retry_after_s == 7.0


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
