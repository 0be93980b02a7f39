"""OpenAIJudgeEngine against a small OpenAI-shaped HTTP server written here (aiohttp).

The stub speaks the two routes the engine uses (``GET /v1/models``, ``POST
/v1/chat/completions``), records every request and answers from a script of statuses, so
the tests see the engine's real HTTP traffic. The real-server test is in
``test_judge_openai_vllm.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from aiohttp import web

from rmserve.errors import EngineError, EngineNotReady, InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import Message
from rmserve.server.config import EngineConfig
from rmserve.server.judge_openai import (
    OpenAIClientConfig,
    OpenAIJudgeEngine,
    endpoint_fingerprint,
    retry_after_seconds,
)
from rmserve.server.judge_protocols import JudgeOutput
from rmserve.server.protocol import JudgeEngine
from testkit.openai_server import free_port
from testkit.servers import SleepRecorder

MODEL = "judge-7b"

VLLM_TOO_LONG = (
    "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 "
    "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
    "the input prompt. (parameter=input_tokens, value=4097)"
)
OPENAI_TOO_LONG = (
    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
    "Please reduce the length of the messages."
)


class Stub:
    """An OpenAI-shaped server: records requests, answers the next scripted reply.

    ``script`` holds, per chat request in arrival order, ``(status, body, headers)``; when it
    runs out every request gets a 200 whose text is ``"verdict for: " + last message``, with
    ``prompt_tokens`` = characters of all messages, ``completion_tokens`` 3 and 2 cached tokens.
    """

    def __init__(self, *, models=(MODEL,), max_model_len=4096, hold_until: int | None = None) -> None:
        self.models = models
        self.max_model_len = max_model_len
        self.script: list[tuple[int, object, dict[str, str]]] = []
        self.chat_requests: list[tuple[dict, dict[str, str]]] = []
        self.model_requests: list[dict[str, str]] = []
        self.models_status = 200
        self.inflight = 0
        self.max_inflight = 0
        self.hold_until = hold_until
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def list_models(self, request: web.Request) -> web.Response:
        self.model_requests.append(request.headers.copy())
        if self.models_status != 200:
            # Echo the key, as a careless server might: the engine must not repeat it.
            key = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return web.json_response({"error": {"message": f"invalid key {key}"}}, status=self.models_status)
        data = []
        for name in self.models:
            entry = {"id": name, "object": "model", "owned_by": "stub", "root": f"/models/{name}", "created": 1700000000}
            if self.max_model_len is not None:
                entry["max_model_len"] = self.max_model_len
            data.append(entry)
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chat_requests.append((body, request.headers.copy()))
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.hold_until is not None:
                if self.inflight >= self.hold_until:
                    self.release.set()
                await self.release.wait()
                await asyncio.sleep(0)
            if self.script:
                status, payload, headers = self.script.pop(0)
                if status != 200:
                    return web.json_response(payload, status=status, headers=headers)
                return web.json_response(payload, headers=headers)
            last = body["messages"][-1]["content"]
            chars = sum(len(m["content"]) for m in body["messages"])
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": f"verdict for: {last}"}, "finish_reason": "stop"}
                    ],
                    "usage": {
                        "prompt_tokens": chars,
                        "completion_tokens": 3,
                        "total_tokens": chars + 3,
                        "prompt_tokens_details": {"cached_tokens": 2},
                    },
                }
            )
        finally:
            self.inflight -= 1


def error_body(message: str, code: int | str | None = None) -> dict:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}


@pytest.fixture
async def stub_server(aiohttp_server):
    """Start a :class:`Stub` (keyword arguments to it); returns ``(stub, base URL)``."""

    async def start(**kwargs):
        stub = Stub(**kwargs)
        server = await aiohttp_server(stub.app())
        return stub, str(server.make_url("/v1")), server

    return start


def config(url: str, **kwargs) -> EngineConfig:
    fields = {"model": MODEL, "kind": "judge", "judge_url": url, "judge_max_tokens": 32}
    fields.update(kwargs)
    return EngineConfig(**fields)


CALLS = [
    [Message("system", "You are a judge."), Message("user", "Which is better, A or B?")],
    [Message("user", "Rate this answer.")],
]


@pytest.fixture
async def engines():
    """Collects engines made in a test and shuts them down at its end."""
    made: list[OpenAIJudgeEngine] = []

    def make(cfg: EngineConfig, *, sleep=asyncio.sleep, **client) -> OpenAIJudgeEngine:
        engine = OpenAIJudgeEngine(cfg, OpenAIClientConfig(**client), sleep=sleep)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.shutdown()


async def test_request_bodies_and_outputs(stub_server, engines, monkeypatch):
    monkeypatch.delenv("RMSERVE_JUDGE_API_KEY", raising=False)
    stub, url, _ = await stub_server()
    engine = engines(config(url, protocol="ranking", compat="official"))
    assert isinstance(engine, JudgeEngine)
    loaded = await engine.start()
    assert loaded.info.kind == "judge"
    assert loaded.info.engine == "openai"
    assert loaded.info.mode == "ranking"
    assert loaded.info.compat == "official"
    assert loaded.info.max_model_len == 4096
    assert loaded.info.name == MODEL
    assert loaded.renderer is None and loaded.checkpoint_dir is None
    assert engine.max_tokens == 32

    outputs = await engine.judge_group(CALLS, "req-7")

    bodies = sorted((body for body, _ in stub.chat_requests), key=lambda b: len(b["messages"]), reverse=True)
    assert bodies == [
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You are a judge."},
                {"role": "user", "content": "Which is better, A or B?"},
            ],
            "temperature": 0,
            "top_p": 1,
            "max_tokens": 32,
            "n": 1,
        },
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Rate this answer."}],
            "temperature": 0,
            "top_p": 1,
            "max_tokens": 32,
            "n": 1,
        },
    ]
    assert sorted(headers["X-Request-Id"] for _, headers in stub.chat_requests) == ["req-7-0", "req-7-1"]
    assert outputs == [
        JudgeOutput("verdict for: Which is better, A or B?", 16 + 24, 3, "stop", 2),
        JudgeOutput("verdict for: Rate this answer.", 17, 3, "stop", 2),
    ]


async def test_judge_model_overrides_model_name(stub_server, engines):
    stub, url, _ = await stub_server(models=("other", "served-name"))
    engine = engines(config(url, judge_model="served-name"))
    loaded = await engine.start()
    assert loaded.info.name == "served-name"
    await engine.judge_group(CALLS[1:], "r")
    assert stub.chat_requests[0][0]["model"] == "served-name"


async def test_bearer_header_from_the_named_environment_variable(stub_server, engines, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test-123")
    monkeypatch.setenv("RMSERVE_JUDGE_API_KEY", "sk-default-not-this-one")
    stub, url, _ = await stub_server()
    engine = engines(config(url, judge_api_key_env="MY_JUDGE_KEY"))
    await engine.start()
    await engine.judge_group(CALLS, "r")
    assert stub.model_requests[0]["Authorization"] == "Bearer sk-test-123"
    assert [headers["Authorization"] for _, headers in stub.chat_requests] == ["Bearer sk-test-123"] * 2
    assert "sk-test-123" not in repr(engine)


async def test_no_authorization_header_when_the_variable_is_unset(stub_server, engines, monkeypatch):
    monkeypatch.delenv("RMSERVE_JUDGE_API_KEY", raising=False)
    stub, url, _ = await stub_server()
    engine = engines(config(url))
    await engine.start()
    await engine.judge_group(CALLS, "r")
    assert "Authorization" not in stub.model_requests[0]
    assert all("Authorization" not in headers for _, headers in stub.chat_requests)


async def test_429_with_retry_after_is_retried_then_succeeds(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [
        (429, error_body("rate limited"), {"Retry-After": "2"}),
        (429, error_body("rate limited"), {"Retry-After": "7"}),
    ]
    sleeps = SleepRecorder()
    engine = engines(config(url), sleep=sleeps, backoff_s=0.5)
    await engine.start()
    [output] = await engine.judge_group(CALLS[1:], "r")
    assert output.text == "verdict for: Rate this answer."
    assert sleeps.delays_s == [2.0, 7.0]
    assert len(stub.chat_requests) == 3


async def test_5xx_without_retry_after_backs_off_exponentially(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [(503, error_body("busy"), {})] * 3
    sleeps = SleepRecorder()
    engine = engines(config(url), sleep=sleeps, backoff_s=0.5, max_backoff_s=1.5, max_attempts=4)
    await engine.start()
    [output] = await engine.judge_group(CALLS[1:], "r")
    assert output.finish_reason == "stop"
    assert sleeps.delays_s == [0.5, 1.0, 1.5]
    assert len(stub.chat_requests) == 4


async def test_exhausted_retries_raise_engine_error_naming_url_and_status(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [(500, error_body("kaput"), {})] * 3
    sleeps = SleepRecorder()
    engine = engines(config(url), sleep=sleeps, max_attempts=3)
    await engine.start()
    with pytest.raises(EngineError) as caught:
        await engine.judge_group(CALLS[1:], "r")
    message = str(caught.value)
    assert f"{url}/chat/completions" in message
    assert "after 3 attempts" in message
    assert "HTTP 500" in message and "kaput" in message
    assert len(stub.chat_requests) == 3
    assert len(sleeps.delays_s) == 2


async def test_retry_after_over_the_limit_ends_the_retries(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [(429, error_body("slow down"), {"Retry-After": "600"})]
    engine = engines(config(url), sleep=SleepRecorder(), max_retry_wait_s=120)
    await engine.start()
    with pytest.raises(EngineError, match="retry after 600 s, over the 120 s limit"):
        await engine.judge_group(CALLS[1:], "r")
    assert len(stub.chat_requests) == 1


async def test_connection_errors_are_retried_then_reported(stub_server, engines):
    stub, url, server = await stub_server()
    sleeps = SleepRecorder()
    engine = engines(config(url), sleep=sleeps, max_attempts=2)
    await engine.start()
    await server.close()
    with pytest.raises(EngineError) as caught:
        await engine.judge_group(CALLS[1:], "r")
    assert f"{url}/chat/completions" in str(caught.value)
    assert "no reply" in str(caught.value)
    assert len(sleeps.delays_s) == 1


async def test_other_client_errors_are_not_retried(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [(422, error_body("messages[0].role: unknown role 'tool'"), {})]
    engine = engines(config(url), sleep=SleepRecorder())
    await engine.start()
    with pytest.raises(EngineError, match="HTTP 422: messages\\[0\\].role: unknown role 'tool'"):
        await engine.judge_group(CALLS[1:], "r")
    assert len(stub.chat_requests) == 1


@pytest.mark.parametrize(
    ("message", "code", "limit", "value"),
    [
        (VLLM_TOO_LONG, 400, 4096, 4097),
        ("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", 400, 4096, None),
        (OPENAI_TOO_LONG, "context_length_exceeded", 8192, 9000),
    ],
)
async def test_prompt_too_long_raises_sequence_too_long(stub_server, engines, message, code, limit, value):
    stub, url, _ = await stub_server()
    stub.script = [(400, error_body(message, code), {})]
    engine = engines(config(url), sleep=SleepRecorder())
    await engine.start()
    with pytest.raises(SequenceTooLong) as caught:
        await engine.judge_group(CALLS[1:], "r")
    assert caught.value.field == "messages"
    assert caught.value.limit == limit
    assert caught.value.value == value
    assert len(stub.chat_requests) == 1


async def test_a_too_long_call_fails_the_whole_group(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [(400, error_body(VLLM_TOO_LONG, 400), {})]
    engine = engines(config(url), sleep=SleepRecorder())
    await engine.start()
    with pytest.raises(SequenceTooLong):
        await engine.judge_group(CALLS, "r")


async def test_model_not_listed_is_a_clear_start_error(stub_server, engines):
    _, url, _ = await stub_server(models=("llama-70b", "qwen-7b"))
    engine = engines(config(url, judge_model="judge-9b"))
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    message = str(caught.value)
    assert "'judge-9b'" in message
    assert url in message
    assert "'llama-70b', 'qwen-7b'" in message
    assert caught.value.field == "judge_model"


async def test_unreachable_endpoint_is_a_clear_start_error(engines):
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = engines(config(url), connect_timeout_s=5)
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    assert f"{url}/models" in str(caught.value)
    assert "cannot reach" in str(caught.value)


async def test_refused_key_names_the_variable_not_the_key(stub_server, engines, monkeypatch):
    monkeypatch.setenv("RMSERVE_JUDGE_API_KEY", "sk-wrong-456")
    stub, url, _ = await stub_server()
    stub.models_status = 401
    engine = engines(config(url))
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    assert "RMSERVE_JUDGE_API_KEY" in str(caught.value)
    assert str(caught.value).endswith("invalid key ***")
    assert stub.model_requests[0]["Authorization"] == "Bearer sk-wrong-456"


async def test_max_model_len_falls_back_to_the_config_then_unknown(stub_server, engines):
    _, url, _ = await stub_server(max_model_len=None)
    assert (await engines(config(url, max_model_len=1024)).start()).info.max_model_len == 1024
    assert (await engines(config(url)).start()).info.max_model_len == 0


async def test_reply_without_usage_is_an_engine_error(stub_server, engines):
    stub, url, _ = await stub_server()
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "[[A]]"}, "finish_reason": "stop"}]}
    stub.script = [(200, reply, {})]
    engine = engines(config(url))
    await engine.start()
    with pytest.raises(EngineError, match="no valid usage"):
        await engine.judge_group(CALLS[1:], "r")


async def test_missing_cached_tokens_read_as_zero(stub_server, engines):
    stub, url, _ = await stub_server()
    reply = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "[[B]]"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 32, "prompt_tokens_details": None},
    }
    stub.script = [(200, reply, {})]
    engine = engines(config(url))
    await engine.start()
    assert await engine.judge_group(CALLS[1:], "r") == [JudgeOutput("[[B]]", 40, 32, "length", 0)]


async def test_concurrency_is_bounded_across_the_engine(stub_server, engines):
    stub, url, _ = await stub_server(hold_until=2)
    engine = engines(config(url), max_concurrency=2)
    await engine.start()
    calls = [[Message("user", f"q{i}")] for i in range(5)]
    first, second = await asyncio.gather(engine.judge_group(calls[:3], "a"), engine.judge_group(calls[3:], "b"))
    assert [o.text for o in first + second] == [f"verdict for: q{i}" for i in range(5)]
    assert stub.max_inflight == 2
    assert OpenAIClientConfig().max_concurrency == 16


async def test_lifecycle_errors_and_idempotent_shutdown(stub_server, engines):
    _, url, _ = await stub_server()
    engine = engines(config(url))
    with pytest.raises(EngineNotReady):
        engine.info()
    await engine.start()
    with pytest.raises(InvalidRequest) as caught:
        await engine.judge_group([], "r")
    assert caught.value.field == "calls"
    await engine.shutdown()
    await engine.shutdown()
    with pytest.raises(EngineNotReady):
        await engine.judge_group(CALLS, "r")


def test_constructor_refuses_a_config_without_url_and_bad_client_settings():
    with pytest.raises(ValueError, match="judge_url"):
        OpenAIJudgeEngine(EngineConfig(model=MODEL, kind="judge"))
    with pytest.raises(ValueError, match="max_concurrency: 0 must be an integer ≥ 1"):
        OpenAIClientConfig(max_concurrency=0)
    with pytest.raises(ValueError, match="read_timeout_s: 0 must be a number > 0"):
        OpenAIClientConfig(read_timeout_s=0)
    with pytest.raises(ValueError, match="backoff_s: -1 must be a number ≥ 0"):
        OpenAIClientConfig(backoff_s=-1)


def test_retry_after_header_values():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    # An HTTP date 90 s after "now" (Unix 1700000000 = Tue, 14 Nov 2023 22:13:20 GMT).
    assert retry_after_seconds("Tue, 14 Nov 2023 22:14:50 GMT", now=1700000000.0) == 90.0
    assert retry_after_seconds("Tue, 14 Nov 2023 22:00:00 GMT", now=1700000000.0) == 0.0


def _expected_fingerprint(sections: list[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for label, value in sections:
        data = value.encode()
        digest.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]


def test_endpoint_fingerprint_covers_url_model_listing_and_settings():
    listing = {"id": MODEL, "root": "/models/j", "created": 1600000000}
    settings = {"protocol": "auto", "compat": "none"}
    got = endpoint_fingerprint("http://h:8000/v1/", MODEL, listing, settings, listing_time=1700000000.0)
    assert got == _expected_fingerprint(
        [("kind", "judge-openai"), ("url", "http://h:8000/v1"), ("model", MODEL), ("root", "/models/j"),
         ("created", "1600000000"), ("compat", "none"), ("protocol", "auto")]
    )
    # vLLM stamps `created` with the listing time: left out, so a later listing gives the same value.
    now = {"id": MODEL, "root": "/models/j", "created": 1700000001}
    later = {"id": MODEL, "root": "/models/j", "created": 1700000500}
    assert endpoint_fingerprint("http://h:8000/v1", MODEL, now, settings, listing_time=1700000000.0) == endpoint_fingerprint(
        "http://h:8000/v1", MODEL, later, settings, listing_time=1700000499.0
    )
    assert got != endpoint_fingerprint("http://h:8000/v1", "other", listing, settings, listing_time=1700000000.0)
    assert got != endpoint_fingerprint("http://h:9000/v1", MODEL, listing, settings, listing_time=1700000000.0)
    assert got != endpoint_fingerprint(
        "http://h:8000/v1", MODEL, listing, {**settings, "compat": "official"}, listing_time=1700000000.0
    )


def test_module_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, rmserve.server.judge_openai; print(json.dumps(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
