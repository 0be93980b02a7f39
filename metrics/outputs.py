"""Write an evaluation's files: ``results.json``, ``table.md`` and (RM-Bench) the heatmaps."""

from __future__ import annotations

from pathlib import Path

from rmserve.metrics.evaluation import Evaluation
from rmserve.metrics.figures import plot_heatmaps
from rmserve.metrics.render_json import result_dict, to_json
from rmserve.metrics.render_markdown import render_markdown
from rmserve.metrics.rmbench import RMBenchResult


def write_outputs(evaluation: Evaluation, out_dir: str | Path) -> list[Path]:
    """Write ``results.json``, ``table.md`` and (RM-Bench) the heatmaps into ``out_dir``.

    The folder is created when absent. Returns the written paths.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    results.write_text(to_json(result_dict(evaluation)) + "\n")
    table = out_dir / "table.md"
    table.write_text(render_markdown(evaluation))
    paths = [results, table]
    if isinstance(evaluation.result, RMBenchResult):
        paths += plot_heatmaps(
            evaluation.result, out_dir, models=evaluation.models, kind=evaluation.score_kind, reward=evaluation.reward,
            protocols=evaluation.judge.summary.protocols if evaluation.judge is not None else (),
        )
    return paths


__all__ = ["write_outputs"]
