"""The JSON form of an evaluation (``results.json``) and of a comparison.

Fractions at full precision, intervals as ``[low, high]``, NaN as ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rmserve.metrics.bootstrap import Interval
from rmserve.metrics.comparison import Comparison
from rmserve.metrics.dpo import DPO_REWARD_FORMULAS
from rmserve.metrics.evaluation import JUDGE_VERDICTS, RMSERVE_PROTOCOL_NOTE, Evaluation, JudgeReport, MetricsConfig
from rmserve.metrics.judge import ParseFailures
from rmserve.metrics.judge_setup import JudgeSetup
from rmserve.metrics.rewardbench2 import TIES, TIES_WEIGHTS
from rmserve.metrics.rmbench import RMBenchResult
from rmserve.metrics.scores import SCORED_REWARDS

from rmserve.schema import ScoreKind


def _pair(interval: Interval | None) -> list[float] | None:
    return None if interval is None else [interval.low, interval.high]


def _bootstrap_dict(config: MetricsConfig) -> dict[str, Any] | None:
    if config.resamples == 0:
        return None
    return {
        "resamples": config.resamples,
        "seed": config.seed,
        "confidence": config.confidence,
        "method": "percentile; groups resampled within each domain/subset (Ties: by prompt)",
    }


def _score_kind_dict(kind: ScoreKind | None) -> dict[str, Any] | None:
    if kind is None:
        return None
    return {"kind": kind.kind, "mode": kind.mode, "ref_model": kind.ref_model, "compat": kind.compat}


def _reward_dict(reward: str) -> dict[str, Any]:
    if reward in (SCORED_REWARDS, JUDGE_VERDICTS):
        return {"name": reward, "formula": None}
    if reward.startswith("extra:"):
        return {"name": reward, "formula": f"extras.{reward.removeprefix('extra:')}"}
    name = reward.removeprefix("dpo:")
    return {"name": reward, "formula": DPO_REWARD_FORMULAS[name]}


def _failures_dict(failures: ParseFailures | None) -> dict[str, Any] | None:
    if failures is None:
        return None
    return {
        "rate": failures.rate,
        "n_failed": failures.n_failed,
        "n_calls": failures.n_calls,
        "n_truncated": failures.n_truncated,
        "reasons": dict(failures.reasons),
    }


def _setup_dict(setup: JudgeSetup | None) -> dict[str, Any]:
    """``sampling`` and ``engine`` (null when the records do not state them) and
    ``n_unrecorded`` (records that state no set-up) of a judge's score set."""
    sampling = setup.sampling if setup is not None else None
    engine = setup.engine if setup is not None else None
    return {
        "sampling": None if sampling is None else {
            "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_tokens,
        },
        "engine": None if engine is None else {
            "engine": engine.engine, "version": engine.version, "batch_invariant": engine.batch_invariant,
            "batch_invariant_note": engine.batch_invariant_note,
        },
        "n_unrecorded": setup.n_unrecorded if setup is not None else None,
    }


def _judge_dict(judge: JudgeReport | None) -> dict[str, Any] | None:
    if judge is None:
        return None
    summary = judge.summary
    return {
        "mode": summary.mode,
        "protocols": list(summary.protocols),
        "compat": list(summary.compat),
        "readers": list(summary.readers),
        "thinking": list(summary.thinking),
        "seeds": list(summary.seeds),
        "n_groups": summary.n_groups,
        "n_judged": summary.n_judged,
        "n_unjudged": summary.n_unjudged,
        "n_calls": summary.n_calls,
        "n_failed": summary.n_failed,
        "parse_failure_rate": summary.n_failed / summary.n_calls if summary.n_calls else None,
        "n_truncated": summary.n_truncated,
        "rmserve_protocols": list(summary.rmserve_protocols),
        "protocol_note": RMSERVE_PROTOCOL_NOTE if summary.rmserve_protocols else None,
        **_setup_dict(judge.setup),
    }


def result_dict(evaluation: Evaluation) -> dict[str, Any]:
    """The JSON form of an evaluation: fractions at full precision, intervals as ``[low, high]``.

    Keys: ``benchmark``, ``files``, ``n_groups``, ``score_kind`` (``kind``, ``mode``,
    ``ref_model``, ``compat`` of the score records; null for official result files),
    ``reward`` (``name``: ``rewards``, ``dpo:<avg|sum|norm|reference>`` or ``extra:<name>``; ``formula``: the
    DPO formula or null; ``judge-verdicts`` for a generative judge), ``partial``, ``missing``,
    ``notes``, ``warnings``, ``bootstrap``, ``judge`` (null unless the records are a generative
    judge's: ``mode``, ``protocols``, ``compat``, ``readers`` (the readers that read the calls),
    ``thinking`` (the thinking switches set, empty when none), ``seeds``, ``n_calls``, ``n_failed``,
    ``parse_failure_rate``, ``n_truncated`` (calls cut at ``max_tokens``), ``n_unjudged``
    (groups the judge could not take), ``rmserve_protocols``, ``protocol_note``, ``sampling``
    (``temperature``, ``top_p``, ``max_tokens``), ``engine`` (``engine``, ``version``,
    ``batch_invariant``, ``batch_invariant_note``) — each null when the records do not state
    it — and ``n_unrecorded`` (records that state no sampling or engine); each
    domain / subset then also has ``parse_failures``: ``rate``, ``n_failed``, ``n_calls``,
    ``n_truncated``, ``reasons``) and,
    for RM-Bench, ``domains`` (score / hard / normal / easy / matrix / n_groups / n_nan_groups /
    parts / interval) and ``overall``; for RewardBench 2,
    ``subsets`` (score / n_groups / n_nan_groups / interval; Ties also its components) and
    ``average``.
    """
    result = evaluation.result
    iv = evaluation.intervals
    out: dict[str, Any] = {
        "benchmark": evaluation.benchmark,
        "files": list(evaluation.files),
        "n_groups": evaluation.n_groups,
        "score_kind": _score_kind_dict(evaluation.score_kind),
        "reward": _reward_dict(evaluation.reward),
        "partial": result.partial,
        "missing": list(result.missing),
        "notes": evaluation.notes(),
        "warnings": list(evaluation.warnings),
        "bootstrap": _bootstrap_dict(evaluation.config),
        "judge": _judge_dict(evaluation.judge),
    }
    judge = evaluation.judge
    if isinstance(result, RMBenchResult):
        figures = ("score", "hard", "normal", "easy")
        out["domains"] = {
            d.domain: {
                "score": d.score,
                "hard": d.hard,
                "normal": d.normal,
                "easy": d.easy,
                "matrix": [list(row) for row in d.matrix],
                "n_groups": d.n_groups,
                "n_nan_groups": d.n_nan_groups,
                "parts": list(d.parts),
                "part_groups": dict(zip(d.parts, d.part_groups, strict=True)),
                "interval": {f: _pair(iv.get(f"{d.domain}.{f}")) for f in figures} if iv else None,
                **({"parse_failures": _failures_dict(judge.pooled(d.parts))} if judge is not None else {}),
            }
            for d in result.domains
        }
        out["overall"] = {
            "score": result.score,
            "hard": result.hard,
            "normal": result.normal,
            "easy": result.easy,
            "domains": [d.domain for d in result.domains],
            "interval": {f: _pair(iv.get(f"overall.{f}")) for f in figures} if iv else None,
        }
        return out
    subsets: dict[str, Any] = {}
    for s in result.subsets:
        entry: dict[str, Any] = {
            "score": s.score,
            "n_groups": s.n_groups,
            "n_nan_groups": s.n_nan_groups,
            "interval": _pair(iv.get(s.subset)),
        }
        if judge is not None:
            entry["parse_failures"] = _failures_dict(judge.pooled((s.subset,)))
        if s.subset == TIES and result.ties is not None:
            ties = result.ties
            entry["components"] = {c: getattr(ties, c) for c in TIES_WEIGHTS}
            entry["component_intervals"] = {c: _pair(iv.get(f"{TIES}.{c}")) for c in TIES_WEIGHTS} if iv else None
            entry.update(n_ref=ties.n_ref, n_tied=ties.n_tied, n_prompts_paired=ties.n_prompts_paired)
        subsets[s.subset] = entry
    out["subsets"] = subsets
    out["average"] = {
        "score": result.average,
        "subsets": [s.subset for s in result.subsets],
        "interval": _pair(iv.get("average")),
    }
    return out


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    """The JSON form of a comparison: ``score_kind_a``/``score_kind_b`` and ``reward`` (as in
    :func:`result_dict`; also ``reward_b`` when B's differs from A's, e.g. a judge against a
    classifier), ``warnings`` and, per figure, ``a``, ``b``, ``difference`` (B − A),
    ``interval`` and ``excludes_zero``; fractions at full precision."""
    return {
        "benchmark": comparison.benchmark,
        "files_a": list(comparison.files_a),
        "files_b": list(comparison.files_b),
        "n_groups": comparison.n_groups,
        "score_kind_a": _score_kind_dict(comparison.score_kind_a),
        "score_kind_b": _score_kind_dict(comparison.score_kind_b),
        "reward": _reward_dict(comparison.reward),
        **({"reward_b": _reward_dict(comparison.reward_b)} if comparison.reward_b is not None else {}),
        "warnings": list(comparison.warnings),
        "notes": list(comparison.notes),
        "partial": comparison.partial,
        "bootstrap": _bootstrap_dict(comparison.config),
        "figures": {
            f.figure: {
                "a": f.a,
                "b": f.b,
                "difference": f.difference,
                "interval": _pair(f.interval),
                "excludes_zero": f.excludes_zero,
            }
            for f in comparison.figures
        },
    }


def to_json(data: Mapping[str, Any]) -> str:
    """Indented JSON text (NaN becomes ``null``)."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()


__all__ = ["comparison_dict", "result_dict", "to_json"]
