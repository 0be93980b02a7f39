"""Score heads the transformers engine builds from a checkpoint's tensors, for checkpoints whose
reward model class no library ships (the checkpoint holds a decoder and the head's tensors; the
class lives in a model card or in the official harness): the ``mlp-value`` head's two-layer MLP
(INF-ORM), the ``value-head`` head's linear layers (GRM) and the ``label-distribution`` head's
regression and gating layers (LDL-Reward, from the state-dict files beside the decoder). Each maps the decoder's hidden state
at the last token, shape (batch, hidden), to the reward, shape (batch, 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rmserve.errors import ServerFault


def _checkpoint_folder(path: str, patterns: list[str]) -> Path:
    """The folder of checkpoint ``path``: itself when local, else the hub id's files matching
    ``patterns`` downloaded into the cache."""
    folder = Path(path)
    if folder.is_dir():
        return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, allow_patterns=patterns))


def _checkpoint_tensors(path: str, wanted: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint ``path`` (a folder, or a hub id downloaded into the cache) whose
    names ``wanted`` accepts, read from its ``*.safetensors`` files."""
    from safetensors import safe_open

    folder = _checkpoint_folder(path, ["*.safetensors", "*.json"])
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as shard:
            for name in shard.keys():
                if wanted(name):
                    tensors[name] = shard.get_tensor(name)
    return tensors


def value_head_module(path: str, hidden_size: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The ``value-head`` head of checkpoint ``path`` from its ``v_head.summary`` tensors
    (:data:`~rmserve.server.kinds.heads.VALUE_HEAD_PREFIX`), shape (batch, hidden) → (batch, 1):
    one linear layer (``v_head.summary.weight``/``.bias``), or linear layers
    ``v_head.summary.0``, ``.2``, … with a ReLU between each two (GRM's ``ValueHead``, per
    allenai/reward-bench ``rewardbench/models/grm.py``: ``vhead_num_layers`` hidden layers of
    ``vhead_num_neurons``, then one output; its dropout is off in evaluation).

    Raises:
        ServerFault: no such tensors, layer indices other than 0, 2, 4, …, a weight without its
            bias, or shapes that do not chain hidden → … → 1 (naming them).
    """
    from rmserve.server.kinds.heads import VALUE_HEAD_PREFIX

    tensors = _checkpoint_tensors(path, lambda name: name.startswith(VALUE_HEAD_PREFIX))
    names = {name[len(VALUE_HEAD_PREFIX):] for name in tensors}
    if names == {"weight", "bias"}:
        indices: list[str] = [""]
    else:
        found = sorted({part.split(".")[0] for part in names})
        numbers = sorted(int(i) for i in found if i.isdigit())
        if not numbers or len(numbers) != len(found) or numbers != list(range(0, 2 * len(numbers), 2)):
            raise ServerFault(
                f"{path!r} has value-head tensors {sorted(tensors) or 'none'}; the value-head head reads "
                f"{VALUE_HEAD_PREFIX}weight/bias (one linear layer) or {VALUE_HEAD_PREFIX}0, 2, 4, … (linear layers, "
                "a ReLU between each two)"
            )
        indices = [f"{i}." for i in numbers]
    layers: list[torch.nn.Module] = []
    width = hidden_size
    for k, index in enumerate(indices):
        weight, bias = tensors.get(f"{VALUE_HEAD_PREFIX}{index}weight"), tensors.get(f"{VALUE_HEAD_PREFIX}{index}bias")
        out = 1 if k == len(indices) - 1 else None
        if (weight is None or bias is None or weight.dim() != 2 or weight.shape[1] != width
                or (out is not None and weight.shape[0] != out) or tuple(bias.shape) != (weight.shape[0],)):
            shapes = {name: tuple(t.shape) for name, t in sorted(tensors.items())}
            raise ServerFault(
                f"{path!r} has a value head of shapes {shapes}; the value-head head reads linear layers that chain "
                f"hidden ({hidden_size}) → … → 1, each with a bias"
            )
        linear = torch.nn.Linear(int(weight.shape[1]), int(weight.shape[0]))
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        layers += [linear] if out is not None else [linear, torch.nn.ReLU()]
        width = int(weight.shape[0])
    return torch.nn.Sequential(*layers).to(device=device, dtype=dtype).eval()


def mlp_score_head(path: str, hidden_size: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Sequential:
    """The ``mlp-value`` head of checkpoint ``path``: ``score.2(relu(score.0(h)))`` from its
    tensors (:data:`~rmserve.server.kinds.heads.MLP_SCORE_WEIGHTS`), shape (batch, hidden) →
    (batch, 1).

    Raises:
        ServerFault: a tensor is missing, or the layers' shapes are not hidden → hidden → 1.
    """
    from rmserve.server.kinds.heads import MLP_SCORE_WEIGHTS

    tensors = _checkpoint_tensors(path, lambda name: name in MLP_SCORE_WEIGHTS)
    missing = [name for name in MLP_SCORE_WEIGHTS if name not in tensors]
    if missing:
        raise ServerFault(f"{path!r} has no {', '.join(missing)} in its *.safetensors files; the mlp-value head reads them")
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    want = {"score.0.weight": (hidden_size, hidden_size), "score.0.bias": (hidden_size,),
            "score.2.weight": (1, hidden_size), "score.2.bias": (1,)}
    if shapes != want:
        raise ServerFault(
            f"{path!r} has an MLP score head of shapes {shapes}; the mlp-value head reads hidden → hidden → 1 "
            f"(hidden {hidden_size}): {want}"
        )
    first, last = torch.nn.Linear(hidden_size, hidden_size), torch.nn.Linear(hidden_size, 1)
    with torch.no_grad():
        first.weight.copy_(tensors["score.0.weight"])
        first.bias.copy_(tensors["score.0.bias"])
        last.weight.copy_(tensors["score.2.weight"])
        last.bias.copy_(tensors["score.2.bias"])
    return torch.nn.Sequential(first, torch.nn.ReLU(), last).to(device=device, dtype=dtype).eval()


class LabelDistributionHead(torch.nn.Module):
    """The ``label-distribution`` head (LDL-Reward-Gemma-2-27B-v0.1, per allenai/reward-bench
    ``rewardbench/models/ldlreward.py``): from the hidden state ``h`` at the last token, shape
    (batch, hidden), in float32,

    * ``p = softmax(regression(h) reshaped to (batch, K, bins), over bins)``: one score
      distribution per objective (K objectives, :data:`~rmserve.server.kinds.heads.LABEL_DISTRIBUTION_BINS` bins);
    * ``g = gating(h)``, shape (batch, K), then ``softmax(g / temperature)`` when the config asks
      for it (``softmax``: true);
    * reward ``Σₖ bₖ · (Σⱼ gⱼ pⱼₖ)`` with bins ``bₖ = k / (bins − 1)``: the expected score of
      the gated mixture, shape (batch, 1).

    ``regression`` and ``gating`` are linear layers with a LeakyReLU (slope 0.01) between each two.
    """

    def __init__(self, regression: torch.nn.Sequential, gating: torch.nn.Sequential, *, bins: int,
                 temperature: float | None) -> None:
        super().__init__()
        self.regression, self.gating = regression, gating
        self.bins, self.temperature = bins, temperature
        self.register_buffer("scores", torch.linspace(0, 1, bins))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        batch = hidden.shape[0]
        distributions = torch.softmax(self.regression(hidden).view(batch, -1, self.bins), dim=-1)
        gate = self.gating(hidden)
        if self.temperature is not None:
            gate = torch.softmax(gate / self.temperature, dim=1)
        mixture = torch.bmm(gate.unsqueeze(1), distributions).squeeze(1)
        return (mixture * self.scores).sum(dim=-1, keepdim=True)


def _leaky_layers(state: dict[str, torch.Tensor], what: str, width: int, out: int | None, path: str) -> torch.nn.Sequential:
    """Linear layers from a state dict's ``network.N.weight``/``.bias`` (N ascending), a LeakyReLU
    between each two, checked to chain ``width`` → … → ``out`` (any multiple of the bins when
    ``out`` is None: the regression layers)."""
    from rmserve.server.kinds.heads import LABEL_DISTRIBUTION_BINS

    indices = sorted({int(k.split(".")[1]) for k in state if k.startswith("network.") and k.split(".")[1].isdigit()})
    layers: list[torch.nn.Module] = []
    for position, index in enumerate(indices):
        weight, bias = state.get(f"network.{index}.weight"), state.get(f"network.{index}.bias")
        last = position == len(indices) - 1
        fits = (weight is not None and bias is not None and weight.dim() == 2 and weight.shape[1] == width
                and tuple(bias.shape) == (weight.shape[0],))
        if fits and last:
            fits = weight.shape[0] == out if out is not None else weight.shape[0] % LABEL_DISTRIBUTION_BINS == 0
        if not fits:
            shapes = {k: tuple(v.shape) for k, v in sorted(state.items())}
            raise ServerFault(
                f"{path!r} has {what} layers of shapes {shapes}; the label-distribution head reads linear layers "
                f"network.N (weight and bias) that chain hidden ({width if position == 0 else '…'}) → … → "
                f"{out if out is not None else f'objectives × {LABEL_DISTRIBUTION_BINS}'}"
            )
        linear = torch.nn.Linear(int(weight.shape[1]), int(weight.shape[0]))
        with torch.no_grad():
            linear.weight.copy_(weight.float())
            linear.bias.copy_(bias.float())
        layers += [linear] if last else [linear, torch.nn.LeakyReLU()]
        width = int(weight.shape[0])
    if not layers:
        raise ServerFault(f"{path!r} has no {what} layers (network.N.weight); the label-distribution head reads them")
    return torch.nn.Sequential(*layers)


def label_distribution_head(path: str, hidden_size: int, config: dict, device: torch.device) -> LabelDistributionHead:
    """The ``label-distribution`` head of checkpoint ``path`` (a folder, or a hub id downloaded into
    the cache): its :data:`~rmserve.server.kinds.heads.LABEL_DISTRIBUTION_FILES` read as state dicts
    (``torch.load(weights_only=True)``: tensors only, no code), the gate's softmax and temperature
    from ``config`` (``config.json`` as written: ``softmax``, default false; ``temperature``, default
    1.0, a key transformers' config classes treat as a generation setting); float32 whatever
    the decoder's dtype, as the official code runs it.

    Raises:
        ServerFault: a file is missing or unreadable, or its layers do not chain hidden → … →
            objectives × bins (regression) and hidden → … → objectives (gating).
    """
    from rmserve.server.kinds.heads import LABEL_DISTRIBUTION_BINS, LABEL_DISTRIBUTION_FILES

    folder = _checkpoint_folder(path, list(LABEL_DISTRIBUTION_FILES))
    states = []
    for name in LABEL_DISTRIBUTION_FILES:
        try:
            states.append(torch.load(folder / name, map_location="cpu", weights_only=True))
        except FileNotFoundError:
            raise ServerFault(f"{path!r} has no {name}; the label-distribution head reads "
                              f"{' and '.join(LABEL_DISTRIBUTION_FILES)} beside the decoder") from None
        except Exception as exc:  # noqa: BLE001 - a file that is not a state dict of tensors
            raise ServerFault(f"{path!r}: {name} is not a state dict of tensors: {type(exc).__name__}: {exc}") from exc
    regression = _leaky_layers(states[0], "regression", hidden_size, None, path)
    objectives = regression[-1].out_features // LABEL_DISTRIBUTION_BINS
    gating = _leaky_layers(states[1], "gating", hidden_size, objectives, path)
    temperature = float(config.get("temperature", 1.0)) if config.get("softmax", False) else None
    return LabelDistributionHead(regression, gating, bins=LABEL_DISTRIBUTION_BINS,
                                 temperature=temperature).to(device).eval()
