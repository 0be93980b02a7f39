"""The acceptance run of a generative judge, end to end with a real engine: ``rmserve run
DEMO_CAUSAL --kind judge --bench rm-bench --only chat --judge-max-tokens 32`` on the RM-Bench
release files, as a user types it (a vLLM CPU engine; slow).

The engine comes from ``rmserve.server.engines.registry.build_engine`` (kind ``judge``); where this
checkout's ``build_engine`` has no judge engine yet, the test is skipped and says so.
"""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from testkit.shared_data import shared_data_dir

from rmserve.datasets import load_rmbench
from rmserve.schema import JudgeSampling, ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
ENGINE_OPTIONS = ["--dtype", "float32", "--max-model-len", "4096", "--block-size", "32",
                  "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]


def _require_judge_engine(model) -> None:
    from rmserve.server.engines.registry import build_engine
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.protocol import JudgeEngine

    try:
        engine = build_engine(EngineConfig(model=str(model), kind="judge", dtype="float32"))
    except Exception as exc:  # noqa: BLE001 - any failure: no judge engine to test here
        pytest.skip(f"build_engine has no judge engine in this checkout ({type(exc).__name__}: {exc})")
    if not isinstance(engine, JudgeEngine):
        pytest.skip(f"build_engine gives a {type(engine).__name__} for kind judge, not a JudgeEngine")


def test_run_a_judge_on_rmbench_chat(demo_policy_dir, tmp_path):
    _require_judge_engine(demo_policy_dir)
    data = shared_data_dir() / "rm-bench"
    out = tmp_path / "out"
    cmd = [*RMSERVE, "run", str(demo_policy_dir), "--kind", "judge", "--bench", "rm-bench", "--data", str(data),
           "--only", "chat", "--judge-max-tokens", "32", "--out", str(out), "--resamples", "0", "--quiet",
           *ENGINE_OPTIONS]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3300)
    assert res.returncode in (0, 3), res.stderr[-3000:]  # 3: a group over the max length is named, not scored
    assert "chat" in res.stdout
    records = [msgspec.json.decode(line, type=ScoreRecord) for line in (out / "scores.jsonl").read_bytes().splitlines()]
    chat = [g for g in load_rmbench(data).groups if g.domain == "chat"]
    assert len(records) == len(chat)
    judged = [r for r in records if r.judge is not None]
    assert judged, "no group was judged"
    for record in judged:
        assert record.kind == "judge" and record.mode == "auto"
        assert record.judge.protocol == "rmbench-pairwise" and len(record.judge.calls) == 18
        assert all(call.completion_tokens <= 32 for call in record.judge.calls)
        # the 18 calls of a group share the pairwise instructions and the question: cache hits
        assert sum(call.cached_tokens for call in record.judge.calls) > 0
    for record in records:
        if record.judge is None:
            assert record.first_error is not None and record.first_error.type in ("sequence_too_long", "unsupported_group")
        # How every group was decoded and by what: greedy, 32 tokens, vLLM without its batch-invariant mode.
        assert record.judge_sampling == JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=32)
        assert (record.judge_engine.engine, record.judge_engine.batch_invariant) == ("vllm", False)
    assert "Judge set-up: sampling temperature 0, top_p 1, max_tokens 32; engine vllm " in res.stdout
    results = msgspec.json.decode((out / "results.json").read_bytes())
    assert results["judge"]["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32}
    assert results["judge"]["engine"]["batch_invariant"] is False and results["judge"]["n_unrecorded"] == 0
