"""Every picture rmserve writes, read back as matplotlib figures: labels, regions, model, fit.

The RM-Bench heatmap (one per domain) and the sweep curves (one per headline figure) are drawn
on an Agg canvas; the tests read the figure's texts (title, axis labels, cell texts, legend,
foot) and check that each title and foot lies inside the canvas (window extent in pixels).
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from rmserve.metrics.evaluation import MetricsConfig, evaluate_files, evaluate_records
from rmserve.metrics.figures import heatmap_figure
from rmserve.metrics.outputs import write_outputs
from rmserve.metrics.sweep import SweepPoint, curve_figure, evaluate_points, find_best
from testkit.metrics_data import random_rmbench_records, rmbench_record, write_jsonl

LONG_MODEL = "an-organisation-with-a-long-name/Reward-Model-V2-Llama-3.1-8B-instruct-finetuned"


EDGE_PX = 1.0
"""Slack at the canvas edge, pixels: constrained layout puts a text's extent (line height
included) flush with the edge, up to a fraction of a pixel over. A clipped title is tens of
pixels over."""


def _inside_canvas(fig, text) -> None:
    """Assert the drawn ``text`` lies within the figure's canvas (within :data:`EDGE_PX`)."""
    fig.canvas.draw()
    box = text.get_window_extent(fig.canvas.get_renderer())
    width, height = fig.canvas.get_width_height()
    assert box.width > 0 and box.height > 0, text.get_text()
    assert -EDGE_PX <= box.x0 and box.x1 <= width + EDGE_PX, (text.get_text(), box, width)
    assert -EDGE_PX <= box.y0 and box.y1 <= height + EDGE_PX, (text.get_text(), box, height)


def _one_group_result(model: str = "rm-a", fingerprint: str = "f00d"):
    # chosen (3, 1, 5) vs rejected (2, 4, 6): chosen_i > rejected_j holds for (0, 0), (2, 0), (2, 1)
    # only, so hard (i < j) = 0/3, normal (i = j) = 1/3, easy (i > j) = 2/3.
    record = msgspec.structs.replace(
        rmbench_record("chat", "0", [3.0, 1.0, 5.0, 2.0, 4.0, 6.0]), model=model, fingerprint=fingerprint
    )
    return evaluate_records([record], MetricsConfig(resamples=0))


def test_heatmap_cells_name_their_region_as_rm_bench_counts_it():
    evaluation = _one_group_result()
    fig = heatmap_figure(evaluation.result.domains[0], evaluation.models)
    ax = fig.axes[0]
    at = {(round(t.get_position()[1]), round(t.get_position()[0]), t.get_text()) for t in ax.texts}
    # Rows = chosen style, columns = rejected style; RM-Bench scripts/utils.py: hard = np.triu(m, 1).
    expected_regions = {
        (0, 0): "normal", (0, 1): "hard", (0, 2): "hard",
        (1, 0): "easy", (1, 1): "normal", (1, 2): "hard",
        (2, 0): "easy", (2, 1): "easy", (2, 2): "normal",
    }
    wins = {(0, 0), (2, 0), (2, 1)}
    for (i, j), region in expected_regions.items():
        assert (i, j, region) in at
        assert (i, j, "100.0%" if (i, j) in wins else "0.0%") in at
    title = ax.get_title()
    assert "RM-Bench chat (1 groups)" in title
    assert "hard 0.0%" in title and "normal 33.3%" in title and "easy 66.7%" in title
    assert ax.get_xlabel() == "rejected response style" and ax.get_ylabel() == "chosen response style"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["concise", "detailed\nplain", "detailed\nmarkdown"]
    colorbar = fig.axes[1]
    assert colorbar.get_ylabel() == "chosen outscores rejected (% of groups)"
    foot = fig._supxlabel
    assert "model: rm-a" in foot.get_text() and "fingerprint: f00d" in foot.get_text()
    assert "hard = above the diagonal" in foot.get_text()
    _inside_canvas(fig, ax.title)
    _inside_canvas(fig, foot)


def test_heatmap_title_and_foot_fit_with_a_long_model_name_and_domain():
    evaluation = _one_group_result(model=LONG_MODEL, fingerprint="0123456789abcdef")
    domain = evaluation.result.domains[0]
    fig = heatmap_figure(dataclasses.replace(domain, domain="safety-response"), evaluation.models)
    assert LONG_MODEL in fig._supxlabel.get_text().replace("\n", " ")
    _inside_canvas(fig, fig.axes[0].title)
    _inside_canvas(fig, fig._supxlabel)


def test_heatmap_says_when_the_files_record_no_model(tmp_path):
    # The official RM-Bench result format has no model or fingerprint field.
    rows = [{"id": str(i), "domain": "chat", "score_chosen": [1, 2, 3], "score_rejected": [0, 0, 0]} for i in range(3)]
    evaluation = evaluate_files([write_jsonl(tmp_path / "chat_results.jsonl", rows)], MetricsConfig(resamples=0))
    assert evaluation.models == ()
    fig = heatmap_figure(evaluation.result.domains[0], evaluation.models)
    assert "model and fingerprint: not recorded in the score files" in fig._supxlabel.get_text()


def test_written_heatmaps_carry_the_models_of_the_score_file(tmp_path):
    records = random_rmbench_records({"chat": 5, "code": 5})
    records = [msgspec.structs.replace(r, model="rm-b" if k >= 7 else "rm-a", fingerprint="fb" if k >= 7 else "fa")
               for k, r in enumerate(records)]
    evaluation = evaluate_files([write_jsonl(tmp_path / "scores.jsonl", records)], MetricsConfig(resamples=0))
    assert evaluation.models == (("rm-a", "fa"), ("rm-b", "fb"))
    paths = write_outputs(evaluation, tmp_path / "out")
    assert {p.name for p in paths} >= {"heatmap-chat.png", "heatmap-code.png"}
    fig = heatmap_figure(evaluation.result.domains[0], evaluation.models)
    assert "2 models in one score set: rm-a [fa], rm-b [fb]" in fig._supxlabel.get_text().replace("\n", " ")


def _sweep(model: str = LONG_MODEL):
    points = []
    for k, step in enumerate((100, 200, 300, 400)):
        records = random_rmbench_records({"chat": 8, "code": 8}, seed=k, shift=0.3 * k)
        fingerprint = f"{k:04x}abcdef012345"
        records = [msgspec.structs.replace(r, model=model, fingerprint=fingerprint) for r in records]
        point = SweepPoint(step=step, name=f"checkpoint-{step}", path=f"/c/{step}", fingerprint=fingerprint,
                           model=model, records={"rm-bench": records})
        points.append(point)
    return points, evaluate_points(points, ["rm-bench"], MetricsConfig(resamples=20))


def test_sweep_curve_labels_and_fit():
    points, evaluations = _sweep()
    for figure_name, label in (("overall.score", "RM-Bench Avg"), ("overall.hard", "RM-Bench Hard")):
        fig = curve_figure(points, evaluations, "rm-bench", figure_name)
        ax = fig.axes[0]
        title = ax.get_title()
        assert title.startswith(f"{label} by checkpoint (4 checkpoints)")
        # chat and code only: the overall figures are partial, and the title says which domains are absent.
        assert "partial: no math, safety-refuse, safety-response in the data" in title.replace("\n", " ")
        assert ax.get_ylabel() == f"{label} (% accuracy)"
        assert ax.get_xlabel() == "training step (from the checkpoint folder name)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "200", "300", "400"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["95 % bootstrap interval", f"{label} (point estimate)"]
        foot = fig._supxlabel.get_text().replace("\n", " ")
        assert f"model: {LONG_MODEL}" in foot
        for k, step in enumerate((100, 200, 300, 400)):
            assert f"{step}:\u00a0{k:04x}abcdef012345" in foot
        _inside_canvas(fig, ax.title)
        _inside_canvas(fig, fig._supxlabel)


def test_sweep_curve_point_values_are_the_figures_in_percent():
    points, evaluations = _sweep(model="m")
    fig = curve_figure(points, evaluations, "rm-bench", "overall.score")
    (line,) = fig.axes[0].get_lines()
    expected = [100 * e["rm-bench"].figures()["overall.score"] for e in evaluations]
    assert list(line.get_xdata()) == [100, 200, 300, 400]
    assert list(line.get_ydata()) == pytest.approx(expected)


def test_sweep_curve_stars_the_best_checkpoint():
    points, evaluations = _sweep(model="m")
    best = find_best(points, evaluations, "rm-bench", MetricsConfig(resamples=20))
    values = [100 * e["rm-bench"].figures()["overall.score"] for e in evaluations]
    assert best.best == max(range(4), key=lambda i: values[i])
    fig = curve_figure(points, evaluations, "rm-bench", "overall.hard", best.best)
    curve, star = fig.axes[0].get_lines()
    assert star.get_marker() == "*"
    assert list(star.get_xdata()) == [points[best.best].step]
    hard = 100 * evaluations[best.best]["rm-bench"].figures()["overall.hard"]
    assert list(star.get_ydata()) == pytest.approx([hard])  # on this figure's curve, chosen by the Avg
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[-1] == f"best checkpoint by RM-Bench Avg: {points[best.best].name} ({hard:.1f} %)"
    (only,) = curve_figure(points, evaluations, "rm-bench", "overall.hard").axes[0].get_lines()  # no best: no star
