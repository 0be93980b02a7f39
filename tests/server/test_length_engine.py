"""The length baseline on the demo model's real tokenizer: rewards equal an independent count.

The count is ``len(AutoTokenizer(...)(response, add_special_tokens=False)["input_ids"])`` for
each response alone, computed here with transformers directly, one text at a time.
"""

from __future__ import annotations

import pytest

from rmserve.server.config import EngineConfig
from rmserve.server.engines.length import LengthEngine
from rmserve.server.kinds.length import LengthKind
from rmserve.datasets import load_rmbench
from rmserve.fingerprint import length_fingerprint
from rmserve.schema import RequestGroup, ScoreRequest


@pytest.mark.parametrize("sign", ["longest", "shortest"])
async def test_rewards_equal_an_independent_token_count(demo_model_dir, rmbench_dir, sign):
    from transformers import AutoTokenizer

    config = EngineConfig(model=str(demo_model_dir), kind="length", length_sign=sign)
    engine = LengthEngine(config)
    loaded = await engine.start()
    assert loaded.info.kind == "length" and loaded.info.fingerprint == length_fingerprint(demo_model_dir, sign)
    assert length_fingerprint(demo_model_dir, "longest") != length_fingerprint(demo_model_dir, "shortest")
    groups = list(load_rmbench(rmbench_dir, ["chat"]).groups[:5])
    request = ScoreRequest(groups=tuple(
        RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in groups))
    kind = LengthKind()
    prepared = kind.prepare(request, None, loaded.info, loaded.renderer)
    independent = AutoTokenizer.from_pretrained(str(demo_model_dir))
    factor = -1 if sign == "shortest" else 1
    for gi, (wire, group) in enumerate(zip(request.groups, prepared, strict=True)):
        scores = await kind.call(engine, group, f"r-{gi}", gi, 0)
        result = kind.result(wire, group, scores, gi)
        counts = [len(independent(r, add_special_tokens=False)["input_ids"]) for r in wire.responses]
        assert result.rewards == tuple(float(factor * c) for c in counts)
        assert result.num_tokens == tuple(counts) and min(counts) > 0
    await engine.shutdown()


def test_an_engine_s_start_is_logged_in_words_not_as_a_struct_repr():
    import msgspec

    from rmserve.schema import ModelInfo, RewardHead
    from rmserve.server.engines.lifecycle import model_info_text

    info = ModelInfo(name="demo-rm", max_model_len=4096, dtype="float32", fingerprint="3fab", engine="vllm",
                     head=RewardHead(name="multi-label", label_index=2), attention="TORCH_SDPA")
    assert model_info_text(info) == ("model demo-rm: classifier, head multi-label (label 2), engine vllm, float32, "
                                     "max_model_len 4096, attention TORCH_SDPA, fingerprint 3fab")
    dpo = msgspec.structs.replace(info, kind="dpo", head=msgspec.UNSET, attention=msgspec.UNSET, mode="ratio",
                                  ref_model="/r/ref", compat="official")
    text = model_info_text(dpo)
    assert text == ("model demo-rm: dpo (mode ratio, reference '/r/ref', compat official), engine vllm, float32, "
                    "max_model_len 4096, fingerprint 3fab")
    assert "UNSET" not in text and "ModelInfo(" not in text
