"""Markdown tables of an evaluation (``table.md``) and of a comparison.

Tables follow the leaderboard column order and show percent with one decimal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rmserve.metrics.bootstrap import Interval
from rmserve.metrics.comparison import Comparison
from rmserve.metrics.dpo import DPO_REWARD_FORMULAS
from rmserve.metrics.evaluation import JUDGE_VERDICTS, RB2_COLUMNS, RMBENCH_COLUMNS, Evaluation, JudgeReport
from rmserve.metrics.judge import JudgeSummary, ParseFailures
from rmserve.metrics.judge_setup import JudgeSetup
from rmserve.metrics.rewardbench2 import TIES, TIES_WEIGHTS, RB2Result
from rmserve.metrics.rmbench import RMBenchResult
from rmserve.metrics.scores import JUDGE_KIND, SCORED_REWARDS

from rmserve.schema import CLASSIFIER_HEAD, ScoreKind

MISSING_CELL = "—"
"""Table cell for a figure with no groups."""


def reward_text(reward: str) -> str:
    """Words for the reward the figures use: ``rewards as scored``, e.g. ``DPO reward avg =
    policy_logp / answer_tokens, recomputed from the extras``, or the extras it was read from."""
    if reward == SCORED_REWARDS:
        return "rewards as scored"
    if reward == JUDGE_VERDICTS:
        return "figures from the judge's verdicts (credits, ratings, pairwise cells), not from its rewards"
    if reward.startswith("extra:"):
        return f"rewards from the extras {reward.removeprefix('extra:')} of each response (--reward-extra)"
    name = reward.removeprefix("dpo:")
    return f"DPO reward {name} = {DPO_REWARD_FORMULAS[name]}, recomputed from the extras"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return MISSING_CELL
    if math.isnan(value):
        return "n/a"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _span(interval: Interval | None, signed: bool = False) -> str:
    if interval is None:
        return MISSING_CELL
    return f"[{_pct(interval.low, signed)}, {_pct(interval.high, signed)}]"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(cells: Sequence[str], first_left: bool = True) -> list[str]:
    align = [":---" if first_left and i == 0 else "---:" for i in range(len(cells))]
    return [_row(cells), _row(align)]


def render_markdown(evaluation: Evaluation) -> str:
    """Markdown report: the title (naming a recomputed DPO reward), a header line with the
    groups, files, kind of score and reward, the leaderboard-order table (percent, 1 decimal)
    with its interval row, notes on missing parts, and a per-domain / Ties detail table."""
    result = evaluation.result
    figures = evaluation.figures()
    iv = evaluation.intervals
    level = round(100 * evaluation.config.confidence)
    if isinstance(result, RMBenchResult):
        title, columns = "RM-Bench", RMBENCH_COLUMNS
    else:
        title, columns = "RewardBench 2", RB2_COLUMNS
    judge = evaluation.judge
    heading = title
    if judge is not None:
        heading += ": generative judge"
    elif evaluation.reward.startswith("extra:"):
        heading += f": {evaluation.reward.removeprefix('extra:')}"
    elif evaluation.reward != SCORED_REWARDS:
        heading += f": DPO reward {evaluation.reward.removeprefix('dpo:')}"
    kind = _kind_text(evaluation.score_kind, judge.summary.protocols if judge is not None else ())
    if evaluation.heads and evaluation.heads != (CLASSIFIER_HEAD,):
        kind += f", head{'s' if len(evaluation.heads) > 1 else ''} {', '.join(evaluation.heads)}"
    lines = [
        f"## {heading}",
        "",
        f"{evaluation.n_groups} group{'' if evaluation.n_groups == 1 else 's'} from {', '.join(evaluation.files)}. "
        f"Scores: {kind}; {reward_text(evaluation.reward)}.",
        "",
    ]
    if judge is not None:
        lines += [judge_header(judge.summary), "", judge_setup_line(judge.setup), ""]
        if judge.summary.no_verdicts:
            lines += [f"**Warning: {judge.summary.no_verdicts_sentence()}.**", ""]
    lines += _header([""] + [h for h, _ in columns])
    lines.append(
        _row(["Accuracy (%)" if title == "RM-Bench" else "Score (%)"] + [_pct(figures.get(f)) for _, f in columns])
    )
    if iv:
        lines.append(_row([f"{level}% CI"] + [_span(iv.get(f)) if f in figures else MISSING_CELL for _, f in columns]))
    if judge is not None:
        lines.append(_row(["Parse failures (%)"] + [_column_failures(judge, result, f) for _, f in columns]))
    notes = evaluation.notes()
    if notes or evaluation.warnings:
        lines.append("")
        lines += [f"Warning: {w}" for w in evaluation.warnings]
        lines += [f"Note: {n}" for n in notes]
    lines.append("")
    if isinstance(result, RMBenchResult):
        extra = ["Parse failures", "Cut at max_tokens"] if judge is not None else []
        lines += _header(["Domain", "Groups", "Easy", "Normal", "Hard", "Score", *extra])
        for d in result.domains:
            cells = [d.domain, _groups_cell(d)]
            for f in ("easy", "normal", "hard", "score"):
                name = f"{d.domain}.{f}"
                cells.append(_pct(figures[name]) + (f" ({_span(iv[name])})" if name in iv else ""))
            if judge is not None:
                cells += _failure_cells(judge.pooled(d.parts))
            lines.append(_row(cells))
    else:
        extra = ["Parse failures", "Cut at max_tokens"] if judge is not None else []
        lines += _header(["Subset", "Groups", "Score", f"{level}% CI", *extra])
        for s in result.subsets:
            cells = [s.subset, str(s.n_groups), _pct(s.score), _span(iv.get(s.subset)) if iv else MISSING_CELL]
            if judge is not None:
                cells += _failure_cells(judge.pooled((s.subset,)))
            lines.append(_row(cells))
        if result.ties is not None:
            lines += ["", *_header(["Ties component", "Weight", "Value", f"{level}% CI"])]
            for c, weight in TIES_WEIGHTS.items():
                name = f"{TIES}.{c}"
                lines.append(
                    _row([c, f"{weight:.2f}", _pct(figures[name]), _span(iv.get(name)) if iv else MISSING_CELL])
                )
    if iv:
        lines += [
            "",
            f"Intervals: {level}% percentile bootstrap, {evaluation.config.resamples} resamples, "
            f"seed {evaluation.config.seed}.",
        ]
    return "\n".join(lines) + "\n"


def _failure_text(failures: ParseFailures | None) -> str:
    """``"2.5 (3/120)"``: percent of calls without a verdict or rating, then the counts."""
    if failures is None or failures.n_calls == 0:
        return MISSING_CELL
    return f"{_pct(failures.rate)} ({failures.n_failed}/{failures.n_calls})"


def _failure_cells(failures: ParseFailures | None) -> list[str]:
    """The detail table's parse-failure cells: ``"2.5% (3/120)"`` and the calls cut at ``max_tokens``."""
    if failures is None or failures.n_calls == 0:
        return [MISSING_CELL, MISSING_CELL]
    return [f"{_pct(failures.rate)}% ({failures.n_failed}/{failures.n_calls})", str(failures.n_truncated)]


def _column_failures(judge: JudgeReport, result: RMBenchResult | RB2Result, figure: str) -> str:
    """The parse-failure cell under a leaderboard column: its domain's or subset's, every
    call's under Avg, empty under RM-Bench's Easy / Normal / Hard (they span all domains)."""
    if figure in ("overall.score", "average"):
        parts = [p.domain for p in judge.parse_failures]
        return _failure_text(judge.pooled(parts))
    if isinstance(result, RMBenchResult):
        if figure.startswith("overall."):
            return ""
        domain = result.domain(figure.split(".", 1)[0])
        return _failure_text(judge.pooled(domain.parts)) if domain is not None else MISSING_CELL
    return _failure_text(judge.pooled((figure,)))


def judge_header(summary: JudgeSummary) -> str:
    """The header line of a judge's table: protocol(s) and the ``--protocol`` choice, compat
    and the readers it gave, the thinking switch when set, seed, calls, parse failures and
    calls cut at ``max_tokens``, and, for rmserve's own protocol, that it is not an official
    one."""
    plural = "s" if len(summary.protocols) > 1 else ""
    protocol = f"protocol{plural} {', '.join(summary.protocols) or 'none recorded'}"
    if summary.mode:
        chosen = "chosen by " if summary.mode == "auto" and summary.protocols else ""
        protocol += f" ({chosen}--protocol {summary.mode})"
    if summary.rmserve_protocols:
        own = ", ".join(summary.rmserve_protocols)
        protocol += f"; {own} is rmserve's own protocol for RM-Bench, not an official one"
    if summary.seeds:
        seed = f"seed{'s' if len(summary.seeds) > 1 else ''} {', '.join(map(str, summary.seeds))}"
    else:
        seed = "seed: none drawn (only the ranking protocol draws answer positions)"
    rate = f" ({100 * summary.n_failed / summary.n_calls:.1f}%)" if summary.n_calls else ""
    compat = f"compat {', '.join(summary.compat) or 'not recorded'}"
    if summary.readers:
        compat += f" (reader{'s' if len(summary.readers) > 1 else ''} {', '.join(summary.readers)})"
    if summary.thinking:
        compat += f"; thinking {', '.join(summary.thinking)}"
    return (
        f"Judge: {protocol}; {compat}; {seed}; "
        f"{summary.n_calls:,} calls, {summary.n_failed:,} without a verdict or rating{rate}, "
        f"{summary.n_truncated:,} cut at max_tokens (a cut call counts as a failure when nothing was read)."
    )


def judge_setup_line(setup: JudgeSetup | None) -> str:
    """The second header line of a judge's table: how it decoded (temperature, top_p,
    max_tokens) and what decoded (engine, version, batch invariance and why), as the score
    records state them; "not recorded" for what they do not state, and how many records state
    nothing."""
    sampling = setup.sampling if setup is not None else None
    engine = setup.engine if setup is not None else None
    if sampling is None:
        decoding = "sampling not recorded"
    else:
        decoding = (
            f"sampling temperature {sampling.temperature:g}, top_p {sampling.top_p:g}, "
            f"max_tokens {sampling.max_tokens:,}"
        )
    if engine is None:
        engine_text = "engine not recorded"
    else:
        invariance = {True: "batch-invariant", False: "not batch-invariant", None: "batch invariance unknown"}
        why = f" ({engine.batch_invariant_note})" if engine.batch_invariant_note else ""
        engine_text = (
            f"engine {engine.engine} {engine.version or '(version unknown)'}, {invariance[engine.batch_invariant]}{why}"
        )
    unknown = ""
    if setup is not None and setup.n_unrecorded and setup.known:
        unknown = f" ({setup.n_unrecorded:,} of {setup.n_records:,} records state no set-up: unknown)"
    return f"Judge set-up: {decoding}; {engine_text}{unknown}."


def _figure_label(figure: str) -> str:
    for header, name in RMBENCH_COLUMNS + RB2_COLUMNS:
        if name == figure:
            return header
    return figure


def _kind_text(kind: ScoreKind | None, protocols: Sequence[str] = ()) -> str:
    """The kind of score in words; a judge's names the protocols its records used (``protocols``)
    and the ``--protocol`` choice that picked them."""
    if kind is None:
        return "kind not recorded in the files"
    if kind.kind == JUDGE_KIND:
        return kind.describe(mode_word="--protocol", protocols=protocols)
    return kind.describe()


def render_comparison(comparison: Comparison) -> str:
    """Markdown table of a paired comparison: A, B, B − A (percentage points), its interval
    and whether the interval excludes 0."""
    level = round(100 * comparison.config.confidence)
    lines = [
        f"## {comparison.benchmark}: B − A over {comparison.n_groups} paired groups",
        "",
        f"A: {', '.join(comparison.files_a)} ({_kind_text(comparison.score_kind_a)})  ",
        f"B: {', '.join(comparison.files_b)} ({_kind_text(comparison.score_kind_b)})  ",
        f"Reward: {reward_text(comparison.reward)}."
        if comparison.reward_b is None
        else f"Reward: A {reward_text(comparison.reward)}; B {reward_text(comparison.reward_b)}.",
        "",
        *(f"Warning: {w}" for w in comparison.warnings),
        *([""] if comparison.warnings else []),
        *(f"Note: {n}" for n in comparison.notes),
        *([""] if comparison.notes else []),
        *_header(["Figure", "A (%)", "B (%)", "B − A (pp)", f"{level}% CI of B − A", "Excludes 0"]),
    ]
    for f in comparison.figures:
        lines.append(
            _row(
                [
                    _figure_label(f.figure),
                    _pct(f.a),
                    _pct(f.b),
                    _pct(f.difference, signed=True),
                    _span(f.interval, signed=True),
                    "yes" if f.excludes_zero else "no",
                ]
            )
        )
    lines += [
        "",
        f"Intervals: {level}% percentile bootstrap of B − A, {comparison.config.resamples} resamples "
        f"(same resampled groups for A and B), seed {comparison.config.seed}.",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["MISSING_CELL", "judge_header", "judge_setup_line", "render_comparison", "render_markdown", "reward_text"]


def _groups_cell(domain) -> str:
    """``441 (refuse 284, response 157)`` for a domain pooled from several parts; the count alone
    otherwise (one part present)."""
    if len(domain.parts) < 2:
        return str(domain.n_groups)
    short = ", ".join(f"{part.rsplit('-', 1)[-1]} {n}" for part, n in zip(domain.parts, domain.part_groups, strict=True))
    return f"{domain.n_groups} ({short})"
