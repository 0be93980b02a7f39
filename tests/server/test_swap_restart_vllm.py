"""Engine restart on a checkpoint of another shape, with the real engines.

vLLM, over HTTP: an app that owns its own :class:`~rmserve.server.engines.vllm_engine.VLLMEngine` (the
session engine stays untouched) on the session demo model (2 layers, max length 4096) loads
a demo model with 3 layers, another weight seed and max length 2048 — a restart: the reply
says so, ``/v1/models`` has the new max length and fingerprint, and the HTTP rewards equal an
unbatched transformers forward pass of the new checkpoint. A two-label copy is refused from
its files (422, nothing restarted); a checkpoint whose files pass but whose weights cannot
be read (another max length, so a restart; garbage weight bytes) is loaded: 500, the previous
(3-layer) checkpoint is restarted and serves the same rewards again. The transformers
engine's ``restart`` is checked the same way,
without HTTP. Tolerance ``1e-4``: see ``test_engine_parity.py`` (float32 kernel rounding is
~1e-6; two seeds give rewards that differ by ~1e-1).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from aiohttp.test_utils import TestClient, TestServer
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.fingerprint import model_fingerprint
from rmserve.server.http.serve import engine_renderer
from test_swap_vllm import ATOL, AUTH, TOKEN, _direct_rewards

from rmserve.datasets import load_rmbench
from rmserve.errors import EngineError, EngineNotReady, InvalidRequest
from rmserve.schema import LoadModelResponse, ModelList, RequestGroup, ScoreRequest, ScoreResponse, decode, encode

pytestmark = pytest.mark.slow

SECOND_MAX_LEN = 2048
"""Max length of the 3-layer checkpoint (the first one's is 4096)."""


def _corrupt_copy(source, target, max_position_embeddings: int):
    """A copy of ``source`` that passes the file checks but cannot start: its config names
    another max length (so loading it is a restart), its weight files hold garbage bytes."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = max_position_embeddings
    (target / "config.json").write_text(json.dumps(config))
    for weights in target.glob("*.safetensors"):
        weights.write_bytes(b"\xff" * weights.stat().st_size)
    return target


@pytest.fixture(scope="module")
def restart_checkpoints(demo_model_dir, rmbench_dir, tmp_path_factory):
    """(3-layer seed-1 checkpoint with max length 2048, a two-label copy of it, a corrupt copy
    of it with max length 1024: see :func:`_corrupt_copy`)."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    root = tmp_path_factory.mktemp("restart-root")
    deeper = root / "deeper"
    build_demo_model(deeper, rmbench_dir, DemoModelConfig(layers=3, seed=1, max_len=SECOND_MAX_LEN))
    broken = root / "two-labels"
    shutil.copytree(deeper, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_labels"] = 2
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1"}
    config["label2id"] = {"LABEL_0": 0, "LABEL_1": 1}
    (broken / "config.json").write_text(json.dumps(config))
    return deeper, broken, _corrupt_copy(deeper, root / "corrupt", SECOND_MAX_LEN // 2)


def _chat_groups(rmbench_dir, count: int = 3) -> list[RequestGroup]:
    """The first ``count`` chat groups (they fit 2048 tokens with the demo tokenizer)."""
    groups = [g for g in load_rmbench(rmbench_dir, domains=["chat"]).groups][:count]
    return [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in groups]


async def test_vllm_restart_on_other_shape_then_failed_restart_restores(demo_model_dir, rmbench_dir,
                                                                        restart_checkpoints):
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_engine import VLLMEngine

    deeper, broken, corrupt = restart_checkpoints
    engine = VLLMEngine(EngineConfig(model=str(demo_model_dir), engine="vllm", dtype="float32", block_size=32,
                                     kv_cache_memory_bytes=1 << 30, enforce_eager=True))
    config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(demo_model_dir.parent), str(deeper.parent)))
    app = create_app(config, engine, renderer_factory=engine_renderer)
    groups = _chat_groups(rmbench_dir)
    payload = encode(ScoreRequest(groups=tuple(groups)))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await app[STATE_KEY].settled.wait()
        assert app[STATE_KEY].status == "ready", app[STATE_KEY].error

        async def http_rewards() -> tuple[list[float], ScoreResponse]:
            async with client.post("/v1/score", data=payload, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200, await resp.text()
                reply = decode(await resp.read(), ScoreResponse)
            return [r for result in reply.results for r in result.rewards], reply

        async def served():
            async with client.get("/v1/models") as resp:
                assert resp.status == 200
                return decode(await resp.read(), ModelList).models[0]

        before, _ = await http_rewards()
        first = await served()
        assert first.max_model_len == 4096

        async with client.post("/v1/models/load", json={"name": "deeper", "path": str(deeper)}, headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
            loaded = decode(await resp.read(), LoadModelResponse)
        assert loaded.swap_kind == "restart"
        info = await served()
        assert (info.name, info.max_model_len, info.swap_count) == ("deeper", SECOND_MAX_LEN, 1)
        expected_fingerprint = model_fingerprint(deeper, engine.renderer.chat_template, "float32")
        assert info.fingerprint == expected_fingerprint != first.fingerprint
        assert engine.renderer.max_model_len == SECOND_MAX_LEN and engine.config.model == str(deeper)
        sequences = [ids for group in engine.renderer.render_groups(groups) for ids in group.token_ids]
        after, reply = await http_rewards()
        assert reply.fingerprint == info.fingerprint
        assert after == pytest.approx(_direct_rewards(deeper, sequences), abs=ATOL)
        assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 100 * ATOL  # another model

        async with client.post("/v1/models/load", json={"name": "broken", "path": str(broken)}, headers=AUTH) as resp:
            body = await resp.json()
            assert resp.status == 422, body
        assert body["error"]["message"] == (
            "checkpoint 'two-labels/config.json': has 2 labels (num_labels/id2label), so the multi-label head; the "
            "served model has the classifier head, and a swap keeps the head (the fingerprint and what the rewards "
            "mean); start a server on this checkpoint instead")
        assert (await served()).fingerprint == info.fingerprint  # nothing was restarted

        async with client.post("/v1/models/load", json={"name": "corrupt", "path": str(corrupt)}, headers=AUTH) as resp:
            body = await resp.json()
            assert resp.status == 500, body
        assert body["error"]["type"] == "engine_error"
        message = body["error"]["message"]
        assert "restarting the engine on checkpoint 'corrupt' failed" in message
        assert "'deeper' was restored" in message
        async with client.get("/health") as resp:
            assert resp.status == 200
        restored = await served()
        assert (restored.name, restored.fingerprint, restored.swap_count) == ("deeper", info.fingerprint, 1)
        again, _ = await http_rewards()
        assert again == pytest.approx(after, abs=ATOL)
    finally:
        await client.close()  # the app shuts its engine down


async def test_hf_restart_on_other_shape(demo_model_dir, rmbench_dir, restart_checkpoints):
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.hf_engine import HFEngine

    deeper, broken, _ = restart_checkpoints
    engine = HFEngine(EngineConfig(model=str(demo_model_dir), engine="hf", dtype="float32"))
    await engine.start()
    try:
        first = engine.info()
        loaded = await engine.restart(str(deeper))
        info = loaded.info
        assert info == engine.info() and info.max_model_len == SECOND_MAX_LEN
        assert loaded.renderer is engine.renderer and loaded.checkpoint_dir == deeper.resolve()
        expected_fingerprint = model_fingerprint(deeper, engine.renderer.chat_template, "float32")
        assert info.fingerprint == expected_fingerprint != first.fingerprint
        groups = _chat_groups(rmbench_dir, count=2)
        sequences = [ids for group in engine.renderer.render_groups(groups) for ids in group.token_ids]
        scores = await engine.score_group(sequences, "hf-restart")
        assert [s.reward for s in scores] == pytest.approx(_direct_rewards(deeper, sequences), abs=ATOL)

        with pytest.raises(InvalidRequest, match="not a folder"):
            await engine.restart(str(deeper / "missing"))
        assert engine.info() == info  # nothing was stopped
        message = (f"the transformers engine did not start on checkpoint 'two-labels': {str(broken)!r} has 2 labels "
                   "(num_labels/id2label); rmserve reads one reward from them: give --label-index I (0 ≤ I < 2) for one "
                   "label, or --label-weights w1,...,w2 for their weighted sum")
        with pytest.raises(EngineError, match=f"^{re.escape(message)}$"):
            await engine.restart(str(broken))
        with pytest.raises(EngineNotReady, match="no model is loaded"):
            engine.info()
        assert (await engine.restart(str(deeper))).info.fingerprint == info.fingerprint
    finally:
        await engine.shutdown()


async def test_hf_swap_waits_for_the_groups_in_flight(demo_model_dir, rmbench_dir, restart_checkpoints):
    """The transformers engine batches across groups; a swap that comes while groups wait lets
    every queued group finish on the model it was queued for, and no group is scored by two
    models (each group's rewards all equal one checkpoint's unbatched forward)."""
    import asyncio

    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.hf_engine import HFEngine

    deeper, _, _ = restart_checkpoints
    engine = HFEngine(EngineConfig(model=str(demo_model_dir), engine="hf", dtype="float32", hf_batch_size=4))
    await engine.start()
    try:
        groups = [[list(ids) for ids in g.token_ids] for g in engine.renderer.render_groups(_chat_groups(rmbench_dir, 6))]
        queued = [asyncio.create_task(engine.score_group(g, f"queued-{i}")) for i, g in enumerate(groups[:4])]
        await asyncio.sleep(0)  # the four groups are in the queue
        swap = asyncio.create_task(engine.reload_weights(str(deeper)))
        during = [asyncio.create_task(engine.score_group(g, f"during-{i}")) for i, g in enumerate(groups[4:])]
        scored = await asyncio.gather(*queued, *during)
        await swap
        after = await engine.score_group(groups[0], "after")
        passes = engine.forward_passes
    finally:
        await engine.shutdown()
    old = _direct_rewards(demo_model_dir, [ids for g in groups for ids in g])
    new = _direct_rewards(deeper, [ids for g in groups for ids in g])
    starts = [sum(map(len, groups[:i])) for i in range(len(groups))]

    def model_of(i, scores):
        got = [s.reward for s in scores]
        n = len(groups[i])
        if got == pytest.approx(old[starts[i]:starts[i] + n], abs=ATOL):
            return "old"
        assert got == pytest.approx(new[starts[i]:starts[i] + n], abs=ATOL), f"group {i} mixes two checkpoints"
        return "new"

    assert [model_of(i, s) for i, s in enumerate(scored[:4])] == ["old"] * 4
    for i, s in enumerate(scored[4:], start=4):
        model_of(i, s)  # one checkpoint or the other, never both
    assert model_of(0, after) == "new"
    assert min(abs(a - b) for a, b in zip(old, new)) > 100 * ATOL  # the two checkpoints are told apart
    assert passes < sum(map(len, groups)) + len(groups[0])  # sequences shared forward passes
