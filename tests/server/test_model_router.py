"""Several models in one server (``rmserve.server.http.node``) over fake engines.

Two fake engines differ by their reward offset: model ``a`` adds 0, model ``b`` adds 10. For
the group (prompt "hi", answers "yo"/"ya") the fake rewards are 4.55 and 4.41 (worked out in
``test_app.py``: ``sum(ids) % 1000 / 100`` over the fake tokenizer's ids), so ``a`` answers
4.55 / 4.41 and ``b`` 14.55 / 14.41. Users come from the ``X-Test-User`` header (the stand-in
for the authentication middleware used in ``test_leases.py``).
"""

from __future__ import annotations

import asyncio

import msgspec
import orjson
import pytest
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from rmserve.server.http.app import create_app
from rmserve.server.config import EngineConfig, ModelSpec, ServerConfig, node_engine_configs
from rmserve.server.sharing.limits import LIMITS_KEY
from rmserve.server.http.node import MODELS_KEY, create_node_app, merge_queue_replies, model_states
from rmserve.server.http.queue_routes import QueueReply, UserQueue
from rmserve.server.sharing.users import User

TOKEN = "s3cret-token"
USERS = {"alice": User("alice"), "bob": User("bob"), "root": User("root", role="admin")}


def group_body(model: str | None, **extra) -> dict:
    body = {"groups": [{"id": "g1", "prompt": "hi", "responses": ["yo", "ya"]}], **extra}
    if model is not None:
        body["model"] = model
    return body


user_from_test_header = user_header_middleware(USERS)


@pytest.fixture
def make_node(aiohttp_client, tmp_path):
    root = tmp_path / "ckpts"
    step = write_fake_checkpoint(root / "step-5", 5.0)

    async def make(start_gate_b: asyncio.Event | None = None, fail_b: BaseException | None = None):
        config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),))
        engines = {
            "a": ReloadableFakeEngine(model=msgspec.structs.replace(FAKE_MODEL, name="a", fingerprint="fp-a"),
                                      checkpoint_dir=str(step)),
            "b": FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, name="b", fingerprint="fp-b"),
                            reward_offset=10.0, start_gate=start_gate_b, start_error=fail_b),
        }
        apps = [(name, create_app(ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),),
                                               served_model_name=name), engine, FakeRenderer()))
                for name, engine in engines.items()]
        node = create_node_app(config, apps)
        node.middlewares.append(user_from_test_header)
        client = await aiohttp_client(node)
        return client, node, engines, step

    return make


async def wait_settled(node) -> None:
    async with asyncio.timeout(10):
        for state in model_states(node):
            await state.settled.wait()


async def test_each_request_is_scored_by_the_model_it_names(make_node):
    client, node, engines, _ = await make_node()
    await wait_settled(node)
    for model, rewards in (("a", [4.55, 4.41]), ("b", [14.55, 14.41])):
        reply = await client.post("/v1/score", data=orjson.dumps(group_body(model)))
        assert reply.status == 200, await reply.text()
        body = await reply.json()
        assert body["model"] == model and body["fingerprint"] == f"fp-{model}"
        assert body["results"][0]["rewards"] == rewards
    assert [len(e.calls) for e in engines.values()] == [1, 1]


async def test_a_request_without_model_or_with_an_unknown_one_is_refused(make_node):
    client, node, engines, _ = await make_node()
    await wait_settled(node)
    reply = await client.post("/v1/score", data=orjson.dumps(group_body(None)))
    assert reply.status == 400
    error = (await reply.json())["error"]
    assert error["field"] == "model" and "'a', 'b'" in error["message"]
    reply = await client.post("/v1/score", data=orjson.dumps(group_body("c")))
    assert reply.status == 404
    error = (await reply.json())["error"]
    assert error["type"] == "model_not_found" and "'c'" in error["message"] and "'a', 'b'" in error["message"]
    assert [len(e.calls) for e in engines.values()] == [0, 0]


async def test_classify_on_a_node_is_scored_by_the_model_it_names(make_node):
    """"hi" tokenized with the fake's BOS: [1, 104, 105] → 2.10; model b adds its offset 10."""
    client, node, engines, _ = await make_node()
    await wait_settled(node)
    for model, reward in (("a", 2.10), ("b", 12.10)):
        reply = await client.post("/classify", data=orjson.dumps({"model": model, "input": "hi", "use_activation": False}))
        assert reply.status == 200, await reply.text()
        body = await reply.json()
        assert body["model"] == model and body["rmserve"]["fingerprint"] == f"fp-{model}"
        assert body["data"][0]["probs"] == [pytest.approx(reward, abs=1e-12)]
    reply = await client.post("/classify", data=orjson.dumps({"input": "hi"}))
    assert reply.status == 400
    assert (await reply.json())["error"]["field"] == "model"
    assert [len(e.calls) for e in engines.values()] == [1, 1]


async def test_models_lists_every_model_with_its_fingerprint_and_lease(make_node):
    client, node, engines, step = await make_node()
    await wait_settled(node)
    reply = await client.post("/v1/models/load", data=orjson.dumps({"name": "a-5", "path": str(step), "model": "a"}),
                              headers={"Authorization": f"Bearer {TOKEN}", "X-Test-User": "alice"})
    assert reply.status == 200, await reply.text()
    models = (await (await client.get("/v1/models")).json())["models"]
    assert [m["name"] for m in models] == ["a-5", "b"]
    assert models[0]["lease_holder"] == "alice" and models[0]["swap_count"] == 1
    assert "lease_holder" not in models[1] and models[1]["fingerprint"] == "fp-b"
    swaps = (await (await client.get("/v1/status")).json())["swaps"]
    assert [(s["user"], s["model"], s["old_fingerprint"], s["forced"]) for s in swaps] == [("alice", "a-5", "fp-a", False)]
    # the swapped model answers under its new name; the other is untouched
    body = await (await client.post("/v1/score", data=orjson.dumps(group_body("a-5")))).json()
    assert body["model"] == "a-5" and body["results"][0]["rewards"] == [9.55, 9.41]
    body = await (await client.post("/v1/score", data=orjson.dumps(group_body("b")))).json()
    assert body["results"][0]["rewards"] == [14.55, 14.41]


async def test_a_load_must_name_which_model_it_replaces(make_node):
    client, node, _, step = await make_node()
    await wait_settled(node)
    reply = await client.post("/v1/models/load", data=orjson.dumps({"name": "x", "path": str(step)}),
                              headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status == 400 and (await reply.json())["error"]["field"] == "model"


async def test_health_waits_for_every_model_and_engines_start_in_order(make_node):
    gate = asyncio.Event()
    client, node, engines, _ = await make_node(start_gate_b=gate)
    async with asyncio.timeout(10):
        await model_states(node)[0].settled.wait()
    reply = await client.get("/health")
    assert reply.status == 503 and (await reply.json())["status"] == "loading"
    reply = await client.get("/v1/models")
    assert reply.status == 503 and "'b'" in (await reply.json())["error"]["message"]
    gate.set()
    await wait_settled(node)
    assert (await client.get("/health")).status == 200


async def test_a_failed_model_stops_the_server_from_becoming_ready(make_node):
    client, node, engines, _ = await make_node(fail_b=RuntimeError("no weights"))
    await wait_settled(node)
    assert [s.status for s in model_states(node)] == ["ready", "failed"]
    reply = await client.get("/health")
    assert reply.status == 503 and (await reply.json())["status"] == "failed"


async def test_limits_are_shared_and_metrics_carry_the_model(make_node):
    client, node, engines, _ = await make_node()
    await wait_settled(node)
    apps = node[MODELS_KEY].apps
    assert apps["a"][LIMITS_KEY] is node[LIMITS_KEY] is apps["b"][LIMITS_KEY]
    for model in ("a", "b", "b"):
        assert (await client.post("/v1/score", data=orjson.dumps(group_body(model)))).status == 200
    text = await (await client.get("/metrics")).text()
    assert 'rmserve_groups_total{model="a"} 1.0' in text
    assert 'rmserve_groups_total{model="b"} 1.0' in text  # b's second identical group came from its result cache
    assert 'rmserve_result_cache_hits_total{model="b"} 1.0' in text
    assert "rmserve_groups_total 0.0" not in text  # the node's own, never-moved counter is left out
    assert 'rmserve_requests_total{endpoint="/v1/score",status="200"} 3.0' in text
    status = await (await client.get("/v1/status")).json()
    assert status["status"] == "ready" and status["groups_scored"] == 2
    assert [lease["model"] for lease in status["leases"]] == ["a", "b"]


def entry(user: str, queued: int, wait: float | None) -> UserQueue:
    return UserQueue(user, 1.0, queued, 10 * queued, 1, 7, 2, 20, 3.5, wait)


def test_queue_replies_of_several_models_are_summed():
    one = QueueReply("alice", True, True, 64, 1, 3, 100.0, (entry("alice", 3, 2.0), entry("bob", 0, 0.0)))
    two = QueueReply("alice", True, True, 64, 2, 5, 50.0, (entry("alice", 5, 4.5),))
    merged = merge_queue_replies([one, two])
    assert (merged.concurrency, merged.inflight_groups, merged.queued_groups, merged.tokens_per_s) == (128, 3, 8, 150.0)
    alice, bob = merged.users
    assert (alice.user, alice.queued_groups, alice.queued_tokens, alice.inflight_groups, alice.estimated_wait_s) == (
        "alice", 8, 80, 2, 4.5)
    assert (alice.served_groups, alice.tokens_per_s) == (4, 7.0)
    assert (bob.user, bob.queued_groups) == ("bob", 0)
    unknown = QueueReply("alice", False, True, 64, 0, 1, 0.0, (entry("alice", 1, None),))
    assert merge_queue_replies([one, unknown]).users[0].estimated_wait_s is None


def test_model_specs_parse_and_share_memory():
    specs = [ModelSpec.parse("a=/ckpt/a,gpu_memory_utilization=0.5"), ModelSpec.parse("b=/ckpt/b"),
             ModelSpec.parse(" c = /ckpt/c ,kv_cache_memory_bytes=2097152")]
    assert specs[2] == ModelSpec("c", "/ckpt/c", kv_cache_memory_bytes=2097152)
    configs = node_engine_configs(EngineConfig(model="/ckpt/a", gpu_memory_utilization=0.9), specs)
    assert [(c.model, c.name, c.gpu_memory_utilization, c.kv_cache_memory_bytes) for c in configs] == [
        ("/ckpt/a", "a", 0.5, None), ("/ckpt/b", "b", 0.2, None), ("/ckpt/c", "c", 0.2, 2097152)]
    configs = node_engine_configs(EngineConfig(model="/x", kv_cache_memory_bytes=3 << 20), specs[1:2] * 1 + [
        ModelSpec("d", "/ckpt/d")])
    assert [c.kv_cache_memory_bytes for c in configs] == [(3 << 20) // 2] * 2
    for bad, words in (("a", "NAME=PATH"), ("=/x", "NAME=PATH"), ("a=", "empty"), ("a b=/x", "spaces"),
                       ("a=/x,colour=red", "colour=red"), ("a=/x,gpu_memory_utilization=lots", "not a number")):
        with pytest.raises(ValueError, match=words):
            ModelSpec.parse(bad)
    with pytest.raises(ValueError, match="more than once"):
        node_engine_configs(EngineConfig(model="/x"), [ModelSpec("a", "/x"), ModelSpec("a", "/y")])
    with pytest.raises(ValueError, match="gpu_memory_utilization: the models' own fractions sum to 0.95"):
        node_engine_configs(EngineConfig(model="/x"), [ModelSpec("a", "/x", 0.95), ModelSpec("b", "/y")])
