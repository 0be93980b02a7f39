"""The one front door (``rmserve.server.http.routes``) and the one admission
(``rmserve.server.sharing.admission``), over fake engines.

A server of one model and a node of two answer ``POST /v1/score`` through the same routes: the
body is decoded once, on the front door's render threads, and the engine's readiness is read
once. The group (prompt "hi", answers "yo"/"ya") scores 4.55 / 4.41 on model ``a`` and
14.55 / 14.41 on ``b`` (reward offset 10; worked out in ``test_model_router.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

import msgspec
import orjson
import pytest
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer
from rmserve.server.config import ServerConfig
from rmserve.server.http import wire
from rmserve.server.http.app import create_app
from rmserve.server.http.node import create_node_app, model_states
from rmserve.server.http.queue_routes import UserQueue
from rmserve.server.http.serve import run_app
from rmserve.server.sharing import admission
from rmserve.server.sharing.auth import add_user
from rmserve.server.sharing.fair_queue import UserQueueState
from rmserve.server.sharing.limits import LIMITS_KEY
from rmserve.server.sharing.users import User
from rmserve.server.swaps.state import METRICS_KEY, STATE_KEY, EngineState

from rmserve.errors import OverLimit, Overloaded

BODY = {"groups": [{"id": "g1", "prompt": "hi", "responses": ["yo", "ya"]}]}


def _engine(name: str, offset: float = 0.0) -> FakeEngine:
    return FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, name=name, fingerprint=f"fp-{name}"),
                      reward_offset=offset)


def _node(config: ServerConfig | None = None):
    config = config or ServerConfig(port=0)
    apps = [(name, create_app(dataclasses.replace(config, served_model_name=name), _engine(name, offset), FakeRenderer()))
            for name, offset in (("a", 0.0), ("b", 10.0))]
    return create_node_app(config, apps)


@pytest.fixture
def decodes(monkeypatch):
    """Every call of ``wire.decode_score_request``: (thread name, max_model_len given)."""
    calls: list[tuple[str, int | None]] = []
    real = wire.decode_score_request

    def spy(body: bytes, *, max_model_len: int | None = None):
        calls.append((threading.current_thread().name, max_model_len))
        return real(body, max_model_len=max_model_len)

    monkeypatch.setattr(wire, "decode_score_request", spy)
    return calls


@pytest.fixture
def readiness(monkeypatch):
    """How many times ``EngineState.require_ready`` ran."""
    count = [0]
    real = EngineState.require_ready

    def spy(self):
        count[0] += 1
        return real(self)

    monkeypatch.setattr(EngineState, "require_ready", spy)
    return count


async def _settled(app) -> None:
    async with asyncio.timeout(10):
        for state in model_states(app):
            await state.settled.wait()


async def test_a_node_decodes_the_body_once_on_its_render_threads(aiohttp_client, decodes, readiness):
    node = _node()
    client = await aiohttp_client(node)
    await _settled(node)
    reply = await client.post("/v1/score", data=orjson.dumps({**BODY, "model": "b"}))
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["results"][0]["rewards"] == [14.55, 14.41]
    assert len(decodes) == 1
    thread, bound = decodes[0]
    assert thread.startswith("rmserve-render") and bound is None
    assert readiness[0] == 1


async def test_a_server_of_one_model_decodes_once_and_reads_readiness_once(aiohttp_client, decodes, readiness):
    app = create_app(ServerConfig(port=0), _engine("a"), FakeRenderer())
    client = await aiohttp_client(app)
    await _settled(app)
    reply = await client.post("/v1/score", data=orjson.dumps({**BODY, "model": "a"}))
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["results"][0]["rewards"] == [4.55, 4.41]
    assert len(decodes) == 1 and decodes[0][0].startswith("rmserve-render")
    assert readiness[0] == 1
    # the name is resolved in one place, with the same words as before the front door was shared
    reply = await client.post("/v1/score", data=orjson.dumps({**BODY, "model": "x"}))
    assert reply.status == 404
    assert (await reply.json())["error"]["message"] == "model 'x' is not served here; this server scores 'a'"
    assert len(decodes) == 2


@pytest.fixture
def users_node(tmp_path, caplog):
    """A node of two models with a users file and an admin token (the file is read outside
    the event loop), and the warnings logged while it was built."""
    users = tmp_path / "users.jsonl"
    add_user(users, "root", role="admin")
    config = ServerConfig(port=0, host="127.0.0.1", users_file=str(users), admin_token="s3cret")
    with caplog.at_level(logging.WARNING, logger="rmserve.server"):
        node = _node(config)
    return config, node


async def test_the_unused_admin_token_is_warned_about_once_with_two_models(users_node, caplog):
    config, node = users_node
    with caplog.at_level(logging.WARNING, logger="rmserve.server"):
        assert [r for r in caplog.records if "is not used with a users file" in r.getMessage()] == []
        stop = asyncio.Event()
        stop.set()
        assert await run_app(node, config, model_states(node), announce=lambda _: None, stop=stop) == 0
    warned = [r for r in caplog.records if "is not used with a users file" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING


def test_admission_takes_and_gives_back_every_count():
    app = create_app(ServerConfig(port=0, max_inflight_groups=3), _engine("a"), FakeRenderer())
    alice = User("alice", max_inflight_groups=2)
    state, limits = app[STATE_KEY], app[LIMITS_KEY]

    def gauge() -> float:
        return app[METRICS_KEY].registry.get_sample_value("rmserve_inflight_groups")

    with admission.admit(app, alice, 2) as held:
        assert (held.num_groups, held.user) == (2, alice)
        assert (state.inflight_groups, limits.inflight(alice), gauge()) == (2, 2, 2.0)
        with pytest.raises(Overloaded) as refused:
            admission.admit(app, User("bob"), 2)
        assert refused.value.message == (
            "2 groups in flight; admitting 2 more would exceed max_inflight_groups=3; retry later"
        )
        with pytest.raises(Overloaded) as refused:
            admission.admit(app, alice, 1)
        assert refused.value.message == (
            "user 'alice' has 2 groups in flight; 1 more would exceed the user's max_inflight_groups=2; "
            "retry when some are answered"
        )
        assert (state.inflight_groups, limits.inflight(alice), gauge()) == (2, 2, 2.0)  # refusals hold nothing
    assert (state.inflight_groups, limits.inflight(alice), gauge()) == (0, 0, 0.0)
    held.release()  # a second release gives nothing back twice
    assert (state.inflight_groups, gauge()) == (0, 0.0)
    with pytest.raises(OverLimit) as refused:
        admission.admit(app, alice, 4)
    assert (refused.value.field, refused.value.limit_name, refused.value.unit, refused.value.limit,
            refused.value.value, refused.value.status) == ("groups", "server.max_inflight_groups", "groups", 3, 4, 413)


def test_a_queue_entry_is_the_fair_queue_record():
    assert UserQueue is UserQueueState
