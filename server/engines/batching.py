"""Batch planning for engines that pad: which sequences share a forward pass (no torch needed)."""

from __future__ import annotations

from collections.abc import Sequence


def length_sorted_batches(lengths: Sequence[int], *, max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Pack sequence indices into right-padded batches, longest first.

    Indices are sorted by length, longest first (ties in input order), and cut greedily:
    a batch grows while ``rows × its longest length ≤ max_batch_tokens`` (the padded size
    of the batch, which bounds activation memory) and ``rows ≤ max_batch_size``. A single
    sequence longer than ``max_batch_tokens`` gets a batch of its own. Sorting keeps
    similar lengths together, so little of each batch is padding.

    Args:
        lengths: length of each sequence in tokens (≥ 1).
        max_batch_tokens: padded-token budget of one batch (≥ 1).
        max_batch_size: most sequences in one batch (≥ 1).

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.

    Raises:
        ValueError: a budget below 1.
    """
    if max_batch_tokens < 1 or max_batch_size < 1:
        raise ValueError(f"max_batch_tokens ({max_batch_tokens}) and max_batch_size ({max_batch_size}) must be ≥ 1")
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    batches: list[list[int]] = []
    current: list[int] = []
    for j in order:
        width = lengths[current[0]] if current else lengths[j]
        if current and (len(current) + 1 > max_batch_size or (len(current) + 1) * width > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(j)
    if current:
        batches.append(current)
    return batches
