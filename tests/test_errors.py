"""``field_path`` / ``validation_reason``: the location in a msgspec validation error."""

from __future__ import annotations

import msgspec
import pytest

from rmserve.errors import field_path, validation_reason


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    values: list[float] = []


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    items: list[Inner] = []
    table: dict[str, list[int]] = {}


def error_of(body: bytes, type_=Outer) -> msgspec.ValidationError:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(body, type=type_)
    return info.value


@pytest.mark.parametrize(
    ("body", "path", "reason"),
    [
        (b'{"id": 3}', "id", "Expected `str`, got `int`"),
        (b"{}", "id", "Object missing required field `id`"),
        (b'{"id": "a", "extra": 1}', "extra", "Object contains unknown field `extra`"),
        (b'{"id": "a", "items": [{"name": "x"}, {}]}', "items[1].name", "Object missing required field `name`"),
        (
            b'{"id": "a", "items": [{"name": "x", "values": [1, "2"]}]}',
            "items[0].values[1]",
            "Expected `float`, got `str`",
        ),
        (b'{"id": "a", "items": [{"name": "x", "nope": 0}]}', "items[0].nope", "Object contains unknown field `nope`"),
        (b'{"id": "a", "table": {"k": [1, "x"]}}', "table[...][1]", "Expected `int`, got `str`"),
        (b"[1]", None, "Expected `object`, got `array`"),
    ],
)
def test_field_path_and_reason(body, path, reason):
    exc = error_of(body)
    assert field_path(exc) == path
    assert validation_reason(exc) == reason


def test_a_list_at_the_root_keeps_its_index():
    exc = error_of(b'[{"id": "a"}, {"id": 1}]', list[Outer])
    assert field_path(exc) == "[1].id"
    assert validation_reason(exc) == "Expected `str`, got `int`"


def test_error_classes_keep_their_type_status_and_retryable():
    from rmserve import errors

    table = {
        errors.ClientFault: ("invalid_request", 400, False),
        errors.InvalidRequest: ("invalid_request", 400, False),
        errors.Unauthorized: ("unauthorized", 401, False),
        errors.Forbidden: ("forbidden", 403, False),
        errors.Conflict: ("conflict", 409, False),
        errors.InvalidCheckpoint: ("invalid_checkpoint", 422, False),
        errors.ModelNotFound: ("model_not_found", 404, False),
        errors.SequenceTooLong: ("sequence_too_long", 413, False),
        errors.BodyTooLarge: ("body_too_large", 413, False),
        errors.ServerFault: ("internal_error", 500, False),
        errors.EngineNotReady: ("engine_not_ready", 503, True),
        errors.Overloaded: ("overloaded", 429, True),
        errors.EngineError: ("engine_error", 500, False),
        errors.ConnectionFailed: ("connection_failed", 503, True),
        errors.FingerprintMismatch: ("fingerprint_mismatch", 409, False),
        errors.GroupNotScored: ("group_not_scored", 422, False),
        errors.DataError: ("data_error", 400, False),
    }
    assert {cls: (cls.type, cls.status, cls.retryable) for cls in table} == table


def test_a_subclass_sets_what_its_keywords_give_and_inherits_the_rest():
    from rmserve.errors import EngineNotReady

    class Paused(EngineNotReady, status=409):
        pass

    assert (Paused.type, Paused.status, Paused.retryable) == ("engine_not_ready", 409, True)
    assert (EngineNotReady.type, EngineNotReady.status) == ("engine_not_ready", 503)
