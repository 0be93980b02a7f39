"""Figures of a checkpoint sweep: one row per checkpoint, curves against step, the best one.

Input: one :class:`SweepPoint` per checkpoint with its score records per benchmark (read
from the score store by ``rmserve sweep``). Every figure and interval comes from
:mod:`rmserve.metrics.evaluation` (the same code as ``rmserve metrics``); this module only
arranges them:

- ``sweep.csv`` — one row per checkpoint: step, name, fingerprint, then for every benchmark
  figure its value and bootstrap interval (``<bench>:<figure>``, ``…:low``, ``…:high``);
- ``sweep.json`` — the same rows with each checkpoint's full ``results.json`` per benchmark;
- one PNG per headline figure against step (RM-Bench Avg / Easy / Normal / Hard,
  RewardBench 2 average), intervals as a shaded band;
- ``summary.md`` — per benchmark the headline figure per checkpoint, the best checkpoint
  and the paired-bootstrap difference best − runner-up over the same groups.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmserve.metrics.comparison import compare_scores
from rmserve.metrics.evaluation import Evaluation, MetricsConfig, evaluate_records
from rmserve.metrics.figures import kind_label
from rmserve.metrics.render_json import result_dict, to_json
from rmserve.metrics.score_files import scores_from_records

from rmserve.schema import ScoreRecord

HEADLINE_FIGURES: Mapping[str, tuple[str, ...]] = {
    "rm-bench": ("overall.score", "overall.easy", "overall.normal", "overall.hard"),
    "rewardbench2": ("average",),
}
"""Figures plotted against step, per benchmark."""

BEST_BY: Mapping[str, str] = {"rm-bench": "overall.score", "rewardbench2": "average"}
"""The figure that names the best checkpoint of a benchmark (the leaderboard's average)."""

_LABELS = {
    "overall.score": "RM-Bench Avg",
    "overall.easy": "RM-Bench Easy",
    "overall.normal": "RM-Bench Normal",
    "overall.hard": "RM-Bench Hard",
    "average": "RewardBench 2 average",
}


@dataclass(frozen=True)
class SweepPoint:
    """One checkpoint of a sweep and its score records.

    Attributes:
        step: training step (from the folder name).
        name: checkpoint name (folder name).
        path: checkpoint folder.
        fingerprint: the model fingerprint the servers reported.
        model: the served model name.
        records: benchmark → score records (one per group of that benchmark's data).
    """

    step: int
    name: str
    path: str
    fingerprint: str
    model: str
    records: Mapping[str, Sequence[ScoreRecord]]


@dataclass(frozen=True)
class Best:
    """The best checkpoint of one benchmark and how sure that is.

    Attributes:
        benchmark: the benchmark.
        figure: the figure compared (:data:`BEST_BY`).
        best, runner_up: indices into the sweep's points (runner_up None with one checkpoint).
        difference: best − runner-up on ``figure`` (None without a runner-up).
        interval: paired-bootstrap interval of the difference, (low, high).
    """

    benchmark: str
    figure: str
    best: int
    runner_up: int | None
    difference: float | None
    interval: tuple[float, float] | None


def evaluate_points(
    points: Sequence[SweepPoint],
    benchmarks: Sequence[str],
    config: MetricsConfig,
    excluded: Mapping[str, Sequence[str]] | None = None,
) -> list[dict[str, Evaluation]]:
    """Evaluate every checkpoint on every benchmark; ``result[i][bench]`` is point i's.

    ``excluded``: per benchmark, the domains/subsets the run left out on purpose (``--only``;
    see :attr:`rmserve.metrics.evaluation.MetricsConfig.excluded`).

    Raises:
        rmserve.errors.DataError: invalid records (names the checkpoint and benchmark).
    """
    out = []
    for point in points:
        per_bench = {}
        for bench in benchmarks:
            bench_config = MetricsConfig(
                resamples=config.resamples, seed=config.seed, confidence=config.confidence, benchmark=bench,
                excluded=tuple((excluded or {}).get(bench, ())),
            )
            per_bench[bench] = evaluate_records(point.records[bench], bench_config, source=f"{point.name}/{bench}")
        out.append(per_bench)
    return out


def find_best(
    points: Sequence[SweepPoint], evaluations: Sequence[Mapping[str, Evaluation]], benchmark: str, config: MetricsConfig
) -> Best | None:
    """The checkpoint with the highest :data:`BEST_BY` figure (earliest step on a tie) and the
    paired-bootstrap difference to the runner-up (:func:`rmserve.metrics.comparison.compare_scores`,
    same resamples applied to both checkpoints' groups). None when no checkpoint has a value.
    """
    figure = BEST_BY[benchmark]
    values = [e[benchmark].figures().get(figure, math.nan) for e in evaluations]
    ranked = sorted((i for i, v in enumerate(values) if not math.isnan(v)), key=lambda i: (-values[i], points[i].step))
    if not ranked:
        return None
    best = ranked[0]
    if len(ranked) == 1:
        return Best(benchmark, figure, best, None, None, None)
    runner = ranked[1]
    a = scores_from_records(points[runner].records[benchmark], source=points[runner].name)
    b = scores_from_records(points[best].records[benchmark], source=points[best].name)
    comparison = compare_scores(a, b, config)
    paired = next(f for f in comparison.figures if f.figure == figure)
    return Best(benchmark, figure, best, runner, paired.difference, (paired.interval.low, paired.interval.high))


def _figure_names(evaluations: Sequence[Mapping[str, Evaluation]], bench: str) -> list[str]:
    names: list[str] = []
    for per_bench in evaluations:
        for name in per_bench[bench].figures():
            if name not in names:
                names.append(name)
    head = list(HEADLINE_FIGURES[bench])
    return [n for n in head if n in names] + [n for n in names if n not in head]


def _cell(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else repr(float(value))


def sweep_rows(
    points: Sequence[SweepPoint], evaluations: Sequence[Mapping[str, Evaluation]], benchmarks: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """The CSV header and rows: one row per checkpoint, the domains/subsets absent from the data
    per benchmark (``<bench>:missing``; non-empty = the overall figures are partial), then every
    figure with its interval."""
    header = ["step", "checkpoint", "fingerprint", "model"] + [f"{bench}:missing" for bench in benchmarks]
    columns: list[tuple[str, str]] = []
    for bench in benchmarks:
        for name in _figure_names(evaluations, bench):
            columns.append((bench, name))
            header += [f"{bench}:{name}", f"{bench}:{name}:low", f"{bench}:{name}:high"]
    rows = []
    for point, per_bench in zip(points, evaluations, strict=True):
        row = [str(point.step), point.name, point.fingerprint, point.model]
        # Absent domains/subsets: the overall figures then average only the present ones.
        row += [" ".join(per_bench[bench].result.missing) for bench in benchmarks]
        for bench, name in columns:
            evaluation = per_bench[bench]
            interval = evaluation.intervals.get(name)
            row += [
                _cell(evaluation.figures().get(name)),
                _cell(interval.low if interval else None),
                _cell(interval.high if interval else None),
            ]
        rows.append(row)
    return header, rows


MAX_STEP_TICKS = 12
"""Up to this many checkpoints, every checkpoint's step is an x tick."""


def sweep_model_label(points: Sequence[SweepPoint], *, width: int = 95) -> str:
    """The foot of a sweep figure: the served model name(s) and each checkpoint's fingerprint.

    Lists every checkpoint as ``step: fingerprint``, wrapped at ``width`` characters (the
    same values are in ``sweep.csv``).
    """
    import textwrap

    names = list(dict.fromkeys(p.model or "(unnamed)" for p in points))
    head = f"model: {names[0]}" if len(names) == 1 else f"models: {', '.join(names)}"
    prints = ", ".join(f"{p.step}:\u00a0{p.fingerprint or '(none)'}" for p in points)  # no break inside a pair
    return "\n".join(textwrap.wrap(f"{head}   fingerprints by step: {prints}", width=width))


def curve_figure(
    points: Sequence[SweepPoint],
    evaluations: Sequence[Mapping[str, Evaluation]],
    benchmark: str,
    figure_name: str,
    best: int | None = None,
) -> Any | None:
    """The matplotlib ``Figure`` of one headline figure against step (drawn, not saved), or None
    when no checkpoint has a value for it; ``best`` (an index into ``points``: the best
    checkpoint by :data:`BEST_BY`) is marked with a star on the curve and named in the legend.
    See :func:`plot_curves`."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [p.step for p in points]
    values, lows, highs = [], [], []
    for per_bench in evaluations:
        evaluation = per_bench[benchmark]
        value = evaluation.figures().get(figure_name, math.nan)
        interval = evaluation.intervals.get(figure_name)
        values.append(100 * value)
        lows.append(100 * interval.low if interval else math.nan)
        highs.append(100 * interval.high if interval else math.nan)
    if all(math.isnan(v) for v in values):
        return None
    level = round(100 * evaluations[0][benchmark].config.confidence)
    label = _LABELS.get(figure_name, figure_name)
    fig = Figure(figsize=(7, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # A percentile interval need not be centred on the point, so it is drawn as a band.
    ax.fill_between(steps, lows, highs, alpha=0.25, label=f"{level} % bootstrap interval")
    ax.plot(steps, values, marker="o", label=f"{label} (point estimate)")
    if best is not None and not math.isnan(values[best]):
        by = _LABELS.get(BEST_BY[benchmark], BEST_BY[benchmark])
        ax.plot([steps[best]], [values[best]], marker="*", markersize=16, linestyle="none", color="tab:red",
                label=f"best checkpoint by {by}: {points[best].name} ({values[best]:.1f} %)")
    ax.legend(loc="best", fontsize="small")
    ax.set_xlabel("training step (from the checkpoint folder name)")
    ax.set_ylabel(f"{label} (% accuracy)")
    if len(steps) <= MAX_STEP_TICKS:
        ax.set_xticks(steps, [str(s) for s in steps])
    missing = sorted({m for e in evaluations for m in e[benchmark].result.missing})
    first = evaluations[0][benchmark]
    title = f"{label} by checkpoint ({len(points)} checkpoints)"
    title += "\n" + "\n".join(textwrap.wrap(kind_label(first.score_kind, first.reward), width=70))
    if missing:
        title += "\n" + "\n".join(textwrap.wrap(f"partial: no {', '.join(missing)} in the data", width=70))
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3)
    fig.supxlabel(sweep_model_label(points), fontsize=8)
    return fig


def plot_curves(
    points: Sequence[SweepPoint],
    evaluations: Sequence[Mapping[str, Evaluation]],
    benchmark: str,
    out_dir: Path,
    best: int | None = None,
) -> list[Path]:
    """One PNG per headline figure of ``benchmark`` against step, the bootstrap interval as a band.

    Per figure: the value (percent) per checkpoint, its bootstrap interval (the evaluations'
    confidence level) as a shaded band, every step as an x tick (up to
    :data:`MAX_STEP_TICKS` checkpoints), the kind of score (classifier, DPO, generative judge;
    :func:`rmserve.metrics.figures.kind_label`) and the domains absent from the data in the title, and
    the model name(s) and each checkpoint's fingerprint at the foot (:func:`sweep_model_label`);
    the ``best`` checkpoint (index into ``points``) starred on every curve.
    Uses matplotlib's Agg canvas (no display). Returns the files written
    (``<benchmark>_<figure>.png``; none for a figure no checkpoint has).
    """
    paths = []
    for figure_name in HEADLINE_FIGURES[benchmark]:
        fig = curve_figure(points, evaluations, benchmark, figure_name, best)
        if fig is None:
            continue
        path = out_dir / f"{benchmark}_{figure_name.replace('.', '-')}.png"
        fig.savefig(path)
        paths.append(path)
    return paths


def _pct(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def render_summary(
    points: Sequence[SweepPoint],
    evaluations: Sequence[Mapping[str, Evaluation]],
    benchmarks: Sequence[str],
    bests: Mapping[str, Best | None],
    *,
    notes: Sequence[str] = (),
    refused: Sequence[str] = (),
) -> str:
    """``summary.md``: per benchmark the best checkpoint, its margin and the headline table."""
    lines = ["# Checkpoint sweep", ""]
    for bench in benchmarks:
        figure = BEST_BY[bench]
        best = bests.get(bench)
        lines += [f"## {bench}", ""]
        if best is None:
            lines += ["No checkpoint has a value for this benchmark.", ""]
            continue
        absent = sorted({m for e in evaluations for m in e[bench].result.missing})
        left_out = [m for m in absent if evaluations and m in evaluations[0][bench].config.excluded]
        missing = [m for m in absent if m not in left_out]
        if absent:
            said = [f"{', '.join(left_out)} excluded by --only"] if left_out else []
            said += [f"{', '.join(missing)} not in the data"] if missing else []
            lines += [
                f"**Partial**: {'; '.join(said)}; the overall figures average the domains/subsets present.",
                "",
            ]
        winner = points[best.best]
        if best.runner_up is None:
            lines.append(f"Best checkpoint: **{winner.name}** (step {winner.step}); no other checkpoint to compare.")
        else:
            runner = points[best.runner_up]
            assert best.interval is not None and best.difference is not None
            low, high = best.interval
            resolved = low > 0 or high < 0
            verdict = (
                "the 95 % interval excludes 0" if resolved else "the 95 % interval includes 0: not resolved"
            )
            lines.append(
                f"Best checkpoint: **{winner.name}** (step {winner.step}), {_LABELS.get(figure, figure)} "
                f"{_pct(evaluations[best.best][bench].figures()[figure])}; runner-up {runner.name} "
                f"(step {runner.step}). Paired bootstrap, best − runner-up over the same groups: "
                f"{100 * best.difference:+.2f} points [{100 * low:+.2f}, {100 * high:+.2f}], {verdict}."
            )
        lines.append("")
        heads = HEADLINE_FIGURES[bench]
        lines.append("| step | checkpoint | " + " | ".join(_LABELS.get(h, h) for h in heads) + " |")
        lines.append("|---:|---|" + "---:|" * len(heads))
        for i, (point, per_bench) in enumerate(zip(points, evaluations, strict=True)):
            evaluation = per_bench[bench]
            cells = []
            for h in heads:
                value = evaluation.figures().get(h)
                interval = evaluation.intervals.get(h)
                span = f" [{_pct(interval.low)}, {_pct(interval.high)}]" if interval else ""
                cells.append(_pct(value) + span)
            name = f"**{point.name}**" if i == best.best else point.name
            lines.append(f"| {point.step} | {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if refused:
        lines += ["## Refused servers", ""] + [f"- {r}" for r in refused] + [""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    lines.append("Figures in %; intervals: 95 % bootstrap over groups (see rmserve metrics).")
    return "\n".join(lines) + "\n"


def write_sweep(
    points: Sequence[SweepPoint],
    benchmarks: Sequence[str],
    out_dir: str | Path,
    *,
    resamples: int = 1000,
    seed: int = 0,
    notes: Sequence[str] = (),
    refused: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    excluded: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[Path], str, dict[str, Any]]:
    """Evaluate the sweep and write ``sweep.csv``, ``sweep.json``, the PNGs and ``summary.md``.

    Args:
        points: the checkpoints in step order.
        benchmarks: benchmark names present in every point's ``records``.
        out_dir: output folder (created).
        resamples, seed: bootstrap settings (``resamples`` ≥ 1).
        notes, refused: sentences for the summary (and ``sweep.json``).
        extra: more top-level keys for ``sweep.json`` (e.g. per-server group counts).
        excluded: per benchmark, the domains/subsets left out by ``--only`` (named as
            excluded, not as missing, in the summary).

    Returns:
        (files written, the summary Markdown, the ``sweep.json`` document).

    Raises:
        ValueError: no points, or ``resamples`` < 1.
        rmserve.errors.DataError: invalid records.
    """
    if not points:
        raise ValueError("a sweep needs at least one checkpoint")
    if resamples < 1:
        raise ValueError(f"resamples must be ≥ 1 for the paired differences, got {resamples}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = MetricsConfig(resamples=resamples, seed=seed)
    evaluations = evaluate_points(points, benchmarks, config, excluded)
    bests = {bench: find_best(points, evaluations, bench, config) for bench in benchmarks}
    paths = []

    header, rows = sweep_rows(points, evaluations, benchmarks)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    csv_path = out / "sweep.csv"
    csv_path.write_text(buffer.getvalue())
    paths.append(csv_path)

    document: dict[str, Any] = {
        "benchmarks": list(benchmarks),
        "bootstrap": {"resamples": resamples, "seed": seed, "confidence": config.confidence},
        "checkpoints": [
            {
                "step": p.step,
                "name": p.name,
                "path": p.path,
                "fingerprint": p.fingerprint,
                "model": p.model,
                "results": {bench: result_dict(e[bench]) for bench in benchmarks},
            }
            for p, e in zip(points, evaluations, strict=True)
        ],
        "best": {
            bench: None
            if b is None
            else {
                "figure": b.figure,
                "checkpoint": points[b.best].name,
                "step": points[b.best].step,
                "runner_up": None if b.runner_up is None else points[b.runner_up].name,
                "difference": b.difference,
                "interval": None if b.interval is None else list(b.interval),
            }
            for bench, b in bests.items()
        },
        "refused_servers": list(refused),
        "notes": list(notes),
        **(dict(extra) if extra else {}),
    }
    json_path = out / "sweep.json"
    json_path.write_text(to_json(document))
    paths.append(json_path)

    for bench in benchmarks:
        best = bests.get(bench)
        paths += plot_curves(points, evaluations, bench, out, best.best if best is not None else None)

    summary = render_summary(points, evaluations, benchmarks, bests, notes=notes, refused=refused)
    summary_path = out / "summary.md"
    summary_path.write_text(summary)
    paths.append(summary_path)
    return paths, summary, document
