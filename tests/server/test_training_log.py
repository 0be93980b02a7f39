"""``--training-log``: the sampled JSON-lines record of the trainer routes, over the fake engine.

Rewards by the fakes' rules (``testkit/fakes.py``; see ``test_get_reward_route.py`` and
``test_pooling_routes.py``): reward = ``sum(ids) % 1000 / 100``.

- ChatML query "hi" → "yo" re-templated: ``[1, 4, 104, 105, 2, 5, 121, 111, 2]`` (455): 4.55,
  9 tokens; → "ya" (…, 97, 2: 441): 4.41; → "yb" (442): 4.42.
- /classify text "cd" → ``[1, 99, 100]`` (200): 2.0, 3 tokens; "hi" → 2.10; token ids
  ``[5, 6, 7]`` (18): 0.18, 3 tokens.

SHA-256 of the inputs as sent, computed with ``printf '%s' TEXT | sha256sum`` (token ids: of
``[5,6,7]``), and the first 8 bytes of each over 2⁶⁴ (recorded at rate 0.5 when below it):

===========================  ==================================================================  =====
input                        sha256                                                              /2⁶⁴
===========================  ==================================================================  =====
ChatML "hi" → "yo"           5b065f1cba0dd1c9b0b2ffb35fd5b4ef83e0a50c92e1807c8c9ac08fea4e87fc  0.356
ChatML "hi" → "ya"           28282d36f62f5b67a69e66578d2865e246556dc6f5fa20b0411b1a1a03536667  0.157
ChatML "hi" → "yb"           b218af6bafd2c3945a815f1fe42eea7ef6a78a16bf1fe47eeade5bbc33a55704  0.696
"hi"                         8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4  0.560
"cd"                         21e721c35a5823fdb452fa2f9f0a612c74fb952e06927489c6b27a43b817bed4  0.132
``[5,6,7]``                  419f49e7575753b9756af1bf43941cae34f9a35fed91a9a0303483b242ae61f1  0.256
``[1,104,105]``              dbc4369efb79925d4ba2d986e6a81136e50e0cbca04b257967f0325e0205fa93  0.858
===========================  ==================================================================  =====
"""

from __future__ import annotations

import asyncio
import logging
import threading

import orjson
import pytest
from testkit.app_client import fake_app_client
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FakeEngine
from rmserve.server.http.app import ServerConfig
from rmserve.server.http.training_log import TRAINING_LOG_KEY, ScoredInput, TrainingLog, input_digest, sampled
from rmserve.server.sharing.users import User

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
Q_YO, Q_YA, Q_YB = (PROMPT + f"{r}<|im_end|>" for r in ("yo", "ya", "yb"))
SHA = {
    "yo": "5b065f1cba0dd1c9b0b2ffb35fd5b4ef83e0a50c92e1807c8c9ac08fea4e87fc",
    "ya": "28282d36f62f5b67a69e66578d2865e246556dc6f5fa20b0411b1a1a03536667",
    "yb": "b218af6bafd2c3945a815f1fe42eea7ef6a78a16bf1fe47eeade5bbc33a55704",
    "hi": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4",
    "cd": "21e721c35a5823fdb452fa2f9f0a612c74fb952e06927489c6b27a43b817bed4",
    "[5,6,7]": "419f49e7575753b9756af1bf43941cae34f9a35fed91a9a0303483b242ae61f1",
    "[1,104,105]": "dbc4369efb79925d4ba2d986e6a81136e50e0cbca04b257967f0325e0205fa93",
}
NOW = 1767225600.5
USERS = {"trainer": User("trainer"), "eval": User("eval")}
HEAD = '{"time":1767225600.5,"route":"%s","user":"%s","model":"fake-rm","fingerprint":"fp-fake-1",'


async def start(aiohttp_client, tmp_path, **config):
    path = tmp_path / "training.jsonl"
    config = ServerConfig(port=0, policy_template="chatml", training_log=str(path), **config)
    client = await fake_app_client(aiohttp_client, config, FakeEngine(), middlewares=(user_header_middleware(USERS),))
    log = client.server.app[TRAINING_LOG_KEY]
    log.clock = lambda: NOW
    return client, log, path


async def post(client, path: str, payload: dict, user: str | None = "trainer") -> dict:
    headers = {"X-Test-User": user} if user else {}
    async with client.post(path, json=payload, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return orjson.loads(await resp.read())


def test_digests_and_sampling_by_hash():
    assert input_digest(Q_YO) == ("text", SHA["yo"])
    assert input_digest([5, 6, 7]) == ("token_ids", SHA["[5,6,7]"])
    assert input_digest((5, 6, 7)) == ("token_ids", SHA["[5,6,7]"])
    assert [sampled(SHA[k], 0.5) for k in ("yo", "ya", "yb", "hi", "cd")] == [True, True, False, False, True]
    assert sampled(SHA["yb"], 0.7) and not sampled(SHA["yb"], 0.69)  # 0.6957 of the way
    assert sampled("f" * 64, 1.0) and not sampled("0" * 64, 0.0)


async def test_get_reward_samples_are_recorded_with_the_fingerprint(aiohttp_client, tmp_path):
    client, log, path = await start(aiohttp_client, tmp_path, training_log_rate=0.5)
    body = await post(client, "/get_reward", {"query": [Q_YO, Q_YB]})
    assert body["rewards"] == [pytest.approx(4.55, abs=1e-12), pytest.approx(4.42, abs=1e-12)]
    await post(client, "/get_reward", {"query": [Q_YA]}, user="eval")
    await post(client, "/get_reward", {"query": [Q_YA]}, user=None)
    await log.drain()
    get = HEAD % ("/get_reward", "trainer")
    assert path.read_text().splitlines() == [
        get + '"index":0,"reward":4.55,"num_tokens":9,"input":"text","sha256":"%s"}' % SHA["yo"],
        # Q_YB (index 1) is not sampled at 0.5
        HEAD % ("/get_reward", "eval") + '"index":0,"reward":4.41,"num_tokens":9,"input":"text","sha256":"%s"}'
        % SHA["ya"],
        HEAD % ("/get_reward", "anonymous") + '"index":0,"reward":4.41,"num_tokens":9,"input":"text","sha256":"%s"}'
        % SHA["ya"],
    ]
    assert (log.written_lines, log.failed_lines, log.dropped_requests) == (3, 0, 0)


async def test_classify_and_pooling_record_the_raw_reward(aiohttp_client, tmp_path):
    client, log, path = await start(aiohttp_client, tmp_path, training_log_rate=0.5)
    body = await post(client, "/classify", {"input": ["hi", "cd"]})  # the reply holds σ(reward)
    assert body["data"][1]["probs"] == [pytest.approx(0.8807970779778823, abs=1e-12)]  # σ(2.0)
    await post(client, "/pooling", {"input": [[1, 104, 105], [5, 6, 7]], "use_activation": False})
    await log.drain()
    assert path.read_text().splitlines() == [
        HEAD % ("/classify", "trainer") + '"index":1,"reward":2.0,"num_tokens":3,"input":"text","sha256":"%s"}'
        % SHA["cd"],
        HEAD % ("/pooling", "trainer") + '"index":1,"reward":0.18,"num_tokens":3,"input":"token_ids","sha256":"%s"}'
        % SHA["[5,6,7]"],
    ]


async def test_with_text_every_scored_input_and_its_text_but_no_unscored_one(aiohttp_client, tmp_path):
    client, log, path = await start(aiohttp_client, tmp_path, training_log_text=True)  # rate 1: all
    body = await post(client, "/classify", {"input": ["hi", "b" + "a" * 69]})  # 71 tokens > 64: not scored
    assert body["data"][1]["probs"] is None
    await post(client, "/pooling", {"input": [5, 6, 7]})
    await log.drain()
    assert path.read_text().splitlines() == [
        HEAD % ("/classify", "trainer")
        + '"index":0,"reward":2.1,"num_tokens":3,"input":"text","sha256":"%s","text":"hi"}' % SHA["hi"],
        HEAD % ("/pooling", "trainer")
        + '"index":0,"reward":0.18,"num_tokens":3,"input":"token_ids","sha256":"%s","text":[5,6,7]}'
        % SHA["[5,6,7]"],
    ]


async def test_a_failed_get_reward_request_records_nothing(aiohttp_client, tmp_path):
    client, log, path = await start(aiohttp_client, tmp_path)
    async with client.post("/get_reward", json={"query": [Q_YO, "plain text"]}) as resp:
        assert resp.status == 400
    await post(client, "/v1/score", {"groups": [{"id": "g", "prompt": "hi", "responses": ["yo"]}]})  # not a trainer route
    await log.drain()
    assert path.read_text() == ""  # created empty when the server started
    assert log.written_lines == 0


async def test_a_write_failure_is_logged_once_and_never_costs_a_reply(aiohttp_client, tmp_path, caplog):
    client, log, path = await start(aiohttp_client, tmp_path)
    path.unlink()
    path.mkdir()  # the file cannot be opened for appending any more
    with caplog.at_level(logging.WARNING, logger="rmserve.server"):
        for _ in range(2):
            body = await post(client, "/classify", {"input": ["hi", "cd"], "activation": False})
            assert [d["probs"] for d in body["data"]] == [[pytest.approx(2.1, abs=1e-12)], [pytest.approx(2.0, abs=1e-12)]]
        await log.drain()
    errors = [r.getMessage() for r in caplog.records if "training log" in r.getMessage()]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"training log {path}: cannot write ([Errno 21] Is a directory")
    assert (log.written_lines, log.failed_lines) == (0, 4)
    path.rmdir()  # writable again: the next request is written
    await post(client, "/classify", {"input": "cd"})
    await log.drain()
    assert path.read_text().splitlines() == [
        HEAD % ("/classify", "trainer") + '"index":0,"reward":2.0,"num_tokens":3,"input":"text","sha256":"%s"}'
        % SHA["cd"],
    ]
    assert (log.written_lines, log.failed_lines) == (1, 4)


async def test_a_writer_far_behind_drops_requests_without_waiting(tmp_path, caplog):
    """One request may wait: with the writer held on the first, the second waits and the
    third is not recorded (counted, said once); record never blocks."""
    log = TrainingLog(tmp_path / "t.jsonl", 1.0, clock=lambda: NOW, max_pending=1)
    held, entered = threading.Event(), threading.Event()
    lines = log.lines

    def slow_lines(batch):
        entered.set()
        held.wait(10)
        return lines(batch)

    log.lines = slow_lines
    item = [ScoredInput(index=0, value="cd", reward=2.0, num_tokens=3)]
    with caplog.at_level(logging.WARNING, logger="rmserve.server"):
        log.record(route="/classify", user="u", model="m", fingerprint="f", inputs=item)
        assert entered.wait(10)  # the writer holds the first request
        log.record(route="/classify", user="u", model="m", fingerprint="f", inputs=item)  # waits in the queue
        log.record(route="/classify", user="u", model="m", fingerprint="f", inputs=item)  # dropped
        log.record(route="/classify", user="u", model="m", fingerprint="f", inputs=item)  # dropped
        held.set()
        await log.drain()
        await asyncio.to_thread(log.close)
    assert (log.written_lines, log.dropped_requests) == (2, 2)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"training log {tmp_path / 't.jsonl'}: a request's samples were not recorded: 1 requests are waiting for the "
        "writer (the disk is behind) (said once; counted)",
        f"training log {tmp_path / 't.jsonl'}: 2 lines written, 0 not written (write errors), 2 requests not "
        "recorded (writer behind)",
    ]
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2


def test_config_checks_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"training_log_rate is 1.5; it must be a fraction in \[0, 1\]"):
        ServerConfig(training_log=str(tmp_path / "t.jsonl"), training_log_rate=1.5)
    with pytest.raises(ValueError, match=r"training_log_rate is 0.5 but no training log file is given"):
        ServerConfig(training_log_rate=0.5)
    with pytest.raises(ValueError, match=r"training_log_text is on but no training log file is given"):
        ServerConfig(training_log_text=True)
    with pytest.raises(ValueError, match="is a folder; give a file"):
        ServerConfig(training_log=str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        ServerConfig(training_log=str(tmp_path / "no" / "t.jsonl"))
    with pytest.raises(ValueError, match="rate: 2 must be a fraction"):
        TrainingLog(tmp_path / "t.jsonl", 2)
    config = ServerConfig(training_log=str(tmp_path / "t.jsonl"), training_log_rate=0.25)
    assert (tmp_path / "t.jsonl").read_text() == ""  # checked by creating it
    assert (config.training_log_rate, config.training_log_text) == (0.25, False)
