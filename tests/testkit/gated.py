"""The gated multi-objective head of the demo's remote-code replica (``rmserve demo-model --head
gated``), computed from its description rather than with the folder's own code: the independent
computation the remote-code head's tests compare against."""

from __future__ import annotations

from pathlib import Path


def gated_forward(folder: Path, sequences) -> list[tuple[float, list[float]]]:
    """The gated head as its description reads, computed here (not with the folder's code):
    the folder's decoder weights in transformers' own ``LlamaModel``, the hidden state ``h`` at
    the last token (unpadded), objective rewards ``r = W_r h``, gate ``g = softmax(W_g h + b_g)``,
    reward ``Σ gₖ rₖ``. Returns (reward, r) per sequence."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaModel

    config = json.loads((folder / "config.json").read_text())
    base_config = LlamaConfig(**{k: v for k, v in config.items() if k not in ("auto_map", "architectures", "model_type")})
    weights = load_file(str(folder / "model.safetensors"))
    base = LlamaModel(base_config).to(torch.float32).eval()
    missing = base.load_state_dict({k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")})
    assert not missing.missing_keys and not missing.unexpected_keys
    w_r, w_g, b_g = weights["regression_layer.weight"], weights["gating.weight"], weights["gating.bias"]
    out = []
    with torch.inference_mode():
        for ids in sequences:
            h = base(torch.tensor([list(ids)])).last_hidden_state[0, -1]
            r = w_r @ h
            g = torch.softmax(w_g @ h + b_g, dim=-1)
            out.append((float((g * r).sum()), r.tolist()))
    return out
