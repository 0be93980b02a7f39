"""The status page's history (``rmserve.server.http.status_history``): the ring buffer's rates
from written-out samples, and the ``history`` of ``GET /v1/status`` on a fake engine whose
samples the test takes itself (the buffer's clock seam), for one model and for a node of two.

Token counts: a group of prompt "hi" (5 tokens) and two answers of 4 tokens each costs
2 × 9 = 18 prompt tokens (the fake renderer: one token per character plus the template's
3; worked out in ``test_status_page.py``). The result cache is off (every group is the same):
each group takes a turn of the fair queue.
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
import orjson
import pytest
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer
from rmserve.server.config import ServerConfig
from rmserve.server.http.app import STATE_KEY, create_app
from rmserve.server.http.node import create_node_app, model_states
from rmserve.server.http.status_history import (
    HISTORY_KEY,
    HISTORY_SAMPLES,
    SAMPLE_INTERVAL_S,
    HistoryBuffer,
    Sample,
    StatusHistory,
    UserThroughput,
    take_sample,
)
from rmserve.server.sharing.fair_queue import QueueState, UserQueueState
from rmserve.server.sharing.users import User

T0 = 1_700_000_000.0
"""Unix time of the first sample in these tests."""


def _sample(t: float, served: dict[str, tuple[int, int]], queued: int = 0, inflight: int = 0) -> Sample:
    return Sample(time_s=t, queued_groups=queued, inflight_groups=inflight, served=served)


def test_defaults_keep_fifteen_minutes_of_five_second_samples():
    assert (SAMPLE_INTERVAL_S, HISTORY_SAMPLES) == (5.0, 180)
    buffer = HistoryBuffer()
    assert (buffer.interval_s, buffer.capacity) == (5.0, 180)


def test_rates_are_each_intervals_increase_over_its_seconds():
    buffer = HistoryBuffer(capacity=10, interval_s=5)
    buffer.record(_sample(T0, {"alice": (100, 2)}))
    buffer.record(_sample(T0 + 5, {"alice": (150, 3)}, queued=4, inflight=1))
    # bob first seen: served nothing before (0); alice's interval is 10 s here
    buffer.record(_sample(T0 + 15, {"alice": (250, 5), "bob": (40, 1)}, queued=2, inflight=2))
    buffer.record(_sample(T0 + 20, {"alice": (250, 5), "bob": (60, 2)}))
    history = buffer.history()
    assert history == StatusHistory(
        interval_s=5.0,
        capacity=10,
        time_s=(T0, T0 + 5, T0 + 15, T0 + 20),
        queued_groups=(0, 4, 2, 0),
        inflight_groups=(0, 1, 2, 0),
        users=(
            UserThroughput("alice", tokens_per_s=(10.0, 10.0, 0.0), groups_per_s=(0.2, 0.2, 0.0)),
            UserThroughput("bob", tokens_per_s=(0.0, 4.0, 4.0), groups_per_s=(0.0, 0.1, 0.2)),
        ),
    )


def test_a_counter_below_its_last_value_restarted_from_zero():
    buffer = HistoryBuffer(capacity=4)
    buffer.record(_sample(T0, {"alice": (500, 10)}))
    buffer.record(_sample(T0 + 5, {"alice": (30, 1)}))  # 30 tokens, 1 group since the restart
    assert buffer.history().users == (UserThroughput("alice", (6.0,), (0.2,)),)


def test_only_users_served_in_the_window_and_only_the_viewers_own():
    buffer = HistoryBuffer(capacity=4)
    buffer.record(_sample(T0, {"alice": (90, 1), "carol": (70, 1)}))
    buffer.record(_sample(T0 + 5, {"alice": (90, 1), "bob": (10, 1), "carol": (70, 1)}))
    # alice and carol served nothing in the window: no entry
    assert [u.user for u in buffer.history().users] == ["bob"]
    assert buffer.history("bob").users == (UserThroughput("bob", (2.0,), (0.2,)),)
    assert buffer.history("alice").users == ()
    assert buffer.history("nobody").users == ()
    assert buffer.history("alice").time_s == (T0, T0 + 5)  # the times and depths are everyone's


def test_the_ring_keeps_the_newest_capacity_samples():
    buffer = HistoryBuffer(capacity=3)
    for i in range(5):
        buffer.record(_sample(T0 + 5 * i, {"alice": (10 * i * i, i)}))
    assert len(buffer) == 3
    history = buffer.history()
    assert history.time_s == (T0 + 10, T0 + 15, T0 + 20)
    # cumulative 40, 90, 160 tokens → 50 / 5, 70 / 5
    assert history.users == (UserThroughput("alice", (10.0, 14.0), (0.2, 0.2)),)


def test_one_sample_has_no_interval_and_no_rates():
    buffer = HistoryBuffer()
    assert buffer.history() == StatusHistory(5.0, 180, (), (), (), ())
    buffer.record(_sample(T0, {"alice": (10, 1)}, queued=1))
    assert buffer.history() == StatusHistory(5.0, 180, (T0,), (1,), (0,), ())


def test_bad_settings_and_a_clock_that_went_back_are_refused():
    with pytest.raises(ValueError, match=r"capacity: 1 must be an integer ≥ 2"):
        HistoryBuffer(capacity=1)
    with pytest.raises(ValueError, match=r"interval_s: 0 must be a number > 0"):
        HistoryBuffer(interval_s=0)
    buffer = HistoryBuffer()
    buffer.record(_sample(T0, {}))
    with pytest.raises(ValueError, match=r"time_s: sample at 1700000000.0 is not after the last one at 1700000000.0"):
        buffer.record(_sample(T0, {}))
    assert len(buffer) == 1


def _entry(user: str, served_groups: int, served_tokens: int) -> UserQueueState:
    return UserQueueState(user, 1.0, 0, 0, 0, 0, served_groups, served_tokens, 0.0, None)


def test_a_sample_of_several_queues_sums_them():
    a = QueueState(concurrency=4, inflight_groups=2, queued_groups=3, tokens_per_s=0.0,
                   users=(_entry("alice", 2, 36), _entry("bob", 1, 18)))
    b = QueueState(concurrency=4, inflight_groups=1, queued_groups=0, tokens_per_s=0.0,
                   users=(_entry("alice", 5, 90),))
    assert Sample.of(T0, [a, b]) == Sample(T0, 3, 3, {"alice": (126, 7), "bob": (18, 1)})


def test_a_full_buffer_of_two_users_is_small_json():
    """The size the module docstring states: under 5 KB of times and depths, under 7 KB per
    active user, for a full buffer of realistic times (ms fractions) and rates."""
    buffer = HistoryBuffer()
    for i in range(HISTORY_SAMPLES):
        t = T0 + 5.000137 * i + 0.123456
        buffer.record(_sample(t, {"alice": (1234 * i + i * i % 7, 3 * i), "bob": (987 * i, i)}, queued=i % 50,
                              inflight=i % 64))
    body = msgspec.json.encode(buffer.history())
    empty = msgspec.json.encode(msgspec.structs.replace(buffer.history(), users=()))
    assert len(empty) < 5 * 1024
    assert len(body) - len(empty) < 2 * 7 * 1024


# --- GET /v1/status --------------------------------------------------------------------------

USERS = {"alice": User("alice"), "bob": User("bob", weight=2.0), "root": User("root", role="admin")}


def _body(n: int, first: int = 0, model: str | None = None) -> dict:
    groups = [{"id": f"g{i}", "prompt": "hi", "responses": ["ya", "yb"]} for i in range(first, first + n)]
    return {"groups": groups} if model is None else {"groups": groups, "model": model}


async def _post(client, user: str, body: dict) -> None:
    async with client.post("/v1/score", json=body, headers={"X-Test-User": user}) as resp:
        assert resp.status == 200, await resp.text()


async def _history(client, user: str | None = None) -> dict:
    headers = {"X-Test-User": user} if user else {}
    async with client.get("/v1/status", headers=headers) as resp:
        assert resp.status == 200
        return orjson.loads(await resp.read())["history"]


async def never(seconds: float) -> None:
    """A sleep that never ends: the sampler takes its first sample only, the test the others."""
    await asyncio.Event().wait()


class Clock:
    """A Unix clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _until(predicate) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_status_history_of_two_users_and_the_queue(aiohttp_client):
    engine = FakeEngine(score_gate=asyncio.Event())
    engine.score_gate.set()
    app = create_app(ServerConfig(port=0, engine_concurrency_groups=1, result_cache_groups=0), engine, FakeRenderer())
    app.middlewares.append(user_header_middleware(USERS))
    clock = Clock(T0)
    app[HISTORY_KEY] = HistoryBuffer(clock=clock, sleep=never)  # the test takes the samples
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    buffer = app[HISTORY_KEY]
    await _until(lambda: len(buffer) == 1)  # the sampler's first sample, as the app started

    await _post(client, "alice", _body(3))  # 54 tokens
    await _post(client, "bob", _body(1))  # 18 tokens
    clock.now = T0 + 5
    take_sample(app)
    await _post(client, "bob", _body(2, first=1))  # 36 tokens
    clock.now = T0 + 15
    take_sample(app)
    # alice's next 2 groups: one at the stalled engine, one queued behind it (1 slot)
    engine.score_gate.clear()
    post = asyncio.create_task(_post(client, "alice", _body(2, first=3)))
    await _until(lambda: len(engine.calls) == 7)
    clock.now = T0 + 20
    take_sample(app)

    expected = {
        "interval_s": 5.0,
        "capacity": 180,
        "time_s": [T0, T0 + 5, T0 + 15, T0 + 20],
        "queued_groups": [0, 0, 0, 1],
        "inflight_groups": [0, 0, 0, 1],
        "users": [
            {"user": "alice", "tokens_per_s": [10.8, 0.0, 0.0], "groups_per_s": [0.6, 0.0, 0.0]},
            {"user": "bob", "tokens_per_s": [3.6, 3.6, 0.0], "groups_per_s": [0.2, 0.2, 0.0]},
        ],
    }
    assert await _history(client) == expected  # no user header: the anonymous admin sees all
    assert await _history(client, "root") == expected
    assert await _history(client, "bob") == {**expected, "users": [expected["users"][1]]}
    engine.score_gate.set()
    await post


async def test_the_sampler_runs_on_its_interval_and_stops_with_the_app(aiohttp_client):
    app = create_app(ServerConfig(port=0), FakeEngine(), FakeRenderer())
    app[HISTORY_KEY] = HistoryBuffer(interval_s=0.02)
    client = await aiohttp_client(app)
    buffer = app[HISTORY_KEY]
    await _until(lambda: len(buffer) >= 3)
    assert any(t.get_name() == "rmserve-status-history" for t in asyncio.all_tasks())
    await client.close()
    assert not any(t.get_name() == "rmserve-status-history" for t in asyncio.all_tasks())
    count = len(buffer)
    await asyncio.sleep(0.1)
    assert len(buffer) == count


async def test_a_nodes_history_sums_its_models_queues(aiohttp_client):
    config = ServerConfig(port=0, result_cache_groups=0)
    apps = []
    for name in ("a", "b"):
        engine = FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, name=name, fingerprint=f"fp-{name}"))
        apps.append((name, create_app(dataclasses.replace(config, served_model_name=name), engine, FakeRenderer())))
    node = create_node_app(config, apps)
    node.middlewares.append(user_header_middleware(USERS))
    clock = Clock(T0)
    node[HISTORY_KEY] = HistoryBuffer(clock=clock, sleep=never)
    client = await aiohttp_client(node)
    await _until(lambda: all(state.status == "ready" for state in model_states(node)))
    await _until(lambda: len(node[HISTORY_KEY]) >= 1)
    clock.now = T0 + 1  # a sample after the models are ready: both queues
    take_sample(node)
    await _post(client, "alice", _body(1, model="a"))  # 18 tokens on a
    await _post(client, "alice", _body(2, model="b"))  # 36 tokens on b
    clock.now = T0 + 11
    take_sample(node)
    history = await _history(client)
    assert history["time_s"][-2:] == [T0 + 1, T0 + 11]
    assert history["users"] == [{"user": "alice", "tokens_per_s": [0.0] * (len(history["time_s"]) - 2) + [5.4],
                                 "groups_per_s": [0.0] * (len(history["time_s"]) - 2) + [0.3]}]
