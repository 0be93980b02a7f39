"""Cross-group batches of the transformers engine (:mod:`rmserve.server.engines.batching`):
which waiting sequences share a forward pass, and what each group gets back. The expected
batches are worked out by hand in each test from the rule (oldest sequence first, then the
next shorter or longer one that adds the least padding, within the size, token and padding
limits); no torch."""

from __future__ import annotations

import asyncio

import pytest

from rmserve.errors import EngineError
from rmserve.server.engines.batching import CrossGroupBatcher, length_matched_batch


def test_the_oldest_sequence_takes_the_nearest_lengths():
    # sorted: 10 (1), 50 (4), 98 (2), 100 (0), 101 (5), 102 (3); the anchor is 100.
    # + 101: 2 x 101 = 202 padded, 1 padding (98 would add 2) → + 102: 3 x 102 = 306, 3 padding (98: 4)
    assert length_matched_batch([100, 10, 98, 102, 50, 101], max_batch_size=3) == [3, 5, 0]
    # then 98 (4 x 102 = 408 padded, 7 padding), 50 (510, 59: 11.6 %), 10 (612, 151: 24.7 %)
    assert length_matched_batch([100, 10, 98, 102, 50, 101], max_batch_size=8) == [3, 5, 0, 2, 4, 1]
    assert length_matched_batch([100, 10, 98, 102, 50, 101], max_batch_size=8, max_padding=0.2) == [3, 5, 0, 2, 4]


def test_a_batch_is_never_mostly_padding():
    assert length_matched_batch([100, 10], max_batch_size=8) == [0]  # 90 of 200 padded tokens
    assert length_matched_batch([100, 80], max_batch_size=8) == [0, 1]  # 20 of 200: 10 %
    assert length_matched_batch([100, 10], max_batch_size=8, max_padding=0.5) == [0, 1]  # 45 %


def test_the_token_budget_and_the_anchor_alone():
    assert length_matched_batch([10, 10, 10, 10], max_batch_size=8, max_batch_tokens=30) == [0, 1, 2]
    assert length_matched_batch([50, 2], max_batch_size=8, max_batch_tokens=20) == [0]  # over budget alone


def test_bad_limits_are_named():
    with pytest.raises(ValueError, match="at least one"):
        length_matched_batch([], max_batch_size=1)
    with pytest.raises(ValueError, match="max_batch_size"):
        length_matched_batch([3], max_batch_size=0)
    with pytest.raises(ValueError, match="max_padding"):
        length_matched_batch([3], max_batch_size=1, max_padding=1.0)


def _seq(length: int, first: int = 1) -> list[int]:
    return [first] + [1] * (length - 1)


class _Runs:
    """A fake forward pass: one value per sequence (its length x 10 + its first id), the batches
    it saw (as lengths per model), a failure for any sequence whose first id is -1."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []

    def __call__(self, model, sequences):
        self.batches.append((model, [len(s) for s in sequences]))
        if any(s[0] == -1 for s in sequences):
            raise ValueError("a bad sequence")
        return [10 * len(s) + s[0] for s in sequences]


def _batcher(runs: _Runs, size: int = 3) -> CrossGroupBatcher[int]:
    return CrossGroupBatcher(runs, max_batch_size=size,
                             error=lambda rid, exc: EngineError(f"forward pass failed for {rid}: {exc}"))


async def test_groups_in_flight_share_batches_by_length():
    runs = _Runs()
    batcher = _batcher(runs)
    a = batcher.submit("m", [_seq(5), _seq(50)], "a")
    b = batcher.submit("m", [_seq(48), _seq(6)], "b")
    c = batcher.submit("m", [_seq(51)], "c")
    got = [await asyncio.gather(*g) for g in (a, b, c)]
    # anchor 5 (a's first): + 6 (1 padding of 12); 48 would make 3 x 48 = 144 with 85 padding.
    # anchor 50: + 51 (1 of 102) then + 48 (4 of 153).
    assert runs.batches == [("m", [6, 5]), ("m", [51, 50, 48])]
    assert got == [[51, 501], [481, 61], [511]]
    await batcher.idle()


async def test_a_bad_sequence_fails_its_group_alone():
    runs = _Runs()
    batcher = _batcher(runs)
    good = batcher.submit("m", [_seq(20), _seq(21)], "good")
    bad = batcher.submit("m", [_seq(20, first=-1)], "bad")
    assert await asyncio.gather(*good) == [201, 211]
    with pytest.raises(EngineError, match="forward pass failed for bad: a bad sequence"):
        await bad[0]
    # the mixed batch failed, then each sequence ran alone
    assert runs.batches == [("m", [21, 20, 20]), ("m", [21]), ("m", [20]), ("m", [20])]


async def test_other_models_and_cancelled_groups():
    runs = _Runs()
    batcher = _batcher(runs)
    old = batcher.submit("old", [_seq(30)], "old")
    gone = batcher.submit("old", [_seq(31)], "gone")
    new = batcher.submit("new", [_seq(30)], "new")
    for future in gone:
        future.cancel()
    assert await asyncio.gather(*old, *new) == [301, 301]
    await batcher.idle()
    assert runs.batches == [("old", [30]), ("new", [30])]  # never mixed; the cancelled sequence never ran
