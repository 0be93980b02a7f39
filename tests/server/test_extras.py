"""Per-response extras: from the engine's ``SequenceScore.extras`` through the app to the wire.

Numbers follow the fakes (see ``test_app.py``): prompt "hi" with responses "yo" and "ya"
gives ``[1, 4, 104, 105, 2, 5, 121, 111, 2]`` and ``[1, 4, 104, 105, 2, 5, 121, 97, 2]``
(9 tokens each, rewards 4.55 and 4.41, 0 and 4 cached tokens). The extras hook below gives
``logp_sum = -len(ids) / 2`` (-4.5 for both) and ``verdict = chr(ids[-2])`` ("o", "a").
"""

from __future__ import annotations

import msgspec
import pytest
from testkit.app_client import fake_app_client
from testkit.fakes import FakeEngine, FakeRenderer
from rmserve.server.http import wire
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app

from rmserve.schema import GroupResult, ScoreResponse, decode, encode

VALID = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}
PLAIN_REPLY = (
    b'{"model":"fake-rm","fingerprint":"fp-fake-1","results":[{"id":"g0","rewards":[4.55,4.41],'
    b'"num_tokens":[9,9],"num_cached_tokens":[0,4]}]}'
)
"""Today's reply to VALID, byte for byte (no ``extras`` key)."""

EXTRAS_REPLY = (
    b'{"model":"fake-rm","fingerprint":"fp-fake-1","results":[{"id":"g0","rewards":[4.55,4.41],'
    b'"num_tokens":[9,9],"num_cached_tokens":[0,4],"extras":{"logp_sum":[-4.5,-4.5],"verdict":["o","a"]}}]}'
)


def judge_like(ids):
    return {"logp_sum": -len(ids) / 2, "verdict": chr(ids[-2])}


@pytest.fixture
def post(aiohttp_client):
    async def run(engine: FakeEngine, payload=VALID) -> tuple[int, bytes]:
        client = await fake_app_client(aiohttp_client, ServerConfig(port=0), engine)
        async with client.post("/v1/score", json=payload) as resp:
            return resp.status, await resp.read()

    return run


async def test_reply_without_extras_is_byte_identical_to_before(post):
    status, body = await post(FakeEngine())
    assert status == 200
    assert body == PLAIN_REPLY


async def test_engine_extras_reach_the_reply_in_response_order(post):
    status, body = await post(FakeEngine(extras_of=judge_like))
    assert status == 200
    assert body == EXTRAS_REPLY
    (result,) = decode(body, ScoreResponse).results
    assert result.extras == {"logp_sum": (-4.5, -4.5), "verdict": ("o", "a")}


async def test_extras_of_a_group_answered_from_the_result_cache(aiohttp_client):
    engine = FakeEngine(extras_of=judge_like)
    app = create_app(ServerConfig(port=0), engine, FakeRenderer())
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    bodies = []
    for _ in range(2):
        async with client.post("/v1/score", json=VALID) as resp:
            assert resp.status == 200
            bodies.append(await resp.read())
    assert len(engine.calls) == 1  # the second reply came from the cache
    assert bodies[0] == EXTRAS_REPLY
    # the cached answer: the same extras, flagged as coming from the result cache
    assert bodies[1] == EXTRAS_REPLY.replace(b"}]}", b',"from_result_cache":true}]}')


async def test_responses_with_different_extra_names_are_an_engine_error(post):
    engine = FakeEngine(extras_of=lambda ids: {"a": 1} if ids[-2] == ord("o") else {"b": 1})
    status, body = await post(engine)
    assert status == 500
    error = msgspec.json.decode(body)["error"]
    assert error["type"] == "engine_error"
    assert "response 1" in error["message"] and "['a']" in error["message"] and "['b']" in error["message"]


def test_extras_round_trip_on_the_wire_and_are_absent_when_empty():
    with_extras = GroupResult(id="g", rewards=(1.0, -2.0), num_tokens=(3, 4), num_cached_tokens=(0, 0),
                              extras={"logp_policy": (-3.25, None), "judge": ("A", "B"), "tokens": (3, 4)})
    reply = ScoreResponse(model="m", fingerprint="f", results=(with_extras,))
    data = wire.encode_score_response(reply)
    assert b'"extras":{"logp_policy":[-3.25,null],"judge":["A","B"],"tokens":[3,4]}' in data
    assert decode(data, ScoreResponse) == reply

    plain = GroupResult(id="g", rewards=(1.0,), num_tokens=(3,), num_cached_tokens=(0,))
    assert plain.extras is None
    assert encode(plain) == b'{"id":"g","rewards":[1.0],"num_tokens":[3],"num_cached_tokens":[0]}'
    assert decode(encode(plain), GroupResult) == plain


async def test_extras_of_a_response_not_sent_to_the_engine_are_null(post):
    # "x" * 60 renders to 1 + (1 + 2 + 1) + (1 + 60 + 1) = 67 tokens, over the fake model's 64.
    payload = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["x" * 60, "ya"]}]}
    status, body = await post(FakeEngine(extras_of=judge_like), payload)
    assert status == 200
    (result,) = decode(body, ScoreResponse).results
    assert result.rewards == (None, 4.41)
    assert result.extras == {"logp_sum": (None, -4.5), "verdict": (None, "a")}
    assert result.errors[0].type == "sequence_too_long" and result.errors[1] is None
