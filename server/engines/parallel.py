"""Data parallel placement and request options of the vLLM engines, without importing vLLM.

:class:`RankBalancer` places each group on one data parallel rank; :func:`request_options`
builds the per-request keywords (``priority``, ``data_parallel_rank``) the adapter
(:mod:`rmserve.server.engines.vllm_engine`) passes to ``AsyncLLM``; :func:`split_cpus` cuts the CPUs of
the CPU build into one thread-binding list per rank.

With ``data_parallel_size`` > 1, vLLM starts one engine core per rank and, by default, places
each request on the least loaded core. Prefix caches are per core, so the sequences of one
group, placed one by one, would land on different cores and each core would compute the
shared prompt again. vLLM lets a request name its core (``data_parallel_rank``); the adapter
names the same one for every request of a group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from rmserve.server.config import EngineConfig

from rmserve.errors import InvalidRequest, ServerFault


class RankBalancer:
    """Chooses the data parallel rank of each group, so that a group is never scattered.

    vLLM's own balancer places each *request* on the least loaded rank, so the sequences of one
    group would land on different ranks and each rank would compute the shared prompt again
    (prefix caches are per rank). Here a whole group is placed at once: on the rank with the
    fewest prompt tokens of groups still in flight, ties broken round robin (the rank after the
    last one chosen first). Least-loaded rather than a hash of the request id or a plain round
    robin, because groups differ a lot in size (2 to 12 sequences, a few hundred to thousands
    of tokens): by tokens in flight, a rank busy with one long group gets the next short ones
    elsewhere. The choice depends only on the order of calls and their sizes (deterministic).

    Args:
        size: the number of ranks (``data_parallel_size``), ≥ 1.

    Raises:
        ValueError: ``size`` below 1.
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"data_parallel_size: {size!r} must be an integer ≥ 1")
        self.size = size
        self._load = [0] * size
        self._next = 0

    def loads(self) -> list[int]:
        """Prompt tokens in flight per rank (a copy)."""
        return list(self._load)

    @contextlib.contextmanager
    def group(self, tokens: int) -> Iterator[int | None]:
        """Hold a rank for one group of ``tokens`` prompt tokens while the block runs.

        Yields:
            The rank every request of the group must carry (``data_parallel_rank``), or None
            with one rank (nothing to choose; vLLM is then given no rank).

        Raises:
            ValueError: ``tokens`` negative.
        """
        if tokens < 0:
            raise ValueError(f"tokens: {tokens!r} must be ≥ 0")
        if self.size == 1:
            yield None
            return
        rank = min(range(self.size), key=lambda r: (self._load[r], (r - self._next) % self.size))
        self._next = (rank + 1) % self.size
        self._load[rank] += tokens
        try:
            yield rank
        finally:
            self._load[rank] -= tokens


def request_options(config: EngineConfig, priority: int, rank: int | None) -> dict[str, Any]:
    """The keyword arguments of one vLLM request (``encode``/``generate``) beyond prompt and params.

    ``priority`` is sent only under ``scheduling_policy="priority"``: vLLM's engine ignores it
    under ``fcfs`` (its first-come queue never reads it) and its API server refuses a non-zero
    one there. ``data_parallel_rank`` is sent only when a rank was chosen
    (:class:`RankBalancer`, ``data_parallel_size`` > 1).

    Raises:
        InvalidRequest: ``priority`` not an integer (field ``priority``).
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidRequest(f"priority: {priority!r} must be an integer", field="priority", value=priority)
    options: dict[str, Any] = {}
    if config.scheduling_policy == "priority":
        options["priority"] = priority
    if rank is not None:
        options["data_parallel_rank"] = rank
    return options


def split_cpus(cpus: Sequence[int], ranks: int) -> str:
    """``cpus`` cut into ``ranks`` contiguous lists of near-equal length (the first ones one
    longer when it does not divide), joined by ``|``: vLLM's CPU build reads one list per rank
    (data parallel × tensor parallel) from ``VLLM_CPU_OMP_THREADS_BIND``.

    Raises:
        ServerFault: fewer CPUs than ranks (each rank needs one of its own).
    """
    if ranks > len(cpus):
        raise ServerFault(
            f"data_parallel_size × tensor_parallel_size = {ranks} ranks, but this process may use only "
            f"{len(cpus)} CPU(s); each rank needs one"
        )
    size, extra = divmod(len(cpus), ranks)
    lists, start = [], 0
    for rank in range(ranks):
        end = start + size + (rank < extra)
        lists.append(",".join(str(cpu) for cpu in cpus[start:end]))
        start = end
    return "|".join(lists)
