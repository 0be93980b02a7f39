"""Offline metrics stage: score files → official RM-Bench and RewardBench 2 figures.

Modules: :mod:`~rmserve.metrics.rmbench` and :mod:`~rmserve.metrics.rewardbench2` (pure array
functions), :mod:`~rmserve.metrics.dpo` (DPO rewards recomputed from a score file's extras),
:mod:`~rmserve.metrics.judge` (figures and parse failures of a generative judge's verdicts),
:mod:`~rmserve.metrics.bootstrap` (intervals and paired comparisons),
:mod:`~rmserve.metrics.scores` (the score sets), :mod:`~rmserve.metrics.score_files` (score-file
readers), :mod:`~rmserve.metrics.evaluation` (figures and intervals of a score set; the
:func:`~rmserve.metrics.evaluation.evaluate_files` entry point), :mod:`~rmserve.metrics.comparison`
(paired B − A), :mod:`~rmserve.metrics.render_json` and :mod:`~rmserve.metrics.render_markdown`
(``results.json`` and tables), :mod:`~rmserve.metrics.figures` (heatmaps),
:mod:`~rmserve.metrics.outputs` (the files of a run), :mod:`~rmserve.metrics.sweep` (checkpoint sweeps).

Imports numpy, msgspec and orjson only; matplotlib is loaded when a heatmap is drawn.
"""

from rmserve.metrics.bootstrap import BootstrapConfig, Interval, PairedFigure
from rmserve.metrics.comparison import Comparison, compare_files
from rmserve.metrics.evaluation import Evaluation, MetricsConfig, evaluate_files, evaluate_records
from rmserve.metrics.outputs import write_outputs
from rmserve.metrics.render_json import result_dict
from rmserve.metrics.render_markdown import render_markdown
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
