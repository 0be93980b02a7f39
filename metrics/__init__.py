"""Offline metrics stage: score files → official RM-Bench and RewardBench 2 figures.

Modules: :mod:`~rmserve.metrics.rmbench` and :mod:`~rmserve.metrics.rewardbench2` (pure array
functions), :mod:`~rmserve.metrics.dpo` (DPO rewards recomputed from a score file's extras),
:mod:`~rmserve.metrics.judge` (figures and parse failures of a generative judge's verdicts),
:mod:`~rmserve.metrics.bootstrap` (intervals and paired comparisons),
:mod:`~rmserve.metrics.inputs` (score-file readers), :mod:`~rmserve.metrics.report` (tables,
JSON, heatmaps and the :func:`~rmserve.metrics.report.evaluate_files` entry point).

Imports numpy, msgspec and orjson only; matplotlib is loaded when a heatmap is drawn.
"""

from rmserve.metrics.bootstrap import BootstrapConfig, Interval, PairedFigure
from rmserve.metrics.report import (
    Comparison,
    Evaluation,
    MetricsConfig,
    compare_files,
    evaluate_files,
    evaluate_records,
    render_markdown,
    result_dict,
    write_outputs,
)
from rmserve.metrics.rewardbench2 import RB2Result, rewardbench2_scores
from rmserve.metrics.rmbench import RMBenchResult, rmbench_accuracy

__all__ = [
    "BootstrapConfig",
    "Comparison",
    "Evaluation",
    "Interval",
    "MetricsConfig",
    "PairedFigure",
    "RB2Result",
    "RMBenchResult",
    "compare_files",
    "evaluate_files",
    "evaluate_records",
    "render_markdown",
    "result_dict",
    "rewardbench2_scores",
    "rmbench_accuracy",
    "write_outputs",
]
