"""``POST /v1/models/load`` over a reloadable fake engine: auth, path roots, shape checks,
drain/gate ordering, the swapped name/fingerprint/rewards, metrics.

Fake checkpoints carry a reward offset in ``config.json``; after a swap every reward is
``fake_reward(ids) + offset`` (``fakes.py``). For the request ``VALID`` (prompt "hi",
responses "yo"/"ya") the base rewards are 4.55 and 4.41 (worked out in ``test_app.py``).
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import orjson
import pytest
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from rmserve.server.http.app import RESULT_CACHE_KEY, STATE_KEY, ServerConfig, create_app
from rmserve.fingerprint import model_fingerprint
from test_app import VALID, assert_serves, error_of, post_score, scrape, wait_until

from rmserve.schema import ModelList, decode

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE_REWARDS = (4.55, 4.41)


@pytest.fixture
def roots(tmp_path):
    """(root, original checkpoint inside it with offset 0, second checkpoint with offset 10)."""
    root = tmp_path / "ckpts"
    original = write_fake_checkpoint(root / "step-0", 0.0)
    second = write_fake_checkpoint(root / "step-1", 10.0)
    return root, original, second


@pytest.fixture
def make_swap_client(aiohttp_client, roots):
    root, original, _ = roots

    async def make(*, engine=None, admin_token=TOKEN, **config):
        engine = engine or ReloadableFakeEngine(checkpoint_dir=str(original))
        server_config = ServerConfig(port=0, admin_token=admin_token, checkpoint_roots=(str(root),), **config)
        app = create_app(server_config, engine, FakeRenderer())
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client, engine

    return make


async def load(client, name: str, path, headers=AUTH) -> tuple[int, dict]:
    async with client.post("/v1/models/load", json={"name": name, "path": str(path)}, headers=headers) as resp:
        return resp.status, orjson.loads(await resp.read())


async def rewards(client, model: str | None = None) -> tuple[float, ...]:
    payload = dict(VALID, model=model) if model else VALID
    status, body = await post_score(client, payload)
    assert status == 200, body
    return tuple(body["results"][0]["rewards"])


async def model_info(client):
    async with client.get("/v1/models") as resp:
        assert resp.status == 200
        (info,) = decode(await resp.read(), ModelList).models
    return info


async def test_swap_changes_rewards_name_fingerprint_and_counters(make_swap_client, roots):
    _, _, second = roots
    client, engine = await make_swap_client()
    before = await model_info(client)
    assert (before.swap_count, before.last_swap_time) == (0, None)
    assert await rewards(client) == pytest.approx(BASE_REWARDS)

    status, body = await load(client, "step-1", second)
    assert status == 200, body
    after = await model_info(client)
    assert body["models"][0]["name"] == "step-1" and body["swap_kind"] == "reload"
    assert after.name == "step-1"
    assert after.fingerprint == model_fingerprint(second, None) != before.fingerprint
    assert after.swap_count == 1 and after.last_swap_time is not None and after.last_swap_time > 0
    assert engine.resets == 1  # the prefix cache is reset after every reload
    status, reply = await post_score(client, dict(VALID, model="step-1"))
    assert status == 200
    assert reply["model"] == "step-1" and reply["fingerprint"] == after.fingerprint
    assert tuple(reply["results"][0]["rewards"]) == pytest.approx((14.55, 14.41))
    # the old name is no longer served
    status, body = await post_score(client, dict(VALID, model="fake-rm"))
    assert (status, error_of(body)["type"]) == (404, "model_not_found")

    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "ok")))] == 1
    assert samples[("rmserve_checkpoint_swap_duration_seconds_count", (("kind", "reload"),))] == 1


async def test_no_admin_token_configured_is_403(make_swap_client, roots):
    client, engine = await make_swap_client(admin_token=None)
    status, body = await load(client, "x", roots[2])
    assert (status, error_of(body)["type"]) == (403, "forbidden")
    assert "disabled" in body["error"]["message"]
    assert engine.reloads == []
    await assert_serves(client)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}])
async def test_missing_or_wrong_token_is_401(make_swap_client, roots, headers):
    client, engine = await make_swap_client()
    status, body = await load(client, "x", roots[2], headers=headers)
    assert (status, error_of(body)["type"]) == (401, "unauthorized")
    assert engine.reloads == [] and (await model_info(client)).name == "fake-rm"
    await assert_serves(client)


async def test_path_outside_roots_is_403(make_swap_client, tmp_path):
    outside = write_fake_checkpoint(tmp_path / "elsewhere", 5.0)
    client, engine = await make_swap_client()
    for path in (outside, tmp_path / "ckpts" / ".." / "elsewhere", tmp_path / "ckpts" / "missing"):
        status, body = await load(client, "x", path)
        assert (status, error_of(body)["type"], error_of(body)["field"]) == (403, "forbidden", "path")
    assert engine.reloads == []
    assert (await model_info(client)).swap_count == 0
    await assert_serves(client)


async def test_symlink_escaping_root_is_403(make_swap_client, roots, tmp_path):
    root, _, _ = roots
    outside = write_fake_checkpoint(tmp_path / "elsewhere", 5.0)
    (root / "sneaky").symlink_to(outside, target_is_directory=True)
    inside_link = root / "alias"
    inside_link.symlink_to(root / "step-1", target_is_directory=True)
    client, engine = await make_swap_client()
    status, body = await load(client, "x", root / "sneaky")
    assert (status, error_of(body)["type"]) == (403, "forbidden")
    assert engine.reloads == []
    await assert_serves(client)
    # a symlink that stays inside the root is followed, and the resolved folder is loaded
    status, body = await load(client, "alias", inside_link)
    assert status == 200, body
    assert engine.reloads == [str((root / "step-1").resolve())]


async def test_different_shape_or_tokenizer_is_409_and_model_unchanged(make_swap_client, roots):
    root, _, _ = roots
    wider = write_fake_checkpoint(root / "wider", 3.0, hidden_size=16)
    retokenized = write_fake_checkpoint(root / "retok", 3.0, tokenizer="tok-v2")
    client, engine = await make_swap_client()
    for folder, needle in ((wider, "hidden_size"), (retokenized, "tokenizer.json")):
        status, body = await load(client, "x", folder)
        assert (status, error_of(body)["type"]) == (409, "conflict")
        assert needle in body["error"]["message"] and "restart" in body["error"]["message"]
    assert engine.reloads == []
    assert (await model_info(client)).name == "fake-rm"
    await assert_serves(client)


async def test_bad_body_is_400(make_swap_client):
    client, _ = await make_swap_client()
    for payload, field in (({"name": "x"}, "path"), ({"name": "", "path": "p"}, "name"),
                           ({"name": "x", "path": "p", "extra": 1}, "extra")):
        async with client.post("/v1/models/load", json=payload, headers=AUTH) as resp:
            body = orjson.loads(await resp.read())
        assert (resp.status, error_of(body)["field"]) == (400, field)
    await assert_serves(client)


async def test_engine_without_reload_is_409(make_swap_client, roots):
    client, _ = await make_swap_client(engine=FakeEngine())
    status, body = await load(client, "x", roots[2])
    assert (status, error_of(body)["type"]) == (409, "conflict")
    await assert_serves(client)


async def test_swap_drains_in_flight_and_gates_new_requests(make_swap_client, roots):
    """In-flight requests finish on the old weights; requests arriving mid-swap wait and get
    the new ones; no request is scored while the reload is in progress; a second load is 409."""
    _, original, second = roots
    score_gate, reload_gate = asyncio.Event(), asyncio.Event()
    engine = ReloadableFakeEngine(checkpoint_dir=str(original), score_gate=score_gate, reload_gate=reload_gate)
    client, _ = await make_swap_client(engine=engine)
    state = client.app[STATE_KEY]

    in_flight = asyncio.create_task(post_score(client, VALID))
    await wait_until(lambda: len(engine.calls) == 1)
    swapping = asyncio.create_task(load(client, "step-1", second))
    await wait_until(lambda: not state.serving.is_set())
    waiting = asyncio.create_task(post_score(client, VALID))
    await asyncio.sleep(0.05)
    assert not engine.reload_entered.is_set()  # the swap waits for the in-flight request
    assert len(engine.calls) == 1  # the new request waits at the gate
    status, body = await load(client, "again", second)  # one swap at a time
    assert (status, error_of(body)["type"]) == (409, "conflict")

    score_gate.set()
    status, body = await in_flight
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    assert body["model"] == "fake-rm"
    await engine.reload_entered.wait()
    await asyncio.sleep(0.05)
    assert len(engine.calls) == 1 and not waiting.done()  # still gated while weights load
    reload_gate.set()
    assert (await swapping)[0] == 200
    status, body = await waiting
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx((14.55, 14.41))
    assert body["model"] == "step-1"
    assert engine.mixed == 0
    assert all(math.isfinite(r) for r in body["results"][0]["rewards"])


async def test_request_waiting_past_swap_wait_s_gets_503(make_swap_client, roots):
    _, original, second = roots
    reload_gate = asyncio.Event()
    engine = ReloadableFakeEngine(checkpoint_dir=str(original), reload_gate=reload_gate)
    client, _ = await make_swap_client(engine=engine, swap_wait_s=0.0)
    swapping = asyncio.create_task(load(client, "step-1", second))
    await engine.reload_entered.wait()
    async with client.post("/v1/score", json=VALID) as resp:
        body = orjson.loads(await resp.read())
        assert (resp.status, error_of(body)["type"]) == (503, "engine_not_ready")
        assert resp.headers["Retry-After"] == "5"
    reload_gate.set()
    assert (await swapping)[0] == 200
    assert engine.mixed == 0
    assert await rewards(client) == pytest.approx((14.55, 14.41))


async def test_failed_reload_keeps_serving(make_swap_client, roots):
    """A reload that fails (here before touching anything) is followed by a reload of the
    previous checkpoint, which then serves on under its name, fingerprint and swap count."""
    root, original, _ = roots
    broken = write_fake_checkpoint(root / "broken", 1.0)
    original_fingerprint = model_fingerprint(original, None)
    engine = ReloadableFakeEngine(checkpoint_dir=str(original),
                                  model=msgspec.structs.replace(FAKE_MODEL, fingerprint=original_fingerprint))
    reload_for_real = engine.reload_weights

    async def failing_reload(path):
        if path == str(broken.resolve()):
            raise RuntimeError("weights file is corrupt")
        return await reload_for_real(path)

    engine.reload_weights = failing_reload
    client, _ = await make_swap_client(engine=engine)
    status, body = await load(client, "x", broken)
    assert (status, error_of(body)["type"]) == (500, "engine_error")
    assert error_of(body)["message"] == (
        "reloading the weights of checkpoint 'broken' failed (RuntimeError: weights file is corrupt); the previous "
        f"checkpoint 'step-0' was reloaded and is served again (fingerprint {original_fingerprint})"
    )
    assert engine.reloads == [str(original.resolve())]  # the restore (the failing call never reached the fake)
    info = await model_info(client)
    assert (info.name, info.fingerprint, info.swap_count) == ("fake-rm", original_fingerprint, 0)
    await assert_serves(client)
    samples = await scrape(client)
    assert samples[("rmserve_checkpoint_swaps_total", (("kind", "reload"), ("outcome", "error")))] == 1


@pytest.mark.parametrize(("kwargs", "field"), [({"admin_token": " "}, "admin_token"),
                                               ({"checkpoint_roots": ("/nonexistent-root",)}, "checkpoint_roots"),
                                               ({"swap_wait_s": -1.0}, "swap_wait_s"),
                                               ({"swap_drain_timeout_s": -0.5}, "swap_drain_timeout_s")])
def test_server_config_rejects_bad_swap_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**kwargs)


def test_server_config_hides_admin_token():
    assert TOKEN not in repr(ServerConfig(admin_token=TOKEN))


async def test_successful_swap_clears_the_result_cache_and_a_refused_one_keeps_it(make_swap_client, roots):
    root, original, second = roots
    client, engine = await make_swap_client()
    cache = client.app[RESULT_CACHE_KEY]
    assert await rewards(client) == pytest.approx(BASE_REWARDS)
    assert len(cache) == 1  # the one group of VALID
    other_shape = write_fake_checkpoint(root / "wide", 5.0, hidden_size=16)
    status, body = await load(client, "wide", other_shape)  # this engine cannot restart: refused
    assert (status, error_of(body)["type"]) == (409, "conflict")
    assert len(cache) == 1
    status, body = await load(client, "step-1", second)
    assert status == 200, body
    assert len(cache) == 0
    assert await rewards(client, "step-1") == pytest.approx((14.55, 14.41))
    assert len(engine.calls) == 2  # the same tokens were scored again, on the new weights
    # The same checkpoint loaded again (a sweep resuming) keeps its answers: no engine work.
    status, body = await load(client, "step-1", second)
    assert status == 200, body
    assert len(cache) == 1
    assert await rewards(client, "step-1") == pytest.approx((14.55, 14.41))
    assert len(engine.calls) == 2


async def test_a_server_started_with_a_chat_template_says_so_before_and_after_a_swap(make_swap_client, roots, tmp_path):
    """``chat_template_override`` is the digest of the --chat-template file's text (sha256, 16 hex,
    worked out here), kept across a swap: the template applies to every checkpoint loaded;
    a server without one leaves the field out of its JSON."""
    import hashlib
    from types import SimpleNamespace

    _, original, second = roots
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    digest = hashlib.sha256(template.read_bytes()).hexdigest()[:16]
    engine = ReloadableFakeEngine(checkpoint_dir=str(original))
    engine.config = SimpleNamespace(chat_template=str(template))
    client, _ = await make_swap_client(engine=engine)
    assert (await model_info(client)).chat_template_override == digest
    status, body = await load(client, "step-1", second)
    assert status == 200, body
    assert (await model_info(client)).chat_template_override == digest

    plain, _ = await make_swap_client()
    async with plain.get("/v1/models") as resp:
        assert "chat_template_override" not in orjson.loads(await resp.read())["models"][0]
