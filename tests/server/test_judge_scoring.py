"""``POST /v1/score`` with a generative judge, over real HTTP and a fake judge engine.

The fake judge (``testkit.judge_fakes``) prefers answers holding ``GOOD``: ranking names the
letter of the first such answer, rating gives 8 to such an answer and 3 to the others,
pairwise says ``A>B`` / ``B>A`` toward it and ``A=B`` when both or neither hold it. Its
prompt length is ``1 + Σ (len(content) + 2)``.
"""

from __future__ import annotations

import asyncio
import hashlib

import msgspec
import orjson
import pytest
from testkit.judge_fakes import FAKE_JUDGE_MODEL, FakeJudgeEngine, fake_prompt_tokens, rb2_group, rmbench_group
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge import share_tokens
from rmserve.server.http.wire import encode_models

from rmserve.errors import EngineError
from rmserve.fingerprint import judge_fingerprint
from rmserve.schema import Group, JudgeEngineInfo, JudgeSampling, Message, ModelInfo, ScoreResponse, decode


def wire(group: Group, **extra) -> dict:
    """The wire form a client sends to a judge (``num_chosen`` and ``styles`` included)."""
    body = {"id": f"{group.benchmark}/{group.domain}/{group.id}",
            "messages": [{"role": m.role, "content": m.content} for m in group.messages],
            "responses": list(group.responses), "num_chosen": group.num_chosen}
    if group.styles is not None:
        body["styles"] = list(group.styles)
    body.update(extra)
    return body


@pytest.fixture
def make_judge(aiohttp_client):
    async def make(engine: FakeJudgeEngine | None = None, settings: JudgeSettings | None = None, **config):
        engine = engine or FakeJudgeEngine()
        app = create_app(ServerConfig(port=0, **config), engine, judge=settings)
        client = await aiohttp_client(app)
        await app[STATE_KEY].settled.wait()
        return client, engine

    return make


async def post(client, payload) -> tuple[int, dict]:
    async with client.post("/v1/score", data=orjson.dumps(payload)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def scrape(client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with client.get("/metrics") as resp:
        text = await resp.text()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def position_by_hand(seed: int, subset: str, gid: str) -> int:
    payload = f'["rb2-ranking",{seed},"{subset}","{gid}"]'.encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") % 4


# --- protocols -----------------------------------------------------------------------------


async def test_ranking_reply(make_judge):
    client, engine = await make_judge()
    group = rb2_group("Factuality", "7")
    status, body = await post(client, {"groups": [wire(group)]})
    assert status == 200, body
    reply = decode(orjson.dumps(body), ScoreResponse)
    (result,) = reply.results
    p = position_by_hand(0, "Factuality", "7")
    shown = [0, 1, 2, 3]
    shown[0], shown[p] = shown[p], shown[0]
    judge = result.judge
    assert judge.protocol == "rb2-ranking" and judge.position == p and judge.seed == 0
    assert judge.credit == 1.0
    (call,) = judge.calls
    assert call.responses == tuple(shown)
    assert call.text == f"I pick [[{'ABCD'[p]}]]"
    assert call.parse.verdict == "ABCD"[p]
    assert result.rewards == (1.0, 0.0, 0.0, 0.0)
    assert result.errors is None
    # one engine call for the group: a system and a user message
    ((_, calls),) = engine.calls
    ((system, user),) = calls
    assert system.role == "system" and user.role == "user" and "[The Start of Assistant D's Answer]" in user.content
    prompt = 1 + len(system.content) + 2 + len(user.content) + 2
    assert call.prompt_tokens == prompt and call.completion_tokens == len(call.text)
    base, extra = divmod(prompt, 4)
    by_hand = [0] * 4
    for rank, j in enumerate(shown):
        by_hand[j] = base + (1 if rank < extra else 0)
    assert result.num_tokens == tuple(by_hand) and sum(result.num_tokens) == prompt
    assert result.num_cached_tokens == (0, 0, 0, 0)
    assert reply.model == "fake-judge"
    assert reply.fingerprint == judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=64, seed=0)


async def test_ranking_without_a_verdict_gives_a_quarter_each(make_judge):
    client, _ = await make_judge()
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "1", good=False))]})
    assert status == 200
    (result,) = body["results"]
    assert result["rewards"] == [0.25, 0.25, 0.25, 0.25]
    assert result["judge"]["credit"] == 0.25
    assert result["judge"]["calls"][0]["parse"] == {"parser": "rb2-ranking", "reason": "no_verdict"}


@pytest.mark.parametrize(("compat", "parser", "verdict", "credit"),
                         [("none", "rb2-ranking", "C", 1.0), ("official", "rb2-ranking-official", "A", 0.0)])
async def test_the_reply_names_the_reader_of_its_compat(make_judge, compat, parser, verdict, credit):
    """The judge quotes the format sentence, then concludes with the correct answer (shown at C):
    rmserve's reader reads C, the official reader A (the first letter whose token occurs)."""
    engine = FakeJudgeEngine(reply_of=lambda messages: 'The format is "[[A]]" if A is best.\nFinal verdict: [[C]]')
    client, _ = await make_judge(engine, JudgeSettings(compat=compat, max_tokens=64))
    group = next(rb2_group("Math", str(k)) for k in range(50) if position_by_hand(0, "Math", str(k)) == 2)
    status, body = await post(client, {"groups": [wire(group)]})
    assert status == 200, body
    judge = body["results"][0]["judge"]
    assert judge["compat"] == compat and judge["position"] == 2
    assert judge["calls"][0]["parse"] == {"parser": parser, "reason": "ok", "verdict": verdict,
                                          "candidates": ["A", "C"]}
    assert judge["credit"] == credit


async def test_ratings_reply_with_a_ties_group(make_judge):
    client, engine = await make_judge(settings=JudgeSettings(protocol="ratings", max_tokens=64))
    focus, ties = rb2_group("Focus", "2"), rb2_group("Ties", "9", correct=2, rejected=3)
    status, body = await post(client, {"groups": [wire(focus), wire(ties)]})
    assert status == 200, body
    reply = decode(orjson.dumps(body), ScoreResponse)
    first, second = reply.results
    assert first.rewards == (8.0, 3.0, 3.0, 3.0)
    assert first.judge.protocol == "rb2-rating" and first.judge.ratings == (8, 3, 3, 3) and first.judge.credit == 1.0
    assert second.rewards == (8.0, 8.0, 3.0, 3.0, 3.0)
    assert second.judge.protocol == "rb2-rating-ties" and second.judge.ratings == (8, 8, 3, 3, 3)
    assert second.judge.credit is None and second.judge.num_chosen == 2
    # one engine call per group, one generation per response
    assert sorted(len(calls) for _, calls in engine.calls) == [4, 5]
    for result in (first, second):
        calls = result.judge.calls
        assert result.num_tokens == tuple(c.prompt_tokens for c in calls)
        assert result.num_cached_tokens == tuple(c.cached_tokens for c in calls)
        assert calls[0].cached_tokens == 0 and all(c.cached_tokens > 0 for c in calls[1:])
    # the calls' prompt and cached tokens reach /metrics
    metrics = await scrape(client)
    all_calls = first.judge.calls + second.judge.calls
    assert metrics["rmserve_groups_total"] == 2
    assert metrics["rmserve_sequences_total"] == 9
    assert metrics["rmserve_prefix_cache_queries_total"] == sum(c.prompt_tokens for c in all_calls)
    assert metrics["rmserve_prefix_cache_hits_total"] == sum(c.cached_tokens for c in all_calls)


async def test_pairwise_reply(make_judge):
    client, engine = await make_judge()
    status, body = await post(client, {"groups": [wire(rmbench_group("chat", "3")),
                                                  wire(rmbench_group("chat", "4", good=False))]})
    assert status == 200, body
    reply = decode(orjson.dumps(body), ScoreResponse)
    good, tie = reply.results
    assert good.judge.protocol == "rmbench-pairwise" and good.judge.cells == (1.0,) * 9
    assert good.rewards == (1.0, 1.0, 1.0, 0.0, 0.0, 0.0)
    assert tie.judge.cells == (0.5,) * 9 and tie.rewards == (0.5,) * 6
    calls = good.judge.calls
    assert len(calls) == 18
    assert [c.responses for c in calls[:4]] == [(0, 3), (3, 0), (0, 4), (4, 0)]
    assert [c.parse.verdict for c in calls[:2]] == ["A>B", "B>A"]
    # each call's prompt tokens split over its 2 answers: the sums are the calls' totals
    assert sum(good.num_tokens) == sum(c.prompt_tokens for c in calls)
    assert sum(good.num_cached_tokens) == sum(c.cached_tokens for c in calls)
    assert good.num_tokens == share_tokens([c.prompt_tokens for c in calls], [c.responses for c in calls], 6)
    assert len(engine.calls) == 2 and all(len(c) == 18 for _, c in engine.calls)


def test_share_tokens_by_hand():
    # 10 over (2, 0, 1): 4, 3, 3; 7 over (1, 2): 4, 3; 5 over (0,): 5
    assert share_tokens([10, 7, 5], [(2, 0, 1), (1, 2), (0,)], 3) == (3 + 5, 3 + 4, 4 + 3)


# --- per-group answers and request errors ------------------------------------------------------


async def test_groups_the_judge_cannot_take_are_answered_per_group(make_judge):
    engine = FakeJudgeEngine(model=ModelInfo(name="fake-judge", max_model_len=2000, dtype="float32",
                                             fingerprint="fp-judge-1", engine="fake"))
    client, _ = await make_judge(engine)
    multi = wire(rb2_group("Factuality", "1"), messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}])
    three = wire(Group(benchmark="rewardbench2", domain="Math", id="2", messages=(Message("user", "q"),),
                       responses=("GOOD a", "b", "c"), num_chosen=1))
    too_long = wire(rb2_group("Safety", "3", question="x" * 3000))
    fine = wire(rb2_group("Focus", "4"))
    status, body = await post(client, {"groups": [multi, three, too_long, fine]})
    assert status == 200, body
    r_multi, r_three, r_long, r_fine = body["results"]
    for result, n in ((r_multi, 4), (r_three, 3), (r_long, 4)):
        assert result["rewards"] == [None] * n
        assert "judge" not in result
        assert result["num_tokens"] == [0] * n and result["num_cached_tokens"] == [0] * n
    assert {e["type"] for e in r_multi["errors"]} == {"unsupported_group"}
    assert "exactly one user turn" in r_multi["errors"][0]["message"]
    assert {e["type"] for e in r_three["errors"]} == {"unsupported_group"}
    assert {e["type"] for e in r_long["errors"]} == {"sequence_too_long"}
    assert "max_model_len=2000" in r_long["errors"][0]["message"]
    assert r_fine["rewards"] == [1.0, 0.0, 0.0, 0.0] and "errors" not in r_fine


@pytest.mark.parametrize(("group", "field", "words"), [
    ({"id": "rewardbench2/Math/1", "prompt": "q", "responses": ["a", "b", "c", "d"]},
     "groups[0].num_chosen", "num_chosen (id 'rewardbench2/Math/1') is missing"),
    ({"id": "g0", "prompt": "q", "responses": ["a", "b"], "num_chosen": 1},
     "groups[0].id", "is not 'benchmark/domain/id'"),
    ({"id": "other/x/1", "prompt": "q", "responses": ["a", "b"], "num_chosen": 1},
     "groups[0].id", "benchmark 'other' is not one of rm-bench, rewardbench2"),
    ({"id": "rewardbench2/Math/1", "prompt": "q", "responses": ["a", "b"], "num_chosen": 2},
     "groups[0].num_chosen", "with 2 responses it must lie in 1 … 1"),
])
async def test_bad_judge_groups_fail_the_request(make_judge, group, field, words):
    client, engine = await make_judge()
    status, body = await post(client, {"groups": [group]})
    assert status == 400
    assert body["error"]["type"] == "invalid_request" and body["error"]["field"] == field
    assert words in body["error"]["message"]
    assert engine.calls == []


@pytest.mark.parametrize(("protocol", "group", "benchmark"), [
    ("ranking", rmbench_group("chat", "1"), "rm-bench"),
    ("ratings", rmbench_group("chat", "1"), "rm-bench"),
    ("pairwise", rb2_group("Math", "1"), "rewardbench2"),
])
async def test_a_protocol_for_the_other_benchmark_is_refused(make_judge, protocol, group, benchmark):
    client, engine = await make_judge(settings=JudgeSettings(protocol=protocol))
    status, body = await post(client, {"groups": [wire(group)]})
    assert status == 400
    assert body["error"]["field"] == "protocol"
    assert f"is a {benchmark} group" in body["error"]["message"] and repr(protocol) in body["error"]["message"]
    assert engine.calls == []


async def test_truncation_is_refused_for_a_judge(make_judge):
    client, _ = await make_judge()
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "1"))],
                                       "truncation": {"side": "left", "max_tokens": 100}})
    assert status == 400 and body["error"]["field"] == "truncation"


async def test_an_engine_failure_fails_the_request(make_judge):
    client, engine = await make_judge(FakeJudgeEngine(fail_with=EngineError("the judge engine died")))
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "1")), wire(rb2_group("Math", "2"))]})
    assert status == 500
    assert body["error"]["type"] == "engine_error" and "the judge engine died" in body["error"]["message"]
    assert client.app[STATE_KEY].inflight_groups == 0


async def test_admission_limit_applies(make_judge):
    client, engine = await make_judge(max_inflight_groups=1)
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "1")), wire(rb2_group("Math", "2"))]})
    assert status == 413 and body["error"]["field"] == "groups"
    assert body["error"]["limit"] == {"name": "server.max_inflight_groups", "unit": "groups", "limit": 1,
                                      "requested": 2}
    assert engine.calls == []


async def test_client_disconnect_cancels_judge_calls(make_judge):
    client, engine = await make_judge(FakeJudgeEngine(gate=asyncio.Event()))
    task = asyncio.create_task(post(client, {"groups": [wire(rb2_group("Math", "1")), wire(rb2_group("Math", "2"))]}))
    async with asyncio.timeout(10):
        while len(engine.calls) < 2:
            await asyncio.sleep(0.005)
    task.cancel()
    async with asyncio.timeout(10):
        while len(engine.cancelled) < 2 or client.app[STATE_KEY].inflight_groups:
            await asyncio.sleep(0.005)
    assert sorted(engine.cancelled) == sorted(rid for rid, _ in engine.calls)


async def test_a_group_sent_again_comes_from_the_result_cache(make_judge):
    client, engine = await make_judge()
    payload = {"groups": [wire(rb2_group("Math", "1"))]}
    first = await post(client, payload)
    second = await post(client, payload)
    assert second[1]["results"][0].pop("from_result_cache") is True
    assert first == second and first[0] == 200
    assert len(engine.calls) == 1
    metrics = await scrape(client)
    assert metrics["rmserve_result_cache_hits_total"] == 1 and metrics["rmserve_groups_total"] == 1


# --- what the app publishes -------------------------------------------------------------------


async def test_models_describe_the_judge(make_judge):
    settings = JudgeSettings(protocol="ratings", max_tokens=32, seed=5, compat="official", system_prompt=False)
    client, _ = await make_judge(settings=settings)
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    assert info == {
        "name": "fake-judge", "max_model_len": 100_000, "dtype": "float32", "engine": "fake",
        "fingerprint": judge_fingerprint("fp-judge-1", protocol="ratings", max_tokens=32, seed=5,
                                         compat="official", system_prompt=False),
        "swap_count": 0, "last_swap_time": None, "kind": "judge", "mode": "ratings", "ref_model": None,
        "compat": "official", "judge_max_tokens": 32, "judge_seed": 5,
    }
    assert decode(orjson.dumps(info), ModelInfo).judge_settings() == (32, 5)


async def test_the_thinking_switch_is_published_and_recorded(make_judge):
    client, _ = await make_judge(settings=JudgeSettings(max_tokens=64, thinking="off"))
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    fingerprint = judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=64, seed=0, thinking="off")
    assert (info["judge_thinking"], info["fingerprint"]) == ("off", fingerprint)
    assert fingerprint != judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=64, seed=0)
    status, body = await post(client, {"groups": [wire(rb2_group("Focus", "3"))]})
    assert status == 200 and body["fingerprint"] == fingerprint
    assert body["results"][0]["judge"]["thinking"] == "off"
    plain, _ = await make_judge()
    async with plain.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    assert "judge_thinking" not in info  # not set: left out, as before the switch existed
    status, body = await post(plain, {"groups": [wire(rb2_group("Focus", "3"))]})
    assert "thinking" not in body["results"][0]["judge"]
SETUP_MODEL = msgspec.structs.replace(
    FAKE_JUDGE_MODEL,
    judge_sampling=JudgeSampling(temperature=0.7, top_p=0.9, max_tokens=64),
    judge_engine=JudgeEngineInfo("fake", "1.2.3", False, "batches its calls"),
)
"""A fake judge that reports its sampling (not greedy) and its engine."""


async def test_models_and_every_result_carry_the_engines_sampling_and_engine(make_judge):
    settings = JudgeSettings(protocol="auto", max_tokens=64, seed=0)
    client, _ = await make_judge(FakeJudgeEngine(model=SETUP_MODEL), settings=settings)
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    sampling = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64}
    engine = {"engine": "fake", "version": "1.2.3", "batch_invariant": False, "batch_invariant_note": "batches its calls"}
    assert (info["judge_sampling"], info["judge_engine"], info["judge_max_tokens"]) == (sampling, engine, 64)
    # The fingerprint covers the sampling: hashed with temperature 0.7 and top_p 0.9 (not greedy).
    assert info["fingerprint"] == _by_hand_judge("fp-judge-1", ("temperature", "0.7"), ("top_p", "0.9"))
    assert info["fingerprint"] != judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=64, seed=0)

    multi = wire(rb2_group("Factuality", "1"), messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}])
    status, body = await post(client, {"groups": [wire(rb2_group("Focus", "4")), multi]})
    assert status == 200, body
    judged, unjudged = body["results"]
    assert "judge" in judged and "judge" not in unjudged
    for result in (judged, unjudged):
        assert (result["judge_sampling"], result["judge_engine"]) == (sampling, engine)


def _by_hand_judge(model: str, *sampling: tuple[str, str]) -> str:
    """The judge fingerprint of ``model`` with protocol auto, 64 tokens, seed 0, compat none, system
    prompt on, readers version 2, and the sampling sections given (the documented hash, computed here)."""
    digest = hashlib.sha256()
    for label, value in (("kind", "judge"), ("model", model), ("protocol", "auto"), ("max_tokens", "64"),
                         ("seed", "0"), ("compat", "none"), ("system_prompt", "1"), ("readers", "2"), *sampling):
        digest.update(label.encode() + b"\0" + len(value.encode()).to_bytes(8, "little") + value.encode())
    return digest.hexdigest()[:16]


async def test_an_engine_that_reports_no_sampling_leaves_the_results_without_it(make_judge):
    client, _ = await make_judge()
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    assert "judge_sampling" not in info and "judge_engine" not in info
    status, body = await post(client, {"groups": [wire(rb2_group("Focus", "4"))]})
    assert status == 200 and "judge_sampling" not in body["results"][0] and "judge_engine" not in body["results"][0]


def test_classifier_model_bytes_are_unchanged():
    from testkit.fakes import FAKE_MODEL

    assert encode_models([FAKE_MODEL]) == (
        b'{"models":[{"name":"fake-rm","max_model_len":64,"dtype":"float32","fingerprint":"fp-fake-1",'
        b'"engine":"fake","swap_count":0,"last_swap_time":null,"kind":"classifier","mode":null,'
        b'"ref_model":null,"compat":"none"}]}'
    )
    assert FAKE_MODEL.judge_settings() == (None, None)


def test_settings_come_from_the_engine_config():
    from rmserve.server.config import EngineConfig

    config = EngineConfig(model="m", kind="judge", protocol="ranking", judge_max_tokens=32, judge_seed=3,
                          compat="official", judge_system_prompt=False)
    assert JudgeSettings.from_engine_config(config) == JudgeSettings("ranking", 32, 3, "official", False)
    thinking = EngineConfig(model="m", kind="judge", judge_thinking="on")
    assert JudgeSettings.from_engine_config(thinking).thinking == "on"
    assert JudgeSettings.from_engine_config(thinking).protocol_config().thinking == "on"
    with pytest.raises(ValueError, match="judge_thinking: 'yes' is not one of on, off"):
        EngineConfig(model="m", kind="judge", judge_thinking="yes")
    with pytest.raises(ValueError, match="judge_thinking: only for kind judge"):
        EngineConfig(model="m", judge_thinking="on")
    assert JudgeSettings.from_engine_config(config).protocol_config().ratings is False
    assert JudgeSettings(protocol="ratings").protocol_config().ratings is True


def test_a_judge_takes_no_renderer():
    from testkit.fakes import FakeRenderer

    with pytest.raises(ValueError, match="a judge engine renders its own prompts"):
        create_app(ServerConfig(port=0), FakeJudgeEngine(), FakeRenderer())


async def test_checkpoint_swap_is_refused_for_a_judge(make_judge, tmp_path):
    client, _ = await make_judge(admin_token="t0ken", checkpoint_roots=(str(tmp_path),))
    async with client.post("/v1/models/load", json={"name": "x", "path": str(tmp_path)},
                           headers={"Authorization": "Bearer t0ken"}) as resp:
        assert resp.status == 422
        body = orjson.loads(await resp.read())
    assert body["error"]["type"] == "invalid_checkpoint"
    assert "not supported for a generative judge" in body["error"]["message"]


def test_fake_prompt_tokens_rule():
    assert fake_prompt_tokens((Message("user", "abc"),)) == 6
    assert FAKE_JUDGE_MODEL.max_model_len == 100_000


async def test_outputs_that_make_no_valid_record_are_an_engine_error(make_judge):
    class BadCounts(FakeJudgeEngine):
        async def judge_group(self, calls, request_id, priority=0):
            outputs = await super().judge_group(calls, request_id)
            return [replaced(o, cached_tokens=o.prompt_tokens + 1) for o in outputs]

    client, _ = await make_judge(BadCounts())
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "1"))]})
    assert status == 500 and body["error"]["type"] == "engine_error"
    assert "groups[0] (id 'rewardbench2/Math/1') cannot be recorded: cached_tokens must lie in" in body["error"]["message"]


def replaced(output, **changes):
    import dataclasses

    return dataclasses.replace(output, **changes)


def test_a_judge_groups_fair_queue_cost_is_its_estimated_prompt_tokens_plus_its_generation_budget():
    from rmserve.server.kinds.judge_protocols import JudgePlan, JudgePrompt
    from rmserve.server.kinds.judge import queue_cost

    from rmserve.schema import Message

    plan = JudgePlan(
        "rb2-rating",
        (
            JudgePrompt("rb2-rating", (Message("system", "s" * 38), Message("user", "x" * 402)), (0,)),
            JudgePrompt("rb2-rating", (Message("user", "y" * 43),), (1,)),
        ),
    )
    # (38 + 402 + 43) // 4 = 120 estimated prompt tokens, plus 2 calls x 32 generated tokens.
    assert queue_cost(plan, 32) == 120 + 64


@pytest.mark.parametrize(("headers", "expected"), [({"X-RMServe-Priority": "interactive"}, 0), ({}, 1)])
async def test_a_judge_group_reaches_the_engine_with_the_priority_of_its_request(make_judge, headers, expected):
    seen = []

    class Recording(FakeJudgeEngine):
        async def judge_group(self, calls, request_id, *, priority=0):
            seen.append(priority)
            return await super().judge_group(calls, request_id, priority=priority)

    client, _ = await make_judge(Recording())
    payload = {"groups": [wire(rb2_group("Factuality", "7")), wire(rb2_group("Focus", "8"))]}
    async with client.post("/v1/score", data=orjson.dumps(payload), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
    assert seen == [expected, expected]


async def test_benchmark_and_domain_fields_and_the_old_id_form_judge_alike(make_judge, caplog):
    """The typed fields (what the client sends) and the deprecated ``benchmark/domain/id`` id
    give the same verdict records; only the old form logs the deprecation."""
    import logging

    group = rb2_group("Factuality", "7")
    typed = wire(group, benchmark="rewardbench2", domain="Factuality")
    bare = dict(typed, id="7")  # an id without the prefix: the fields alone say where it is from
    client, _ = await make_judge()
    replies = []
    for body in (typed, bare, wire(group)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rmserve.server"):
            status, reply = await post(client, {"groups": [body]})
        assert status == 200, reply
        deprecated = [r for r in caplog.records if "deprecated" in r.getMessage()]
        assert len(deprecated) == (0 if "benchmark" in body else 1)
        replies.append(reply["results"][0])
    p = position_by_hand(0, "Factuality", "7")
    for result in replies:
        assert result["judge"]["position"] == p and result["rewards"] == [1.0, 0.0, 0.0, 0.0]
    assert [r["id"] for r in replies] == ["rewardbench2/Factuality/7", "7", "rewardbench2/Factuality/7"]


async def test_only_one_of_benchmark_and_domain_is_refused(make_judge):
    client, _ = await make_judge()
    status, body = await post(client, {"groups": [wire(rb2_group("Math", "2"), benchmark="rewardbench2")]})
    assert status == 400 and body["error"]["field"] == "groups[0].domain"
