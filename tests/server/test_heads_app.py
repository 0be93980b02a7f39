"""Reward heads through the real app over fake engines: ``/v1/models``, score replies and the
client's records say which head, engine and attention implementation scored; a checkpoint swap
to another head is refused with 422 naming both heads, and the server keeps serving.

Rewards by hand (``fakes.py``, worked in ``test_app.py``): for ``VALID`` the fake gives 4.55 and
4.41, plus the reward offset of the fake checkpoint loaded last.
"""

from __future__ import annotations

import msgspec
import orjson
import pytest
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from rmserve.client.client import RewardClient
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.kinds.classifier import ClassifierKind
from rmserve.server.kinds.heads import HeadSettings
from test_app import VALID, error_of, post_score

from rmserve.schema import CLASSIFIER_REWARD_HEAD, Group, Message, RewardHead, Scorer

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE_REWARDS = (4.55, 4.41)
KEEPS_THE_HEAD = (
    "and a swap keeps the head (the fingerprint and what the rewards mean); start a server on this checkpoint instead"
)


@pytest.fixture
def make_client(aiohttp_client, tmp_path):
    """An app over ``engine`` serving the classifier kind with ``settings``; checkpoint root ``tmp_path/ckpts``."""
    root = tmp_path / "ckpts"
    root.mkdir()

    async def make(engine, settings: HeadSettings = HeadSettings()):
        config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(root),))
        app = create_app(config, engine, FakeRenderer(), kind=ClassifierKind(settings))
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client, app

    return root, make


async def _load(client, path) -> tuple[int, dict]:
    async with client.post("/v1/models/load", json={"name": path.name, "path": str(path)}, headers=AUTH) as resp:
        return resp.status, orjson.loads(await resp.read())


async def _models(client) -> dict:
    async with client.get("/v1/models") as resp:
        assert resp.status == 200
        (info,) = orjson.loads(await resp.read())["models"]
    return info


async def test_models_replies_and_records_say_what_scored(make_client):
    _, make = make_client
    head = RewardHead("multi-label", label_index=1)
    engine = FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, head=head, attention="fake-attn"))
    client, _ = await make(engine, HeadSettings(label_index=1))
    info = await _models(client)
    assert (info["engine"], info["head"], info["attention"]) == ("fake", {"name": "multi-label", "label_index": 1},
                                                                 "fake-attn")
    status, body = await post_score(client, VALID)
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    assert body["scorer"] == {"engine": "fake", "attention": "fake-attn", "head": {"name": "multi-label", "label_index": 1}}
    group = Group("rm-bench", "chat", "1", (Message("user", "hi"),), ("yo", "ya"), 1)
    async with RewardClient(str(client.make_url("")), session=client.session) as reward_client:
        records = [record async for record in reward_client.score_stream([group])]
    assert [r.scorer for r in records] == [Scorer(engine="fake", attention="fake-attn", head=head)]


async def test_an_engine_that_reports_no_head_leaves_replies_as_they_were(make_client):
    _, make = make_client
    client, _ = await make(FakeEngine())
    assert {"head", "attention"}.isdisjoint(await _models(client))
    status, body = await post_score(client, VALID)
    assert status == 200 and "scorer" not in body


async def test_a_swap_to_another_head_is_refused_and_the_server_keeps_serving(make_client):
    root, make = make_client
    original = write_fake_checkpoint(root / "step-0", 0.0)
    engine = ReloadableFakeEngine(checkpoint_dir=str(original),
                                  model=msgspec.structs.replace(FAKE_MODEL, head=CLASSIFIER_REWARD_HEAD))
    client, app = await make(engine)
    three = write_fake_checkpoint(root / "three-labels", 10.0, num_labels=3)
    status, body = await _load(client, three)
    assert (status, error_of(body)) == (422, {
        "type": "invalid_checkpoint", "field": "path",
        "message": "checkpoint 'three-labels/config.json': has 3 labels (num_labels/id2label), so the multi-label "
                   f"head; the served model has the classifier head, {KEEPS_THE_HEAD}",
    })
    status, body = await post_score(client, VALID)
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    assert (engine.reloads, app[STATE_KEY].info.swap_count) == ([], 0)
    # the same head loads
    status, body = await _load(client, write_fake_checkpoint(root / "step-1", 10.0))
    assert status == 200, body
    assert tuple((await post_score(client, VALID))[1]["results"][0]["rewards"]) == pytest.approx((14.55, 14.41))


async def test_a_multi_label_server_keeps_its_label_rule_across_swaps(make_client):
    root, make = make_client
    original = write_fake_checkpoint(root / "step-0", 0.0, num_labels=3)
    head = RewardHead("multi-label", label_index=2)
    engine = ReloadableFakeEngine(checkpoint_dir=str(original), model=msgspec.structs.replace(FAKE_MODEL, head=head))
    client, _ = await make(engine, HeadSettings(label_index=2))
    one = write_fake_checkpoint(root / "one-label", 10.0)
    status, body = await _load(client, one)
    assert (status, error_of(body)["message"]) == (422, (
        "checkpoint 'one-label/config.json': has 1 label (num_labels/id2label), so the classifier head; the served "
        f"model has the multi-label (label 2) head, {KEEPS_THE_HEAD}"))
    two = write_fake_checkpoint(root / "two-labels", 10.0, num_labels=2)
    status, body = await _load(client, two)
    assert (status, error_of(body)["message"]) == (422, (
        "checkpoint 'two-labels/config.json': has 2 labels (num_labels/id2label); --label-index 2 is out of range "
        "(0 … 1)"))
    assert engine.reloads == []
    status, body = await post_score(client, VALID)
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)
    status, body = await _load(client, write_fake_checkpoint(root / "step-1", 10.0, num_labels=3))
    assert status == 200, body
    assert engine.reloads == [str(root / "step-1")]


async def test_an_lm_logit_server_refuses_a_classifier_checkpoint(make_client):
    root, make = make_client
    original = write_fake_checkpoint(root / "step-0", 0.0)
    head = RewardHead("lm-logit", token_id=0)
    engine = ReloadableFakeEngine(checkpoint_dir=str(original), model=msgspec.structs.replace(FAKE_MODEL, head=head))
    client, _ = await make(engine, HeadSettings(choice="lm-logit"))
    status, body = await _load(client, write_fake_checkpoint(root / "step-1", 10.0))
    assert (status, error_of(body)["message"]) == (422, (
        "checkpoint 'step-1/config.json': has architectures ['FakeForSequenceClassification']; the lm-logit head "
        "reads the LM head of a causal LM (*ForCausalLM or *LMHeadModel); a *ForSequenceClassification is served "
        "with the classifier or multi-label head (leave out --head)"))
    assert engine.reloads == []


@pytest.mark.parametrize("route", ["/classify", "/pooling"])
async def test_vllm_routes_refuse_a_multi_label_head(make_client, route):
    _, make = make_client
    head = RewardHead("multi-label", label_weights=(0.5, 0.5))
    client, _ = await make(FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, head=head)),
                           HeadSettings(label_weights=(0.5, 0.5)))
    async with client.post(route, json={"input": "hi"}) as resp:
        status, body = resp.status, orjson.loads(await resp.read())
    assert (status, error_of(body)) == (400, {
        "type": "invalid_request", "field": "model",
        "message": f"POST {route} answers as vLLM's classify task, which gives every label; this model has the "
                   "multi-label (weights 0.5, 0.5) head, which reads one reward from its labels: use POST /v1/score "
                   "or POST /get_reward",
    })
    status, body = await post_score(client, VALID)  # /v1/score reads the head's one reward
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)


def _with_own_code(folder):
    """Turn a fake checkpoint into one that ships its own reward model class (``auto_map``), as
    ArmoRM does; returns the folder."""
    import json

    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["GatedRewardModel"],
                  auto_map={"AutoModelForSequenceClassification": "modeling_gated_rm.GatedRewardModel"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_gated_rm.py").write_text("# the checkpoint's own code\n")
    return folder


async def test_a_swap_to_a_checkpoint_with_its_own_code_needs_trust_remote_code(make_client):
    """A classifier server refuses (422) a checkpoint that ships its own reward model class (another
    head, named as such) and keeps serving; a server started with --trust-remote-code on such a
    checkpoint (the remote-code head) loads the next one and refuses a plain classifier (another
    architecture); the same
    folder under settings without the flag is refused naming it."""
    root, make = make_client
    engine = ReloadableFakeEngine(checkpoint_dir=str(write_fake_checkpoint(root / "step-0", 0.0)),
                                  model=msgspec.structs.replace(FAKE_MODEL, head=CLASSIFIER_REWARD_HEAD))
    client, _ = await make(engine)
    status, body = await _load(client, _with_own_code(write_fake_checkpoint(root / "armo", 10.0)))
    assert (status, error_of(body)["message"]) == (422, (
        "checkpoint 'armo/config.json': has its own reward model class (modeling_gated_rm.GatedRewardModel), so the "
        f"remote-code head; the served model has the classifier head, {KEEPS_THE_HEAD}"))
    assert engine.reloads == []
    status, body = await post_score(client, VALID)
    assert status == 200 and tuple(body["results"][0]["rewards"]) == pytest.approx(BASE_REWARDS)

    remote = RewardHead("remote-code")
    engine = ReloadableFakeEngine(checkpoint_dir=str(_with_own_code(write_fake_checkpoint(root / "armo-0", 0.0))),
                                  model=msgspec.structs.replace(FAKE_MODEL, head=remote))
    client, _ = await make(engine, HeadSettings(trust_remote_code=True))
    status, body = await _load(client, _with_own_code(write_fake_checkpoint(root / "armo-1", 10.0)))
    assert status == 200, body
    assert engine.reloads == [str(root / "armo-1")]
    status, body = await _load(client, write_fake_checkpoint(root / "plain", 10.0))
    assert (status, error_of(body)["message"]) == (409, (
        "checkpoint 'plain' has a different architecture/shape (architectures: ['GatedRewardModel'] → "
        "['FakeForSequenceClassification']); restart the server on it (this engine cannot restart itself on another "
        "checkpoint)"))
    client, _ = await make(engine, HeadSettings())
    status, body = await _load(client, _with_own_code(write_fake_checkpoint(root / "armo-2", 20.0)))
    assert (status, error_of(body)["message"]) == (422, (
        "checkpoint 'armo-2/config.json': has its own modeling code (auto_map AutoModelForSequenceClassification: "
        "modeling_gated_rm.GatedRewardModel), which rmserve runs only when the server is started with "
        "--trust-remote-code (it executes the checkpoint's Python files; off by default), on the transformers "
        "engine (--engine hf: vLLM runs no checkpoint code)"))
    assert engine.reloads == [str(root / "armo-1")]
