"""Recent group results, so a group sent again is answered without engine work.

A client that loses a reply (killed, timed out, connection cut after the server finished)
sends the same group again when it resumes. The engine's output is a pure function of the
model and the token ids, so the server keeps the last ``max_groups`` results keyed by
(model fingerprint, token ids of every sequence of the group) and answers a repeat from
here: same rewards, same ``num_cached_tokens`` as the first answer. Such groups are counted
by ``rmserve_result_cache_hits_total``, not by ``rmserve_groups_total`` (engine work).

No torch, no vllm; used on the event loop only.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from rmserve.server.engines.protocol import SequenceScore


def group_key(fingerprint: str, token_ids: Sequence[Sequence[int]]) -> bytes:
    """A 32-byte digest of the fingerprint and every sequence's token ids (lengths included)."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(fingerprint.encode() + b"\0")
    for ids in token_ids:
        digest.update(len(ids).to_bytes(4, "little"))
        digest.update(array("q", ids).tobytes())
    return digest.digest()


class ResultCache:
    """Least-recently-used map from :func:`group_key` to a group's engine scores.

    Args:
        max_groups: groups kept (≥ 0; 0 turns the cache off). About 0.3 KiB per 6-response
            group, so the default of 100,000 groups stays near 30 MiB.

    Raises:
        ValueError: ``max_groups`` < 0.
    """

    def __init__(self, max_groups: int) -> None:
        if max_groups < 0:
            raise ValueError(f"max_groups: {max_groups} must be ≥ 0")
        self.max_groups = max_groups
        self._entries: OrderedDict[bytes, tuple[SequenceScore, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> list[SequenceScore] | None:
        """The stored scores for ``key`` (and mark them recently used), else None."""
        scores = self._entries.get(key)
        if scores is None:
            return None
        self._entries.move_to_end(key)
        return list(scores)

    def put(self, key: bytes, scores: Sequence[SequenceScore]) -> None:
        """Store ``scores`` under ``key``, evicting the least recently used beyond ``max_groups``."""
        if self.max_groups == 0:
            return
        self._entries[key] = tuple(scores)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_groups:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry (e.g. after a checkpoint swap: the old model's results are dead weight)."""
        self._entries.clear()
