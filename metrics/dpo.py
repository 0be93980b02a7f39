"""DPO implicit rewards recomputed from a score file's per-response extras, without rescoring.

A DPO run (``rmserve serve --kind dpo``) stores, beside the reward it was asked for, the parts
every other DPO reward is built from (:attr:`rmserve.schema.ScoreRecord.extras`):
``policy_logp`` (sum of the policy's log-probs of the answer tokens, nats), ``ref_logp`` (the
same under the reference model; null when the run was reference-free), ``policy_logp_norm``
(L2 norm of the policy's per-token answer log-probs) and ``answer_tokens`` (their count).

Formulas (allenai/reward-bench ``rewardbench/dpo.py``: ``DPOInference.get_batch_logps`` for
the reference-free ``avg`` / ``sum`` / ``norm`` reductions of the per-token log-probs, and
``inference_step`` for the reward with a reference: the policy's summed log-probs minus the
reference's, with no β factor there either):

- ``avg``: ``policy_logp / answer_tokens`` (mean log-prob per answer token; the default of
  ``scripts/run_dpo.py --ref_free_type``);
- ``sum``: ``policy_logp``;
- ``norm``: ``-policy_logp_norm`` (minus the L2 norm of the per-token log-probs);
- ``reference``: ``policy_logp - ref_logp``.

Pure array functions: no I/O, no printing. NaN rules: a NaN part gives a NaN reward (a loss
in every comparison, as a missing reward); ``avg`` of a response with 0 answer tokens is NaN
(the official mean divides by the token count: 0/0). Direction: higher is better, as for
every reward.
"""

from __future__ import annotations

import numpy as np

DPO_REWARDS: tuple[str, ...] = ("avg", "sum", "norm", "reference")
"""The rewards :func:`dpo_rewards` computes, as ``--dpo-reward`` names them."""

DPO_EXTRAS_NEEDED: dict[str, tuple[str, ...]] = {
    "avg": ("policy_logp", "answer_tokens"),
    "sum": ("policy_logp",),
    "norm": ("policy_logp_norm",),
    "reference": ("policy_logp", "ref_logp"),
}
"""For each reward of :data:`DPO_REWARDS`, the extras it is computed from."""

DPO_REWARD_FORMULAS: dict[str, str] = {
    "avg": "policy_logp / answer_tokens",
    "sum": "policy_logp",
    "norm": "-policy_logp_norm",
    "reference": "policy_logp - ref_logp",
}
"""Each reward's formula in words, as reports print it."""


def dpo_rewards(reward: str, parts: dict[str, np.ndarray]) -> np.ndarray:
    """One DPO reward per response, computed from the extras of a score set.

    Args:
        reward: one of :data:`DPO_REWARDS`.
        parts: extras name → float64 array, every array of one shape (e.g. ``(n_groups, 6)``
            for RM-Bench, NaN-padded ``(n_groups, L)`` for RewardBench 2); must hold the names
            :data:`DPO_EXTRAS_NEEDED` lists for ``reward`` (others are ignored).

    Returns:
        A new float64 array of the same shape (formulas in the module docstring); NaN where a
        part is NaN, and for ``avg`` where ``answer_tokens`` is 0.

    Raises:
        ValueError: an unknown ``reward`` (lists the choices), a needed part missing (names it),
            or parts of different shapes (names both).
    """
    if reward not in DPO_EXTRAS_NEEDED:
        raise ValueError(f"dpo_reward must be one of {', '.join(DPO_REWARDS)}, got {reward!r}")
    needed = DPO_EXTRAS_NEEDED[reward]
    for name in needed:
        if name not in parts:
            raise ValueError(f"extras.{name}: needed for the DPO reward {reward!r} ({DPO_REWARD_FORMULAS[reward]})")
    arrays = {name: np.asarray(parts[name], dtype=np.float64) for name in needed}
    shape = arrays[needed[0]].shape
    for name, array in arrays.items():
        if array.shape != shape:
            raise ValueError(f"extras.{name}: shape {array.shape} differs from extras.{needed[0]}'s {shape}")
    if reward == "sum":
        return arrays["policy_logp"].copy()
    if reward == "norm":
        return -arrays["policy_logp_norm"]
    if reward == "reference":
        return arrays["policy_logp"] - arrays["ref_logp"]
    tokens = arrays["answer_tokens"]
    out = np.full(shape, np.nan)
    np.divide(arrays["policy_logp"], tokens, out=out, where=tokens != 0)
    return out
