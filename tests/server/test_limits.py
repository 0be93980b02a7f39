"""Per-user limits on a real server over the fake engine: groups in flight and prompt tokens per
minute give 429 with Retry-After and a message naming the limit and the user, while another
user is served as usual.

Token counts follow the fakes (see ``tests/server/test_app.py``): the group ``VALID`` (prompt
"hi", responses "yo", "ya") sends 9 + 9 = 18 tokens to the engine.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from testkit.app_client import fake_app_client, metric_samples, wait_until
from testkit.fakes import FakeEngine

from rmserve.server.http.app import ServerConfig
from rmserve.server.sharing.auth import add_user

VALID = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}
TWO = {"groups": [{"id": "a", "prompt": "hi", "responses": ["yo"]}, {"id": "b", "prompt": "hi", "responses": ["ya"]}]}
VALID_TOKENS = 18
"""Tokens of ``VALID`` and of every ``distinct(i)``."""


def distinct(i: int) -> dict:
    """A one-group request of 18 tokens like ``VALID`` but with other responses, so the result
    cache (same token ids → no engine work) does not answer it."""
    return {"groups": [{"id": "g", "prompt": "hi", "responses": [f"z{chr(97 + 2 * i)}", f"z{chr(98 + 2 * i)}"]}]}

RETRY_AFTER_S = 7


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def users_config(tmp_path, **alice_limits) -> tuple[ServerConfig, dict[str, str]]:
    path = tmp_path / "users.jsonl"
    alice, _ = add_user(path, "alice", **alice_limits)
    bob, _ = add_user(path, "bob")
    return ServerConfig(port=0, users_file=str(path), retry_after_s=RETRY_AFTER_S), {"alice": alice, "bob": bob}


@pytest.fixture
def start(aiohttp_client, engine):
    async def make(config: ServerConfig):
        return await fake_app_client(aiohttp_client, config, engine)

    return make


async def scrape(client, token) -> dict[tuple[str, tuple], float]:
    async with client.get("/metrics", headers=bearer(token)) as resp:
        text = await resp.text()
    return metric_samples(text)


@pytest.fixture
def inflight_setup(tmp_path):
    return users_config(tmp_path, max_inflight_groups=1)


async def test_max_inflight_groups_is_429_for_that_user_only(start, engine, inflight_setup):
    config, tokens = inflight_setup
    client = await start(config)
    engine.score_gate = asyncio.Event()
    first = asyncio.create_task(client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])))
    await wait_until(lambda: len(engine.calls) == 1)

    async with client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == str(RETRY_AFTER_S)
        error = orjson.loads(await resp.read())["error"]
    assert error["type"] == "overloaded"
    assert error["message"] == (
        "user 'alice' has 1 groups in flight; 1 more would exceed the user's max_inflight_groups=1; "
        "retry when some are answered"
    )
    assert len(engine.calls) == 1  # the refused request never reached the engine

    bob = asyncio.create_task(client.post("/v1/score", json=VALID, headers=bearer(tokens["bob"])))
    await wait_until(lambda: len(engine.calls) == 2)  # bob is admitted while alice is at her cap
    engine.score_gate.set()
    for task in (first, bob):
        resp = await task
        assert resp.status == 200
        resp.release()

    async with client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 200  # the slot is free again once her first request is answered
    async with client.post("/v1/score", json=TWO, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 413  # more groups than her cap in one request can never pass
        assert "Retry-After" not in resp.headers
        error = orjson.loads(await resp.read())["error"]
    assert error == {
        "type": "request_over_limit",
        "message": "the request holds 2 groups, more than user 'alice' may have in flight at once (1, "
                   "max_inflight_groups of the users file), so it can never be admitted; send at most 1 groups per "
                   "request, or ask an admin for a larger max_inflight_groups",
        "field": "groups",
        "limit": {"name": "user.max_inflight_groups", "unit": "groups", "limit": 1, "requested": 2},
    }

    metrics = await scrape(client, tokens["bob"])
    assert metrics[("rmserve_user_limit_rejections_total", (("limit", "max_inflight_groups"), ("user", "alice")))] == 1
    assert ("rmserve_user_limit_rejections_total", (("limit", "max_inflight_groups"), ("user", "bob"))) not in metrics
    assert metrics[("rmserve_user_inflight_groups", (("user", "alice"),))] == 0
    assert metrics[("rmserve_requests_total", (("endpoint", "/v1/score"), ("status", "429")))] == 1


@pytest.fixture
def tpm_setup(tmp_path):
    return users_config(tmp_path, tokens_per_minute=2 * VALID_TOKENS + 5)


async def test_tokens_per_minute_is_429_with_the_wait_until_the_window_ends(start, engine, tpm_setup):
    config, tokens = tpm_setup
    client = await start(config)
    for i in range(2):  # 2 × 18 = 36 of 41 tokens
        async with client.post("/v1/score", json=distinct(i), headers=bearer(tokens["alice"])) as resp:
            assert resp.status == 200
    async with client.post("/v1/score", json=distinct(2), headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 429
        retry_after_s = int(resp.headers["Retry-After"])
        error = orjson.loads(await resp.read())["error"]
    assert 1 <= retry_after_s <= 60  # the rest of the 60 s window opened by her first request
    assert error["type"] == "overloaded"
    assert error["message"] == (
        "user 'alice' has sent 36 prompt tokens in this minute; 18 more would exceed the user's "
        f"tokens_per_minute=41; retry in {retry_after_s} s"
    )
    assert len(engine.calls) == 2

    for i in range(3, 6):  # bob has no token limit and is not slowed by alice's
        async with client.post("/v1/score", json=distinct(i), headers=bearer(tokens["bob"])) as resp:
            assert resp.status == 200
    assert len(engine.calls) == 5

    metrics = await scrape(client, tokens["bob"])
    assert metrics[("rmserve_user_prompt_tokens_total", (("user", "alice"),))] == 2 * VALID_TOKENS
    assert metrics[("rmserve_user_prompt_tokens_total", (("user", "bob"),))] == 3 * VALID_TOKENS
    assert metrics[("rmserve_user_limit_rejections_total", (("limit", "tokens_per_minute"), ("user", "alice")))] == 1


@pytest.fixture
def small_tpm_setup(tmp_path):
    return users_config(tmp_path, tokens_per_minute=VALID_TOKENS - 1)


async def test_a_request_over_the_whole_token_budget_is_413_without_a_retry_hint(start, engine, small_tpm_setup):
    config, tokens = small_tpm_setup
    client = await start(config)
    async with client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 413
        assert "Retry-After" not in resp.headers
        error = orjson.loads(await resp.read())["error"]
    assert error == {
        "type": "request_over_limit",
        "message": "the request holds 18 prompt tokens, more than user 'alice''s whole budget of 17 tokens per "
                   "minute (tokens_per_minute of the users file), so it can never be admitted; send fewer groups "
                   "per request (a group that alone holds more cannot be scored under this budget), or ask an "
                   "admin for a larger tokens_per_minute",
        "field": "groups",
        "limit": {"name": "user.tokens_per_minute", "unit": "tokens", "limit": 17, "requested": 18},
    }
    assert engine.calls == []
    async with client.post("/v1/score", json=distinct(0), headers=bearer(tokens["bob"])) as resp:
        assert resp.status == 200  # bob has no budget


async def test_a_refused_request_does_not_use_up_the_budget(start, engine, tpm_setup):
    config, tokens = tpm_setup  # 41 tokens a minute: two VALID requests fit, a third does not
    client = await start(config)
    for expected in (200, 200, 429, 429, 429):
        async with client.post("/v1/score", json=VALID, headers=bearer(tokens["alice"])) as resp:
            assert resp.status == expected
    one = {"groups": [{"id": "x", "prompt": "", "responses": [""]}]}  # [1, 4, 2, 5, 2]: 5 tokens
    async with client.post("/v1/score", json=one, headers=bearer(tokens["alice"])) as resp:
        assert resp.status == 200  # 36 + 5 = 41: the refused requests took nothing
    metrics = await scrape(client, tokens["bob"])
    assert metrics[("rmserve_user_prompt_tokens_total", (("user", "alice"),))] == 41
