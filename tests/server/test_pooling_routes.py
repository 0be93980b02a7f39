"""vLLM-compatible ``POST /classify`` and ``POST /pooling`` over the fake engine and renderer.

Numbers by hand from the fakes' rules (``fakes.py``): a text is tokenized as it is, code points,
with the fake's BOS ``1`` first (``add_special_tokens``, vLLM's default); reward =
``sum(ids) % 1000 / 100``; σ(x) = 1 / (1 + e^(−x)).

- "hi" → ``[1, 104, 105]`` (sum 210): reward 2.10, σ 0.8909031788043871; without special
  tokens ``[104, 105]`` (209): 2.09.
- "yo" → ``[1, 121, 111]`` (233): 2.33, σ 0.9113313367452667.
- token ids ``[5, 6, 7]`` (18): 0.18, σ 0.5448788923735801.
- "b" + 69 × "a" → 71 tokens, over ``max_model_len`` 64. Cut to 10 on the right:
  ``[1, 98] + 8 × [97]`` (875): 8.75; on the left (BOS kept): ``[1] + 9 × [97]`` (874): 8.74;
  61 tokens cut either way.
"""

from __future__ import annotations

import datetime as dt

import orjson
import pytest
from testkit.app_client import fake_app_client, metric_samples
from testkit.fakes import FakeEngine, FakeRenderer
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.kinds.dpo import DPOKind
from rmserve.server.sharing.auth import add_user

LONG = "b" + "a" * 69


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def client(aiohttp_client, engine):
    return await fake_app_client(aiohttp_client, ServerConfig(port=0), engine)


async def post(client, path: str, payload, headers=None) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    async with client.post(path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_classify_answers_vllm_fields_with_sigmoid_by_default(client, engine):
    status, body = await post(client, "/classify", {"model": "fake-rm", "input": ["hi", "yo"], "request_id": "r1"})
    assert status == 200, body
    assert body["id"] == "classify-r1"
    assert body["object"] == "list"
    assert isinstance(body["created"], int)
    assert body["model"] == "fake-rm"
    assert body["data"] == [
        {"index": 0, "label": None, "probs": [pytest.approx(0.8909031788043871, abs=1e-12)], "num_classes": 1},
        {"index": 1, "label": None, "probs": [pytest.approx(0.9113313367452667, abs=1e-12)], "num_classes": 1},
    ]
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6, "completion_tokens": 0,
                             "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": None}
    assert body["rmserve"] == {"activation": "sigmoid", "fingerprint": "fp-fake-1"}
    # each input is its own engine call, sent as tokenized (BOS from the tokenizer, no template)
    assert sorted(ids for _, (ids,) in engine.calls) == [(1, 104, 105), (1, 121, 111)]


@pytest.mark.parametrize("switch", [{"activation": False}, {"use_activation": False},
                                    {"activation": True, "use_activation": False}])
async def test_classify_with_either_switch_false_answers_the_raw_reward(client, switch):
    status, body = await post(client, "/classify", {"input": "hi", **switch})
    assert status == 200, body
    assert body["data"][0]["probs"] == [pytest.approx(2.10, abs=1e-12)]
    assert body["rmserve"]["activation"] == "none"


async def test_classify_raw_values_equal_v1_score_rewards_of_the_same_ids(client):
    """A /v1/score group renders the template; /classify of the same token ids, as ids, gives
    the same reward (prompt "hi", response "yo": 9 tokens, reward 4.55, see test_app.py)."""
    ids = [1, 4, 104, 105, 2, 5, 121, 111, 2]
    status, body = await post(client, "/classify", {"input": [ids], "use_activation": False})
    assert status == 200, body
    status, scored = await post(client, "/v1/score", {"groups": [{"id": "g", "prompt": "hi", "responses": ["yo"]}]})
    assert status == 200
    assert body["data"][0]["probs"] == [pytest.approx(4.55, abs=1e-12)]
    assert scored["results"][0]["rewards"] == [pytest.approx(4.55, abs=1e-12)]


async def test_token_id_inputs_and_no_special_tokens(client):
    status, body = await post(client, "/classify", {"input": [5, 6, 7]})
    assert status == 200, body
    assert body["data"][0]["probs"] == [pytest.approx(0.5448788923735801, abs=1e-12)]
    assert body["usage"]["prompt_tokens"] == 3
    status, body = await post(client, "/classify", {"input": "hi", "add_special_tokens": False, "activation": False})
    assert status == 200, body
    assert body["data"][0]["probs"] == [pytest.approx(2.09, abs=1e-12)]


async def test_pooling_answers_the_pooling_shape(client):
    status, body = await post(client, "/pooling", {"input": ["hi"], "use_activation": False, "task": "classify",
                                                   "request_id": "p7"})
    assert status == 200, body
    assert body["id"] == "pooling-p7"
    assert body["object"] == "list"
    assert body["data"] == [{"index": 0, "object": "pooling", "data": [pytest.approx(2.10, abs=1e-12)]}]
    assert body["rmserve"] == {"activation": "none", "fingerprint": "fp-fake-1"}


async def test_an_over_length_input_is_a_per_input_error_naming_the_limit(client, engine):
    status, body = await post(client, "/classify", {"input": [LONG, "hi"], "activation": False})
    assert status == 200, body
    assert body["data"][0] == {
        "index": 0, "label": None, "probs": None, "num_classes": 1,
        "error": {"type": "sequence_too_long",
                  "message": "71 tokens, over max_model_len=64; shorten it or send truncate_prompt_tokens"},
    }
    assert body["data"][1]["probs"] == [pytest.approx(2.10, abs=1e-12)]
    assert body["usage"]["prompt_tokens"] == 3  # only what was sent
    assert [ids for _, (ids,) in engine.calls] == [(1, 104, 105)]  # the long input never reached the engine


@pytest.mark.parametrize(("side", "reward"), [("right", 8.75), ("left", 8.74)])
async def test_truncate_prompt_tokens_cuts_and_reports(client, side, reward):
    status, body = await post(client, "/classify", {"input": LONG, "truncate_prompt_tokens": 10,
                                                    "truncation_side": side, "use_activation": False})
    assert status == 200, body
    assert body["data"][0]["probs"] == [pytest.approx(reward, abs=1e-12)]
    assert body["rmserve"]["truncated_tokens"] == [61]
    assert body["usage"]["prompt_tokens"] == 10


async def test_truncate_prompt_tokens_minus_one_is_the_max_length(client):
    status, body = await post(client, "/classify", {"input": LONG, "truncate_prompt_tokens": -1})
    assert status == 200, body
    assert body["rmserve"]["truncated_tokens"] == [7]  # 71 → 64 (right: the fake tokenizer has no side)
    assert body["usage"]["prompt_tokens"] == 64


@pytest.mark.parametrize(("payload", "field", "words"), [
    ({}, "input", "missing required field `input`"),
    ({"input": []}, "input", "at least one"),
    ({"input": ["a", [1, 2]]}, "input[1]", "input[1] is a token-id list but input[0] is a text"),
    ({"input": [[1], []]}, "input[1]", "empty token-id list"),
    ({"input": [[1, -3]]}, "input[0][1]", "token ids are ≥ 0"),
    ({"input": "hi", "messages": []}, "messages", "unknown field"),
    ({"input": "hi", "truncate_prompt_tokens": 1}, "truncate_prompt_tokens", "-1 (the model's max length) or between 2"),
    ({"input": "hi", "truncate_prompt_tokens": 65}, "truncate_prompt_tokens", "at most the model's max length 64"),
    ({"input": "hi", "priority": 3}, "priority", "X-RMServe-Priority"),
    ({"input": "hi", "use_activation": "no"}, "use_activation", "Expected `bool | null`"),
    ({"input": "", "add_special_tokens": False}, "input[0]", "no token"),
    ({"input": [[0x110000]]}, "input[0][0]", "the tokenizer has 1114112"),
])
async def test_wrong_shapes_are_400_naming_the_field(client, payload, field, words):
    status, body = await post(client, "/classify", payload)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request"
    assert body["error"]["field"] == field
    assert words in body["error"]["message"]


@pytest.mark.parametrize(("payload", "field"), [({"task": "embed"}, "task"), ({"encoding_format": "base64"},
                                                 "encoding_format"), ({"dimensions": 8}, "dimensions")])
async def test_pooling_options_rmserve_cannot_honour_are_400(client, payload, field):
    status, body = await post(client, "/pooling", {"input": "hi", **payload})
    assert status == 400, body
    assert body["error"]["field"] == field


async def test_another_kind_is_400_naming_it(aiohttp_client):
    app = create_app(ServerConfig(port=0), FakeEngine(), FakeRenderer(), kind=DPOKind())
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    status, body = await post(client, "/classify", {"input": "hi"})
    assert status == 400
    assert body["error"]["field"] == "model"
    assert body["error"]["message"] == ("POST /classify serves sequence classifiers (kind classifier); "
                                        "this model is kind dpo: use POST /v1/score")


async def test_an_unknown_model_is_404(client):
    status, body = await post(client, "/classify", {"input": "hi", "model": "other"})
    assert status == 404
    assert body["error"]["type"] == "model_not_found"


@pytest.fixture
def users_config(tmp_path):
    """A users file with alice (max_inflight_groups 1) and an expired user; built outside the
    event loop (it writes and reads the file). Returns (config, alice's token, old's token)."""
    path = tmp_path / "users.jsonl"
    alice, _ = add_user(path, "alice", max_inflight_groups=1)
    old, _ = add_user(path, "old", expires=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    return ServerConfig(port=0, users_file=str(path)), alice, old


async def test_classify_goes_through_auth_user_limits_and_metrics(aiohttp_client, users_config, engine):
    config, alice, old = users_config
    client = await fake_app_client(aiohttp_client, config, engine)
    status, body = await post(client, "/classify", {"input": "hi"})
    assert status == 401
    status, body = await post(client, "/classify", {"input": "hi"}, {"Authorization": f"Bearer {old}"})
    assert status == 401
    auth = {"Authorization": f"Bearer {alice}"}
    status, body = await post(client, "/classify", {"input": "hi"}, auth)
    assert status == 200, body
    # each input is one group: two inputs are over alice's max_inflight_groups=1
    status, body = await post(client, "/classify", {"input": ["hi", "yo"]}, auth)
    assert status == 413, body  # the request alone is over the limit: it could never be admitted
    assert (body["error"]["type"], body["error"]["field"]) == ("request_over_limit", "input")
    assert body["error"]["limit"] == {"name": "user.max_inflight_groups", "unit": "groups", "limit": 1, "requested": 2}
    assert body["error"]["message"].endswith("(each input is one group)")
    assert "max_inflight_groups" in body["error"]["message"]
    async with client.get("/metrics", headers=auth) as resp:
        metrics = metric_samples(await resp.text())
    assert metrics[("rmserve_user_requests_total", (("endpoint", "/classify"), ("status", "200"), ("user", "alice")))] == 1
    assert metrics[("rmserve_groups_total", ())] == 1
