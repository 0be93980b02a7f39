"""The ``label-distribution`` head (LDL-Reward-Gemma-2-27B's shape) computed from its description,
to check the served rewards against: transformers' own decoder class on the folder's weights (eager
attention, which applies Gemma 2's soft-capping), then, written out here in float64 from the state
dicts beside it, the regression layers (LeakyReLU between) giving one 10-bin score distribution per
objective, the gating layers giving one weight per objective (a softmax at the config's temperature
when ``softmax`` is set), and the expected score of the gated mixture with bins 0, 1/9, …, 1.
Shares no code with rmserve. One unpadded forward pass per sequence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def _layers(state) -> list:
    indices = sorted({int(k.split(".")[1]) for k in state})
    return [(state[f"network.{i}.weight"].double(), state[f"network.{i}.bias"].double()) for i in indices]


def _apply(layers, x):
    import torch

    for k, (w, b) in enumerate(layers):
        x = w @ x + b
        if k < len(layers) - 1:
            x = torch.nn.functional.leaky_relu(x, 0.01)
    return x


def label_distribution_forward(folder: Path, sequences: Sequence[Sequence[int]]) -> list[float]:
    """Per sequence, ``Σₖ bₖ·(Σⱼ gⱼ·pⱼₖ)`` at the decoder's last hidden state."""
    import torch
    import transformers

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    regression = _layers(torch.load(folder / "regression_layer.pt", weights_only=True))
    gating = _layers(torch.load(folder / "gating_layer.pt", weights_only=True))
    decoder_class = getattr(transformers, config["architectures"][0])
    decoder, info = decoder_class.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager",
                                                  output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    decoder.eval()
    bins = torch.linspace(0, 1, 10, dtype=torch.float64)
    rewards = []
    with torch.inference_mode():
        for ids in sequences:
            h = decoder(torch.tensor([list(ids)])).last_hidden_state[0, -1].double()
            p = torch.softmax(_apply(regression, h).reshape(-1, 10), dim=-1)
            g = _apply(gating, h)
            if config.get("softmax"):
                g = torch.softmax(g / config.get("temperature", 1.0), dim=0)
            rewards.append(float(((g @ p) * bins).sum()))
    return rewards
