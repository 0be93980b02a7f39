"""The heads of an MLP over a decoder, on the transformers engine, and the checks that keep such a
checkpoint from being read through a head it lacks: ``mlp-value`` (INF-ORM-Llama3.1-70B's shape:
a two-layer MLP score head over a Llama decoder, ``INFORMForSequenceClassification``, a class no
library ships) and ``value-head`` (the GRM reward models' shape: a decoder and a value head
``v_head.summary``, ``GRewardModel``, a class only allenai/reward-bench's
``rewardbench/models/grm.py`` defines; replica ``rmserve demo-model --head grm --family llama3``,
the family's causal LM without its LM head and with random ``v_head.summary.0`` / ``.2``), and
``label-distribution`` (LDL-Reward-Gemma-2-27B's shape: a Gemma 2 decoder and, beside it, the
state dicts of regression and gating layers; replica ``rmserve demo-model --head ldl --family
gemma2``; checked against ``tests/testkit/label_distribution.py``).

The replica is ``rmserve demo-model --head inf-orm --family llama3``: the llama3 family's
classifier whose ``score`` layer is replaced by random ``score.0`` / ``score.2`` tensors. The
rewards equal ``tests/testkit/token_value.py`` (transformers' own ``LlamaModel`` on the folder's
decoder weights, the MLP written out from the checkpoint's tensors, float64), within 1e-4 (float32
rounding of a two-layer decoder, observed below 1e-5); the value one position early is far off.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from testkit.chat_runs import chat_run_sample
from testkit.shared_data import shared_data_dir
from testkit.label_distribution import label_distribution_forward
from testkit.token_value import token_value_forward

from rmserve.schema import RewardHead

ATOL = 1e-4
RMBENCH = shared_data_dir() / "rm-bench"
RMSERVE = [sys.executable, "-m", "rmserve.cli"]
RUN = ["run", "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat", "--quiet", "--resamples", "0",
       "--dtype", "float32"]


@pytest.fixture(scope="module")
def replica(family_replica):
    return family_replica("llama3", "inf-orm")


def _relabelled(replica, tmp_path, architecture):
    """A copy of the replica whose config names another architecture (its tensors unchanged)."""
    copy = tmp_path / architecture
    shutil.copytree(replica, copy)
    config = json.loads((copy / "config.json").read_text())
    config["architectures"] = [architecture]
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.model
def test_the_head_is_found_and_a_classifier_label_over_its_tensors_is_refused(replica, tmp_path, demo_model_dir):
    from rmserve.errors import ServerFault
    from rmserve.server.config import check_reward_head
    from rmserve.server.kinds.heads import HeadSettings

    assert check_reward_head(str(replica), None, "hf") == RewardHead("mlp-value")
    with pytest.raises(ServerFault, match="served by the hf engine only.*add --engine hf"):
        check_reward_head(str(replica), None, "vllm")
    # INF-ORM's tensors under transformers' own class name: LlamaForSequenceClassification would find no
    # score.weight and initialise one at random, so the start is refused naming the head that reads them
    plain = _relabelled(replica, tmp_path, "LlamaForSequenceClassification")
    for engine in ("vllm", "hf"):
        with pytest.raises(ServerFault, match=r"MLP score head .* no score\.weight.*--head mlp-value --engine hf"):
            check_reward_head(str(plain), None, engine)
    assert check_reward_head(str(plain), HeadSettings(choice="mlp-value"), "hf") == RewardHead("mlp-value")
    # and the head named over a plain classifier: its tensors are not there
    with pytest.raises(ServerFault, match=r"has no score\.0\.weight, score\.0\.bias, score\.2\.weight, score\.2\.bias"):
        check_reward_head(str(demo_model_dir), HeadSettings(choice="mlp-value"), "hf")
    with pytest.raises(ServerFault, match="--label-index does not apply to the mlp-value head"):
        check_reward_head(str(replica), HeadSettings(label_index=0), "hf")


@pytest.mark.model
def test_a_checkpoint_missing_a_weight_is_refused_not_initialised_at_random(demo_policy_dir, tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from rmserve.errors import ServerFault
    from rmserve.server.engines.hf_engine import from_pretrained_checked

    copy = tmp_path / "no-lm-head"
    shutil.copytree(demo_policy_dir, copy)
    weights = load_file(str(copy / "model.safetensors"))
    del weights["lm_head.weight"]  # the demo policy's LM head is not tied (tie_word_embeddings false)
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    assert from_pretrained_checked(AutoModelForCausalLM, str(demo_policy_dir)) is not None
    with pytest.raises(ServerFault, match=r"holds no tensor for 1 weight\(s\) of LlamaForCausalLM \(lm_head\.weight\)"):
        from_pretrained_checked(AutoModelForCausalLM, str(copy))


@pytest.fixture(scope="module")
def grm_replica(family_replica):
    return family_replica("llama3", "grm")


@pytest.mark.model
def test_the_value_head_is_found_and_other_heads_over_its_tensors_are_refused(grm_replica, tmp_path, demo_model_dir):
    from rmserve.errors import ServerFault
    from rmserve.server.config import check_reward_head
    from rmserve.server.kinds.heads import HeadSettings

    assert check_reward_head(str(grm_replica), None, "hf") == RewardHead("value-head")
    with pytest.raises(ServerFault, match="served by the hf engine only.*add --engine hf"):
        check_reward_head(str(grm_replica), None, "vllm")
    # GRM's tensors under a classifier's name: transformers would find no score.weight
    plain = _relabelled(grm_replica, tmp_path, "LlamaForSequenceClassification")
    with pytest.raises(ServerFault, match=r"value head \(v_head\.summary\.\*\) and no score\.weight.*--head value-head"):
        check_reward_head(str(plain), None, "hf")
    assert check_reward_head(str(plain), HeadSettings(choice="value-head"), "hf") == RewardHead("value-head")
    with pytest.raises(ServerFault, match=r"has no v_head\.summary\.\* tensors"):
        check_reward_head(str(demo_model_dir), HeadSettings(choice="value-head"), "hf")
    with pytest.raises(ServerFault, match="--label-index does not apply to the value-head head"):
        check_reward_head(str(grm_replica), HeadSettings(label_index=0), "hf")
    with pytest.raises(ServerFault, match=r"the mlp-value head reads a classifier .*; its config gives the value-head "
                                          r"head: leave out --head$"):
        check_reward_head(str(grm_replica), HeadSettings(choice="mlp-value"), "hf")


@pytest.mark.model
def test_value_head_layouts_and_their_refusals(tmp_path):
    import torch
    from safetensors.torch import save_file

    from rmserve.errors import ServerFault
    from rmserve.server.engines.hf_heads import value_head_module

    def folder(name, tensors):
        out = tmp_path / name
        out.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
        return str(out)

    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 8, generator=g)
    w, b = torch.randn(1, 8, generator=g), torch.randn(1, generator=g)
    linear = folder("linear", {"v_head.summary.weight": w, "v_head.summary.bias": b})
    got = value_head_module(linear, 8, torch.device("cpu"), torch.float32)(h)
    assert torch.allclose(got, h @ w.T + b, atol=1e-6)
    layers = {f"v_head.summary.{i}.{p}": t for i, (wt, bt) in
              {0: (torch.randn(5, 8, generator=g), torch.randn(5, generator=g)),
               2: (torch.randn(4, 5, generator=g), torch.randn(4, generator=g)),
               4: (torch.randn(1, 4, generator=g), torch.randn(1, generator=g))}.items()
              for p, t in (("weight", wt), ("bias", bt))}
    deep = folder("deep", {**layers, "model.norm.weight": torch.ones(8)})
    x = torch.relu(h @ layers["v_head.summary.0.weight"].T + layers["v_head.summary.0.bias"])
    x = torch.relu(x @ layers["v_head.summary.2.weight"].T + layers["v_head.summary.2.bias"])
    expected = x @ layers["v_head.summary.4.weight"].T + layers["v_head.summary.4.bias"]
    assert torch.allclose(value_head_module(deep, 8, torch.device("cpu"), torch.float32)(h), expected, atol=1e-5)
    with pytest.raises(ServerFault, match=r"chain hidden \(6\) → … → 1"):
        value_head_module(deep, 6, torch.device("cpu"), torch.float32)
    gap = folder("gap", {k.replace(".2.", ".3."): v for k, v in layers.items()})
    with pytest.raises(ServerFault, match=r"0, 2, 4, … \(linear layers"):
        value_head_module(gap, 8, torch.device("cpu"), torch.float32)
    no_bias = folder("no-bias", {k: v for k, v in layers.items() if k != "v_head.summary.4.bias"})
    with pytest.raises(ServerFault, match="each with a bias"):
        value_head_module(no_bias, 8, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def ldl_replica(family_replica):
    return family_replica("gemma2", "ldl")


@pytest.mark.model
def test_the_label_distribution_head_is_named_and_its_files_are_checked(ldl_replica, tmp_path):
    import torch

    from rmserve.errors import ServerFault
    from rmserve.server.config import check_reward_head
    from rmserve.server.engines.hf_heads import label_distribution_head
    from rmserve.server.kinds.heads import HeadSettings

    named = HeadSettings(choice="label-distribution")
    assert check_reward_head(str(ldl_replica), named, "hf") == RewardHead("label-distribution")
    with pytest.raises(ServerFault, match=r"Gemma2Model.*label-distribution \(a decoder beside regression_layer\.pt.*"
                                          r"gating_layer\.pt lie beside it: add --head label-distribution$"):
        check_reward_head(str(ldl_replica), None, "hf")  # never taken without --head, but the files name it
    with pytest.raises(ServerFault, match="served by the hf engine only.*add --engine hf"):
        check_reward_head(str(ldl_replica), named, "vllm")

    # softmax off: the gate's raw outputs weigh the distributions (the official default)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 8, generator=g)
    reg = {"network.0.weight": torch.randn(6, 8, generator=g), "network.0.bias": torch.randn(6, generator=g),
           "network.2.weight": torch.randn(20, 6, generator=g), "network.2.bias": torch.randn(20, generator=g)}
    gate = {"network.0.weight": torch.randn(2, 8, generator=g), "network.0.bias": torch.randn(2, generator=g)}
    folder = tmp_path / "hand"
    folder.mkdir()
    torch.save(reg, folder / "regression_layer.pt")
    torch.save(gate, folder / "gating_layer.pt")
    head = label_distribution_head(str(folder), 8, {}, torch.device("cpu"))
    x = torch.nn.functional.leaky_relu(h @ reg["network.0.weight"].T + reg["network.0.bias"], 0.01)
    p = torch.softmax((x @ reg["network.2.weight"].T + reg["network.2.bias"]).view(2, 2, 10), dim=-1)
    w = h @ gate["network.0.weight"].T + gate["network.0.bias"]
    expected = ((w.unsqueeze(2) * p).sum(1) * torch.linspace(0, 1, 10)).sum(-1, keepdim=True)
    assert torch.allclose(head(h), expected, atol=1e-5)
    torch.save({**gate, "network.0.weight": torch.randn(3, 8)}, folder / "gating_layer.pt")
    with pytest.raises(ServerFault, match=r"gating layers of shapes .* chain hidden \(8\) → … → 2"):
        label_distribution_head(str(folder), 8, {}, torch.device("cpu"))
    (folder / "gating_layer.pt").unlink()
    with pytest.raises(ServerFault, match="has no gating_layer.pt"):
        label_distribution_head(str(folder), 8, {}, torch.device("cpu"))


HEAD_RUNS = {
    "mlp-value": ("replica", (), lambda folder, ids: token_value_forward(folder, ids, decoder="LlamaModel")),
    "value-head": ("grm_replica", (),
                   lambda folder, ids: token_value_forward(folder, ids, decoder="LlamaModel", head="v_head.summary.")),
    "label-distribution": ("ldl_replica", ("--head", "label-distribution"), label_distribution_forward),
}
"""Head → (its replica's fixture, the flags that name it, the head computed from its description)."""


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("head", list(HEAD_RUNS))
def test_run_on_the_transformers_engine_equals_the_head_from_its_description(head, request, tmp_path):
    from rmserve.server.render.chat import Renderer

    fixture, flags, forward = HEAD_RUNS[head]
    folder = request.getfixturevalue(fixture)
    argv = [*RMSERVE, RUN[0], str(folder), *RUN[1:], *flags]
    refused = subprocess.run([*argv, "--out", str(tmp_path / "refused")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--engine hf" in refused.stderr, refused.stderr[-2000:]
    out = tmp_path / "run"
    done = subprocess.run([*argv, "--out", str(out), "--engine", "hf"], capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Chat |" in done.stdout and f"Scores: classifier, head {head};" in done.stdout
    by_key, sample, sequences = chat_run_sample(out, RMBENCH, Renderer.from_pretrained(folder, max_model_len=4096))
    expected = forward(folder, sequences)
    got = [r for g in sample for r in by_key[g.key].rewards]
    assert all(by_key[g.key].scorer.head == RewardHead(head) and by_key[g.key].scorer.engine == "hf" for g in sample)
    if head == "label-distribution":  # a Gemma 2 decoder: the attention that applies its soft-capping
        assert all(by_key[g.key].scorer.attention == "eager" for g in sample)
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    print(f"{head} run: {len(by_key)} chat groups, {len(got)} rewards checked, max |diff| = {diff:.2e}")
    assert diff <= ATOL
    early = forward(folder, [ids[:-1] for ids in sequences[:6]])  # one position early: far off
    assert max(abs(a - b) for a, b in zip(early, expected[:6], strict=True)) > 100 * ATOL
