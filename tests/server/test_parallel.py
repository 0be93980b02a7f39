"""Data parallel placement (one rank per group), per-request vLLM options and CPU binding lists.

The module under test imports no vLLM; the adapter's use of it on a fake ``AsyncLLM`` is in
``test_engine_requests.py``.
"""

from __future__ import annotations

import pytest
from rmserve.server.config import EngineConfig
from rmserve.server.engines.parallel import RankBalancer, request_options, split_cpus

from rmserve.errors import InvalidRequest, ServerFault


def test_one_rank_chooses_nothing():
    ranks = RankBalancer(1)
    with ranks.group(100) as rank:
        assert rank is None
    assert ranks.loads() == [0]


def test_equal_groups_go_round_robin_while_in_flight():
    ranks = RankBalancer(3)
    chosen = []
    with ranks.group(10) as a, ranks.group(10) as b, ranks.group(10) as c, ranks.group(10) as d:
        chosen = [a, b, c, d]
        assert ranks.loads() == [20, 10, 10]
    assert chosen == [0, 1, 2, 0]
    assert ranks.loads() == [0, 0, 0]


def test_sequential_groups_alternate_ranks():
    """Nothing in flight: ties are broken round robin, so both ranks get work."""
    ranks = RankBalancer(2)
    chosen = []
    for _ in range(4):
        with ranks.group(50) as rank:
            chosen.append(rank)
    assert chosen == [0, 1, 0, 1]


def test_a_rank_busy_with_a_long_group_gets_no_short_ones():
    ranks = RankBalancer(2)
    with ranks.group(3000) as long:
        with ranks.group(100) as s1, ranks.group(100) as s2, ranks.group(100) as s3:
            assert (long, s1, s2, s3) == (0, 1, 1, 1)
            assert ranks.loads() == [3000, 300]
        with ranks.group(100) as s4:
            assert s4 == 1
    assert ranks.loads() == [0, 0]


def test_a_failing_group_frees_its_rank():
    ranks = RankBalancer(2)
    with pytest.raises(RuntimeError):
        with ranks.group(70):
            raise RuntimeError("engine failed")
    assert ranks.loads() == [0, 0]


def test_balancer_refuses_bad_sizes():
    with pytest.raises(ValueError, match="data_parallel_size: 0 must be an integer ≥ 1"):
        RankBalancer(0)
    with pytest.raises(ValueError, match="tokens: -1 must be ≥ 0"):
        with RankBalancer(2).group(-1):
            pass


def test_priority_is_sent_only_under_the_priority_policy():
    fcfs = EngineConfig(model="m")
    priority = EngineConfig(model="m", scheduling_policy="priority")
    assert request_options(fcfs, 1, None) == {}
    assert request_options(fcfs, 0, 1) == {"data_parallel_rank": 1}
    assert request_options(priority, 1, None) == {"priority": 1}
    assert request_options(priority, 0, 0) == {"priority": 0, "data_parallel_rank": 0}
    with pytest.raises(InvalidRequest, match="priority: 'high' must be an integer"):
        request_options(priority, "high", None)  # type: ignore[arg-type]


def test_split_cpus_gives_one_list_per_rank():
    assert split_cpus([0, 1], 1) == "0,1"
    assert split_cpus([0, 1], 2) == "0|1"
    assert split_cpus([0, 1, 2, 3, 4], 2) == "0,1,2|3,4"
    assert split_cpus([4, 5, 6, 7], 4) == "4|5|6|7"
    with pytest.raises(ServerFault, match="2 ranks, but this process may use only 1 CPU"):
        split_cpus([0], 2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"data_parallel_size": 0}, ("data_parallel_size: 0 must be an integer ≥ 1",)),
        ({"data_parallel_size": 1.5}, ("data_parallel_size: 1.5",)),
        ({"scheduling_policy": "lifo"}, ("scheduling_policy: 'lifo' is not one of fcfs, priority",)),
        ({"data_parallel_size": 2, "cpu_threads_bind": "0-1"}, ("has 1 CPU lists", "= 2")),
        ({"cpu_threads_bind": "0|1"}, ("has 2 CPU lists", "= 1")),
        ({"cpu_threads_bind": "0||1"}, ("one list per rank joined by '|'",)),
    ],
)
def test_engine_config_refuses_bad_parallel_values(kwargs, words):
    with pytest.raises(ValueError) as info:
        EngineConfig(model="m", **kwargs)
    for word in words:
        assert word in str(info.value)


def test_engine_config_accepts_parallel_values():
    config = EngineConfig(
        model="m", data_parallel_size=2, tensor_parallel_size=2, scheduling_policy="priority",
        cpu_threads_bind="0|1|2|3",
    )
    assert (config.data_parallel_size, config.scheduling_policy) == (2, "priority")
    assert EngineConfig(model="m", data_parallel_size=2, cpu_threads_bind="nobind").cpu_threads_bind == "nobind"
