"""OpenRLHF's ``POST /get_reward`` over the fake engine and renderer.

Numbers by hand from the fakes' rules (``fakes.py``): the fake RM's template writes BOS ``1``,
then per turn a role id (system 3, user 4, assistant 5), the content's code points and ``2``;
reward = ``sum(ids) % 1000 / 100``.

- user "hi", response "yo" → ``[1, 4, 104, 105, 2, 5, 121, 111, 2]`` (sum 455): 4.55, 9 tokens.
- system "Be brief." (code points sum 765), user "hi", response "yo" → 1 + 3 + 765 + 2 + 4 +
  209 + 2 + 5 + 232 + 2 = 1225: 2.25, 1 + 11 + 4 + 4 = 20 tokens.
- user "hi", response "a<|im_start|>b" (the 12 characters of ``<|im_start|>`` sum to 1237)
  → 1 + 4 + 209 + 2 + 5 + 97 + 1237 + 98 + 2 = 1655: 6.55, 21 tokens.

The ChatML prompt ``<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n`` is 52 characters
(12 + 5 + 2 + 10 + 1 + 12 + 10); with ``yo<|im_end|>`` the query is 64.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import logging
import sys
import types
from pathlib import Path

import jinja2
import msgspec
import orjson
import pytest
from testkit.app_client import fake_app_client, metric_samples
from testkit.chatml import CHATML_TEMPLATE, DEFAULT_SYSTEM
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, FakeTokenizer
from rmserve.demo_model import CHAT_TEMPLATE as DEMO_TEMPLATE
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.kinds.dpo import DPOKind
from rmserve.server.render.chat import Renderer
from rmserve.server.sharing.auth import add_user

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
Q_HI = PROMPT + "yo<|im_end|>"
Q_SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n" + Q_HI
LLAMA3_FILE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
"""A Llama-3-style template file, written for this test."""


async def post(client, payload, headers=None, path="/get_reward") -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    async with client.post(path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as resp:
        return resp.status, orjson.loads(await resp.read())


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


async def client_with(aiohttp_client, engine, renderer=None, **config):
    return await fake_app_client(aiohttp_client, ServerConfig(port=0, **config), engine, renderer=renderer)


async def test_chatml_queries_are_retemplated_with_the_rm_template(aiohttp_client, engine):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, {"query": [Q_SYSTEM, Q_HI], "prompts": ["", PROMPT], "labels": [None, "x"]})
    assert status == 200, body
    assert body == {
        "rewards": [pytest.approx(2.25, abs=1e-12), pytest.approx(4.55, abs=1e-12)],
        "scores": [pytest.approx(2.25, abs=1e-12), pytest.approx(4.55, abs=1e-12)],
        "extra_logs": {"rm_tokens": [20.0, 9.0]},
        "rmserve": {"template": "re-templated chatml→rm", "model": "fake-rm", "fingerprint": "fp-fake-1",
                    "num_tokens": [20, 9]},
    }
    sent = sorted(ids for _, (ids,) in engine.calls)
    assert sent == [
        (1, 3, *map(ord, "Be brief."), 2, 4, 104, 105, 2, 5, 121, 111, 2),
        (1, 4, 104, 105, 2, 5, 121, 111, 2),
    ]


@pytest.mark.parametrize("query", [
    PROMPT + "yo",  # cut at the length limit: no end of turn
    PROMPT + "yo<|im_end|><|endoftext|>",  # an end-of-text token after it
    PROMPT + "yo<|im_end|>\n",
])
async def test_how_a_generation_ends_does_not_change_the_reward(aiohttp_client, engine, query):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, {"query": [query]})
    assert status == 200, body
    assert body["rewards"] == [pytest.approx(4.55, abs=1e-12)]
    assert [ids for _, (ids,) in engine.calls] == [(1, 4, 104, 105, 2, 5, 121, 111, 2)]


async def test_the_prompt_fixes_where_the_response_starts(aiohttp_client, engine):
    """The response holds the text of a special token: read whole, the query is ambiguous
    (refused); with its prompt, the response is everything the policy generated."""
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    query = PROMPT + "a<|im_start|>b<|im_end|>"
    status, body = await post(client, {"query": [query], "prompts": [PROMPT], "labels": [None]})
    assert status == 200, body
    assert body["rewards"] == [pytest.approx(6.55, abs=1e-12)]
    assert body["rmserve"]["num_tokens"] == [21]
    status, body = await post(client, {"query": [query]})
    assert status == 400, body
    assert body["error"]["field"] == "query[0]"
    assert body["error"]["message"] == (
        "query[0] is not in the form of the policy template (chatml): does not parse as a chatml conversation: "
        "at character 53, expected '<|im_end|>' (the end of the assistant turn)"
    )


@pytest.mark.parametrize(("payload", "message"), [
    ({"query": ["Human: hi\nAssistant: yo"]},
     "at character 0, expected '<|im_start|>' (the start of a turn)"),
    ({"query": [Q_HI + "\nmore"]},
     "at character 65, expected '<|im_start|>' (the start of a turn) or the end of the text"),
    ({"query": [Q_HI + "\nmore"], "prompts": [PROMPT]},
     "at character 65, expected the end of the text after the response's '<|im_end|>'"),
    ({"query": ["<|im_start|>user\nhi<|im_end|>\n"]},
     "at character 0, expected the assistant's response as the last turn (found a 'user' turn)"),
    ({"query": ["<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\nyo"]},
     "at character 31, expected a 'user' turn before the response (a 'system' turn there)"),
    ({"query": ["<|im_start|>user hi"]}, "at character 12, expected a role name followed by '\\n'"),
])
async def test_a_query_that_does_not_parse_is_400_naming_the_offset(aiohttp_client, engine, payload, message):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, payload)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request"
    assert body["error"]["field"] == "query[0]"
    assert body["error"]["message"] == (
        "query[0] is not in the form of the policy template (chatml): does not parse as a chatml conversation: "
        + message
    )
    assert engine.calls == []  # nothing was scored


async def test_one_bad_query_fails_the_request_naming_its_position(aiohttp_client, engine):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, {"query": [Q_HI, "plain text"]})
    assert status == 400, body
    assert body["error"]["field"] == "query[1]"
    assert engine.calls == []


async def test_an_over_length_query_is_413_naming_the_limit(aiohttp_client, engine):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, {"query": [PROMPT + "a" * 60 + "<|im_end|>"]})
    assert status == 413, body
    assert body["error"] == {
        "type": "sequence_too_long", "field": "query[0]",
        "message": "query[0] is 67 tokens as the reward model scores it (re-templated chatml→rm), over "
                   "max_model_len=64; nothing of the request was scored",
    }
    assert engine.calls == []


@pytest.fixture
def llama3_config(tmp_path) -> ServerConfig:
    """A config naming a template file (read when built: off the event loop)."""
    return ServerConfig(port=0, policy_template=str(_file(tmp_path, LLAMA3_FILE)))


@pytest.fixture
def chatml_file_config(tmp_path) -> ServerConfig:
    return ServerConfig(port=0, policy_template=str(_file(tmp_path, CHATML_TEMPLATE)))


async def test_llama3_template_file_and_gemma_family(aiohttp_client, engine, llama3_config):
    config = llama3_config
    assert (config.policy_family, config.policy_template_text) == ("llama3", LLAMA3_FILE)
    client = await fake_app_client(aiohttp_client, config, engine)
    query = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>")
    status, body = await post(client, {"query": [query]})
    assert status == 200, body
    assert body["rewards"] == [pytest.approx(4.55, abs=1e-12)]
    assert body["rmserve"]["template"] == "re-templated llama3→rm"

    gemma = await client_with(aiohttp_client, FakeEngine(), policy_template="gemma")
    query = "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
    status, body = await post(gemma, {"query": [query]})
    assert status == 200, body
    assert body["rewards"] == [pytest.approx(4.55, abs=1e-12)]
    assert body["rmserve"]["template"] == "re-templated gemma→rm"


def test_a_template_file_of_no_known_family_is_refused_at_start(tmp_path):
    path = tmp_path / "demo.jinja"
    path.write_text(DEMO_TEMPLATE)
    with pytest.raises(ValueError, match="writes turns in none of the known forms"):
        ServerConfig(port=0, policy_template=str(path))
    with pytest.raises(ValueError, match="neither a family"):
        ServerConfig(port=0, policy_template="vicuna")
    assert ServerConfig(port=0, policy_template=str(_file(tmp_path, CHATML_TEMPLATE))).policy_family == "chatml"


def _file(folder: Path, text: str) -> Path:
    path = folder / "template.jinja"
    path.write_text(text)
    return path


async def test_policy_template_rm_passes_text_through_without_adding_bos(aiohttp_client, engine):
    client = await client_with(aiohttp_client, engine, policy_template="rm")
    status, body = await post(client, {"query": ["\x01\x04hi\x02\x05yo\x02"]})
    assert status == 200, body
    assert body["rewards"] == [pytest.approx(4.55, abs=1e-12)]
    assert body["rmserve"]["template"] == "passed through"
    assert [ids for _, (ids,) in engine.calls] == [(1, 4, 104, 105, 2, 5, 121, 111, 2)]
    status, body = await post(client, {"query": ["\x01\x01\x04hi\x02\x05yo\x02"]})
    assert status == 400, body
    assert body["error"]["field"] == "query[0]"
    assert "starts with the BOS token twice" in body["error"]["message"]


async def test_without_policy_template_an_rm_of_no_known_family_refuses(aiohttp_client, engine, caplog):
    caplog.set_level(logging.INFO, logger="rmserve.server")
    client = await client_with(aiohttp_client, engine)
    (said,) = [r.getMessage() for r in caplog.records if "/get_reward" in r.getMessage()]
    assert said.startswith("POST /get_reward (OpenRLHF) will refuse every query: no --policy-template was given")
    caplog.clear()
    await client_with(aiohttp_client, FakeEngine(), policy_template="rm")
    assert not [r for r in caplog.records if "/get_reward" in r.getMessage()]
    status, body = await post(client, {"query": [Q_HI]})
    assert status == 400, body
    assert body["error"]["field"] == "query"
    assert "started without --policy-template" in body["error"]["message"]


class ChatmlCodePointTokenizer(FakeTokenizer):
    """The fake tokenizer (ids = code points) with a real ChatML template (a default system
    block, testkit's ``CHATML_TEMPLATE``) and no BOS, as Qwen2.5's."""

    chat_template = CHATML_TEMPLATE
    bos_token_id = None

    def apply_chat_template(self, conversations, *, chat_template=None, tokenize=False, add_generation_prompt=False):
        template = jinja2.Environment().from_string(chat_template or self.chat_template)
        single = bool(conversations) and isinstance(conversations[0], dict)
        texts = [template.render(messages=c, add_generation_prompt=add_generation_prompt)
                 for c in ([conversations] if single else conversations)]
        return texts[0] if single else texts

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


LONG_MODEL = msgspec.structs.replace(FAKE_MODEL, max_model_len=4096)


def code_point_reward(text: str) -> float:
    return sum(map(ord, text)) % 1000 / 100


async def test_a_chatml_rm_checks_and_passes_through_or_retemplates(aiohttp_client, caplog):
    """The RM's own template is ChatML: without --policy-template a ChatML query passes through
    as sent (its form checked; no warning at start); named, the same query is re-templated,
    which adds the RM template's default system block."""
    caplog.set_level(logging.INFO, logger="rmserve.server")
    renderer = Renderer(ChatmlCodePointTokenizer(), max_model_len=4096)
    engine = FakeEngine(model=LONG_MODEL)
    client = await client_with(aiohttp_client, engine, renderer=renderer)
    assert not [r for r in caplog.records if "/get_reward" in r.getMessage()]
    status, body = await post(client, {"query": [Q_HI]})
    assert status == 200, body
    assert body["rmserve"]["template"] == "passed through"
    assert body["rewards"] == [pytest.approx(code_point_reward(Q_HI), abs=1e-12)]
    assert [ids for _, (ids,) in engine.calls] == [tuple(map(ord, Q_HI))]
    status, body = await post(client, {"query": ["Human: hi"]})
    assert status == 400, body
    assert body["error"]["message"] == (
        "query[0] is not in the form of the reward model's template: does not parse as a chatml conversation: "
        "at character 0, expected '<|im_start|>' (the start of a turn)"
    )

    engine = FakeEngine(model=LONG_MODEL)
    client = await client_with(aiohttp_client, engine, renderer=renderer, policy_template="chatml")
    status, body = await post(client, {"query": [Q_HI]})
    assert status == 200, body
    rendered = f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n{Q_HI}\n"
    assert [ids for _, (ids,) in engine.calls] == [tuple(map(ord, rendered))]
    assert body["rewards"] == [pytest.approx(code_point_reward(rendered), abs=1e-12)]
    assert body["rmserve"]["template"] == "re-templated chatml→rm"


async def test_a_template_file_equal_to_the_rms_passes_through(aiohttp_client, chatml_file_config):
    renderer = Renderer(ChatmlCodePointTokenizer(), max_model_len=4096)
    engine = FakeEngine(model=LONG_MODEL)
    client = await fake_app_client(aiohttp_client, chatml_file_config, engine, renderer=renderer)
    status, body = await post(client, {"query": [Q_HI]})
    assert status == 200, body
    assert body["rmserve"]["template"] == "passed through"
    assert [ids for _, (ids,) in engine.calls] == [tuple(map(ord, Q_HI))]


@pytest.mark.parametrize(("payload", "field", "words"), [
    ({}, "query", "missing required field `query`"),
    ({"query": Q_HI}, "query", "Expected `array`, got `str`"),
    ({"query": []}, "query", "at least one text"),
    ({"query": [1]}, "query[0]", "Expected `str`, got `int`"),
    ({"query": [Q_HI], "prompts": [PROMPT, PROMPT]}, "prompts", "prompts holds 2 entries for 1 queries"),
    ({"query": [Q_HI], "labels": []}, "labels", "labels holds 0 entries for 1 queries"),
    ({"query": [Q_HI], "prompts": "p"}, "prompts", "Expected `array | null`"),
    ({"query": [Q_HI], "reward": 1}, "reward", "unknown field"),
])
async def test_wrong_shapes_are_400_naming_the_field(aiohttp_client, engine, payload, field, words):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, payload)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request"
    assert body["error"]["field"] == field
    assert words in body["error"]["message"]


async def test_another_kind_is_400_naming_it(aiohttp_client):
    app = create_app(ServerConfig(port=0, policy_template="chatml"), FakeEngine(), FakeRenderer(), kind=DPOKind())
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    status, body = await post(client, {"query": [Q_HI]})
    assert status == 400
    assert body["error"]["field"] == "model"
    assert body["error"]["message"] == ("POST /get_reward serves sequence classifiers (kind classifier); "
                                        "this model is kind dpo: use POST /v1/score")


@pytest.fixture
def users_config(tmp_path):
    """A users file with alice (max_inflight_groups 1) and an expired user (built off the loop)."""
    path = tmp_path / "users.jsonl"
    alice, _ = add_user(path, "alice", max_inflight_groups=1)
    old, _ = add_user(path, "old", expires=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    return ServerConfig(port=0, users_file=str(path), policy_template="chatml"), alice, old


async def test_get_reward_goes_through_auth_user_limits_and_metrics(aiohttp_client, users_config, engine):
    config, alice, old = users_config
    client = await fake_app_client(aiohttp_client, config, engine)
    status, _ = await post(client, {"query": [Q_HI]})
    assert status == 401
    status, _ = await post(client, {"query": [Q_HI]}, {"Authorization": f"Bearer {old}"})
    assert status == 401
    auth = {"Authorization": f"Bearer {alice}"}
    status, body = await post(client, {"query": [Q_HI]}, auth)
    assert status == 200, body
    status, body = await post(client, {"query": [Q_HI, Q_SYSTEM]}, auth)
    assert status == 413, body  # each query is one group: two are over alice's max_inflight_groups=1
    assert (body["error"]["type"], body["error"]["field"]) == ("request_over_limit", "query")
    assert body["error"]["limit"] == {"name": "user.max_inflight_groups", "unit": "groups", "limit": 1, "requested": 2}
    assert body["error"]["message"].endswith("(each query is one group)")
    async with client.get("/metrics", headers=auth) as resp:
        metrics = metric_samples(await resp.text())
    assert metrics[("rmserve_user_requests_total", (("endpoint", "/get_reward"), ("status", "200"), ("user", "alice")))] == 1
    assert metrics[("rmserve_groups_total", ())] == 1


# --- OpenRLHF's own client ------------------------------------------------------------------


@pytest.fixture
def openrlhf_agent(monkeypatch):
    """``openrlhf/utils/agent.py`` of the installed openrlhf (0.11.2; scripts/test.sh installs it
    with ``--no-deps``), loaded by path: the package's ``__init__`` files import torch,
    deepspeed's strategy and sympy, which the module itself does not need (it imports asyncio,
    aiohttp and ``openrlhf.utils.logging_utils``, loaded the same way)."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")
    root = Path(next(iter(spec.submodule_search_locations)))
    for package in ("openrlhf", "openrlhf.utils"):
        stub = types.ModuleType(package)
        stub.__path__ = []  # a namespace of the modules loaded below, nothing imported
        monkeypatch.setitem(sys.modules, package, stub)
    loaded = None
    for name in ("logging_utils", "agent"):
        module_spec = importlib.util.spec_from_file_location(f"openrlhf.utils.{name}", root / "utils" / f"{name}.py")
        loaded = importlib.util.module_from_spec(module_spec)
        monkeypatch.setitem(sys.modules, f"openrlhf.utils.{name}", loaded)
        module_spec.loader.exec_module(loaded)
    return loaded


class _Ids:
    def __init__(self, ids):
        self.ids = ids

    def tolist(self):
        return list(self.ids)


class CodePointPolicyTokenizer:
    """What ``SingleTurnAgentExecutor.execute`` asks of a policy tokenizer: ``__call__`` and
    ``decode``, ids = code points (so the decoded query is the prompt + generated text)."""

    def __call__(self, *, text, add_special_tokens, return_tensors):
        return {"input_ids": [_Ids([ord(c) for c in text])]}

    def decode(self, ids, skip_special_tokens):
        assert skip_special_tokens is False
        return "".join(map(chr, ids))


class FakePolicy:
    """What ``execute`` asks of the vLLM engine: ``generate`` → ``outputs[0]`` with the tokens."""

    def __init__(self, text: str):
        self.text = text

    async def generate(self, prompt_ids, params, multi_modal_data=None):
        out = types.SimpleNamespace(token_ids=[ord(c) for c in self.text], text=self.text,
                                    finish_reason="stop", logprobs=None)
        return types.SimpleNamespace(outputs=[out])


async def _openrlhf_execute(agent, url: str, generated: str) -> dict:
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=[url])
    params = types.SimpleNamespace(max_tokens=16, logprobs=None)
    return await executor.execute(PROMPT, "label", params, 4096, CodePointPolicyTokenizer(), FakePolicy(generated))


async def test_openrlhf_single_turn_executor_reads_rmserve_rewards(aiohttp_client, engine, openrlhf_agent):
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    out = await _openrlhf_execute(openrlhf_agent, str(client.make_url("/get_reward")), "yo<|im_end|>")
    # OpenRLHF keeps the reply's lists as they are: one entry, the raw reward (4.55, see above)
    assert out["reward"] == [pytest.approx(4.55, abs=1e-12)]
    assert out["scores"] == [pytest.approx(4.55, abs=1e-12)]
    assert out["extra_logs"] == {"rm_tokens": [9.0]}
    assert [ids for _, (ids,) in engine.calls] == [(1, 4, 104, 105, 2, 5, 121, 111, 2)]


async def test_openrlhf_authenticates_with_the_token_in_its_url(aiohttp_client, users_config, engine,
                                                               openrlhf_agent, monkeypatch):
    """OpenRLHF has no token option: ``http://NAME:TOKEN@host/get_reward`` makes its aiohttp
    client send ``Authorization: Basic base64(NAME:TOKEN)``, which the server reads as alice's
    token (the name is not checked); without it every attempt is a 401 and no reward comes back."""
    config, alice, _ = users_config
    client = await fake_app_client(aiohttp_client, config, engine)

    async def no_sleep(_seconds):
        return None

    monkeypatch.setattr(openrlhf_agent, "asyncio", types.SimpleNamespace(
        sleep=no_sleep, gather=asyncio.gather, create_task=asyncio.create_task, to_thread=asyncio.to_thread))
    url = client.make_url("/get_reward")
    out = await _openrlhf_execute(openrlhf_agent, str(url), "yo<|im_end|>")
    assert (out["reward"], engine.calls) == (None, [])
    out = await _openrlhf_execute(openrlhf_agent, str(url.with_user("trainer").with_password(alice)), "yo<|im_end|>")
    assert out["reward"] == [pytest.approx(4.55, abs=1e-12)]
    async with client.get("/metrics", headers={"Authorization": f"Bearer {alice}"}) as resp:
        metrics = metric_samples(await resp.text())
    assert metrics[("rmserve_user_requests_total", (("endpoint", "/get_reward"), ("status", "200"), ("user", "alice")))] == 1
    assert metrics[("rmserve_auth_rejections_total", (("reason", "missing"),))] == 5


async def test_openrlhf_gets_no_reward_for_a_refused_query(aiohttp_client, engine, openrlhf_agent, monkeypatch, caplog):
    """A 400 is retried (5 attempts, 1 s apart: sleeps skipped here), then the sample has no
    reward (None), which OpenRLHF 0.11.2's trainer does not turn into a number."""
    client = await client_with(aiohttp_client, engine, policy_template="chatml")

    async def no_sleep(_seconds):
        return None

    monkeypatch.setattr(openrlhf_agent, "asyncio", types.SimpleNamespace(
        sleep=no_sleep, gather=asyncio.gather, create_task=asyncio.create_task, to_thread=asyncio.to_thread))
    with caplog.at_level(logging.INFO):
        out = await _openrlhf_execute(openrlhf_agent, str(client.make_url("/get_reward")), "yo<|im_end|>\nmore")
    assert (out["reward"], out["scores"], out["extra_logs"]) == (None, None, {})
    assert engine.calls == []


async def test_the_body_openrlhf_builds(aiohttp_client, engine):
    """Without openrlhf installed: the body ``SingleTurnAgentExecutor._fetch_rewards_via_http``
    (openrlhf 0.11.2, ``openrlhf/utils/agent.py``) posts — ``{"query": [...], "prompts": [...],
    "labels": [...]}``, one query per rollout — and the fields its ``execute`` reads."""
    client = await client_with(aiohttp_client, engine, policy_template="chatml")
    status, body = await post(client, {"query": [Q_HI], "prompts": [PROMPT], "labels": [{"answer": 3}]})
    assert status == 200, body
    assert body["rewards"] == body["scores"] == [pytest.approx(4.55, abs=1e-12)]
    assert body["extra_logs"] == {"rm_tokens": [9.0]}
