"""``POST /v1/models/load`` when a reload in place is impossible: the engine restarts on the
checkpoint (fake engine), the restore after a failed restart, and the drain time limit.

Numbers by hand from ``fakes.py``: for ``VALID`` (prompt "hi", responses "yo"/"ya") the
base rewards are 4.55 and 4.41 (``test_app.py``); a fake checkpoint adds its reward offset.
Checkpoints here: ``step-0`` (offset 0, the one loaded at start), ``wider`` (hidden_size 16
instead of 8 — another shape — offset 3, max_model_len 32), ``retok`` (same shape, another
tokenizer.json, offset 7), ``step-1`` (same shape and tokenizer, offset 10).
"""

from __future__ import annotations

import asyncio
import math

import orjson
import pytest
from testkit.fakes import (
    FAKE_MODEL,
    FakeEngine,
    FakeRenderer,
    ReloadableFakeEngine,
    RestartableFakeEngine,
    write_fake_checkpoint,
)
from rmserve.server.swaps import swap
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.fingerprint import model_fingerprint
from test_app import VALID, assert_serves, error_of, post_score, scrape, wait_until
from test_swap import AUTH, BASE_REWARDS, TOKEN, load, model_info, rewards

from rmserve import __version__
from rmserve.errors import Conflict

WIDER_MAX_LEN = 32


@pytest.fixture
def ckpts(tmp_path):
    """The checkpoint root and its four fake checkpoints (see the module docstring)."""
    root = tmp_path / "ckpts"
    return {
        "root": root,
        "step-0": write_fake_checkpoint(root / "step-0", 0.0),
        "wider": write_fake_checkpoint(root / "wider", 3.0, hidden_size=16, max_model_len=WIDER_MAX_LEN),
        "retok": write_fake_checkpoint(root / "retok", 7.0, tokenizer="tok-v2"),
        "step-1": write_fake_checkpoint(root / "step-1", 10.0),
    }


@pytest.fixture
def make_client(aiohttp_client, ckpts):
    """An app over a restartable fake engine whose renderer is rebuilt from each ModelInfo."""

    async def make(*, engine=None, **config):
        engine = engine or RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]))
        built: list[int] = []

        def renderer_factory(loaded):
            built.append(loaded.info.max_model_len)
            return FakeRenderer(max_model_len=loaded.info.max_model_len)

        server_config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(ckpts["root"]),), **config)
        app = create_app(server_config, engine, renderer_factory=renderer_factory)
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client, engine, built

    return make


def long_request(response_chars: int) -> dict:
    """One group, prompt "hi", one response of ``response_chars`` letters: 9 + chars - 2 tokens."""
    return {"groups": [{"id": "long", "prompt": "hi", "responses": ["y" * response_chars]}]}


async def test_different_shape_restarts_engine_with_new_renderer_and_counters(make_client, ckpts):
    client, engine, built = await make_client()
    before = await model_info(client)
    assert built == [FAKE_MODEL.max_model_len]
    # 9 + 30 - 2 = 37 tokens: fits the loaded model's 64, not the wider one's 32.
    status, _ = await post_score(client, long_request(30))
    assert status == 200

    status, body = await load(client, "wider", ckpts["wider"])
    assert status == 200, body
    assert body["swap_kind"] == "restart"
    assert engine.restarts == [str(ckpts["wider"].resolve())] and engine.reloads == []
    after = await model_info(client)
    assert body["models"][0] == orjson.loads(orjson.dumps(body["models"][0]))  # plain JSON
    assert (after.name, after.max_model_len) == ("wider", WIDER_MAX_LEN)
    assert after.fingerprint == model_fingerprint(ckpts["wider"], None) != before.fingerprint
    assert after.swap_count == 1 and after.last_swap_time is not None
    assert built == [FAKE_MODEL.max_model_len, WIDER_MAX_LEN]  # the renderer was rebuilt for the new model
    assert await rewards(client) == pytest.approx((7.55, 7.41))
    status, body = await post_score(client, long_request(30))
    assert status == 200
    assert body["results"][0]["rewards"] == [None]
    assert body["results"][0]["errors"] == [
        {"type": "sequence_too_long", "message": "37 tokens (chat template included), over max_model_len=32"}
    ]

    # another tokenizer, same shape: also a restart; the counters keep advancing
    status, body = await load(client, "retok", ckpts["retok"])
    assert (status, body["swap_kind"]) == (200, "restart")
    info = await model_info(client)
    assert (info.name, info.swap_count, info.max_model_len) == ("retok", 2, FAKE_MODEL.max_model_len)
    assert info.last_swap_time >= after.last_swap_time
    assert await rewards(client) == pytest.approx((11.55, 11.41))

    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "restart"), ("outcome", "ok")))] == 2
    assert samples[("rmserve_checkpoint_swap_duration_seconds_count", (("kind", "restart"),))] == 2
    assert ("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "ok"))) not in samples


async def test_same_shape_and_tokenizer_still_reloads_in_place(make_client, ckpts):
    client, engine, built = await make_client()
    status, body = await load(client, "step-1", ckpts["step-1"])
    assert (status, body["swap_kind"]) == (200, "reload")
    assert engine.reloads == [str(ckpts["step-1"].resolve())] and engine.restarts == []
    assert engine.resets == 1 and built == [FAKE_MODEL.max_model_len]  # renderer kept
    assert await rewards(client) == pytest.approx((14.55, 14.41))
    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "ok")))] == 1


async def test_restart_drains_in_flight_and_gates_new_requests(make_client, ckpts):
    """In-flight scoring finishes on the old model before the engine stops; requests that
    arrive meanwhile wait and are scored by the restarted one; nothing is scored mid-restart."""
    score_gate, restart_gate = asyncio.Event(), asyncio.Event()
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]), score_gate=score_gate,
                                   restart_gate=restart_gate)
    client, _, _ = await make_client(engine=engine)
    state = client.app[STATE_KEY]

    in_flight = asyncio.create_task(post_score(client, VALID))
    await wait_until(lambda: len(engine.calls) == 1)
    swapping = asyncio.create_task(load(client, "wider", ckpts["wider"]))
    await wait_until(lambda: not state.serving.is_set())
    waiting = asyncio.create_task(post_score(client, VALID))
    await asyncio.sleep(0.05)
    assert not engine.restart_entered.is_set()  # the restart waits for the in-flight request
    assert len(engine.calls) == 1
    status, body = await load(client, "again", ckpts["retok"])  # one swap at a time
    assert (status, error_of(body)["type"]) == (409, "conflict")

    score_gate.set()
    status, body = await in_flight
    assert (status, body["model"]) == (200, "fake-rm")
    assert tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    await engine.restart_entered.wait()
    assert not engine.started  # the old model is down
    async with client.get("/health") as resp:
        assert (resp.status, await resp.json()) == (503, {"status": "restarting", "version": __version__})
        assert resp.headers["Retry-After"] == "5"
    await asyncio.sleep(0.05)
    assert len(engine.calls) == 1 and not waiting.done()
    restart_gate.set()
    assert (await swapping)[0] == 200
    async with client.get("/health") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "ready", "version": __version__})
    status, body = await waiting
    assert (status, body["model"]) == (200, "wider")
    assert tuple(body["results"][0]["rewards"]) == pytest.approx((7.55, 7.41))
    assert engine.mixed == 0 and state.serving.is_set()


async def test_failed_restart_restores_previous_checkpoint(make_client, ckpts):
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]), failing_paths={str(ckpts["wider"].resolve())})
    client, _, built = await make_client(engine=engine)
    before = await model_info(client)
    status, body = await load(client, "wider", ckpts["wider"])
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    message = error_of(body)["message"]
    assert "'wider' failed" in message and "does not start" in message
    assert "'step-0' was restored" in message
    assert str(ckpts["root"]) not in message  # no file-system paths in a 5xx reply
    assert engine.restarts == [str(ckpts["wider"].resolve()), str(ckpts["step-0"].resolve())]
    info = await model_info(client)
    assert (info.name, info.swap_count, info.last_swap_time, info.max_model_len) == (
        before.name, 0, None, FAKE_MODEL.max_model_len)
    assert info.fingerprint == model_fingerprint(ckpts["step-0"], None)
    assert built == [FAKE_MODEL.max_model_len, FAKE_MODEL.max_model_len]  # rebuilt for the restored engine
    async with client.get("/health") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "ready", "version": __version__})
    await assert_serves(client)
    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "restart"), ("outcome", "error")))] == 1
    # the restored checkpoint is the reference of the next swap: a same-shape one reloads
    status, body = await load(client, "step-1", ckpts["step-1"])
    assert (status, body["swap_kind"]) == (200, "reload")


async def test_failed_restart_and_failed_restore_reports_no_model(make_client, ckpts):
    failing = {str(ckpts["wider"].resolve()), str(ckpts["step-0"].resolve())}
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]), failing_paths=failing)
    client, _, _ = await make_client(engine=engine)
    waiting_gate = asyncio.Event()
    engine.restart_gate = waiting_gate
    swapping = asyncio.create_task(load(client, "wider", ckpts["wider"]))
    await engine.restart_entered.wait()
    waiting = asyncio.create_task(post_score(client, VALID))  # waits on the gate
    await asyncio.sleep(0.02)
    waiting_gate.set()
    status, body = await swapping
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    message = error_of(body)["message"]
    assert "'step-0' failed too" in message and "no model is served" in message
    status, body = await waiting  # released by the gate, then told the truth
    assert (status, error_of(body)["type"]) == (503, "engine_not_ready")
    async with client.get("/health") as resp:
        assert (resp.status, await resp.json()) == (503, {"status": "failed", "version": __version__})
    async with client.get("/v1/models") as resp:
        assert resp.status == 503
    status, body = await load(client, "step-1", ckpts["step-1"])
    assert (status, error_of(body)["type"]) == (503, "engine_not_ready")


async def test_drain_timeout_fails_load_and_reopens_gate(make_client, ckpts):
    score_gate = asyncio.Event()
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]), score_gate=score_gate)
    client, _, _ = await make_client(engine=engine, swap_drain_timeout_s=0.05)
    state = client.app[STATE_KEY]
    in_flight = asyncio.create_task(post_score(client, VALID))
    await wait_until(lambda: len(engine.calls) == 1)
    for name in ("step-1", "wider"):  # reload and restart alike
        async with client.post("/v1/models/load", json={"name": name, "path": str(ckpts[name])}, headers=AUTH) as resp:
            body = orjson.loads(await resp.read())
            assert (resp.status, error_of(body)["type"]) == (503, "engine_not_ready")
            assert resp.headers["Retry-After"] == "5"
        assert "swap_drain_timeout_s=0.05" in error_of(body)["message"]
        assert state.serving.is_set() and not state.swap_lock.locked()
    assert engine.reloads == [] and engine.restarts == []
    score_gate.set()
    status, body = await in_flight
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    info = await model_info(client)
    assert (info.name, info.swap_count) == ("fake-rm", 0)
    await assert_serves(client)
    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "drain_timeout")))] == 1
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "restart"), ("outcome", "drain_timeout")))] == 1
    # with nothing in flight the same load goes through
    status, body = await load(client, "step-1", ckpts["step-1"])
    assert (status, body["swap_kind"]) == (200, "reload")


async def test_restart_survives_admin_client_giving_up(make_client, ckpts):
    """The admin client stops waiting mid-restart: the swap still finishes and the lock frees."""
    restart_gate = asyncio.Event()
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]), restart_gate=restart_gate)
    client, _, _ = await make_client(engine=engine)
    state = client.app[STATE_KEY]
    swapping = asyncio.create_task(load(client, "wider", ckpts["wider"]))
    await engine.restart_entered.wait()
    swapping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await swapping
    restart_gate.set()
    await wait_until(lambda: not state.swap_lock.locked())
    info = await model_info(client)
    assert (info.name, info.swap_count, info.max_model_len) == ("wider", 1, WIDER_MAX_LEN)
    assert all(math.isfinite(r) for r in await rewards(client))


# --- plan_swap: which kind, without HTTP --------------------------------------------------


@pytest.mark.parametrize(
    ("engine_type", "target", "expected"),
    [
        (RestartableFakeEngine, "step-1", "reload"),
        (RestartableFakeEngine, "wider", "restart"),
        (RestartableFakeEngine, "retok", "restart"),
        (ReloadableFakeEngine, "step-1", "reload"),
        (ReloadableFakeEngine, "wider", None),
        (FakeEngine, "step-1", None),
    ],
)
def test_plan_swap_by_capability_and_checkpoint(ckpts, engine_type, target, expected):
    engine = engine_type()
    if expected is None:
        with pytest.raises(Conflict, match="restart the server"):
            swap.plan_swap(engine, ckpts["step-0"], ckpts[target])
        return
    kind, reason = swap.plan_swap(engine, ckpts["step-0"], ckpts[target])
    assert kind == expected
    assert (reason is None) == (expected == "reload")
    if target == "wider":
        assert "hidden_size: 8 → 16" in reason
    if target == "retok":
        assert "tokenizer.json differs" in reason


def test_plan_swap_without_known_checkpoint(ckpts):
    """A model that is not a local folder: nothing to compare (reload is tried) and nothing to
    restore, so an engine without reload is refused rather than restarted."""
    assert swap.plan_swap(RestartableFakeEngine(), None, ckpts["wider"]) == ("reload", None)

    class RestartOnly(FakeEngine):
        async def restart(self, path):
            raise AssertionError("must not be called")

    with pytest.raises(Conflict, match="could not be undone"):
        swap.plan_swap(RestartOnly(), None, ckpts["wider"])
    kind, reason = swap.plan_swap(RestartOnly(), ckpts["step-0"], ckpts["step-1"])
    assert (kind, reason) == ("restart", "the engine cannot reload weights in place")
