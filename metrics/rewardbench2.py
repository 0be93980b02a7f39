"""RewardBench 2 scores: best-of-n credit per subset and the weighted Ties score.

Pure array functions (no I/O, no printing). Groups arrive as a padded ``(n, L)`` float array
of rewards with a ``(n,)`` length per row (positions ``>= length`` are ignored whatever they
hold), a ``(n,)`` ``num_correct`` (how many leading completions are correct), subset labels
and ids. Direction: higher is better; every score is a fraction (Ties can reach 1.01).

Non-Ties subsets (allenai/reward-bench ``rewardbench/utils.py`` ``reroll_and_score_dataset``):
a group's credit is ``1/k`` when the chosen completion (index 0) is among the ``k``
completions tied at the maximum reward, else 0; a group with any NaN reward gets 0 (counted in
``n_nan_groups``). Subset score = mean credit. Only one correct completion per group.

Ties (same file, ``process_single_model`` and ``_compute_prompt_stats``): rows ``ref:N`` (one
correct answer) and ``tied:N`` (several) share prompt ``N``. Per row, correct = first
``num_correct`` rewards, incorrect = the rest; accurate = min(correct) > max(incorrect);
spread = max(correct) − min(correct); margin = min(correct) − max(incorrect).
ref_accuracy / tied_accuracy = mean ``accurate`` over all ref / tied rows (0 when there are
none, as upstream). Over prompts with both rows: correctness_preferred =
mean(margin_tied > spread_tied); correctness_preferred_hard = mean(min(margin_ref,
margin_tied) > spread_tied); correctness_margin_score = mean(tanh(min(margin_ref,
margin_tied) / spread_tied − 1)) with NaN → 0 (x/0 gives ±inf, tanh → ±1; 0/0 gives NaN → 0).
Ties = 0.30·tied_accuracy + 0.30·ref_accuracy + 0.20·preferred + 0.20·preferred_hard +
0.01·margin_score. A tied row with a single correct answer has spread 0 (upstream leaves it
undefined). NaN rewards make every comparison false (not accurate, not preferred) and the
margin term 0. With no prompt holding both rows the three pair terms and the score are NaN.

Average = unweighted mean of the subset scores present; ``partial`` names absent subsets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rmserve.schema import RB2_SUBSETS

TIES = "Ties"
"""The subset scored with the weighted Ties formula."""

TIES_WEIGHTS: dict[str, float] = {
    "tied_accuracy": 0.30,
    "ref_accuracy": 0.30,
    "correctness_preferred": 0.20,
    "correctness_preferred_hard": 0.20,
    "correctness_margin_score": 0.01,
}
"""Weights of the Ties score (upstream ``process_single_model``)."""

@dataclass(frozen=True)
class SubsetScore:
    """Score of one RewardBench 2 subset.

    Attributes:
        subset: subset name (:data:`rmserve.schema.RB2_SUBSETS`).
        score: mean credit (non-Ties) or the weighted Ties score, a fraction.
        n_groups: groups (rows) scored.
        n_nan_groups: groups with at least one NaN reward (credited 0 / never accurate).
    """

    subset: str
    score: float
    n_groups: int
    n_nan_groups: int


@dataclass(frozen=True)
class TiesScore:
    """The Ties subset and its components (see module docstring).

    Attributes:
        score: weighted Ties score.
        ref_accuracy, tied_accuracy: share of accurate ref / tied rows.
        correctness_preferred, correctness_preferred_hard, correctness_margin_score: means over
            the prompts that have both a ref and a tied row (NaN when there is none).
        n_ref, n_tied: rows of each kind.
        n_prompts_paired: prompts having both rows.
        n_nan_groups: rows with at least one NaN reward.
    """

    score: float
    ref_accuracy: float
    tied_accuracy: float
    correctness_preferred: float
    correctness_preferred_hard: float
    correctness_margin_score: float
    n_ref: int
    n_tied: int
    n_prompts_paired: int
    n_nan_groups: int


@dataclass(frozen=True)
class RB2Result:
    """RewardBench 2 scores for a set of groups.

    Attributes:
        subsets: subsets that have groups, in leaderboard order.
        ties: Ties components when the Ties subset is present, else None.
        average: unweighted mean of ``subsets`` scores.
        missing: subsets with no group.
        partial: True when ``missing`` is non-empty (the average covers the present subsets).
    """

    subsets: tuple[SubsetScore, ...]
    ties: TiesScore | None
    average: float
    missing: tuple[str, ...]
    partial: bool

    def subset(self, name: str) -> SubsetScore | None:
        """The score of subset ``name``, or None when it has no groups."""
        for s in self.subsets:
            if s.subset == name:
                return s
        return None


@dataclass(frozen=True, eq=False)
class TiesPrompts:
    """Per-prompt Ties table, prompts sorted ascending (arrays read-only).

    Attributes:
        prompts: ``(P,)`` prompt numbers.
        has_ref, has_tied: ``(P,)`` bool, whether the prompt has that row.
        ref_accurate, tied_accurate: ``(P,)`` float 0/1 (0 where the row is absent).
        preferred, preferred_hard, margin_score: ``(P,)`` float per paired prompt (0 where
            not paired).
        paired: ``(P,)`` bool, ``has_ref & has_tied``.
    """

    prompts: np.ndarray
    has_ref: np.ndarray
    has_tied: np.ndarray
    ref_accurate: np.ndarray
    tied_accurate: np.ndarray
    preferred: np.ndarray
    preferred_hard: np.ndarray
    margin_score: np.ndarray
    paired: np.ndarray

    def unit_values(self) -> np.ndarray:
        """``(P, 8)`` per-prompt sums whose column totals give every Ties component.

        Columns: has_ref, ref accurate, has_tied, tied accurate, paired, preferred,
        preferred_hard, margin_score (each masked by its row's presence). Bootstrap draws
        are ``counts @ unit_values()`` followed by :func:`ties_from_sums`.
        """
        return np.stack(
            [
                self.has_ref,
                self.ref_accurate,
                self.has_tied,
                self.tied_accurate,
                self.paired,
                self.preferred,
                self.preferred_hard,
                self.margin_score,
            ],
            axis=1,
        ).astype(np.float64)


def check_groups(scores: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate padded rewards; return (scores float64, lengths int64, valid mask ``(n, L)``).

    Raises:
        ValueError: scores not 2-D, lengths not ``(n,)``, or a length outside ``[1, L]``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    lengths = np.asarray(lengths)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D (n_groups, max_completions), got shape {scores.shape}")
    if lengths.shape != (scores.shape[0],):
        raise ValueError(f"lengths must have shape ({scores.shape[0]},), got {lengths.shape}")
    lengths = lengths.astype(np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > scores.shape[1]):
        raise ValueError(f"lengths must lie in [1, {scores.shape[1]}]")
    valid = np.arange(scores.shape[1]) < lengths[:, None]
    return scores, lengths, valid


def best_of_n_credit(scores: np.ndarray, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-group credit of the chosen completion (index 0) under the best-of-n rule.

    Args:
        scores: ``(n, L)`` rewards; completion 0 is the chosen one.
        lengths: ``(n,)`` completions per row (default: all ``L``).

    Returns:
        ``(credit, has_nan)``: ``(n,)`` float64 credit ``1/k`` when completion 0 is among the
        ``k`` completions tied at the row maximum else 0 (0 when the row holds a NaN), and the
        ``(n,)`` bool NaN flag.

    Source: allenai/reward-bench ``rewardbench/utils.py`` ``reroll_and_score_dataset``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if lengths is None:
        if scores.ndim != 2:
            raise ValueError(f"scores must be 2-D (n_groups, completions), got shape {scores.shape}")
        lengths = np.full(scores.shape[0], scores.shape[1])
    scores, lengths, valid = check_groups(scores, lengths)
    has_nan = (np.isnan(scores) & valid).any(axis=1)
    credit = np.zeros(scores.shape[0], dtype=np.float64)
    if scores.shape[0] == 0:
        return credit, has_nan
    masked = np.where(valid, scores, -np.inf)
    at_top = (masked == masked.max(axis=1, keepdims=True)) & valid
    win = at_top[:, 0] & ~has_nan
    credit[win] = 1.0 / at_top[win].sum(axis=1)
    return credit, has_nan


def parse_ties_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split Ties ids ``ref:N`` / ``tied:N`` into (is_tied ``(n,)`` bool, prompt ``(n,)`` int64).

    Raises:
        ValueError: an id not of that form (the first few are listed).
    """
    ids = np.asarray(ids, dtype=str).reshape(-1)
    parts = np.char.partition(ids, ":").reshape(-1, 3)
    kind, sep, number = parts[:, 0], parts[:, 1], parts[:, 2]
    ascii_digits = (np.char.str_len(number) > 0) & (np.char.strip(number, "0123456789") == "")
    ok = (sep == ":") & np.isin(kind, ["ref", "tied"]) & ascii_digits
    if not ok.all():
        raise ValueError(f"Ties ids must be 'ref:<n>' or 'tied:<n>', got {ids[~ok][:3].tolist()}")
    prompts = number.astype(np.int64) if ids.size else np.zeros(0, dtype=np.int64)
    return kind == "tied", prompts


def ties_row_stats(
    scores: np.ndarray, lengths: np.ndarray, num_correct: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-row Ties statistics.

    Args:
        scores: ``(n, L)`` padded rewards; lengths ``(n,)``; num_correct ``(n,)`` with
            ``1 <= num_correct < length``.

    Returns:
        ``(accurate bool, spread float, margin float, has_nan bool)``, each ``(n,)``:
        accurate = min(correct) > max(incorrect); spread = max(correct) − min(correct);
        margin = min(correct) − max(incorrect). NaN rewards propagate into spread / margin.

    Raises:
        ValueError: num_correct outside ``[1, length − 1]``.

    Source: allenai/reward-bench ``rewardbench/utils.py`` ``_compute_prompt_stats``.
    """
    scores, lengths, valid = check_groups(scores, lengths)
    num_correct = np.asarray(num_correct).astype(np.int64)
    if num_correct.shape != lengths.shape or (num_correct < 1).any() or (num_correct >= lengths).any():
        raise ValueError("num_correct must be (n,) with 1 <= num_correct < number of completions")
    position = np.arange(scores.shape[1])
    correct = position < num_correct[:, None]
    incorrect = valid & ~correct
    has_nan = (np.isnan(scores) & valid).any(axis=1)
    # np.min / np.max propagate NaN, so a NaN anywhere in a part makes that extreme NaN.
    min_correct = np.where(correct, scores, np.inf).min(axis=1)
    max_correct = np.where(correct, scores, -np.inf).max(axis=1)
    max_incorrect = np.where(incorrect, scores, -np.inf).max(axis=1)
    with np.errstate(invalid="ignore"):
        margin = min_correct - max_incorrect
        spread = max_correct - min_correct
        accurate = min_correct > max_incorrect
    return accurate, spread, margin, has_nan


def ties_prompts(
    scores: np.ndarray, lengths: np.ndarray, num_correct: np.ndarray, ids: np.ndarray
) -> tuple[TiesPrompts, int]:
    """Pair Ties rows by prompt and compute each prompt's components.

    Args:
        scores, lengths, num_correct: as :func:`ties_row_stats`.
        ids: ``(n,)`` ``ref:N`` / ``tied:N`` ids.

    Returns:
        ``(table, n_nan_rows)``: the :class:`TiesPrompts` table and the count of rows with NaN.

    Raises:
        ValueError: malformed ids, two rows with the same id, or bad num_correct.
    """
    is_tied, prompt = parse_ties_ids(ids)
    if prompt.size == 0:
        raise ValueError("no Ties rows")
    accurate, spread, margin, has_nan = ties_row_stats(scores, lengths, num_correct)
    prompts, inverse = np.unique(prompt, return_inverse=True)
    n_prompts = prompts.size
    row_of = {}
    for name, mask in (("ref", ~is_tied), ("tied", is_tied)):
        counts = np.bincount(inverse[mask], minlength=n_prompts)
        if (counts > 1).any():
            dup = prompts[counts > 1][:3].tolist()
            raise ValueError(f"Ties prompt(s) {dup} have more than one {name!r} row")
        index = np.full(n_prompts, -1, dtype=np.int64)
        index[inverse[mask]] = np.flatnonzero(mask)
        row_of[name] = index
    has_ref = row_of["ref"] >= 0
    has_tied = row_of["tied"] >= 0
    paired = has_ref & has_tied
    ref_row = np.where(has_ref, row_of["ref"], 0)
    tied_row = np.where(has_tied, row_of["tied"], 0)
    ref_accurate = np.where(has_ref, accurate[ref_row], False)
    tied_accurate = np.where(has_tied, accurate[tied_row], False)
    tied_spread = spread[tied_row]
    tied_margin = margin[tied_row]
    with np.errstate(invalid="ignore", divide="ignore"):
        worst_margin = np.minimum(margin[ref_row], tied_margin)
        preferred = np.where(paired, tied_margin > tied_spread, False)
        preferred_hard = np.where(paired, worst_margin > tied_spread, False)
        margin_score = np.nan_to_num(np.tanh(worst_margin / tied_spread - 1.0), nan=0.0)
    margin_score = np.where(paired, margin_score, 0.0)
    table = TiesPrompts(
        prompts=prompts,
        has_ref=has_ref,
        has_tied=has_tied,
        ref_accurate=ref_accurate.astype(np.float64),
        tied_accurate=tied_accurate.astype(np.float64),
        preferred=preferred.astype(np.float64),
        preferred_hard=preferred_hard.astype(np.float64),
        margin_score=margin_score.astype(np.float64),
        paired=paired,
    )
    for value in vars(table).values():
        value.flags.writeable = False
    return table, int(has_nan.sum())


def ties_from_sums(sums: np.ndarray) -> dict[str, np.ndarray]:
    """Ties components and score from column totals of :meth:`TiesPrompts.unit_values`.

    Args:
        sums: ``(..., 8)`` totals (one row per bootstrap draw, or a single row).

    Returns:
        Dict of ``(...)`` arrays: ``score`` and the five components named as in
        :data:`TIES_WEIGHTS`. ref/tied accuracy are 0 when there are no such rows (as
        upstream); pair terms are NaN when no prompt is paired.
    """
    sums = np.asarray(sums, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref_accuracy = np.where(sums[..., 0] > 0, sums[..., 1] / sums[..., 0], 0.0)
        tied_accuracy = np.where(sums[..., 2] > 0, sums[..., 3] / sums[..., 2], 0.0)
        paired = np.where(sums[..., 4] > 0, sums[..., 4], np.nan)
        out = {
            "tied_accuracy": tied_accuracy,
            "ref_accuracy": ref_accuracy,
            "correctness_preferred": sums[..., 5] / paired,
            "correctness_preferred_hard": sums[..., 6] / paired,
            "correctness_margin_score": sums[..., 7] / paired,
        }
    out["score"] = sum(weight * out[name] for name, weight in TIES_WEIGHTS.items())
    return out


def ties_score(scores: np.ndarray, lengths: np.ndarray, num_correct: np.ndarray, ids: np.ndarray) -> TiesScore:
    """The weighted Ties score of ``n`` Ties rows (formula in the module docstring).

    Args:
        scores: ``(n, L)`` padded rewards; lengths ``(n,)``; num_correct ``(n,)``;
            ids ``(n,)`` ``ref:N`` / ``tied:N``.

    Raises:
        ValueError: malformed ids or num_correct, duplicate rows.

    Source: allenai/reward-bench ``rewardbench/utils.py`` ``process_single_model``.
    """
    table, n_nan = ties_prompts(scores, lengths, num_correct, ids)
    parts = ties_from_sums(table.unit_values().sum(axis=0))
    return TiesScore(
        score=float(parts["score"]),
        ref_accuracy=float(parts["ref_accuracy"]),
        tied_accuracy=float(parts["tied_accuracy"]),
        correctness_preferred=float(parts["correctness_preferred"]),
        correctness_preferred_hard=float(parts["correctness_preferred_hard"]),
        correctness_margin_score=float(parts["correctness_margin_score"]),
        n_ref=int(table.has_ref.sum()),
        n_tied=int(table.has_tied.sum()),
        n_prompts_paired=int(table.paired.sum()),
        n_nan_groups=n_nan,
    )


def check_subsets(subsets: np.ndarray, n: int) -> np.ndarray:
    """Validate ``(n,)`` subset labels; raises ValueError naming unknown subsets."""
    subsets = np.asarray(subsets)
    if subsets.shape != (n,):
        raise ValueError(f"subsets must have shape ({n},), got {subsets.shape}")
    unknown = ~np.isin(subsets, RB2_SUBSETS)
    if unknown.any():
        raise ValueError(
            f"unknown RewardBench 2 subset(s) {sorted({str(s) for s in subsets[unknown]})[:5]}; "
            f"expected one of {list(RB2_SUBSETS)}"
        )
    return subsets


def rewardbench2_scores(
    scores: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    subsets: np.ndarray,
    ids: np.ndarray,
) -> RB2Result:
    """RewardBench 2 subset scores and their average.

    Args:
        scores: ``(n, L)`` padded rewards, correct completions first.
        lengths: ``(n,)`` completions per row.
        num_correct: ``(n,)`` correct completions per row (exactly 1 outside Ties).
        subsets: ``(n,)`` labels from :data:`rmserve.schema.RB2_SUBSETS`.
        ids: ``(n,)`` ids (only Ties ids are parsed: ``ref:N`` / ``tied:N``).

    Returns:
        :class:`RB2Result`.

    Raises:
        ValueError: bad shapes, an unknown subset, ``num_correct != 1`` outside Ties, zero
            groups, or malformed Ties rows.

    Source: allenai/reward-bench ``rewardbench/utils.py`` (``reroll_and_score_dataset``,
    ``process_single_model``); average as ``scripts/run_v2.py`` (mean of the six subsets).
    """
    scores, lengths, _ = check_groups(scores, lengths)
    n = scores.shape[0]
    if n == 0:
        raise ValueError("scores holds no groups")
    subsets = check_subsets(subsets, n)
    num_correct = np.asarray(num_correct).astype(np.int64)
    ids = np.asarray(ids)
    if num_correct.shape != (n,) or ids.shape != (n,):
        raise ValueError(f"num_correct and ids must have shape ({n},)")
    is_ties = subsets == TIES
    if (num_correct[~is_ties] != 1).any():
        raise ValueError("num_correct must be 1 outside the Ties subset")
    credit, has_nan = best_of_n_credit(scores, lengths)
    ties = None
    if is_ties.any():
        ties = ties_score(scores[is_ties], lengths[is_ties], num_correct[is_ties], ids[is_ties])
    return rb2_from_parts(credit, has_nan, subsets, ties)


def subset_strata(
    subsets: np.ndarray, credit: np.ndarray, ties_units: Callable[[np.ndarray], np.ndarray]
) -> tuple[list[str], list[np.ndarray]]:
    """Bootstrap strata by subset: per subset of :data:`rmserve.schema.RB2_SUBSETS` present in
    ``subsets`` (``(n,)``), in leaderboard order, its name and per-unit values: the ``(n_s, 1)``
    rows of ``credit`` (``(n,)``), or for Ties ``ties_units(mask)`` (the per-prompt table of
    the Ties rows, ``mask`` the ``(n,)`` bool rows of the subset)."""
    names, strata = [], []
    for name in RB2_SUBSETS:
        mask = subsets == name
        if not mask.any():
            continue
        names.append(name)
        strata.append(ties_units(mask) if name == TIES else credit[mask][:, None])
    return names, strata


def rb2_from_parts(credit: np.ndarray, has_nan: np.ndarray, subsets: np.ndarray, ties: TiesScore | None) -> RB2Result:
    """RewardBench 2 result from per-group credits and the Ties score: the assembly shared by
    every kind of score (rewards, judge verdicts).

    Args:
        credit: ``(n,)`` per-group credit in [0, 1]; read on non-Ties rows only (a subset
            scores the mean of its rows).
        has_nan: ``(n,)`` bool, the group could not be scored (counted in ``n_nan_groups``;
            its credit must already be 0); read on non-Ties rows only.
        subsets: ``(n,)`` labels from :data:`rmserve.schema.RB2_SUBSETS`.
        ties: the Ties score of the Ties rows (:func:`ties_score`), None exactly when no row
            is a Ties row.

    Returns:
        :class:`RB2Result`; average = unweighted mean of the subsets present.

    Raises:
        ValueError: zero groups, bad shapes or an unknown subset, or ``ties`` given without
            Ties rows (or missing with them).

    Source: allenai/reward-bench ``scripts/run_v2.py`` (per-subset means, the average of the
    subsets) and ``rewardbench/utils.py`` ``process_single_model`` (Ties).
    """
    credit = np.asarray(credit, dtype=np.float64)
    has_nan = np.asarray(has_nan, dtype=bool)
    n = credit.shape[0] if credit.ndim == 1 else -1
    if n <= 0:
        raise ValueError(f"credit must be a non-empty 1-D array (n_groups,), got shape {credit.shape}")
    if has_nan.shape != (n,):
        raise ValueError(f"has_nan must have shape ({n},), got {has_nan.shape}")
    subsets = check_subsets(subsets, n)
    n_ties = int((subsets == TIES).sum())
    if (ties is None) != (n_ties == 0):
        raise ValueError(f"ties must be given exactly when there are Ties rows ({n_ties} here)")
    results: list[SubsetScore] = []
    for name in RB2_SUBSETS:
        mask = subsets == name
        count = int(mask.sum())
        if count == 0:
            continue
        if name == TIES:
            assert ties is not None
            results.append(SubsetScore(name, ties.score, count, ties.n_nan_groups))
        else:
            results.append(SubsetScore(name, float(credit[mask].mean()), count, int(has_nan[mask].sum())))
    present = {s.subset for s in results}
    missing = tuple(s for s in RB2_SUBSETS if s not in present)
    return RB2Result(
        subsets=tuple(results),
        ties=ties,
        average=float(np.mean([s.score for s in results])),
        missing=missing,
        partial=bool(missing),
    )
