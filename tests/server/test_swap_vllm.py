"""Checkpoint swap on the real vLLM engine: after ``POST /v1/models/load`` the HTTP rewards
equal a plain transformers forward pass of the NEW checkpoint, and swapping back reproduces
the original rewards.

The app runs in-process over the session ``vllm_engine`` (no second engine start); the
engine is lent without its shutdown, and the original checkpoint is restored at the end so
other tests see the session engine unchanged. The second checkpoint is a demo model with
another weight seed and the first one's tokenizer files (same architecture and tokenizer).
The transformers engine's in-place reload is checked the same way, without HTTP.
Tolerance ``1e-4``: see ``test_engine_parity.py`` (float32 kernel rounding is ~1e-6; two
seeds give rewards that differ by ~1e-1).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.fingerprint import TOKENIZER_FILES, model_fingerprint

from rmserve.datasets import load_rmbench
from rmserve.schema import RequestGroup, ScoreRequest, ScoreResponse, decode, encode

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

ATOL = 1e-4
TOKEN = "swap-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class _Lent:
    """The session engine without its shutdown (the app shuts its engine down on cleanup)."""

    def __init__(self, engine) -> None:
        self._engine = engine

    async def start(self):
        return await self._engine.start()

    def info(self):
        return self._engine.info()

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        return await self._engine.score_group(token_ids, request_id)

    async def reload_weights(self, path: str):
        return await self._engine.reload_weights(path)

    async def reset_prefix_cache(self) -> bool:
        return await self._engine.reset_prefix_cache()

    async def shutdown(self) -> None:
        pass


def _direct_rewards(folder: Path, sequences) -> list[float]:
    """Unbatched ``model(input_ids).logits[0, 0]`` of the checkpoint at ``folder`` (float32)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [float(model(torch.tensor([list(ids)])).logits[0, 0]) for ids in sequences]


async def test_swap_to_second_checkpoint_and_back(vllm_engine, demo_model_dir, rmbench_dir, tmp_path):
    from rmserve.demo_model import DemoModelConfig, build_demo_model
    second = tmp_path / "root" / "seed-1"
    build_demo_model(second, rmbench_dir, DemoModelConfig(seed=1, max_len=vllm_engine.info().max_model_len))
    for name in TOKENIZER_FILES:
        if (demo_model_dir / name).is_file():
            shutil.copyfile(demo_model_dir / name, second / name)

    groups = [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
              for g in load_rmbench(rmbench_dir).groups[::300][:4]]
    payload = encode(ScoreRequest(groups=tuple(groups)))
    sequences = [ids for group in vllm_engine.renderer.render_groups(groups) for ids in group.token_ids]
    original_fingerprint = vllm_engine.info().fingerprint

    config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(demo_model_dir.parent), str(second.parent)))
    app = create_app(config, _Lent(vllm_engine), vllm_engine.renderer)
    client = TestClient(TestServer(app))
    await client.start_server()
    swapped = False
    try:
        await app[STATE_KEY].settled.wait()

        async def http_rewards() -> tuple[list[float], ScoreResponse]:
            async with client.post("/v1/score", data=payload, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200, await resp.text()
                reply = decode(await resp.read(), ScoreResponse)
            return [r for result in reply.results for r in result.rewards], reply

        before, _ = await http_rewards()  # warms the prefix cache with the original weights
        async with client.post("/v1/models/load", json={"name": "seed-1", "path": str(second)}, headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
        swapped = True
        after, reply = await http_rewards()
        assert (reply.model, reply.fingerprint) == ("seed-1", model_fingerprint(second, vllm_engine.renderer.chat_template, "float32"))
        expected_new = _direct_rewards(second, sequences)
        assert after == pytest.approx(expected_new, abs=ATOL)
        assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 100 * ATOL  # the weights did change

        async with client.post("/v1/models/load", json={"name": "demo", "path": str(demo_model_dir)}, headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
        swapped = False
        back, reply = await http_rewards()
        assert reply.fingerprint == original_fingerprint
        assert back == pytest.approx(before, abs=ATOL)
        assert back == pytest.approx(_direct_rewards(demo_model_dir, sequences), abs=ATOL)
    finally:
        if swapped:  # leave the session engine on its original checkpoint
            await vllm_engine.reload_weights(str(demo_model_dir))
        await client.close()


async def test_checkpoint_with_two_labels_is_refused_before_the_engine_is_touched(vllm_engine, demo_model_dir,
                                                                                 rmbench_dir, tmp_path):
    """A copy of the demo model with ``num_labels=2`` is refused with 422 from its files; the
    rewards served afterwards are the original model's (the engine was never stopped)."""
    import json
    import time

    two_labels = tmp_path / "root" / "two-labels"
    shutil.copytree(demo_model_dir, two_labels)
    config = json.loads((two_labels / "config.json").read_text())
    config.update(num_labels=2, id2label={"0": "LABEL_0", "1": "LABEL_1"}, label2id={"LABEL_0": 0, "LABEL_1": 1})
    (two_labels / "config.json").write_text(json.dumps(config))

    groups = [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
              for g in load_rmbench(rmbench_dir).groups[::300][:2]]
    payload = encode(ScoreRequest(groups=tuple(groups)))
    sequences = [ids for group in vllm_engine.renderer.render_groups(groups) for ids in group.token_ids]
    config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(two_labels.parent),))
    app = create_app(config, _Lent(vllm_engine), vllm_engine.renderer)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await app[STATE_KEY].settled.wait()
        started = time.perf_counter()
        async with client.post("/v1/models/load", json={"name": "two", "path": str(two_labels)}, headers=AUTH) as resp:
            status, body = resp.status, await resp.json()
        refusal_s = time.perf_counter() - started
        assert (status, body["error"]) == (422, {
            "type": "invalid_checkpoint", "field": "path",
            "message": "checkpoint 'two-labels/config.json': has 2 labels (num_labels/id2label), so the multi-label "
                       "head; the served model has the classifier head, and a swap keeps the head (the fingerprint "
                       "and what the rewards mean); start a server on this checkpoint instead",
        })
        assert refusal_s < 1.0, f"the refusal took {refusal_s:.3f} s"  # the bound on CPU
        async with client.post("/v1/score", data=payload, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            reply = decode(await resp.read(), ScoreResponse)
        assert (reply.fingerprint, app[STATE_KEY].info.swap_count) == (vllm_engine.info().fingerprint, 0)
        served = [r for result in reply.results for r in result.rewards]
        assert served == pytest.approx(_direct_rewards(demo_model_dir, sequences), abs=ATOL)
    finally:
        await client.close()


async def test_failed_reload_reloads_the_previous_weights(vllm_engine, demo_model_dir, rmbench_dir, tmp_path):
    """A checkpoint whose files pass the checks but whose weights are garbage (same config and
    tokenizer, so a reload in place): vLLM fails to load it, the demo model's weights are
    reloaded, the reply is a 500 saying so, and the rewards are the demo model's again."""
    garbled = tmp_path / "root" / "garbled"
    shutil.copytree(demo_model_dir, garbled)
    for weights in garbled.glob("*.safetensors"):
        weights.write_bytes(b"\xff" * weights.stat().st_size)

    groups = [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
              for g in load_rmbench(rmbench_dir).groups[::300][:2]]
    payload = encode(ScoreRequest(groups=tuple(groups)))
    sequences = [ids for group in vllm_engine.renderer.render_groups(groups) for ids in group.token_ids]
    original_fingerprint = vllm_engine.info().fingerprint
    config = ServerConfig(port=0, admin_token=TOKEN,
                          checkpoint_roots=(str(demo_model_dir.parent), str(garbled.parent)))
    app = create_app(config, _Lent(vllm_engine), vllm_engine.renderer)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await app[STATE_KEY].settled.wait()
        async with client.post("/v1/models/load", json={"name": "garbled", "path": str(garbled)}, headers=AUTH) as resp:
            status, body = resp.status, await resp.json()
        assert (status, body["error"]["type"]) == (500, "engine_error"), body
        message = body["error"]["message"]
        assert message.startswith("reloading the weights of checkpoint 'garbled' failed (")
        assert message.endswith(f"the previous checkpoint '{demo_model_dir.name}' was reloaded and is served again "
                                f"(fingerprint {original_fingerprint})")
        async with client.get("/health") as resp:
            assert resp.status == 200
        async with client.post("/v1/score", data=payload, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            reply = decode(await resp.read(), ScoreResponse)
        assert (reply.model, reply.fingerprint) == (app[STATE_KEY].info.name, original_fingerprint)
        served = [r for result in reply.results for r in result.rewards]
        assert served == pytest.approx(_direct_rewards(demo_model_dir, sequences), abs=ATOL)
    finally:
        if app[STATE_KEY].status != "ready":  # the restore failed: leave the session engine as it was
            await vllm_engine.reload_weights(str(demo_model_dir))
        await client.close()
