"""DPOEngine over fake log-prob engines: the reward formulas and extras (worked by hand), the
start-up refusals, policy swaps, and ``POST /v1/score`` / ``POST /v1/models/load`` end to end.

Fake engines (``testkit.dpo_fakes``): log p(token t) = ``-t * scale``; the policy's scale is
0.01, the reference's 0.005. For prompt "hi" and response "ok" the DPO renderer gives
``[1, 4, 104, 105, 2 | 5, 111, 107, 2, 2]`` (answer from index 5), so the answer ids sum to
227 and their squares to 23803:

- Σ policy = −2.27, Σ reference = −1.135 → reference reward −2.27 − (−1.135) = −1.135
- avg = −2.27 / 5 = −0.454; sum = −2.27; norm = −sqrt(23803 · 0.01²) = −sqrt(2.3803)

For "a": ``[… | 5, 97, 2, 2]``, ids sum 106, squares 9442: Σ policy −1.06, Σ reference −0.53.
"""

from __future__ import annotations

import math
import re

import orjson
import pytest
from rmserve.fingerprint import dpo_fingerprint, model_fingerprint
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.config import EngineConfig
from rmserve.server.engines.dpo_pair import DPOEngine, implicit_reward, tokenizer_difference
from rmserve.server.render.dpo import DPORenderer
from rmserve.server.engines.protocol import AnswerLogprobs, SupportsPrefixCacheStats, SupportsRestart, SupportsWeightReload
from rmserve.server.http.serve import engine_renderer
from testkit.dpo_fakes import (
    FAKE_LOGPROB_MAX_LEN, TOKENIZERS, FakeEngines, fake_tokenizer_loader, write_fake_causal_checkpoint,
)
from testkit.fakes import FakeTokenizer

from rmserve.errors import EngineError, InvalidCheckpoint, ServerFault
from rmserve.schema import ModelList, decode

OK_IDS = [1, 4, 104, 105, 2, 5, 111, 107, 2, 2]
A_IDS = [1, 4, 104, 105, 2, 5, 97, 2, 2]
TOKEN = "s3cret"


@pytest.fixture
def ckpts(tmp_path):
    root = tmp_path / "ckpts"
    return {
        "root": root,
        "policy": write_fake_causal_checkpoint(root / "policy", 0.01),
        "reference": write_fake_causal_checkpoint(root / "reference", 0.005),
        "policy2": write_fake_causal_checkpoint(root / "policy-2", 0.02),
        "classifier": write_fake_causal_checkpoint(root / "rm", 0.03, architecture="FakeForSequenceClassification"),
        "other_vocab": write_fake_causal_checkpoint(root / "other-vocab", 0.04, tokenizer="tok-v2"),
        "policy_nobos": write_fake_causal_checkpoint(root / "policy-nobos", 0.01, tokenizer="tok-nobos"),
        "reference_nobos": write_fake_causal_checkpoint(root / "reference-nobos", 0.005, tokenizer="tok-nobos"),
    }


def make_engine(ckpts, *, ref: str | None = "reference", ref_free: str | None = None, compat: str = "none",
                policy: str = "policy", max_model_len: int = FAKE_LOGPROB_MAX_LEN):
    config = EngineConfig(
        model=str(ckpts[policy]), kind="dpo", engine="hf", compat=compat,
        ref_model=None if ref is None else str(ckpts[ref]), ref_free=ref_free,
    )
    engines = FakeEngines(max_model_len=max_model_len)
    return DPOEngine(config, logprob_engine=engines, load_tokenizer=fake_tokenizer_loader), engines


def test_implicit_reward_formulas_by_hand():
    policy, reference = [-0.5, -1.5, -2.0], [-1.0, -1.0, -1.0]
    assert implicit_reward(policy, reference, "reference") == pytest.approx(-4.0 - -3.0)
    assert implicit_reward(policy, None, "avg") == pytest.approx(-4.0 / 3)
    assert implicit_reward(policy, None, "sum") == pytest.approx(-4.0)
    assert implicit_reward(policy, None, "norm") == pytest.approx(-math.sqrt(0.25 + 2.25 + 4.0))
    with pytest.raises(ValueError, match="no answer token"):
        implicit_reward([], None, "avg")
    with pytest.raises(ValueError, match="needs reference"):
        implicit_reward(policy, None, "reference")


@pytest.mark.parametrize(
    ("ref", "ref_free", "expected"),
    [
        ("reference", None, (-1.135, -0.53)),
        (None, "avg", (-0.454, -1.06 / 4)),
        (None, "sum", (-2.27, -1.06)),
        (None, "norm", (-math.sqrt(2.3803), -math.sqrt(0.9442))),
    ],
)
async def test_rewards_and_extras_by_hand(ckpts, ref, ref_free, expected):
    engine, engines = make_engine(ckpts, ref=ref, ref_free=ref_free)
    await engine.start()
    scores = await engine.score_group([OK_IDS, A_IDS], "r1", answer_starts=[5, 5])
    assert [s.reward for s in scores] == pytest.approx(expected)
    assert scores[0].extras == pytest.approx({
        "policy_logp": -2.27, "ref_logp": -1.135 if ref else None, "policy_logp_norm": math.sqrt(2.3803),
        "answer_tokens": 5, "bos": "template",
    })
    assert scores[1].extras["answer_tokens"] == 4
    assert [s.num_cached_tokens for s in scores] == [0, 4]  # the policy's (fake: 5 shared → one block of 4)
    policy = engines.built[str(ckpts["policy"])]
    assert policy.calls == [("r1-policy", (tuple(OK_IDS), tuple(A_IDS)), (5, 5))]
    if ref:
        assert engines.built[str(ckpts["reference"])].calls[0][0] == "r1-reference"
    await engine.shutdown()


async def test_no_answer_tokens_gives_a_null_reward_with_an_error(ckpts):
    engine, _ = make_engine(ckpts, ref=None, ref_free="avg")
    await engine.start()
    (score,) = await engine.score_group([OK_IDS], "r", answer_starts=[len(OK_IDS)])
    assert math.isnan(score.reward)
    assert score.error is not None and score.error.type == "no_answer_tokens"
    assert score.extras["answer_tokens"] == 0


async def test_model_info_and_fingerprint(ckpts):
    engine, _ = make_engine(ckpts, compat="official")
    loaded = await engine.start()
    template = FakeTokenizer.chat_template
    expected = dpo_fingerprint(
        model_fingerprint(ckpts["policy"], template, "float32"),
        model_fingerprint(ckpts["reference"], template, "float32"),
        "reference", "official",
    )
    info = loaded.info
    assert (info.kind, info.mode, info.ref_model, info.compat, info.fingerprint) == (
        "dpo", "reference", "reference", "official", expected,
    )
    assert (info.name, info.max_model_len, info.engine) == ("policy", 64, "fake")
    assert isinstance(loaded.renderer, DPORenderer) and loaded.renderer.compat == "official"
    assert loaded.checkpoint_dir == ckpts["policy"].resolve()
    for capability in (SupportsWeightReload, SupportsRestart, SupportsPrefixCacheStats):
        assert isinstance(engine, capability)
    ref_free, _ = make_engine(ckpts, ref=None, ref_free="norm")
    info = (await ref_free.start()).info
    assert (info.mode, info.ref_model) == ("norm", None)
    assert info.fingerprint == dpo_fingerprint(model_fingerprint(ckpts["policy"], template, "float32"), None, "norm")


async def test_a_reference_with_another_vocabulary_is_refused_before_loading(ckpts):
    engine, engines = make_engine(ckpts, ref="other_vocab")
    with pytest.raises(ServerFault) as info:
        await engine.start()
    message = info.value.message
    assert message.startswith("ref_model:")
    assert str(ckpts["other_vocab"]) in message and str(ckpts["policy"]) in message
    assert "the vocabulary has 256 tokens in the policy and 257 in the reference" in message
    assert not any(e.started for e in engines.built.values())


def test_tokenizer_difference_names_special_ids_and_the_first_token():
    class Shifted(type(TOKENIZERS["tok-v1"])):
        def get_vocab(self):
            vocab = super().get_vocab()
            vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
            return vocab

    assert tokenizer_difference(TOKENIZERS["tok-v1"], TOKENIZERS["tok-v1"]) is None
    assert tokenizer_difference(TOKENIZERS["tok-v1"], Shifted()) == "token 'a' has id 97 in the policy and 98 in the reference"
    no_bos = type(TOKENIZERS["tok-v1"])(bos=False)
    assert tokenizer_difference(TOKENIZERS["tok-v1"], no_bos) == "bos_token_id is 1 in the policy and None in the reference"


@pytest.mark.parametrize(("which", "field"), [("model", "model"), ("ref_model", "ref_model")])
async def test_a_classifier_as_policy_or_reference_is_refused_before_loading(ckpts, which, field):
    config = EngineConfig(
        model=str(ckpts["classifier" if which == "model" else "policy"]), kind="dpo", engine="hf",
        ref_model=str(ckpts["classifier" if which == "ref_model" else "reference"]),
    )
    engines = FakeEngines()
    engine = DPOEngine(config, logprob_engine=engines, load_tokenizer=fake_tokenizer_loader)
    with pytest.raises(ServerFault, match=f"^{field}: .*FakeForSequenceClassification.*--kind classifier"):
        await engine.start()
    assert not any(e.started for e in engines.built.values())


async def test_an_engine_that_fails_to_start_stops_the_other(ckpts):
    engine, engines = make_engine(ckpts)
    engines.built[str(ckpts["reference"])].start_error = ServerFault("reference: no memory")
    with pytest.raises(ServerFault, match="reference: no memory"):
        await engine.start()
    assert engines.built[str(ckpts["policy"])].shutdowns == 1


async def test_wrong_answer_lengths_from_an_engine_are_an_engine_error(ckpts):
    engine, engines = make_engine(ckpts, ref=None, ref_free="sum")
    await engine.start()
    policy = engines.built[str(ckpts["policy"])]

    async def short(token_ids, answer_starts, request_id, priority=0):
        return [AnswerLogprobs((-1.0,))]

    policy.answer_logprobs = short
    with pytest.raises(EngineError, match="answered 1 log-probs for sequence 0 of r, which has 5 answer tokens"):
        await engine.score_group([OK_IDS], "r", answer_starts=[5])
    with pytest.raises(EngineError, match="needs one answer start per sequence"):
        await engine.score_group([OK_IDS], "r")


async def test_reload_swaps_the_policy_only(ckpts):
    engine, engines = make_engine(ckpts)
    first = await engine.start()
    loaded = await engine.reload_weights(str(ckpts["policy2"]))
    policy, reference = engines.built[str(ckpts["policy"])], engines.built[str(ckpts["reference"])]
    assert policy.reloads == [str(ckpts["policy2"])] and reference.reloads == []
    assert policy.resets == 1 and reference.resets == 1
    assert loaded.info.fingerprint != first.info.fingerprint
    assert loaded.renderer is first.renderer
    (score,) = await engine.score_group([OK_IDS], "r", answer_starts=[5])
    assert score.reward == pytest.approx(-4.54 + 1.135)  # Σ policy at scale 0.02 minus the reference


CLASSIFIER_AS_POLICY = re.escape(
    "checkpoint 'rm/config.json': has architectures ['FakeForSequenceClassification']; kind dpo needs a causal LM "
    "with an LM head (*ForCausalLM or *LMHeadModel); it is a reward classifier: serve it with --kind classifier, "
    "or give a DPO-trained causal LM"
)


@pytest.mark.parametrize(("target", "rule"), [("classifier", f"^{CLASSIFIER_AS_POLICY}$"),
                                               ("other_vocab", "its tokenizer differs from the reference")])
async def test_swap_to_a_classifier_or_another_vocabulary_is_refused_before_engine_work(ckpts, target, rule):
    engine, engines = make_engine(ckpts)
    await engine.start()
    with pytest.raises(InvalidCheckpoint, match=rule) as info:
        await engine.reload_weights(str(ckpts[target]))
    assert info.value.field == "path"
    with pytest.raises(InvalidCheckpoint, match=rule):
        await engine.restart(str(ckpts[target]))
    policy = engines.built[str(ckpts["policy"])]
    assert policy.reloads == [] and policy.restarts == []
    (score,) = await engine.score_group([OK_IDS], "r", answer_starts=[5])
    assert score.reward == pytest.approx(-1.135)


# --- over HTTP --------------------------------------------------------------------------


@pytest.fixture
async def dpo_client(aiohttp_client, ckpts):
    engine, engines = make_engine(ckpts)
    config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(ckpts["root"]),))
    app = create_app(config, engine, renderer_factory=engine_renderer)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return client, engines


async def test_score_returns_the_implicit_rewards_and_extras(dpo_client):
    client, _ = dpo_client
    payload = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["ok", "a"]}]}
    async with client.post("/v1/score", json=payload) as resp:
        assert resp.status == 200
        body = orjson.loads(await resp.read())
    (result,) = body["results"]
    assert result["rewards"] == pytest.approx([-1.135, -0.53])
    assert result["num_tokens"] == [10, 9]
    expected = {
        "policy_logp": [-2.27, -1.06], "ref_logp": [-1.135, -0.53],
        "policy_logp_norm": [math.sqrt(2.3803), math.sqrt(0.9442)], "answer_tokens": [5, 4],
    }
    assert set(result["extras"]) == {*expected, "bos"}
    for name, values in expected.items():
        assert result["extras"][name] == pytest.approx(values), name
    assert result["extras"]["bos"] == ["template", "template"]
    async with client.get("/v1/models") as resp:
        (info,) = decode(await resp.read(), ModelList).models
    assert (info.kind, info.mode, info.ref_model) == ("dpo", "reference", "reference")
    assert body["fingerprint"] == info.fingerprint


@pytest.mark.parametrize(("compat", "front", "rule"), [("none", [], "template"),
                                                       ("official", [2], "eos-as-bos (official)")])
async def test_a_tokenizer_without_bos_is_scored_from_the_templates_first_token(aiohttp_client, ckpts, compat, front,
                                                                                rule):
    # tok-nobos: the template writes no BOS and the tokenizer has none. The answers are those of
    # "ok" and "a" above, so the rewards are too; only the head of the sequences (and the start) moves.
    engine, engines = make_engine(ckpts, policy="policy_nobos", ref="reference_nobos", compat=compat)
    app = create_app(ServerConfig(port=0), engine, renderer_factory=engine_renderer)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    payload = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["ok", "a"]}]}
    async with client.post("/v1/score", json=payload) as resp:
        assert resp.status == 200
        (result,) = orjson.loads(await resp.read())["results"]
    assert result["rewards"] == pytest.approx([-1.135, -0.53])
    assert result["extras"]["bos"] == [rule, rule]
    assert result["extras"]["answer_tokens"] == [5, 4]
    ((_, sent, starts),) = engines.built[str(ckpts["policy_nobos"])].calls
    assert sent == (tuple(front + OK_IDS[1:]), tuple(front + A_IDS[1:]))
    assert starts == (4 + len(front), 4 + len(front))


async def test_a_right_cut_that_leaves_only_the_assistant_header_is_unscored_and_the_request_goes_on(
    aiohttp_client, ckpts
):
    # max_model_len 511; g0's prompt is BOS user x*507 EOS = 510 tokens, so a right cut to 511
    # keeps the assistant marker 5 alone of each answer ([5, y*44, 2, 2] = 47; [5, 97, 98, 2, 2] = 5).
    engine, engines = make_engine(ckpts, max_model_len=511)
    app = create_app(ServerConfig(port=0), engine, renderer_factory=engine_renderer)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    payload = {"groups": [{"id": "g0", "prompt": "x" * 507, "responses": ["y" * 44, "ab"]},
                          {"id": "g1", "prompt": "hi", "responses": ["ok"]}],
               "truncation": {"side": "right", "max_tokens": 511}}
    async with client.post("/v1/score", json=payload) as resp:
        assert resp.status == 200
        g0, g1 = orjson.loads(await resp.read())["results"]
    message = ("a right cut to truncation.max_tokens=511 keeps none of the response: after the 510-token prompt it "
               "keeps 1 of the {} answer tokens, but the answer's first 1 are the chat template's, before the response")
    assert g0 == {"id": "g0", "rewards": [None, None], "num_tokens": [557, 515], "num_cached_tokens": [0, 0],
                  "truncated_tokens": [0, 0],
                  "errors": [{"type": "sequence_too_long", "message": message.format(47)},
                             {"type": "sequence_too_long", "message": message.format(5)}]}
    assert g1["rewards"] == pytest.approx([-1.135]) and g1["truncated_tokens"] == [0] and "errors" not in g1
    policy = engines.built[str(ckpts["policy"])]
    assert [group for _, group, _ in policy.calls] == [(tuple(OK_IDS),)]  # g0 never reached the engine


async def test_load_of_a_classifier_checkpoint_is_refused_and_scoring_goes_on(dpo_client, ckpts):
    client, engines = dpo_client
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with client.post("/v1/models/load", json={"name": "rm", "path": str(ckpts["classifier"])},
                           headers=headers) as resp:
        assert resp.status == 422
        error = orjson.loads(await resp.read())["error"]
    assert error["type"] == "invalid_checkpoint" and "causal LM" in error["message"]
    assert engines.built[str(ckpts["policy"])].reloads == []
    async with client.post("/v1/models/load", json={"name": "p2", "path": str(ckpts["policy2"])},
                           headers=headers) as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read())["swap_kind"] == "reload"
    payload = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["ok"]}]}
    async with client.post("/v1/score", json=payload) as resp:
        assert orjson.loads(await resp.read())["results"][0]["rewards"] == pytest.approx([-4.54 + 1.135])


def test_an_engine_error_on_a_score_gives_a_null_reward_in_the_reply():
    from rmserve.server.engines.protocol import SequenceScore
    from rmserve.server.render.chat import RenderedGroup
    from rmserve.server.kinds.classifier import group_result

    from rmserve.schema import RequestGroup, ResponseError

    error = ResponseError("no_answer_tokens", "none")
    rendered = RenderedGroup(id="g", token_ids=([1, 2], [1, 2, 3]), prompt_tokens=2, answer_start=(2, 2))
    scores = [SequenceScore(math.nan, 0, {"answer_tokens": 0}, error), SequenceScore(-1.5, 0, {"answer_tokens": 1})]
    result = group_result(RequestGroup(id="g", responses=("", "x"), prompt="p"), rendered, scores, 0)
    assert result.rewards == (None, -1.5)
    assert result.errors == (error, None)
    assert result.extras == {"answer_tokens": (0, 1)}


async def test_restart_moves_the_policy_to_another_checkpoint_and_back(ckpts, tmp_path):
    engine, engines = make_engine(ckpts)
    first = await engine.start()
    loaded = await engine.restart(str(ckpts["policy2"]))
    policy = engines.built[str(ckpts["policy"])]
    assert policy.restarts == [str(ckpts["policy2"])]
    assert engines.built[str(ckpts["reference"])].restarts == []
    assert loaded.info.fingerprint != first.info.fingerprint and loaded.renderer is not first.renderer
    assert loaded.checkpoint_dir == ckpts["policy2"].resolve()
    (score,) = await engine.score_group([OK_IDS], "r", answer_starts=[5])
    assert score.reward == pytest.approx(-4.54 + 1.135)
    back = await engine.restart(str(ckpts["policy"]))
    assert back.info.fingerprint == first.info.fingerprint
    assert engine.prefix_cache_stats().query_tokens == 2 * len(OK_IDS)  # policy + reference


def test_reference_mode_splits_memory_and_cpus_between_the_two_engines(monkeypatch):
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.dpo_pair import engine_shares

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    both = EngineConfig(model="p", kind="dpo", ref_model="r", gpu_memory_utilization=0.8, kv_cache_memory_bytes=6 << 20)
    policy, reference = engine_shares(both, cpus=[0, 1, 2, 3, 5])
    assert policy.gpu_memory_utilization == reference.gpu_memory_utilization == pytest.approx(0.4)
    assert policy.kv_cache_memory_bytes == reference.kv_cache_memory_bytes == 3 << 20
    assert (policy.cpu_threads_bind, reference.cpu_threads_bind) == ("0,1", "2,3,5")
    assert (policy.model, policy.ref_model, policy.kind) == ("p", "r", "dpo")
    # One CPU: shared; an explicit binding (option or environment) is kept for both.
    assert [c.cpu_threads_bind for c in engine_shares(both, cpus=[3])] == [None, None]
    pinned = EngineConfig(model="p", kind="dpo", ref_model="r", cpu_threads_bind="0-1")
    assert [c.cpu_threads_bind for c in engine_shares(pinned, cpus=[0, 1])] == ["0-1", "0-1"]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert [c.cpu_threads_bind for c in engine_shares(both, cpus=[0, 1])] == [None, None]
    alone = EngineConfig(model="p", kind="dpo", ref_free="avg", gpu_memory_utilization=0.8)
    assert engine_shares(alone) == (alone, alone)
