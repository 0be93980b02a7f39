"""The TRL reward function against the real server app over the fake engine (in a thread).

Rewards by hand from the fakes' rules (``fakes.py``: BOS 1, role markers 3/4/5, EOS 2 after
every turn, token id = code point; reward = ``sum(ids) % 1000 / 100``):

- user "hi" + "yo": ``[1, 4, 104, 105, 2, 5, 121, 111, 2]`` → 4.55; + "ya" → 4.41; + "yes" → 5.60
- user "ok" + "yo" → 4.64; + "no" → 4.53; + "" → 2.32
- system "be brief", user "hi" + "yo" → 2.11
- user "hi" + 60 × "x": 67 tokens, over the fake model's max length 64 → not scored.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import pickle
import socket
from types import SimpleNamespace

import pytest
from testkit.fakes import FakeEngine, FakeRenderer, ReloadableFakeEngine, write_fake_checkpoint
from testkit.servers import ThreadedServer
from rmserve.client.client import RewardClient
from rmserve.client.config import Retry
from rmserve.client.trl_reward import AsyncRMServeReward, RMServeReward, group_samples
from rmserve.server.http.app import ServerConfig, create_app

from rmserve import errors
from rmserve.schema import Message

FAST_RETRY = Retry(max_attempts=2, base_delay_s=0.01, max_delay_s=0.01, jitter=0.0)
ADMIN = "admin-token"
PROMPTS = ["hi", "hi", "hi", "ok", "ok", "ok"]
COMPLETIONS = ["yo", "ya", "yes", "yo", "no", ""]
REWARDS = [4.55, 4.41, 5.60, 4.64, 4.53, 2.32]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def server(engine):
    with ThreadedServer(lambda: create_app(ServerConfig(port=0), engine, FakeRenderer())) as running:
        yield running.url


@pytest.fixture
def reward(server):
    with RMServeReward(server=server, retry=FAST_RETRY) as function:
        yield function


def test_grouping_by_prompt_is_written_out():
    """2 prompts × 3 completions (interleaved) → 2 groups of 3, first-appearance order; each
    sample's place is (group, response)."""
    groups, where = group_samples(["p", "q", "p", "q", "p", "q"], ["a", "b", "c", "d", "e", "f"])
    assert [(str(g.key), g.messages, g.responses) for g in groups] == [
        ("trl/prompt/0", (Message("user", "p"),), ("a", "c", "e")),
        ("trl/prompt/1", (Message("user", "q"),), ("b", "d", "f")),
    ]
    assert where == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


def test_rewards_come_back_in_sample_order_one_engine_call_per_prompt(reward, engine):
    assert reward.__name__ == "rmserve"
    out = reward(prompts=PROMPTS, completions=COMPLETIONS, completion_ids=[[0]] * 6, trainer_state=None)
    assert out == pytest.approx(REWARDS, abs=1e-12)
    # the G completions of one prompt went to the engine together (the prompt shares its cache)
    assert sorted(len(ids) for _, ids in engine.calls) == [3, 3]
    assert reward.fingerprint == "fp-fake-1"
    assert (reward.calls, reward.samples, reward.unscored) == (1, 6, 0)


def test_interleaved_samples_are_mapped_back(reward):
    order = [0, 3, 1, 4, 2, 5]
    out = reward(prompts=[PROMPTS[i] for i in order], completions=[COMPLETIONS[i] for i in order])
    assert out == pytest.approx([REWARDS[i] for i in order], abs=1e-12)


def test_conversations_are_sent_as_messages(reward):
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    out = reward(prompts=[prompt, [{"role": "user", "content": "hi"}]],
                 completions=[[{"role": "assistant", "content": "yo"}], [{"role": "assistant", "content": "ya"}]])
    assert out == pytest.approx([2.11, 4.41], abs=1e-12)


@pytest.mark.parametrize(("prompt", "completion", "words"), [
    ([{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}],
     "completions[0] has the turns ['assistant', 'tool']"),
    ([{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "a", "tool_calls": [{"x": 1}]}],
     "carries ['tool_calls']"),
    ([{"role": "assistant", "content": "hi"}], "yo", "prompts[0] ends with a 'assistant' turn"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "yo", "multimodal content is not supported"),
])
def test_samples_a_request_cannot_hold_are_refused_by_name(reward, prompt, completion, words):
    with pytest.raises(ValueError, match=None) as info:
        reward(prompts=[prompt], completions=[completion])
    assert words in str(info.value)


def test_a_sample_the_server_cannot_score_is_none_never_zero(reward, caplog):
    out = reward(prompts=["hi", "hi"], completions=["x" * 60, "yo"])
    assert out[0] is None
    assert out[1] == pytest.approx(4.55, abs=1e-12)
    assert reward.unscored == 1
    assert "1 of 2 samples have no reward (None); first, sample 0: sequence_too_long" in caplog.text


def test_an_engine_failure_raises(reward, engine):
    engine.fail_with = errors.EngineError("the engine fell over")
    with pytest.raises(errors.EngineError, match="the engine fell over"):
        reward(prompts=["hi"], completions=["yo"])


def test_no_server_raises_after_the_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with RMServeReward(server=f"http://127.0.0.1:{port}", retry=FAST_RETRY) as reward:
        with pytest.raises(errors.ConnectionFailed):
            reward(prompts=["hi"], completions=["yo"])


def test_a_missing_token_names_the_argument_and_the_variable(tmp_path, monkeypatch, engine):
    from rmserve.server.sharing.auth import add_user

    users = tmp_path / "users.jsonl"
    token, _ = add_user(users, "trainer")
    monkeypatch.delenv("RMSERVE_TOKEN", raising=False)
    config = ServerConfig(port=0, users_file=str(users))
    with ThreadedServer(lambda: create_app(config, engine, FakeRenderer())) as running:
        with RMServeReward(server=running.url, retry=FAST_RETRY) as reward:
            with pytest.raises(errors.Unauthorized) as refused:
                reward(prompts=["hi"], completions=["yo"])
        assert str(refused.value).endswith("(this client sent no token: pass token=... to RMServeReward or set "
                                           "RMSERVE_TOKEN)")
        assert "http://NAME:TOKEN@HOST:PORT/" in str(refused.value)
        with RMServeReward(server=running.url, retry=FAST_RETRY, token=token) as reward:
            assert reward(prompts=["hi"], completions=["yo"]) == [REWARDS[0]]
    assert len(engine.calls) == 1


@pytest.fixture
def swappable(tmp_path):
    """A server on a reloadable fake engine with checkpoints step-0 (offset 0) and step-1 (offset 10)."""
    root = tmp_path / "ckpts"
    original = write_fake_checkpoint(root / "step-0", 0.0)
    second = write_fake_checkpoint(root / "step-1", 10.0)
    engine = ReloadableFakeEngine(checkpoint_dir=str(original))
    config = ServerConfig(port=0, admin_token=ADMIN, checkpoint_roots=(str(root),))
    with ThreadedServer(lambda: create_app(config, engine, FakeRenderer())) as running:
        yield running.url, second


def _swap(url: str, path) -> str:
    async def load() -> str:
        async with RewardClient(url) as client:
            return (await client.load_checkpoint("step-1", str(path), admin_token=ADMIN)).fingerprint

    return asyncio.run(load())


def test_a_model_change_mid_training_is_an_error(swappable):
    url, second = swappable
    with RMServeReward(server=url, retry=FAST_RETRY) as reward:
        assert reward(prompts=["hi"], completions=["yo"]) == pytest.approx([4.55], abs=1e-12)
        first = reward.fingerprint
        new = _swap(url, second)
        assert new != first
        with pytest.raises(errors.FingerprintMismatch) as info:
            reward(prompts=["hi"], completions=["yo"])
        assert "the reward model changed during training" in str(info.value)
        assert "allow_fingerprint_change=True" in str(info.value)
        assert reward.fingerprint == first


def test_a_model_change_is_kept_when_allowed(swappable):
    url, second = swappable
    with RMServeReward(server=url, retry=FAST_RETRY, allow_fingerprint_change=True) as reward:
        reward(prompts=["hi"], completions=["yo"])
        first = reward.fingerprint
        new = _swap(url, second)
        assert reward(prompts=["hi"], completions=["yo"]) == pytest.approx([14.55], abs=1e-12)
        assert reward.fingerprints == [first, new]


def test_expect_fingerprint_pins_from_the_first_call(server):
    with RMServeReward(server=server, retry=FAST_RETRY, expect_fingerprint="fp-other") as reward:
        with pytest.raises(errors.FingerprintMismatch, match="fp-other"):
            reward(prompts=["hi"], completions=["yo"])


def test_the_async_variant_is_what_trl_awaits(server):
    # TRL's test (trl.trainer.utils.is_async_callable): __call__ is a coroutine function
    with AsyncRMServeReward(server=server, retry=FAST_RETRY, name="rm") as reward:
        assert inspect.iscoroutinefunction(reward.__call__)
        assert not inspect.iscoroutinefunction(RMServeReward.__call__)
        out = asyncio.run(reward(prompts=PROMPTS, completions=COMPLETIONS))
        assert out == pytest.approx(REWARDS, abs=1e-12)
        assert reward.__name__ == "rm"


def test_sampled_log_lines_carry_step_and_fingerprint(server, tmp_path):
    path = tmp_path / "log" / "samples.jsonl"
    with RMServeReward(server=server, retry=FAST_RETRY, log_path=path, log_rate=1.0) as reward:
        reward(prompts=["hi", "hi"], completions=["yo", "x" * 60], trainer_state=SimpleNamespace(global_step=7))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [{k: v for k, v in line.items() if k != "time"} for line in lines] == [
        {"step": 7, "prompt": "hi", "completion": "yo", "reward": pytest.approx(4.55, abs=1e-12), "model": "fake-rm",
         "fingerprint": "fp-fake-1"},
        {"step": 7, "prompt": "hi", "completion": "x" * 60, "reward": None, "model": "fake-rm",
         "fingerprint": "fp-fake-1",
         "error": "sequence_too_long: 67 tokens (chat template included), over max_model_len=64"},
    ]


def test_log_rate_zero_writes_nothing_and_bad_rates_are_refused(server, tmp_path):
    path = tmp_path / "samples.jsonl"
    with RMServeReward(server=server, retry=FAST_RETRY, log_path=path, log_rate=0.0) as reward:
        reward(prompts=["hi"], completions=["yo"])
    assert not path.exists()
    with pytest.raises(ValueError, match=r"log_rate must be in \[0, 1\]"):
        RMServeReward(server=server, log_rate=1.5)
    with pytest.raises(ValueError, match="http"):
        RMServeReward(server="localhost:8000")


def test_a_pickled_copy_scores_on_its_own_client(reward):
    reward(prompts=["hi"], completions=["yo"])
    copy = pickle.loads(pickle.dumps(reward))
    try:
        assert copy.fingerprint == reward.fingerprint
        assert copy(prompts=["ok"], completions=["no"]) == pytest.approx([4.53], abs=1e-12)
    finally:
        copy.close()
