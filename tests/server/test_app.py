"""The HTTP layer over a fake engine and renderer: wire path, errors, lifecycle, metrics.

Expected numbers are worked out by hand from the fakes' rules (see ``fakes.py``): token id =
code point, ``[1]`` BOS, role markers 3/4/5, ``2`` EOS after every turn; reward =
``sum(ids) % 1000 / 100``; cached tokens = shared prefix with an earlier sequence, capped at
``len - 1``, rounded down to blocks of 4.

For prompt "hi": ``[1, 4, 104, 105, 2]`` (sum 216); assistant "yo": ``[5, 121, 111, 2]``
(sum 239) → 9 tokens, reward 4.55; "ya": ``[5, 121, 97, 2]`` (sum 225) → 4.41, shares 7
tokens with "yo" → 4 cached.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading

import msgspec
import orjson
import pytest
from testkit.app_client import fake_app_client, metric_samples, wait_until
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, fake_ids, fake_reward
from rmserve.server.http.app import ENGINE_KEY, STATE_KEY, ServerConfig, create_app
from rmserve.server.engines.protocol import SequenceScore

from rmserve import __version__
from rmserve.errors import EngineError
from rmserve.schema import GroupResult, ModelList, ResponseError, ScoreResponse, decode

VALID = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}
VALID_RESULT = GroupResult(id="g0", rewards=(4.55, 4.41), num_tokens=(9, 9), num_cached_tokens=(0, 4))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def make_client(aiohttp_client, engine):
    """Start an app on ``engine`` (or another) and a test client; waits for readiness unless told not to."""

    async def make(*, engine_=None, renderer=None, wait_ready=True, **config):
        config = ServerConfig(port=0, **config)
        return await fake_app_client(aiohttp_client, config, engine_ or engine, renderer=renderer, wait_ready=wait_ready)

    return make


async def post_score(client, payload) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    async with client.post("/v1/score", data=data, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, orjson.loads(await resp.read())


async def assert_serves(client) -> None:
    """A valid request still succeeds, with the hand-computed result (from the engine, or from
    the result cache when the app answered it before)."""
    async with client.post("/v1/score", json=VALID) as resp:
        assert resp.status == 200
        reply = decode(await resp.read(), ScoreResponse)
    assert tuple(msgspec.structs.replace(r, from_result_cache=False) for r in reply.results) == (VALID_RESULT,)


def error_of(body: dict) -> dict:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "message", "field"}
    return body["error"]


async def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return metric_samples(text)


# --- happy path -------------------------------------------------------------------------


async def test_score_happy_path(make_client, engine):
    client = await make_client()
    payload = {
        "model": "fake-rm",
        "groups": [
            VALID["groups"][0],
            {"id": "g1", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
             "responses": ["a", "bc"]},
        ],
    }
    async with client.post("/v1/score", json=payload) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        reply = decode(await resp.read(), ScoreResponse)
    # g1 "a":  [1, 3,115,2, 4,113,2, 5,97,2]      sum 344, 10 tokens
    # g1 "bc": [1, 3,115,2, 4,113,2, 5,98,99,2]   sum 444, 11 tokens, shares 8 → 8 cached
    assert reply == ScoreResponse(
        model="fake-rm",
        fingerprint="fp-fake-1",
        results=(
            VALID_RESULT,
            GroupResult(id="g1", rewards=(3.44, 4.44), num_tokens=(10, 11), num_cached_tokens=(0, 8)),
        ),
    )
    # one engine call per group, holding all its sequences; distinct request ids
    assert len(engine.calls) == 2
    (rid0, seqs0), (rid1, seqs1) = sorted(engine.calls, key=lambda call: call[0])
    assert seqs0 == ((1, 4, 104, 105, 2, 5, 121, 111, 2), (1, 4, 104, 105, 2, 5, 121, 97, 2))
    assert seqs1[1] == (1, 3, 115, 2, 4, 113, 2, 5, 98, 99, 2)
    assert rid0.endswith("-0") and rid1.endswith("-1") and rid0[:-2] == rid1[:-2]


async def test_groups_of_one_request_are_scored_concurrently(make_client, engine):
    engine.score_gate = asyncio.Event()
    client = await make_client()
    payload = {"groups": [{"id": f"g{i}", "prompt": "hi", "responses": ["yo"]} for i in range(3)]}
    task = asyncio.create_task(post_score(client, payload))
    # all three groups reach the engine before any of them is answered
    await wait_until(lambda: len(engine.calls) == 3)
    metrics = await scrape(client)
    assert metrics[("rmserve_inflight_groups", ())] == 3
    engine.score_gate.set()
    status, body = await task
    assert status == 200
    assert [r["id"] for r in body["results"]] == ["g0", "g1", "g2"]
    assert (await scrape(client))[("rmserve_inflight_groups", ())] == 0


# --- bad input: each followed by a request that succeeds ---------------------------------


async def test_malformed_json(make_client):
    client = await make_client()
    status, body = await post_score(client, b'{"groups": [')
    assert status == 400
    err = error_of(body)
    assert (err["type"], err["field"]) == ("invalid_request", None)
    assert "not valid JSON" in err["message"]
    await assert_serves(client)


async def test_missing_field(make_client):
    client = await make_client()
    status, body = await post_score(client, {"groups": [{"id": "a", "prompt": "hi"}]})
    assert status == 400
    err = error_of(body)
    assert (err["type"], err["field"]) == ("invalid_request", "groups[0].responses")
    await assert_serves(client)


async def test_empty_responses_list(make_client):
    client = await make_client()
    groups = [{"id": i, "prompt": "hi", "responses": ["yo"]} for i in ("a", "b")]
    groups.append({"id": "c", "prompt": "hi", "responses": []})
    status, body = await post_score(client, {"groups": groups})
    assert status == 400
    assert error_of(body)["field"] == "groups[2].responses"
    await assert_serves(client)


async def test_empty_response_string_is_scored(make_client):
    """The renderer scores an empty response as an empty assistant turn (documented in render.py)."""
    client = await make_client()
    status, body = await post_score(client, {"groups": [{"id": "e", "prompt": "hi", "responses": [""]}]})
    assert status == 200
    # [1, 4,104,105,2, 5,2]: sum 223, 7 tokens
    assert body["results"] == [{"id": "e", "rewards": [2.23], "num_tokens": [7], "num_cached_tokens": [0]}]
    await assert_serves(client)


async def test_an_over_length_response_is_answered_per_response_and_the_rest_is_scored(make_client, engine):
    client = await make_client()
    # "x" * 60 as the assistant turn: 1 + (1 + 2 + 2) + (1 + 60 + 1) = 67 tokens > 64
    payload = {"groups": [{"id": "ok", "prompt": "hi", "responses": ["yo"]},
                          {"id": "long", "prompt": "hi", "responses": ["yo", "x" * 60]}]}
    status, body = await post_score(client, payload)
    assert status == 200
    yo = fake_reward(fake_ids([("user", "hi")], "yo"))
    assert msgspec.convert(body, ScoreResponse).results == (
        GroupResult(id="ok", rewards=(yo,), num_tokens=(9,), num_cached_tokens=(0,)),
        GroupResult(
            id="long", rewards=(yo, None), num_tokens=(9, 67), num_cached_tokens=(0, 0),
            errors=(None, ResponseError("sequence_too_long", "67 tokens (chat template included), over max_model_len=64")),
        ),
    )
    # The over-length sequence never reached the engine; the group's other response did.
    assert sorted(len(group) for _, group in engine.calls) == [1, 1]
    await assert_serves(client)


async def test_unknown_model(make_client, engine):
    client = await make_client()
    status, body = await post_score(client, {**VALID, "model": "other-rm"})
    assert status == 404
    err = error_of(body)
    assert (err["type"], err["field"]) == ("model_not_found", "model")
    assert "'other-rm'" in err["message"] and "'fake-rm'" in err["message"]
    assert engine.calls == []
    await assert_serves(client)


async def test_oversized_body_with_content_length(make_client):
    client = await make_client(max_body_bytes=2048)
    payload = {"groups": [{"id": "a", "prompt": "hi", "responses": ["y" * 3000]}]}
    status, body = await post_score(client, payload)
    assert status == 413
    err = error_of(body)
    assert err["type"] == "body_too_large"
    assert "2048" in err["message"]
    await assert_serves(client)


async def test_oversized_chunked_body(make_client):
    """A body without Content-Length is cut off by aiohttp's client_max_size, same reply."""
    client = await make_client(max_body_bytes=2048)

    async def chunks():
        yield b'{"groups": [{"id": "a", "prompt": "hi", "responses": ["'
        for _ in range(10):
            yield b"y" * 500
        yield b'"]}]}'

    async with client.post("/v1/score", data=chunks()) as resp:
        assert resp.status == 413
        err = error_of(orjson.loads(await resp.read()))
    assert err["type"] == "body_too_large"
    assert "2048" in err["message"]
    await assert_serves(client)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"groups": []}, "groups"),
        ({"groups": [{"id": "a", "prompt": "p", "responses": ["x", 3]}]}, "groups[0].responses[1]"),
        ({"groups": [{"id": "a", "prompt": "p", "messages": [{"role": "user", "content": "q"}],
                      "responses": ["x"]}]}, "groups[0].messages"),
        ({"groups": [{"id": "a", "prompt": "p", "responses": ["x"]}] * 2}, "groups[1].id"),
        ({"groups": [{"id": "a", "messages": [{"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "a"}],
                      "responses": ["x"]}]}, "groups[0].messages[1].role"),
        ({"groups": [{"id": "a", "messages": [{"role": "tool", "content": "t"}, {"role": "user", "content": "q"}],
                      "responses": ["x"]}]}, "groups[0].messages"),
        ({**VALID, "truncation": {"side": "left", "max_tokens": 65}}, "truncation.max_tokens"),
    ],
)
async def test_schema_violations_are_400_with_field(make_client, engine, payload, field):
    client = await make_client()
    status, body = await post_score(client, payload)
    assert status == 400
    err = error_of(body)
    assert (err["type"], err["field"]) == ("invalid_request", field)
    assert engine.calls == []
    await assert_serves(client)


async def test_unknown_route_and_method_are_json_errors(make_client):
    client = await make_client()
    async with client.get("/v1/nothing") as resp:
        assert resp.status == 404
        assert error_of(orjson.loads(await resp.read()))["type"] == "not_found"
    async with client.get("/v1/score") as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert error_of(orjson.loads(await resp.read()))["type"] == "method_not_allowed"
    await assert_serves(client)


# --- truncation -------------------------------------------------------------------------


async def test_truncation_left_keeps_bos_and_reports_cuts(make_client, engine):
    client = await make_client()
    payload = {"groups": [{"id": "t", "prompt": "hi", "responses": ["abcde", "x"]}],
               "truncation": {"side": "left", "max_tokens": 8}}
    status, body = await post_score(client, payload)
    assert status == 200
    # "abcde": [1,4,104,105,2,5,97,98,99,100,101,2] (12) → BOS + last 7 = [1,5,97,98,99,100,101,2], sum 503
    # "x":     [1,4,104,105,2,5,120,2] (8), uncut, sum 343; shares only BOS with the first → 0 cached
    assert body["results"] == [{"id": "t", "rewards": [5.03, 3.43], "num_tokens": [8, 8],
                                "num_cached_tokens": [0, 0], "truncated_tokens": [4, 0]}]
    assert engine.calls[0][1][0] == (1, 5, 97, 98, 99, 100, 101, 2)
    await assert_serves(client)


async def test_truncation_right_and_over_length_is_no_longer_413(make_client):
    client = await make_client()
    payload = {"groups": [{"id": "t", "prompt": "hi", "responses": ["abcde", "x" * 60]}],
               "truncation": {"side": "right", "max_tokens": 8}}
    status, body = await post_score(client, payload)
    assert status == 200
    # both cut to [1,4,104,105,2,5,<first response char>] + one more: "abcde" → [..,97,98] sum 416;
    # "x"*60 → [1,4,104,105,2,5,120,120] sum 461 (67 tokens → 59 cut)
    assert body["results"] == [{"id": "t", "rewards": [4.16, 4.61], "num_tokens": [8, 8],
                                "num_cached_tokens": [0, 4], "truncated_tokens": [4, 59]}]


async def test_a_right_cut_that_leaves_nothing_of_a_response_is_unscored_not_a_score_of_the_prompt(make_client, engine):
    client = await make_client()
    payload = {"groups": [{"id": "t", "prompt": "hello", "responses": ["ok", "abc"]}],
               "truncation": {"side": "right", "max_tokens": 10}}
    status, body = await post_score(client, payload)
    assert status == 200
    # [1,4,104,101,108,108,111,2,5 | 111,107,2] (12): the first 9 sum 544; a cut to 10 keeps 111 (sum 655),
    # "abc" keeps 97 (641). A cut to 9 would keep the prompt and the assistant marker 5 alone, for both.
    assert body["results"] == [{"id": "t", "rewards": [6.55, 6.41], "num_tokens": [10, 10],
                                "num_cached_tokens": [0, 8], "truncated_tokens": [2, 3]}]
    payload["truncation"]["max_tokens"] = 9
    status, body = await post_score(client, payload)
    assert status == 200
    message = ("a right cut to truncation.max_tokens=9 keeps none of the response: the first 9 of its {} tokens are "
               "the prompt and the chat template before it")
    assert body["results"] == [{"id": "t", "rewards": [None, None], "num_tokens": [12, 13],
                                "num_cached_tokens": [0, 0], "truncated_tokens": [0, 0],
                                "errors": [{"type": "sequence_too_long", "message": message.format(12)},
                                           {"type": "sequence_too_long", "message": message.format(13)}]}]
    assert len(engine.calls) == 1  # the second request sent nothing to the engine
    await assert_serves(client)


# --- errors from the engine ---------------------------------------------------------------


async def test_unexpected_engine_exception_is_generic_500(make_client, engine, caplog):
    client = await make_client()
    engine.fail_with = RuntimeError("secret detail at /home/user/model/weights.bin")
    with caplog.at_level(logging.ERROR, logger="rmserve.server"):
        status, body = await post_score(client, VALID)
    assert status == 500
    err = error_of(body)
    assert err["type"] == "internal_error"
    assert err["field"] is None
    for leak in ("secret", "/home", "Traceback", "RuntimeError", ".py"):
        assert leak not in err["message"]
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    assert len(logged) == 1
    engine.fail_with = None
    await assert_serves(client)


async def _error_of_failing_engine(client, engine, exc: Exception) -> dict:
    """The error body of a score request while the engine raises ``exc`` (asserted 500), after
    asserting that the app serves again once the engine stops failing."""
    engine.fail_with = exc
    status, body = await post_score(client, VALID)
    assert status == 500
    engine.fail_with = None
    await assert_serves(client)
    return error_of(body)


async def test_engine_error_keeps_its_type(make_client, engine):
    client = await make_client()
    err = await _error_of_failing_engine(client, engine, EngineError("the engine process died"))
    assert err == {"type": "engine_error", "message": "the engine process died", "field": None}


async def test_server_fault_messages_lose_file_paths(make_client, engine):
    client = await make_client()
    exc = EngineError("vLLM failed: OSError: /srv/models/rm-8b/model.safetensors is truncated")
    err = await _error_of_failing_engine(client, engine, exc)
    assert err["message"] == "vLLM failed: OSError: <path> is truncated"


class NaNEngine(FakeEngine):
    """Answers NaN for every second sequence."""

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        scores = await super().score_group(token_ids, request_id)
        return [SequenceScore(math.nan if i % 2 else s.reward, s.num_cached_tokens) for i, s in enumerate(scores)]


async def test_a_non_finite_reward_is_null_with_a_per_response_error_in_a_200_reply(make_client):
    client = await make_client(engine_=NaNEngine())
    status, body = await post_score(client, VALID)
    assert status == 200
    assert body["results"][0]["rewards"] == [4.55, None]  # post_score parses with orjson: strict JSON, no NaN
    assert msgspec.convert(body, ScoreResponse).results == (
        GroupResult(
            id="g0", rewards=(4.55, None), num_tokens=(9, 9), num_cached_tokens=(0, 4),
            errors=(None, ResponseError("non_finite_reward", "the model gave a non-finite reward (nan) for it")),
        ),
    )


# --- lifecycle ----------------------------------------------------------------------------


async def test_health_503_while_loading_then_200(make_client, engine, aiohttp_client):
    engine.start_gate = asyncio.Event()
    client = await make_client(wait_ready=False, retry_after_s=7)
    async with client.get("/health") as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "7"
        assert orjson.loads(await resp.read()) == {"status": "loading", "version": __version__}
    async with client.post("/v1/score", json=VALID) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "7"
        assert error_of(orjson.loads(await resp.read()))["type"] == "engine_not_ready"
    async with client.get("/v1/models") as resp:
        assert resp.status == 503
    engine.start_gate.set()
    await client.app[STATE_KEY].settled.wait()
    async with client.get("/health") as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read()) == {"status": "ready", "version": __version__}
    await assert_serves(client)


async def test_engine_start_failure_keeps_answering_503(make_client):
    failing = FakeEngine(start_error=RuntimeError("no weights"))
    client = await make_client(engine_=failing)
    async with client.get("/health") as resp:
        assert resp.status == 503
        assert orjson.loads(await resp.read()) == {"status": "failed", "version": __version__}
    status, body = await post_score(client, VALID)
    assert (status, error_of(body)["type"]) == (503, "engine_not_ready")


async def test_cleanup_shuts_the_engine_down(make_client, engine):
    client = await make_client()
    assert engine.started
    await client.close()
    assert (engine.started, engine.shutdown_calls) == (False, 1)


async def test_models(make_client):
    client = await make_client()
    async with client.get("/v1/models") as resp:
        assert resp.status == 200
        assert decode(await resp.read(), ModelList) == ModelList(models=(FAKE_MODEL,))


async def test_served_model_name_override(make_client):
    client = await make_client(served_model_name="my-rm")
    async with client.get("/v1/models") as resp:
        assert decode(await resp.read(), ModelList).models[0].name == "my-rm"
    status, body = await post_score(client, {**VALID, "model": "my-rm"})
    assert (status, body["model"]) == (200, "my-rm")
    status, body = await post_score(client, {**VALID, "model": "fake-rm"})
    assert status == 404


# --- metrics --------------------------------------------------------------------------------


async def test_metrics_move_by_exact_amounts(make_client):
    client = await make_client(result_cache_groups=0)  # the repeated group is scored again
    before = await scrape(client)
    await assert_serves(client)  # 1 group, 2 sequences, 9 + 9 tokens, 0 + 4 cached
    status, _ = await post_score(client, {"groups": []})
    assert status == 400
    payload = {"groups": [VALID["groups"][0], {"id": "e", "prompt": "hi", "responses": [""]}]}
    status, _ = await post_score(client, payload)  # + 2 groups, 3 sequences, 18 + 7 tokens, 4 cached
    assert status == 200
    after = await scrape(client)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("rmserve_requests_total", endpoint="/v1/score", status="200") == 2
    assert delta("rmserve_requests_total", endpoint="/v1/score", status="400") == 1
    assert delta("rmserve_request_duration_seconds_count", endpoint="/v1/score") == 3
    assert delta("rmserve_groups_total") == 3
    assert delta("rmserve_sequences_total") == 5
    assert delta("rmserve_prompt_tokens_total") == 18 + 25
    assert delta("rmserve_prefix_cache_queries_total") == 18 + 25
    assert delta("rmserve_prefix_cache_hits_total") == 4 + 4
    assert delta("rmserve_engine_prefix_cache_queries_total") == 43
    assert delta("rmserve_engine_prefix_cache_hits_total") == 8
    assert after[("rmserve_inflight_groups", ())] == 0
    # the first scrape itself was counted once /metrics answered
    assert delta("rmserve_requests_total", endpoint="/metrics", status="200") == 1


async def test_group_sent_again_is_answered_from_the_result_cache(make_client):
    client = await make_client(result_cache_groups=2)
    engine = client.app[ENGINE_KEY]
    first = await post_score(client, VALID)
    before = await scrape(client)
    calls = len(engine.calls)
    again = await post_score(client, VALID)
    after = await scrape(client)
    assert "from_result_cache" not in first[1]["results"][0]  # the engine's answer: the flag is not sent
    assert again[1]["results"][0].pop("from_result_cache") is True  # the reply says where it came from
    assert again == first  # otherwise the same rewards, token counts and cached-token counts
    assert len(engine.calls) == calls  # no engine work
    assert after[("rmserve_result_cache_hits_total", ())] - before.get(("rmserve_result_cache_hits_total", ()), 0) == 1
    assert after[("rmserve_groups_total", ())] == before[("rmserve_groups_total", ())]
    # Another response list is another key; the least recently used entry is evicted past 2.
    for text in ("a", "b"):
        status, _ = await post_score(client, {"groups": [{"id": text, "prompt": "hi", "responses": [text]}]})
        assert status == 200
    calls = len(engine.calls)
    await post_score(client, VALID)
    assert len(engine.calls) == calls + 1


async def test_apps_have_separate_registries(make_client):
    first = await make_client()
    second = await make_client(engine_=FakeEngine())
    await assert_serves(first)
    assert (await scrape(first))[("rmserve_groups_total", ())] == 1
    assert (await scrape(second))[("rmserve_groups_total", ())] == 0


# --- concurrency: loop stays free, disconnect cancels, admission limit ---------------------


async def test_rendering_runs_off_the_event_loop(make_client):
    gate = threading.Event()
    renderer = FakeRenderer(gate=gate, gate_timeout_s=10)
    client = await make_client(renderer=renderer)
    task = asyncio.create_task(post_score(client, VALID))
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, renderer.render_entered.wait, 30)
    # the renderer is parked inside render_request; the loop must still answer
    async with client.get("/health") as resp:
        assert resp.status == 200
    async with client.get("/v1/models") as resp:
        assert resp.status == 200
    gate.set()
    status, body = await task
    assert status == 200
    assert body["results"][0]["rewards"] == [4.55, 4.41]
    assert not renderer.gate_timed_out
    assert renderer.thread_ids and threading.main_thread().ident not in renderer.thread_ids


async def test_client_disconnect_cancels_engine_calls(make_client, engine):
    engine.score_gate = asyncio.Event()  # never set: the groups wait until cancelled
    client = await make_client()
    payload = {"groups": [{"id": "a", "prompt": "hi", "responses": ["yo"]},
                          {"id": "b", "prompt": "hi", "responses": ["ya"]}]}
    task = asyncio.create_task(post_score(client, payload))
    await wait_until(lambda: len(engine.calls) == 2)
    task.cancel()
    await wait_until(lambda: len(engine.cancelled) == 2)
    assert sorted(engine.cancelled) == sorted(rid for rid, _ in engine.calls)
    await wait_until(lambda: client.app[STATE_KEY].inflight_groups == 0)
    metrics = await scrape(client)
    assert metrics[("rmserve_requests_total", (("endpoint", "/v1/score"), ("status", "499")))] == 1
    assert metrics[("rmserve_inflight_groups", ())] == 0
    engine.score_gate.set()
    await assert_serves(client)


async def test_admission_limit_429_and_413(make_client, engine):
    engine.score_gate = asyncio.Event()
    client = await make_client(max_inflight_groups=2, retry_after_s=3)
    two = {"groups": [{"id": i, "prompt": "hi", "responses": ["yo"]} for i in ("a", "b")]}
    task = asyncio.create_task(post_score(client, two))
    await wait_until(lambda: len(engine.calls) == 2)
    async with client.post("/v1/score", json=VALID) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "3"
        assert error_of(orjson.loads(await resp.read()))["type"] == "overloaded"
    three = {"groups": [{"id": i, "prompt": "hi", "responses": ["yo"]} for i in ("a", "b", "c")]}
    async with client.post("/v1/score", json=three) as resp:
        # more groups than the server ever admits at once: never admitted, so no retry hint
        assert resp.status == 413
        assert "Retry-After" not in resp.headers
        body = orjson.loads(await resp.read())
    assert body == {"error": {
        "type": "request_over_limit",
        "message": "the request holds 3 groups, more than the server admits at once (2, --max-inflight-groups), so "
                   "it can never be admitted; send at most 2 groups per request, or start the server with a larger "
                   "--max-inflight-groups",
        "field": "groups",
        "limit": {"name": "server.max_inflight_groups", "unit": "groups", "limit": 2, "requested": 3},
    }}
    engine.score_gate.set()
    status, _ = await task
    assert status == 200
    await assert_serves(client)


# --- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"port": 70000}, "port"),
        ({"max_body_bytes": 100}, "max_body_bytes"),
        ({"max_inflight_groups": -1}, "max_inflight_groups"),
        ({"retry_after_s": 0}, "retry_after_s"),
        ({"render_threads": 0}, "render_threads"),
        ({"served_model_name": " "}, "served_model_name"),
        ({"host": ""}, "host"),
        ({"shutdown_timeout_s": -1.0}, "shutdown_timeout_s"),
    ],
)
def test_server_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        ServerConfig(**kwargs)


def test_server_config_defaults():
    config = ServerConfig()
    assert (config.host, config.port, config.max_body_bytes, config.max_inflight_groups) == (
        "127.0.0.1", 8000, 32 * 1024 * 1024, 0,
    )
    assert config.url == "http://127.0.0.1:8000"


def test_create_app_needs_exactly_one_renderer_source():
    with pytest.raises(ValueError, match="exactly one"):
        create_app(ServerConfig(), FakeEngine())
    with pytest.raises(ValueError, match="exactly one"):
        create_app(ServerConfig(), FakeEngine(), FakeRenderer(), renderer_factory=lambda info: FakeRenderer())
