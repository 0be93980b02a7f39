"""Heatmaps of RM-Bench's 3×3 style matrices, one PNG per domain.

matplotlib is imported only when a figure is drawn (Agg canvas: no pyplot, no display).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rmserve.metrics.evaluation import RMSERVE_PROTOCOL_NOTE
from rmserve.metrics.rmbench import DomainAccuracy, RMBenchResult
from rmserve.metrics.scores import JUDGE_KIND, SCORED_REWARDS

from rmserve.schema import RMBENCH_STYLES, ScoreKind

_STYLE_LABELS = tuple(s.replace("_", "\n") for s in RMBENCH_STYLES)


def heatmap_region(row: int, column: int) -> str:
    """The region of cell (``row`` = chosen style, ``column`` = rejected style) of the 3×3 matrix.

    hard = above the diagonal (a plainer chosen response against a fancier rejected one),
    normal = the diagonal, easy = below it: ``np.triu(m, 1)``, ``np.diag(m)`` and
    ``np.tril(m, -1)`` in RM-Bench's ``scripts/utils.py`` ``compute_accuracy``.
    """
    return "hard" if row < column else "normal" if row == column else "easy"


def model_label(models: Sequence[tuple[str, str]], *, width: int = 90) -> str:
    """One line (wrapped at ``width`` characters) naming the model(s) and fingerprint(s) of a figure.

    ``models`` holds ``(name, fingerprint)`` pairs; several pairs are all listed (a score set
    that mixes checkpoints says so); none gives a sentence saying the files do not record them.
    """
    if not models:
        text = "model and fingerprint: not recorded in the score files"
    elif len(models) == 1:
        name, fingerprint = models[0]
        text = f"model: {name or '(unnamed)'}   fingerprint: {fingerprint or '(none)'}"
    else:
        pairs = ", ".join(f"{name or '(unnamed)'} [{fingerprint or 'none'}]" for name, fingerprint in models)
        text = f"{len(models)} models in one score set: {pairs}"
    return "\n".join(textwrap.wrap(text, width=width))


_KIND_NAMES = {"classifier": "classifier rewards", "dpo": "DPO implicit reward", JUDGE_KIND: "generative judge"}
"""A plot's name for each kind of score (:meth:`rmserve.schema.ScoreKind.describe` adds the details)."""


def kind_label(kind: ScoreKind | None, reward: str = SCORED_REWARDS, protocols: Sequence[str] = ()) -> str:
    """Which kind of score a figure shows, in words for a plot: ``classifier rewards``, ``DPO
    implicit reward (mode reference, reference 'ref', compat none)`` (or the recomputed ``DPO
    reward avg``), ``generative judge (protocol rmbench-pairwise, chosen by --protocol auto, compat
    none)`` (``protocols``: those the judge's records used), or
    ``kind of score not recorded`` (official result files). The details are
    :meth:`~rmserve.schema.ScoreKind.describe`'s; a judge's mode is its ``--protocol`` choice."""
    if reward.startswith("dpo:"):
        return f"DPO reward {reward.removeprefix('dpo:')} (recomputed from the extras)"
    if reward.startswith("extra:"):
        return f"rewards from the extras {reward.removeprefix('extra:')}"
    if kind is None:
        return "kind of score not recorded"
    mode_word = "--protocol" if kind.kind == JUDGE_KIND else "mode"
    return kind.describe(name=_KIND_NAMES.get(kind.kind), mode_word=mode_word,
                         protocols=protocols if kind.kind == JUDGE_KIND else ())


def plot_heatmaps(
    result: RMBenchResult,
    out_dir: str | Path,
    *,
    models: Sequence[tuple[str, str]] = (),
    kind: ScoreKind | None = None,
    reward: str = SCORED_REWARDS,
    protocols: Sequence[str] = (),
) -> list[Path]:
    """Write one PNG per RM-Bench domain present: its 3×3 win matrix in percent.

    Rows are the chosen style, columns the rejected style; a cell is the percentage of the
    domain's groups whose chosen response of that style outscores the rejected one of that
    style. Each cell names its region (:func:`heatmap_region`: hard above the diagonal,
    normal on it, easy below; the diagonal is outlined); the title gives the domain, its
    group count and its hard / normal / easy figures; the foot names the model and
    fingerprint (:func:`model_label` of ``models``) and the title the kind of score
    (:func:`kind_label` of ``kind`` and ``reward``: classifier, DPO or generative judge). Uses
    matplotlib's Agg canvas (no pyplot, no display).

    Returns:
        The written paths (``heatmap-<domain>.png``).
    """
    out_dir = Path(out_dir)
    paths = []
    for d in result.domains:
        fig = heatmap_figure(d, models, kind=kind, reward=reward, protocols=protocols)
        path = out_dir / f"heatmap-{d.domain}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def heatmap_figure(
    domain: DomainAccuracy,
    models: Sequence[tuple[str, str]] = (),
    *,
    kind: ScoreKind | None = None,
    reward: str = SCORED_REWARDS,
    protocols: Sequence[str] = (),
) -> Any:
    """The matplotlib ``Figure`` of one domain's heatmap (see :func:`plot_heatmaps`), not saved.

    ``domain`` is one entry of :attr:`rmserve.metrics.rmbench.RMBenchResult.domains` (its ``matrix`` holds 3×3
    fractions); ``models`` as in :func:`model_label`; ``kind`` and ``reward`` as in
    :func:`kind_label` (the title's first line names the kind of score). For a generative
    judge a cell is the judge's mean preference for the chosen answer (both orders), and the
    colour bar says so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    d = domain
    matrix = 100 * np.array(d.matrix)
    fig = Figure(figsize=(6.0, 5.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(3), _STYLE_LABELS)
    ax.set_yticks(range(3), _STYLE_LABELS)
    ax.set_xlabel("rejected response style")
    ax.set_ylabel("chosen response style")
    for i in range(3):
        for j in range(3):
            color = "white" if matrix[i, j] < 60 else "black"
            ax.text(j, i - 0.08, f"{matrix[i, j]:.1f}%", ha="center", va="center", color=color, fontsize=11)
            ax.text(j, i + 0.22, heatmap_region(i, j), ha="center", va="center", color=color, fontsize=8,
                    style="italic")
    for k in range(3):  # the normal (diagonal) cells, outlined
        ax.add_patch(Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="white", linewidth=2.5))
        ax.add_patch(Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1, linestyle="--"))
    judged = kind is not None and kind.kind == JUDGE_KIND
    ax.set_title(
        f"RM-Bench {d.domain} ({d.n_groups} groups)\n"
        + "\n".join(textwrap.wrap(kind_label(kind, reward, protocols), width=70))
        + "\n"
        f"hard {100 * d.hard:.1f}%  ·  normal {100 * d.normal:.1f}%  ·  easy {100 * d.easy:.1f}%",
        fontsize=10,
    )
    bar = (
        "judge prefers chosen (%, mean of both orders)" if judged else "chosen outscores rejected (% of groups)"
    )
    fig.colorbar(image, ax=ax, label=bar, shrink=0.8)
    protocol = "\n".join(textwrap.wrap(RMSERVE_PROTOCOL_NOTE, width=95)) + "\n" if judged else ""
    fig.supxlabel(
        "hard = above the diagonal (plainer chosen vs fancier rejected), normal = diagonal, easy = below\n"
        + protocol
        + model_label(models),
        fontsize=8,
    )
    return fig


__all__ = ["heatmap_figure", "heatmap_region", "kind_label", "model_label", "plot_heatmaps"]
