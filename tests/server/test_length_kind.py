"""The length baseline kind (``--kind length``) through the one scoring path, with a fake tokenizer.

The reward of a response is its own token count (``tokenizer(response, add_special_tokens=False)``),
or minus it with ``length_sign="shortest"``; counted here by hand from the fake tokenizer's rule
(one token per character).
"""

from __future__ import annotations

import orjson
import pytest
from testkit.fakes import FakeTokenizer

from rmserve.server.config import EngineConfig
from rmserve.server.engines.length import LengthEngine
from rmserve.server.engines.protocol import LoadedModel
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.http.serve import engine_renderer
from rmserve.server.kinds.base import kind_of_config
from rmserve.server.kinds.length import LengthKind, response_token_ids
from rmserve.server.render.chat import Renderer
from rmserve.schema import LENGTH_KIND, ModelInfo


class _BatchTokenizer(FakeTokenizer):
    """The fake tokenizer, callable on a batch of texts as transformers tokenizers are."""

    def __call__(self, texts, add_special_tokens=True):
        assert not add_special_tokens
        return {"input_ids": [self.encode(t, add_special_tokens=False) for t in texts]}


class FakeLengthEngine(LengthEngine):
    """:class:`LengthEngine` over the fake tokenizer (no files)."""

    def _load(self) -> LoadedModel:
        self._info = ModelInfo(name="fake-len", max_model_len=1 << 30, dtype="none", engine="tokenizer",
                               fingerprint=f"fp-len-{self.config.length_sign}", kind=LENGTH_KIND,
                               mode=self.config.length_sign)
        return LoadedModel(self._info, Renderer(_BatchTokenizer(), max_model_len=1 << 30))


@pytest.fixture
def make_length(aiohttp_client):
    async def make(sign: str = "longest", **config):
        engine_config = EngineConfig(model="fake", kind="length", length_sign=sign)
        kind = kind_of_config(engine_config)
        assert isinstance(kind, LengthKind)
        app = create_app(ServerConfig(port=0, **config), FakeLengthEngine(engine_config),
                         renderer_factory=engine_renderer, kind=kind)
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client

    return make


GROUP = {"id": "rm-bench/chat/1", "prompt": "a long question", "responses": ["abc", "", "hello world"]}


@pytest.mark.parametrize(("sign", "factor"), [("longest", 1.0), ("shortest", -1.0)])
async def test_rewards_are_the_response_token_counts(make_length, sign, factor):
    client = await make_length(sign)
    async with client.post("/v1/score", data=orjson.dumps({"groups": [GROUP]})) as resp:
        assert resp.status == 200
        body = orjson.loads(await resp.read())
    (result,) = body["results"]
    counts = [len(r) for r in GROUP["responses"]]  # the fake tokenizer: one token per character
    assert result["rewards"] == [factor * c for c in counts]
    assert result["num_tokens"] == counts and result["num_cached_tokens"] == [0, 0, 0]
    assert body["fingerprint"] == f"fp-len-{sign}"
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    assert info["kind"] == "length" and info["mode"] == sign


async def test_truncation_and_swaps_are_refused(make_length):
    client = await make_length(checkpoint_roots=("/tmp",), admin_token="t0ken")
    body = {"groups": [GROUP], "truncation": {"max_tokens": 8, "side": "left"}}
    async with client.post("/v1/score", data=orjson.dumps(body)) as resp:
        reply = orjson.loads(await resp.read())
    assert resp.status == 400 and reply["error"]["field"] == "truncation", reply
    async with client.post("/v1/models/load", json={"name": "x", "path": "/tmp"},
                           headers={"Authorization": "Bearer t0ken"}) as resp:
        reply = orjson.loads(await resp.read())
    assert resp.status == 422 and "length baseline" in reply["error"]["message"]


def test_response_token_ids_tokenize_each_response_alone():
    assert response_token_ids(_BatchTokenizer(), ("ab", "")) == ([ord("a"), ord("b")], [])
    assert response_token_ids(_BatchTokenizer(), ()) == ()


def test_length_sign_is_for_kind_length_only():
    with pytest.raises(ValueError, match="length_sign: only for kind length"):
        EngineConfig(model="m", length_sign="shortest")
    with pytest.raises(ValueError, match="length_sign"):
        EngineConfig(model="m", kind="length", length_sign="middle")
