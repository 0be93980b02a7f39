"""The DPO kind: a DPO policy scored by its implicit reward.

Scored exactly as a classifier (:mod:`rmserve.server.kinds.classifier`): the DPO engine's
renderer (:mod:`rmserve.server.render.dpo`) sets each sequence's answer start, which the
classifier's engine call passes to :meth:`~rmserve.server.engines.protocol.RewardEngine.score_group`
and its result-cache key includes; the engine answers one reward per sequence with the
log-probability sums as extras. What differs is the model: a causal LM (the policy) at start
and at a swap (:func:`rmserve.server.swaps.checkpoints.check_checkpoint` with kind ``dpo``).
"""

from __future__ import annotations

from rmserve.server.kinds.classifier import ClassifierKind

from rmserve.schema import DPO_KIND, ModelKind


class DPOKind(ClassifierKind):
    """The :class:`~rmserve.server.kinds.base.RewardKind` of a DPO policy (see the module docstring)."""

    name: ModelKind = DPO_KIND
