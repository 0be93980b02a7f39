"""Requests over a whole limit of the user (413 ``request_over_limit``): the client splits them
until they fit, learns how many groups fit, and records a group that alone is over the token
budget as unscored.

The server is the real app over :class:`testkit.fakes.FakeEngine` with a users file. Token
costs follow the fake chat template (``fakes.py``): a sequence of prompt P and response R is
``1 + (2 + len(P)) + (2 + len(R))`` tokens, and a group costs the sum over its responses. The
``limits`` library's clock is replaced by :class:`FakeClock`, which the client's retry sleep
moves on, so a 60 s window passes without waiting.
"""

from __future__ import annotations

import logging

import pytest
from testkit.fakes import FakeEngine, FakeRenderer, fake_ids, fake_reward

from rmserve import errors
from rmserve.client.client import RewardClient
from rmserve.client.config import Concurrency, Retry
from rmserve.schema import Group, Message, ResponseError
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.auth import add_user
from rmserve.server.sharing.limits import LIMITS_KEY, UserLimits
from rmserve.server.swaps.state import METRICS_KEY


class FakeClock:
    """Unix time that moves only when :meth:`sleep` is awaited (the client's retry waits)."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        self.now_s += delay_s


def group(i: str, prompt: str, *responses: str) -> Group:
    return Group(benchmark="rm-bench", domain="chat", id=i, messages=(Message("user", prompt),),
                 responses=tuple(responses), num_chosen=1)


def cost(g: Group) -> int:
    """Prompt tokens the server charges for ``g``, worked out from the fake chat template."""
    return sum(5 + len(g.messages[0].content) + len(r) for r in g.responses)


def rewards(g: Group) -> tuple[float, ...]:
    return tuple(fake_reward(fake_ids([("user", g.messages[0].content)], r)) for r in g.responses)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    import limits.aio.storage.memory as memory

    fake = FakeClock()
    monkeypatch.setattr(memory, "time", fake)
    return fake


def users_config(folder, **alice_limits) -> tuple[ServerConfig, str]:
    folder.mkdir()
    path = folder / "users.jsonl"
    token, _ = add_user(path, "alice", **alice_limits)
    return ServerConfig(port=0, users_file=str(path), retry_after_s=1), token


@pytest.fixture
def serve(aiohttp_client, clock):
    """Start the app for a config; returns (test client, engine)."""

    async def start(config: ServerConfig):
        engine = FakeEngine()
        app = create_app(config, engine, FakeRenderer())
        app[LIMITS_KEY] = UserLimits(app[METRICS_KEY], config.retry_after_s, clock=clock.time)
        http = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return http, engine

    return start


def client_of(http, token: str, clock: FakeClock, groups_per_request: int) -> RewardClient:
    return RewardClient(
        str(http.make_url("")), session=http.session, token=token, sleep=clock.sleep,
        concurrency=Concurrency(max_groups_in_flight=groups_per_request, groups_per_request=groups_per_request),
        retry=Retry(max_attempts=3, jitter=0.0),
    )


@pytest.fixture
def limited(tmp_path) -> dict[str, tuple[ServerConfig, str]]:
    """Configs (built outside the event loop) whose user alice has ``budget_45``: 45 prompt
    tokens a minute, or ``two_in_flight``: at most 2 groups in flight; with her token."""
    return {
        "budget_45": users_config(tmp_path / "a", tokens_per_minute=45),
        "two_in_flight": users_config(tmp_path / "b", max_inflight_groups=2),
    }


async def test_a_request_over_the_token_budget_is_split_and_every_group_scored(serve, limited, clock, caplog):
    config, token = limited["budget_45"]
    http, engine = await serve(config)
    groups = [group(f"g{i}", "p", chr(97 + 2 * i), chr(98 + 2 * i)) for i in range(4)]
    assert [cost(g) for g in groups] == [14, 14, 14, 14]  # 56 in one request, over the 45 a minute
    client = client_of(http, token, clock, groups_per_request=4)
    with caplog.at_level(logging.WARNING, logger="rmserve.client"):
        async with client:
            records = [r async for r in client.score_stream(groups)]
    # 4 groups (56 tokens) refused whole: ⌊4 · 45 / 56⌋ = 3 groups per request from now on;
    # g0-g2 (42 tokens) pass, g3 (14 more, 56 in the window) waits out the minute (Retry-After 60).
    assert [r.id for r in records] == ["g0", "g1", "g2", "g3"]
    assert [r.rewards for r in records] == [rewards(g) for g in groups]
    assert all(r.scored for r in records)
    assert client.groups_per_request == 3
    assert client.attempts == 4  # 413, 200, 429, 200
    assert clock.sleeps == [60.0]
    assert len(engine.calls) == 4
    assert [r.getMessage() for r in caplog.records if r.name == "rmserve.client"] == [
        "the server refused a request of 4 groups as over one of its limits (user.tokens_per_minute is 45 tokens, "
        "the request held 56): sending at most 3 groups per request from now on"
    ]


async def test_a_group_alone_over_the_budget_is_an_unscored_record_and_the_stream_goes_on(serve, limited, clock):
    from rmserve.client.records import refused_record

    config, token = limited["budget_45"]
    http, engine = await serve(config)
    small_a, small_b = group("a", "p", "x", "y"), group("b", "p", "z", "w")
    huge = group("huge", "p", "x" * 50, "y" * 50)
    assert (cost(small_a), cost(huge), cost(small_b)) == (14, 112, 14)
    client = client_of(http, token, clock, groups_per_request=3)
    served = (await _models(client))[0]
    async with client:
        records = {r.id: r async for r in client.score_stream([small_a, huge, small_b], served=served,
                                                                expect_fingerprint=served.fingerprint)}
    # 140 tokens refused: ⌊3 · 45 / 140⌋ = 0, so one group per request; a and b (28) fit the minute.
    assert records["a"].rewards == rewards(small_a) and records["b"].rewards == rewards(small_b)
    refused = records["huge"]
    message = (
        "the request holds 112 prompt tokens, more than user 'alice''s whole budget of 45 tokens per minute "
        "(tokens_per_minute of the users file), so it can never be admitted; send fewer groups per request (a "
        "group that alone holds more cannot be scored under this budget), or ask an admin for a larger "
        "tokens_per_minute"
    )
    assert refused.rewards == (None, None) and refused.num_tokens == (0, 0) and refused.num_cached_tokens == (0, 0)
    assert refused.errors == (ResponseError("request_over_limit", message),) * 2
    assert (refused.model, refused.fingerprint) == (served.name, served.fingerprint)
    assert not refused.scored
    assert refused == refused_record(huge, errors.OverLimit(message), model=served.name, fingerprint=served.fingerprint)
    assert client.groups_per_request == 1 and clock.sleeps == []
    assert len(engine.calls) == 2  # the huge group never reached the engine


async def _models(client: RewardClient):
    async with client:
        return await client.models()


async def test_without_served_a_group_alone_over_the_budget_is_raised(serve, limited, clock):
    config, token = limited["budget_45"]
    http, _ = await serve(config)
    client = client_of(http, token, clock, groups_per_request=1)
    async with client:
        with pytest.raises(errors.OverLimit) as refused:
            [r async for r in client.score_stream([group("huge", "p", "x" * 50, "y" * 50)])]
    assert (refused.value.status, refused.value.limit_name, refused.value.unit, refused.value.limit,
            refused.value.value) == (413, "user.tokens_per_minute", "tokens", 45, 112)


async def test_a_request_over_the_users_groups_in_flight_is_split_to_that_many(serve, limited, clock, caplog):
    config, token = limited["two_in_flight"]
    http, engine = await serve(config)
    groups = [group(f"g{i}", "p", chr(97 + i)) for i in range(5)]
    client = client_of(http, token, clock, groups_per_request=4)
    with caplog.at_level(logging.WARNING, logger="rmserve.client"):
        async with client:
            records = [r async for r in client.score_stream(groups)]
    # [g0..g3] refused (4 groups, the cap is 2) → [g0, g1], [g2, g3]; then [g4] from the rest
    assert [r.id for r in records] == ["g0", "g1", "g2", "g3", "g4"]
    assert all(r.scored for r in records)
    assert client.groups_per_request == 2 and client.attempts == 4
    assert [r.getMessage() for r in caplog.records if r.name == "rmserve.client"] == [
        "the server refused a request of 4 groups as over one of its limits (user.max_inflight_groups is 2 groups, "
        "the request held 4): sending at most 2 groups per request from now on"
    ]
    assert len(engine.calls) == 5


def test_the_limit_travels_on_the_wire_and_back():
    body = errors.OverLimit("too big", limit_name="user.tokens_per_minute", unit="tokens", limit=45,
                            value=112).to_wire()
    from rmserve.schema import encode

    wire = encode(body)
    assert wire == (b'{"error":{"type":"request_over_limit","message":"too big","field":"groups","limit":'
                    b'{"name":"user.tokens_per_minute","unit":"tokens","limit":45,"requested":112}}}')
    back = errors.from_wire(413, wire)
    assert type(back) is errors.OverLimit and not back.retryable
    assert (back.limit_name, back.unit, back.limit, back.value, back.field) == (
        "user.tokens_per_minute", "tokens", 45, 112, "groups")
    # a reply without the limit (another server): still OverLimit, halved when split
    bare = errors.from_wire(413, b'{"error":{"type":"request_over_limit","message":"m","field":"groups"}}')
    assert type(bare) is errors.OverLimit and (bare.limit_name, bare.limit, bare.value) == (None, None, None)
    client = RewardClient("http://127.0.0.1:9", concurrency=Concurrency(max_groups_in_flight=8, groups_per_request=8))
    assert client._fit(8, bare) == 4
    assert client._fit(3, errors.OverLimit("m", limit_name="x", unit="tokens", limit=10, value=1000)) == 1
    assert client._fit(5, errors.OverLimit("m", limit_name="x", unit="groups", limit=9, value=5)) == 4  # < n
    # other errors keep their body as it was: no limit member
    assert encode(errors.InvalidRequest("bad", field="f").to_wire()) == (
        b'{"error":{"type":"invalid_request","message":"bad","field":"f"}}')
