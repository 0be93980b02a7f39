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
from rmserve.schema import JudgeEngineInfo, JudgeSampling, Message
from rmserve.server.config import EngineConfig
from rmserve.server.engines.openai_judge import (
    PROBE_REQUEST_ID,
    REMOTE_BATCH_INVARIANCE,
    OpenAIClientConfig,
    OpenAIJudgeEngine,
    endpoint_fingerprint,
    retry_after_seconds,
)
from rmserve.server.kinds.judge_protocols import RANKING_SYSTEM_PROMPT, JudgeOutput
from rmserve.server.engines.protocol import JudgeEngine
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
    runs out, ``reply_of`` (when set) gives the 200 body from the request body, else every
    request gets a 200 whose text is ``"verdict for: " + last message``, with
    ``prompt_tokens`` = characters of all messages, ``completion_tokens`` 3 and 2 cached tokens.
    The engine's start-up probe calls (``X-Request-Id`` ``rmserve-probe…``) are kept apart:
    recorded in ``probe_requests`` and answered from ``probe_script`` (then the 200 above, its
    ``model`` being ``reply_model`` when set), so they take nothing from ``script``. With
    ``refuse_system`` every request holding a system message gets the 400 a vLLM server gives
    for a chat template without a system role (recorded in ``refused``).
    """

    def __init__(
        self, *, models=(MODEL,), max_model_len=4096, hold_until: int | None = None, refuse_system: bool = False
    ) -> None:
        self.models = models
        self.refuse_system = refuse_system
        self.max_model_len = max_model_len
        self.script: list[tuple[int, object, dict[str, str]]] = []
        self.chat_requests: list[tuple[dict, dict[str, str]]] = []
        self.probe_requests: list[tuple[dict, dict[str, str]]] = []
        self.refused: list[dict] = []
        self.probe_script: list[tuple[int, object]] = []
        self.reply_model: str | None = None
        self.model_requests: list[dict[str, str]] = []
        self.models_status = 200
        self.inflight = 0
        self.max_inflight = 0
        self.hold_until = hold_until
        self.release = asyncio.Event()
        self.reply_of = None

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
        if self.refuse_system and any(m["role"] == "system" for m in body["messages"]):
            # What vLLM's server answers when the model's chat template raises on a system message.
            self.refused.append(body)
            return web.json_response(error_body("System role not supported", 400), status=400)
        if request.headers.get("X-Request-Id", "").startswith(PROBE_REQUEST_ID):
            self.probe_requests.append((body, request.headers.copy()))
            if self.probe_script:
                status, payload = self.probe_script.pop(0)
                return web.json_response(payload, status=status)
            return self.completion(body)
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
            if self.reply_of is not None:
                return web.json_response(self.reply_of(body))
            return self.completion(body)
        finally:
            self.inflight -= 1

    def completion(self, body: dict) -> web.Response:
        last = body["messages"][-1]["content"]
        chars = sum(len(m["content"]) for m in body["messages"])
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": self.reply_model or body["model"],
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
    assert "pass --judge-model with one of these" in message
    assert caught.value.field == "judge_model"


async def test_unreachable_endpoint_is_a_clear_start_error(engines):
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = engines(config(url), connect_timeout_s=5)
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    assert f"{url}/models" in str(caught.value)
    assert "cannot reach" in str(caught.value)
    assert "; check --judge-url (the endpoint's base URL, ending in /v1) and that the server is up" in str(caught.value)
    assert caught.value.field == "judge_url"


async def test_refused_key_names_the_variable_not_the_key(stub_server, engines, monkeypatch):
    monkeypatch.setenv("RMSERVE_JUDGE_API_KEY", "sk-wrong-456")
    stub, url, _ = await stub_server()
    stub.models_status = 401
    engine = engines(config(url))
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    assert (
        "refused the API key (HTTP 401); set the environment variable RMSERVE_JUDGE_API_KEY to a valid key, or "
        "name the variable that holds one with --judge-api-key-env: invalid key ***"
    ) in str(caught.value)
    assert str(caught.value).endswith("invalid key ***") and "sk-wrong-456" not in str(caught.value)
    assert stub.probe_requests == []  # refused before the probe call
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

    code = "import sys, rmserve.server.engines.openai_judge; print(json.dumps(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# --- replies without text, reasoning returned apart, the thinking switch ---------------------


def completion(content, finish: str, *, prompt_tokens: int = 40, completion_tokens: int = 32, **message) -> dict:
    """A chat-completion reply body with ``message.content`` = ``content`` (None allowed) and
    the extra ``message`` fields given (``reasoning_content`` …)."""
    return {
        "id": "chatcmpl-2", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, **message},
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


async def test_null_content_and_reasoning_fields_are_read(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.script = [
        (200, completion(None, "length"), {}),  # a reasoning model that spent max_tokens thinking
        (200, completion(None, "length", reasoning_content="[[B]] looks best so far"), {}),
        (200, completion("Final verdict: [[C]]", "stop", completion_tokens=20, reasoning_content="[[B]] first"), {}),
        (200, completion("\n\n8", "stop", completion_tokens=9, reasoning="a 3, or an 8"), {}),
    ]
    engine = engines(config(url))
    await engine.start()
    got = [(await engine.judge_group(CALLS[1:], f"r{k}"))[0] for k in range(4)]
    assert got == [
        JudgeOutput("", 40, 32, "length", 0),
        JudgeOutput("", 40, 32, "length", 0, reasoning="[[B]] looks best so far"),
        JudgeOutput("Final verdict: [[C]]", 40, 20, "stop", 0, reasoning="[[B]] first"),
        JudgeOutput("\n\n8", 40, 9, "stop", 0, reasoning="a 3, or an 8"),
    ]


@pytest.mark.parametrize(
    ("message", "field"),
    [({"content": 7}, "choices\\[0\\].message.content"),
     ({"content": "x", "reasoning_content": ["a"]}, "choices\\[0\\].message.reasoning_content"),
     ({"content": "x", "reasoning": 3}, "choices\\[0\\].message.reasoning")],
)
async def test_content_or_reasoning_of_another_type_is_an_engine_error(stub_server, engines, message, field):
    stub, url, _ = await stub_server()
    reply = completion(None, "stop")
    reply["choices"][0]["message"] = {"role": "assistant", **message}
    stub.script = [(200, reply, {})]
    engine = engines(config(url))
    await engine.start()
    with pytest.raises(EngineError, match=f"no valid {field}"):
        await engine.judge_group(CALLS[1:], "r")


@pytest.mark.parametrize(("thinking", "kwargs"), [(None, None), ("on", {"enable_thinking": True}),
                                                  ("off", {"enable_thinking": False})])
async def test_the_thinking_switch_is_sent_as_chat_template_kwargs(stub_server, engines, thinking, kwargs):
    stub, url, _ = await stub_server()
    engine = engines(config(url, judge_thinking=thinking))
    info = (await engine.start()).info
    await engine.judge_group(CALLS[1:], "r")
    ((body, _),) = stub.chat_requests
    assert body.get("chat_template_kwargs") == kwargs
    assert ("chat_template_kwargs" in body) == (thinking is not None)
    settings = {"protocol": "auto", "compat": "none", "judge_max_tokens": 32, "judge_seed": 0,
                "judge_system_prompt": True}
    if thinking is not None:
        settings["judge_thinking"] = thinking
    listing = {"root": f"/models/{MODEL}", "created": 1700000000}
    assert info.fingerprint == endpoint_fingerprint(url, MODEL, listing, settings, listing_time=None)


def _letter_of_good(body: dict) -> tuple[str, str]:
    """The letter whose answer holds GOOD in a ranking request (the fake judge's rule), and
    another letter."""
    from testkit.judge_fakes import fake_verdict

    messages = [Message(m["role"], m["content"]) for m in body["messages"]]
    right = fake_verdict(messages)[-3]
    return right, "ABCD"[("ABCD".index(right) + 1) % 4]


def reasoning_replies(body: dict) -> dict:
    """Replies of a reasoning judge, by the group's question: ``null`` — no text, cut at
    max_tokens while thinking (reasoning returned apart); ``apart`` — the right verdict in
    ``content``, a wrong one in ``reasoning_content``; ``cut-tags`` — a server without a
    reasoning parser, cut inside ``<think>`` after a wrong ``[[X]]``; ``tags`` — a wrong
    ``[[X]]`` in the reasoning, then ``</think>`` and the right verdict."""
    right, wrong = _letter_of_good(body)
    question = body["messages"][-1]["content"].split("[User Question]\n")[1].split("\n")[0]
    if question == "null":
        return completion(None, "length", reasoning_content=f"[[{wrong}]] looks best so far")
    if question == "apart":
        return completion(f"\n\nFinal verdict: [[{right}]]", "stop", completion_tokens=20,
                          reasoning_content=f"[[{wrong}]] looks best so far")
    if question == "cut-tags":
        return completion(f"<think>[[{wrong}]] looks best so far", "length")
    return completion(f"<think>[[{wrong}]] looks best so far</think> Final: [[{right}]]", "stop",
                      completion_tokens=25)


REASONING_GROUPS = (("Factuality", "1", "null"), ("Focus", "2", "apart"), ("Math", "3", "cut-tags"),
                    ("Safety", "4", "tags"))
"""(subset, id, question) of the groups sent to the reasoning judge; see :func:`reasoning_replies`."""


async def test_score_answers_200_for_replies_without_text_and_reads_after_the_reasoning(
    stub_server, aiohttp_client
):
    """A reasoning judge behind an endpoint: a reply with null content cut at max_tokens is one
    unparsed, cut call (not a 500), and verdicts come only from the answer after the reasoning."""
    import orjson
    from testkit.judge_fakes import rb2_group

    from rmserve.fingerprint import judge_fingerprint
    from rmserve.schema import ScoreResponse, decode
    from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app

    stub, url, _ = await stub_server()
    stub.reply_of = reasoning_replies
    engine = OpenAIJudgeEngine(config(url, judge_thinking="on"), OpenAIClientConfig(), sleep=SleepRecorder())
    app = create_app(ServerConfig(port=0), engine)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    groups = [rb2_group(subset, gid, question=question) for subset, gid, question in REASONING_GROUPS]
    payload = {"groups": [
        {"id": f"rewardbench2/{g.domain}/{g.id}", "benchmark": "rewardbench2", "domain": g.domain,
         "messages": [{"role": "user", "content": g.messages[0].content}], "responses": list(g.responses),
         "num_chosen": 1}
        for g in groups
    ]}
    async with client.post("/v1/score", data=orjson.dumps(payload)) as resp:
        status, raw = resp.status, await resp.read()
    assert status == 200, raw
    reply = decode(raw, ScoreResponse)
    calls = [r.judge.calls[0] for r in reply.results]
    assert [(c.text, c.finish_reason, c.parse.reason) for c in calls] == [
        ("", "length", "truncated"),
        (calls[1].text, "stop", "ok"),
        (calls[2].text, "length", "truncated"),
        (calls[3].text, "stop", "ok"),
    ]
    assert [c.parse.parser for c in calls] == ["rb2-ranking"] * 4
    assert calls[0].reasoning is not None and calls[0].reasoning.endswith("looks best so far")
    assert calls[1].text.startswith("\n\nFinal verdict: [[") and calls[1].reasoning.endswith("looks best so far")
    assert calls[2].reasoning is None and calls[2].text.startswith("<think>")
    assert [r.judge.credit for r in reply.results] == [0.25, 1.0, 0.25, 1.0]
    assert [r.rewards for r in reply.results][0] == (0.25, 0.25, 0.25, 0.25)
    assert {r.judge.thinking for r in reply.results} == {"on"}
    assert all(body["chat_template_kwargs"] == {"enable_thinking": True} for body, _ in stub.chat_requests)
    async with client.get("/v1/models") as resp:
        (info,) = orjson.loads(await resp.read())["models"]
    assert (info["compat"], info["judge_thinking"]) == ("none", "on")
    assert reply.fingerprint == info["fingerprint"] == judge_fingerprint(
        engine.info().fingerprint, protocol="auto", max_tokens=32, seed=0, thinking="on"
    )


def test_an_eval_against_a_reasoning_judge_endpoint_goes_on_and_counts_the_cut_calls(tmp_path):
    """``rmserve eval`` through a judge server whose endpoint replies without text: the run
    finishes, and its table and results count the cut, unparsed calls."""
    from testkit.servers import ThreadedServer

    from rmserve.client.score_file import read_scores
    from rmserve.pipelines.evaluate import EvalConfig, evaluate
    from rmserve.server.http.app import ServerConfig, create_app

    rows = [
        {"id": gid, "prompt": question, "chosen": ["GOOD answer four #0"],
         "rejected": ["answer 5", "answer 6", "answer 7"], "num_correct": 1, "num_incorrect": 3,
         "total_completions": 4, "models": ["m1", "m2", "m3", "m4"], "subset": subset, "additional_metadata": {}}
        for subset, gid, question in REASONING_GROUPS
    ]
    data = tmp_path / "rb2.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    stub = Stub()
    stub.reply_of = reasoning_replies
    with ThreadedServer(stub.app) as endpoint:
        engine = OpenAIJudgeEngine(config(f"{endpoint.url}/v1"))
        with ThreadedServer(lambda: create_app(ServerConfig(port=0), engine)) as judge:
            out = tmp_path / "out"
            result = evaluate(EvalConfig(bench="rewardbench2", data=str(data), out_dir=out, server_url=judge.url,
                                         resamples=0, quiet=True))
    assert result.n_scored == 4
    records = {r.domain: r for r in read_scores(out / "scores.jsonl").records}
    assert [records[s].judge.calls[0].parse.reason for s, _, _ in REASONING_GROUPS] == [
        "truncated", "ok", "truncated", "ok"
    ]
    summary = json.loads((out / "results.json").read_text())["judge"]
    assert (summary["n_calls"], summary["n_failed"], summary["n_truncated"]) == (4, 2, 2)
    assert (summary["compat"], summary["readers"]) == (["none"], ["rb2-ranking"])
    table = (out / "table.md").read_text()
    assert "4 calls, 2 without a verdict or rating (50.0%), 2 cut at max_tokens" in table
    # credits: Factuality 0.25, Focus 1, Math 0.25, Safety 1
    subsets = json.loads((out / "results.json").read_text())["subsets"]
    assert [subsets[s]["score"] for s in ("Factuality", "Focus", "Math", "Safety")] == [0.25, 1.0, 0.25, 1.0]
# --- the start-up probe ----------------------------------------------------------------------

PROBE_USER_START = "[User Question]\nWhat is 2 + 2?\n\n[The Start of Assistant A's Answer]\n"
"""How the user turn of the ranking probe call begins (the made-up group of ``judge_probe``)."""


async def test_start_probes_the_endpoint_with_the_ranking_call_and_max_tokens_1(stub_server, engines):
    stub, url, _ = await stub_server()
    info = (await engines(config(url)).start()).info
    assert stub.chat_requests == []  # the probe takes nothing from the scripted calls
    ((body, headers),) = stub.probe_requests
    assert headers["X-Request-Id"] == "rmserve-probe"
    assert {k: v for k, v in body.items() if k != "messages"} == {
        "model": MODEL, "temperature": 0, "top_p": 1, "max_tokens": 1, "n": 1,
    }
    system, user = body["messages"]
    assert system == {"role": "system", "content": RANKING_SYSTEM_PROMPT}
    assert user["role"] == "user" and user["content"].startswith(PROBE_USER_START)
    assert info.judge_sampling == JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=32)
    assert info.judge_engine == JudgeEngineInfo(
        engine="openai", version="judge-7b (root /models/judge-7b)", batch_invariant=None,
        batch_invariant_note=(
            "unknown: the endpoint does not say how it batches the calls (a vLLM server with default settings is not "
            "batch-invariant; VLLM_BATCH_INVARIANT=1 on a supported GPU makes it so)"
        ),
    )


async def test_the_engine_version_is_the_model_the_probe_reply_names(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.reply_model = "judge-7b-2024-08-06"  # a hosted API names the snapshot behind an alias
    info = (await engines(config(url)).start()).info
    assert info.judge_engine.version == "judge-7b-2024-08-06 (root /models/judge-7b)"


async def test_a_400_to_the_system_message_is_a_start_error_naming_the_flag(stub_server, engines):
    stub, url, _ = await stub_server(refuse_system=True)
    with pytest.raises(ServerFault) as caught:
        await engines(config(url)).start()
    err = caught.value
    assert err.field == "judge_system_prompt"
    assert err.message.startswith(
        f"judge_system_prompt: the judge endpoint {url} (model 'judge-7b') refuses the judge's rb2-ranking call, "
        "which sends its instructions as a system message (HTTP 400: System role not supported); the same call "
        "with the instructions in the user turn is accepted (the server checks every call its protocol choice may "
        "send at start, whichever benchmark comes). Start it (serve, run, eval) with --no-judge-system-prompt"
    )
    # First the ranking call (refused), then the same instructions in the user turn (accepted).
    assert [[m["role"] for m in body["messages"]] for body in stub.refused] == [["system", "user"]]
    ((merged, headers),) = stub.probe_requests
    assert headers["X-Request-Id"] == "rmserve-probe-1"
    ((message,),) = [merged["messages"]]
    assert message["role"] == "user" and message["content"].startswith(RANKING_SYSTEM_PROMPT + "\n\n" + PROBE_USER_START)
    assert merged["max_tokens"] == 1


async def test_the_server_start_is_refused_with_the_message_and_exit_status_2(stub_server):
    from rmserve.server.http.app import ServerConfig
    from rmserve.server.http.serve import serve_app

    stub, url, _ = await stub_server(refuse_system=True)
    lines: list[str] = []
    engine = OpenAIJudgeEngine(config(url))
    assert await serve_app(ServerConfig(port=0), engine, announce=lines.append) == 2  # a refusal naming a flag
    assert lines[-1].startswith("engine failed to start: judge_system_prompt: the judge endpoint ")
    assert "Start it (serve, run, eval) with --no-judge-system-prompt" in lines[-1]


async def test_without_the_system_prompt_the_same_endpoint_starts(stub_server, engines):
    stub, url, _ = await stub_server(refuse_system=True)
    await engines(config(url, judge_system_prompt=False)).start()
    ((body, _),) = stub.probe_requests
    assert [m["role"] for m in body["messages"]] == ["user"] and stub.refused == []


PROBE_CALL = "the judge's rb2-ranking call (roles ['system', 'user'], max_tokens 1)"


@pytest.mark.parametrize(("script", "field", "message", "probes"), [
    # a 400 that the system message does not explain: the form without one is refused too
    ([(400, error_body("unsupported parameter: n", 400))] * 2, "judge_url",
     "judge_url: {url}/chat/completions refused " + PROBE_CALL + " (HTTP 400: unsupported parameter: n); every call "
     "of this judge would be refused so: check --judge-model, --judge-url (the endpoint's base URL, ending in /v1) "
     "and that the server is up", 2),
    # a key allowed to list the models but not to call them (the key is never repeated)
    ([(401, error_body("key sk-list-only-789 may not create completions"))], "judge_api_key_env",
     "judge_api_key_env: {url}/chat/completions refused " + PROBE_CALL + " (HTTP 401) although it listed the "
     "models; set the environment variable RMSERVE_JUDGE_API_KEY to a valid key, or name the variable that holds "
     "one with --judge-api-key-env: HTTP 401: key *** may not create completions", 1),
    # a model listed but unknown to the chat route
    ([(404, error_body("The model `judge-7b` does not exist.", 404))], "judge_model",
     "judge_model: {url}/chat/completions does not serve model 'judge-7b' for " + PROBE_CALL + " (HTTP 404: The "
     "model `judge-7b` does not exist.); pass --judge-model with a model the endpoint serves", 1),
])
async def test_a_refused_probe_is_a_start_error_naming_the_option(
    stub_server, engines, monkeypatch, script, field, message, probes
):
    monkeypatch.setenv("RMSERVE_JUDGE_API_KEY", "sk-list-only-789")
    stub, url, _ = await stub_server()
    stub.probe_script = list(script)
    with pytest.raises(ServerFault) as caught:
        await engines(config(url)).start()
    assert (caught.value.field, caught.value.message) == (field, message.format(url=url))
    assert len(stub.probe_requests) == probes


async def test_a_failing_probe_is_retried_then_names_the_url(stub_server, engines):
    stub, url, _ = await stub_server()
    stub.probe_script = [(503, error_body("loading"))] * 5
    sleep = SleepRecorder()
    with pytest.raises(ServerFault) as caught:
        await engines(config(url), sleep=sleep).start()
    assert caught.value.field == "judge_url" and "(HTTP 503: loading)" in caught.value.message
    assert len(stub.probe_requests) == 5
    assert sleep.delays_s == [0.5, 1.0, 2.0, 4.0]


async def test_models_and_results_carry_the_judges_sampling_and_engine(stub_server, aiohttp_client):
    from rmserve.client.records import record_from_result
    from rmserve.metrics.evaluation import MetricsConfig, evaluate_records
    from rmserve.metrics.render_json import result_dict
    from rmserve.schema import Group, ScoreKind, ScoreResponse, decode
    from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app

    _, url, _ = await stub_server()
    app = create_app(ServerConfig(port=0), OpenAIJudgeEngine(config(url, protocol="ranking")))
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    sampling = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32}
    engine = {
        "engine": "openai", "version": "judge-7b (root /models/judge-7b)", "batch_invariant": None,
        "batch_invariant_note": REMOTE_BATCH_INVARIANCE,
    }
    async with client.get("/v1/models") as resp:
        (info,) = (await resp.json())["models"]
    assert (info["judge_sampling"], info["judge_engine"], info["judge_max_tokens"]) == (sampling, engine, 32)

    group = Group("rewardbench2", "Factuality", "7", (Message("user", "2+2?"),), ("4", "5", "3", "22"), 1)
    body = {"groups": [{"id": "rewardbench2/Factuality/7", "benchmark": "rewardbench2", "domain": "Factuality",
                        "messages": [{"role": "user", "content": "2+2?"}], "responses": ["4", "5", "3", "22"],
                        "num_chosen": 1}]}
    async with client.post("/v1/score", json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    (result,) = json.loads(raw)["results"]
    assert (result["judge_sampling"], result["judge_engine"]) == (sampling, engine)

    reply = decode(raw, ScoreResponse)
    record = record_from_result(group, reply.results[0], model=reply.model, fingerprint=reply.fingerprint,
                                kind=ScoreKind(kind="judge", mode="ranking"))
    assert record.judge_sampling == JudgeSampling(0.0, 1.0, 32)
    assert record.judge_engine == JudgeEngineInfo("openai", "judge-7b (root /models/judge-7b)", None,
                                                  REMOTE_BATCH_INVARIANCE)
    judge = result_dict(evaluate_records([record], MetricsConfig(resamples=0)))["judge"]
    assert (judge["sampling"], judge["engine"], judge["n_unrecorded"]) == (sampling, engine, 0)
