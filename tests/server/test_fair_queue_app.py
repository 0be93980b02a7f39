"""The fair queue inside the app (fake engine): one engine call per group and turn, the cap on
groups at the engine, ``GET /v1/queue`` for a scorer and for an admin, the priority header.

Token counts from the fakes' rules (``testkit/fakes.py``): prompt "hi" is 5 tokens
``[1, 4, 104, 105, 2]``, a two-letter answer 4 (``[5, c, c, 2]``), so each sequence is 9 tokens
and a group of three answers costs 27 prompt tokens.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from testkit.app_client import fake_app_client, wait_until
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FakeEngine, FakeRenderer, PriorityEngine
from rmserve.server.http.app import ServerConfig, create_app
from rmserve.server.sharing.users import User

USERS = {"alice": User("alice"), "bob": User("bob", weight=2.0), "root": User("root", role="admin")}


user_from_test_header = user_header_middleware(USERS)


def group(gi: int) -> dict:
    return {"id": f"g{gi}", "prompt": "hi", "responses": ["ya", "yb", "yc"]}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(score_gate=asyncio.Event())


@pytest.fixture
def make_client(aiohttp_client, engine):
    async def make(**config):
        config = ServerConfig(port=0, **config)
        return await fake_app_client(aiohttp_client, config, engine, middlewares=(user_from_test_header,))

    return make


async def get_queue(client, user: str | None = None) -> dict:
    headers = {"X-Test-User": user} if user else {}
    async with client.get("/v1/queue", headers=headers) as resp:
        assert resp.status == 200
        return orjson.loads(await resp.read())


def score(client, groups: list[dict], user: str | None = None, priority: str | None = None):
    headers = {"X-Test-User": user} if user else {}
    if priority is not None:
        headers["X-RMServe-Priority"] = priority
    return asyncio.create_task(client.post("/v1/score", json={"groups": groups}, headers=headers))


async def test_each_group_goes_whole_to_the_engine_in_its_own_turn(make_client, engine):
    client = await make_client(engine_concurrency_groups=1)
    task = score(client, [group(0), group(1), group(2)])
    await wait_until(lambda: len(engine.calls) == 1)
    queue = await get_queue(client)
    assert len(engine.calls) == 1  # the cap holds the other two groups back
    assert (queue["concurrency"], queue["inflight_groups"], queue["queued_groups"]) == (1, 1, 2)
    [anon] = queue["users"]
    assert (anon["user"], anon["inflight_tokens"], anon["queued_tokens"]) == ("anonymous", 27, 54)
    engine.score_gate.set()
    resp = await task
    assert resp.status == 200
    body = orjson.loads(await resp.read())
    assert [r["id"] for r in body["results"]] == ["g0", "g1", "g2"]
    assert len(engine.calls) == 3
    assert [len(ids) for _, ids in engine.calls] == [3, 3, 3]  # all three answers in one call
    assert [sum(map(len, ids)) for _, ids in engine.calls] == [27, 27, 27]
    served = (await get_queue(client))["users"][0]
    assert (served["served_groups"], served["served_tokens"], served["queued_groups"]) == (3, 81, 0)


async def test_queue_shows_a_scorer_its_own_entry_and_an_admin_everyone(make_client, engine):
    client = await make_client(engine_concurrency_groups=1)
    alice = score(client, [group(0), group(1)], user="alice")
    await wait_until(lambda: len(engine.calls) == 1)
    bob = score(client, [group(2)], user="bob")

    async def bob_queued() -> bool:
        return (await get_queue(client, "root"))["queued_groups"] == 2

    async with asyncio.timeout(10):
        while not await bob_queued():
            await asyncio.sleep(0.01)

    mine = await get_queue(client, "alice")
    assert (mine["user"], mine["admin"], mine["fair_share"]) == ("alice", False, True)
    assert [(u["user"], u["queued_groups"], u["queued_tokens"], u["inflight_groups"], u["inflight_tokens"])
            for u in mine["users"]] == [("alice", 1, 27, 1, 27)]
    assert (mine["inflight_groups"], mine["queued_groups"]) == (1, 2)  # totals of all users

    everyone = await get_queue(client, "root")
    assert (everyone["user"], everyone["admin"]) == ("root", True)
    assert [(u["user"], u["weight"], u["queued_groups"], u["queued_tokens"], u["inflight_groups"])
            for u in everyone["users"]] == [
        ("alice", 1.0, 1, 27, 1),
        ("bob", 2.0, 1, 27, 0),
        ("root", 1.0, 0, 0, 0),  # the caller, not seen by the queue yet: zeros
    ]
    assert everyone["users"][2]["estimated_wait_s"] == 0.0

    engine.score_gate.set()
    assert (await alice).status == 200
    assert (await bob).status == 200


async def test_a_bad_priority_header_is_refused_naming_it(make_client, engine):
    client = await make_client()
    resp = await (score(client, [group(0)], priority="urgent"))
    assert resp.status == 400
    error = orjson.loads(await resp.read())["error"]
    assert error["field"] == "X-RMServe-Priority"
    assert "interactive, batch" in error["message"]
    assert engine.calls == []


async def test_without_fair_share_the_queue_is_empty_and_groups_are_not_capped(make_client, engine):
    client = await make_client(fair_share=False, engine_concurrency_groups=1)
    task = score(client, [group(0), group(1)])
    await wait_until(lambda: len(engine.calls) == 2)
    queue = await get_queue(client)
    assert (queue["fair_share"], queue["concurrency"], queue["queued_groups"]) == (False, 0, 0)
    engine.score_gate.set()
    assert (await task).status == 200


async def test_a_client_that_goes_away_frees_its_queue_entries(make_client, engine):
    client = await make_client(engine_concurrency_groups=1)
    first = score(client, [group(0)], user="alice")
    await wait_until(lambda: len(engine.calls) == 1)
    second = score(client, [group(1), group(2)], user="bob")

    async def queued() -> int:
        return (await get_queue(client, "root"))["queued_groups"]

    async with asyncio.timeout(10):
        while await queued() != 2:
            await asyncio.sleep(0.01)
    second.cancel()  # bob disconnects while both of his groups wait
    with pytest.raises(asyncio.CancelledError):
        await second
    async with asyncio.timeout(10):
        while await queued() != 0:
            await asyncio.sleep(0.01)
    engine.score_gate.set()
    assert (await first).status == 200
    assert len(engine.calls) == 1  # bob's groups never reached the engine


def test_config_fields_are_checked():
    with pytest.raises(ValueError, match="engine_concurrency_groups is 0; it must be an integer ≥ 1"):
        ServerConfig(engine_concurrency_groups=0)
    with pytest.raises(ValueError, match="fair_share_quantum_tokens is 0; it must be an integer ≥ 1"):
        ServerConfig(fair_share_quantum_tokens=0)
    with pytest.raises(ValueError, match="fair_share_interactive_boost is 0.5; it must be ≥ 1"):
        ServerConfig(fair_share_interactive_boost=0.5)


def test_the_app_builds_its_queue_from_the_config():
    from rmserve.server.sharing.fair_queue import queue_of

    app = create_app(ServerConfig(engine_concurrency_groups=7, fair_share_quantum_tokens=300,
                                  fair_share_interactive_boost=2.0), FakeEngine(), FakeRenderer())
    queue = queue_of(app)
    assert queue is not None
    assert (queue.concurrency, queue.quantum_tokens, queue.interactive_boost) == (7, 300, 2.0)
    assert queue_of(create_app(ServerConfig(fair_share=False), FakeEngine(), FakeRenderer())) is None


CHATML_QUERY = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>"
ROUTE_BODIES = {
    "/v1/score": {"groups": [group(0)]},
    "/get_reward": {"query": [CHATML_QUERY]},
    "/classify": {"input": "hi"},
    "/pooling": {"input": "hi"},
}


@pytest.mark.parametrize(("path", "header", "caller_priority"), [
    ("/v1/score", None, "batch"),
    ("/v1/score", "interactive", "interactive"),
    ("/v1/score", "batch", "batch"),
    ("/get_reward", None, "interactive"),
    ("/get_reward", "interactive", "interactive"),
    ("/get_reward", "batch", "batch"),
    ("/classify", None, "interactive"),
    ("/classify", "interactive", "interactive"),
    ("/classify", "batch", "batch"),
    ("/pooling", None, "interactive"),
    ("/pooling", "batch", "batch"),
])
async def test_the_callers_priority_per_route_and_header(aiohttp_client, monkeypatch, path, header, caller_priority):
    """Trainer routes without the header are interactive; a header wins everywhere. The
    engine call carries vLLM's priority of the caller's class (0 interactive, 1 batch)."""
    from rmserve.server.http import routes

    engine = PriorityEngine()
    client = await fake_app_client(aiohttp_client, ServerConfig(port=0, policy_template="chatml"), engine)
    seen: list[str] = []
    original = routes.caller_of

    def spy(request, default_priority="batch"):
        caller = original(request, default_priority)
        seen.append(caller.priority)
        return caller

    headers = {"X-RMServe-Priority": header} if header is not None else {}
    monkeypatch.setattr(routes, "caller_of", spy)
    async with client.post(path, json=ROUTE_BODIES[path], headers=headers) as resp:
        assert resp.status == 200, await resp.text()
    assert seen == [caller_priority]
    expected_engine = {"interactive": 0, "batch": 1}[caller_priority]
    assert engine.priorities == [expected_engine]  # the /v1/score group's one call, or the one input's
