"""The per-token value head (``Qwen2ForRewardModel``, the ``token-value`` head; the same MLP over
a Llama is INF-ORM's ``mlp-value`` head) computed from its description, to check the served rewards against: transformers' own ``Qwen2Model`` on the
folder's decoder weights, then the score head written out here from the checkpoint's tensors
(``score.0``: hidden → hidden, ReLU, ``score.2``: hidden → 1; GRM's ``v_head.summary.0`` and
``.2`` the same way) at the last position. Shares no
code with the folder's modeling file or with rmserve. One unpadded forward pass per sequence,
float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def token_value_forward(folder: Path, sequences: Sequence[Sequence[int]], decoder: str = "Qwen2Model",
                        head: str = "score.") -> list[float]:
    """Per sequence, ``W₂·relu(W₀·h + b₀) + b₂`` of the decoder's last hidden state ``h``
    (``decoder``: the transformers class of the checkpoint's decoder, ``LlamaModel`` for
    INF-ORM's shape; ``head``: the name prefix of the two layers, ``v_head.summary.`` for GRM's)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    weights = load_file(str(Path(folder) / "model.safetensors"))
    w0, b0 = weights[f"{head}0.weight"].double(), weights[f"{head}0.bias"].double()
    w2, b2 = weights[f"{head}2.weight"].double(), weights[f"{head}2.bias"].double()
    model, info = getattr(transformers, decoder).from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]  # every decoder weight read from the folder
    decoder = model.eval()
    rewards = []
    with torch.inference_mode():
        for ids in sequences:
            h = decoder(torch.tensor([list(ids)])).last_hidden_state[0, -1].double()
            rewards.append(float((w2 @ torch.relu(w0 @ h + b0) + b2)[0]))
    return rewards
