"""DPO end to end on real vLLM engines: ``rmserve serve --kind dpo --ref-model`` and a sweep of
three policy checkpoints against one reference, swapped in place.

The reference for every reward is ``testkit.dpo_reference``: the official formula computed
from the text (its own template calls and tokenization, one unpadded transformers forward
per sequence). Three policies of different weight seeds differ by far more than the 1e-4
tolerance, so a prefix cache or a reference engine that kept the previous policy's states
would show. Marked slow (two engines start; about two to three minutes on 2 cores).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import msgspec
import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.sweep_inputs import demo_checkpoints, rmbench_subset, write_token

from rmserve.schema import ModelList, ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
MAX_MODEL_LEN = 4096
STEPS = (100, 200, 300)
GROUPS_PER_DOMAIN = 3
DOMAINS = ("chat", "code", "safety-refuse", "safety-response")
TOKEN = "dpo-e2e-token"


@pytest.fixture(scope="module")
def dpo_env(tmp_path_factory, rmbench_dir, demo_reference_dir):
    """(checkpoint root, policy folders, reference folder, data folder, token file, expected rewards)."""
    from rmserve.demo_model import DemoModelConfig

    base = tmp_path_factory.mktemp("dpo")
    root = base / "run"
    configs = [DemoModelConfig(seed=seed, max_len=MAX_MODEL_LEN, kind="causal") for seed in (1, 3, 4)]
    folders = demo_checkpoints(root, rmbench_dir, STEPS, configs)
    data = rmbench_subset(rmbench_dir, base / "rm-bench", DOMAINS, GROUPS_PER_DOMAIN)
    token = write_token(base / "token", TOKEN)
    return root, folders, demo_reference_dir, data, token, _expected(folders, demo_reference_dir, data)


def _expected(folders, reference_dir, data) -> dict[tuple[int, str], list[float]]:
    """(step, group key) → the official implicit rewards (mode reference) from the text."""
    import torch
    from testkit.dpo_reference import reference_group_scores
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rmserve.datasets import load_rmbench

    groups = load_rmbench(data).groups
    tokenizer = AutoTokenizer.from_pretrained(folders[0])
    reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32).eval()
    out = {}
    for step, folder in zip(STEPS, folders, strict=True):
        policy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        for group in groups:
            messages = [{"role": m.role, "content": m.content} for m in group.messages]
            scores = reference_group_scores(policy, reference, tokenizer, messages, list(group.responses))
            out[(step, str(group.key))] = [s.rewards["reference"] for s in scores]
    return out


def test_sweep_of_three_policies_swaps_in_place_and_equals_the_official_formula(dpo_env, tmp_path):
    root, folders, reference_dir, data, token_file, expected = dpo_env
    port = free_loopback_port()
    argv = [*RMSERVE, "serve", str(folders[0]), "--kind", "dpo", "--ref-model", str(reference_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
            "--block-size", "32", "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager",
            "--admin-token-file", str(token_file), "--checkpoint-root", str(root)]
    log = tmp_path / "server.log"
    out = tmp_path / "out"
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=900, stop_grace_s=30) as server:
        server.wait_ready()
        res = subprocess.run(
            [*RMSERVE, "sweep", "--server", server.url, "--checkpoints", str(root / "step-*"), "--bench", "rm-bench",
             "--data", str(data), "--out", str(out), "--store", str(tmp_path / "store.sqlite"),
             "--admin-token-file", str(token_file), "--resamples", "50", "--quiet"],
            capture_output=True, text=True, timeout=1500,
        )
        assert res.returncode == 0, res.stderr[-4000:]
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as resp:
            (info,) = msgspec.json.decode(resp.read(), type=ModelList).models
    assert (info.kind, info.mode, info.ref_model, info.compat, info.swap_count) == (
        "dpo", "reference", reference_dir.name, "none", 3
    )
    text = log.read_text()
    assert "restarted on" not in text  # every swap reloaded the policy's weights in place
    worst = 0.0
    fingerprints = set()
    for step in STEPS:
        path = out / "checkpoints" / f"step-{step}" / "rm-bench.scores.jsonl"
        records = [msgspec.json.decode(line, type=ScoreRecord) for line in path.read_bytes().splitlines() if line]
        assert len(records) == GROUPS_PER_DOMAIN * len(DOMAINS)
        for record in records:
            assert (record.kind, record.mode) == ("dpo", "reference")
            assert record.extras is not None and set(record.extras) == {
                "policy_logp", "ref_logp", "policy_logp_norm", "answer_tokens", "bos"
            }
            assert record.extras["bos"] == ("template",) * len(record.rewards)  # the demo template writes BOS
            want = expected[(step, str(record.key))]
            worst = max(worst, *(abs(a - b) for a, b in zip(record.rewards, want, strict=True)))
            # The reward is the difference of the two sums it carries.
            for r, p, q in zip(record.rewards, record.extras["policy_logp"], record.extras["ref_logp"], strict=True):
                assert r == pytest.approx(p - q, abs=1e-9)
        fingerprints.add(records[0].fingerprint)
    assert worst < 1e-4, f"largest reward difference {worst:.3g}"
    assert len(fingerprints) == 3
