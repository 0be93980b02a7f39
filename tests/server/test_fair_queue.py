"""The fair queue: deficit-round-robin order, priorities, cancellation, the snapshot, and its
place in the scoring path (a group is never split; one engine call per turn)."""

from __future__ import annotations

import asyncio

import pytest
from rmserve.server.sharing.fair_queue import TRAINER_PRIORITY, FairQueue, parse_priority
from rmserve.server.sharing.users import User

from rmserve.errors import InvalidRequest

A = User("A", weight=1.0)
B = User("B", weight=2.0)
B1 = User("B", weight=1.0)
Z = User("Z")


class Harness:
    """Runs groups through a queue of concurrency 1 and records the order they get their turn.

    A blocker group of user Z holds the only slot while the test enqueues; releasing it lets
    the queue serve the others one at a time, each finishing as soon as it has its turn.
    """

    def __init__(self, queue: FairQueue) -> None:
        self.queue = queue
        self.order: list[str] = []
        self.release = asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    async def _blocker(self) -> None:
        async with self.queue.turn(Z, 0):
            await self.release.wait()

    async def _group(self, user: User, label: str, cost: int, priority: str) -> None:
        async with self.queue.turn(user, cost, priority):
            self.order.append(label)

    async def start(self) -> None:
        self.tasks.append(asyncio.create_task(self._blocker()))
        await asyncio.sleep(0)

    async def add(self, user: User, label: str, cost: int, priority: str = "batch") -> None:
        self.tasks.append(asyncio.create_task(self._group(user, label, cost, priority)))
        await asyncio.sleep(0)  # enqueued in this order

    async def run(self) -> list[str]:
        self.release.set()
        await asyncio.gather(*self.tasks)
        return self.order


async def test_weighted_drr_serves_weight_2_twice_as_many_equal_groups():
    # quantum 100; A weight 1, B weight 2; every group costs 100 tokens.
    # Ring [A, B]. A: +100 → a1. B: +200 → b1, b2. A: +100 → a2. B: +200 → b3, b4 (B empty).
    # A: +100 → a3; A alone: +100 → a4.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100))
    await h.start()
    for i in range(1, 5):
        await h.add(A, f"a{i}", 100)
    for i in range(1, 5):
        await h.add(B, f"b{i}", 100)
    assert await h.run() == ["a1", "b1", "b2", "a2", "b3", "b4", "a3", "a4"]


async def test_drr_charges_tokens_not_groups():
    # quantum 100, equal weights. A: a1 costs 250, a2 50; B: three groups of 100.
    # A: 100 < 250 → next. B: 100 → b1. A: 200 < 250 → next. B: 100 → b2.
    # A: 300 → a1 (50 left) → a2 (0; A empty). B: 100 → b3.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100))
    await h.start()
    await h.add(A, "a1", 250)
    await h.add(A, "a2", 50)
    for i in range(1, 4):
        await h.add(B1, f"b{i}", 100)
    assert await h.run() == ["b1", "b2", "a1", "a2", "b3"]


async def test_costs_far_above_the_quantum_keep_the_round_robin_order():
    # quantum 1, equal weights. A: a1 costs 1,000,000; B: b1 999,999 and b2 1.
    # After k rounds both have k. Round 999,999: A (999,999) < a1, B → b1 (B 0).
    # Next: B 0 < 1 → A +1 → a1 (A empty). B +1 → b2. (The queue credits the rounds that
    # serve nobody at once; the order is plain deficit round robin's.)
    h = Harness(FairQueue(concurrency=1, quantum_tokens=1))
    await h.start()
    await h.add(A, "a1", 1_000_000)
    await h.add(B1, "b1", 999_999)
    await h.add(B1, "b2", 1)
    assert await h.run() == ["b1", "a1", "b2"]


async def test_rounds_skipped_at_once_respect_the_weights():
    # quantum 7; A weight 1 (+7 a round), B weight 2 (+14). A: a1 costs 600; B: b1 1000, b2 500.
    # B reaches 1000 in round ⌈1000/14⌉ = 72 → b1 (B keeps 8; A has 504 then).
    # A reaches 600 in round ⌈600/7⌉ = 86 → a1; B has 8 + 14×13 = 190 < 500 then.
    # B reaches 500 in round 72 + ⌈492/14⌉ = 108 → b2.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=7))
    await h.start()
    await h.add(A, "a1", 600)
    await h.add(B, "b1", 1000)
    await h.add(B, "b2", 500)
    assert await h.run() == ["b1", "a1", "b2"]


async def test_one_user_with_big_groups_gets_no_more_tokens_than_one_with_small_groups():
    # quantum 300, equal weights. A sends groups of 300, B groups of 100.
    # Each visit: A +300 → one group; B +300 → three groups. Equal tokens per round.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=300))
    await h.start()
    for i in range(1, 3):
        await h.add(A, f"a{i}", 300)
    for i in range(1, 7):
        await h.add(B1, f"b{i}", 100)
    assert await h.run() == ["a1", "b1", "b2", "b3", "a2", "b4", "b5", "b6"]


async def test_interactive_goes_first_within_a_user_but_not_across_users():
    # quantum 100, equal weights, costs 100. A: a1 batch, a2 batch, a3 interactive; B: b1 batch.
    # A's own order: a3, a1, a2. Ring [A, B]: a3, b1, a1, a2.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100))
    await h.start()
    await h.add(A, "a1", 100)
    await h.add(A, "a2", 100)
    await h.add(A, "a3", 100, "interactive")
    await h.add(B1, "b1", 100)
    assert await h.run() == ["a3", "b1", "a1", "a2"]


async def test_interactive_boost_multiplies_the_quantum_of_an_interactive_head():
    # quantum 100, boost 2, equal weights, costs 100. A: four batch groups; B: b1, b2
    # interactive, b3 batch. Ring [A, B]. A: +100 → a1. B (head interactive): +200 → b1, b2.
    # A: +100 → a2. B (head batch): +100 → b3 (B empty). A: a3, a4.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100, interactive_boost=2.0))
    await h.start()
    for i in range(1, 5):
        await h.add(A, f"a{i}", 100)
    await h.add(B1, "b1", 100, "interactive")
    await h.add(B1, "b2", 100, "interactive")
    await h.add(B1, "b3", 100)
    assert await h.run() == ["a1", "b1", "b2", "a2", "b3", "a3", "a4"]


EVAL = User("eval", weight=1.0)
TRAINER = User("trainer", weight=1.0)
TRAINER3 = User("trainer", weight=3.0)


async def test_a_training_step_is_not_behind_an_evals_queued_work():
    # quantum 100, boost 2 (the server's default), costs 100. The eval (interactive, as
    # `rmserve eval` sends) has six groups queued when the trainer's two arrive.
    # Trainer without a header on a trainer route: interactive. Ring [eval, trainer].
    # eval +200 → e1, e2; trainer +200 → t1, t2 (trainer done); eval → e3 … e6.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100, interactive_boost=2.0))
    await h.start()
    for i in range(1, 7):
        await h.add(EVAL, f"e{i}", 100, "interactive")
    for i in range(1, 3):
        await h.add(TRAINER, f"t{i}", 100, TRAINER_PRIORITY)
    assert await h.run() == ["e1", "e2", "t1", "t2", "e3", "e4", "e5", "e6"]

    # What the old default (batch) gave the same step: eval +200 → e1, e2; trainer +100 → t1;
    # eval +200 → e3, e4; trainer +100 → t2: the step ends after four eval groups, not two.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100, interactive_boost=2.0))
    await h.start()
    for i in range(1, 7):
        await h.add(EVAL, f"e{i}", 100, "interactive")
    for i in range(1, 3):
        await h.add(TRAINER, f"t{i}", 100, "batch")
    assert await h.run() == ["e1", "e2", "t1", "e3", "e4", "t2", "e5", "e6"]


async def test_weights_set_the_share_between_training_and_an_eval():
    # quantum 100, boost 2, costs 100; trainer weight 3, eval weight 1, both interactive.
    # Ring [eval, trainer]. eval +200 → e1, e2; trainer +600 → t1 … t6; eval +200 → e3, e4;
    # trainer +600 → t7, t8 (done); eval alone → e5 … e8. Three trainer groups per eval group
    # while both wait, and the eval is never shut out.
    h = Harness(FairQueue(concurrency=1, quantum_tokens=100, interactive_boost=2.0))
    await h.start()
    for i in range(1, 9):
        await h.add(EVAL, f"e{i}", 100, "interactive")
    for i in range(1, 9):
        await h.add(TRAINER3, f"t{i}", 100, TRAINER_PRIORITY)
    assert await h.run() == [
        "e1", "e2", "t1", "t2", "t3", "t4", "t5", "t6", "e3", "e4", "t7", "t8", "e5", "e6", "e7", "e8",
    ]


async def test_an_idle_user_banks_no_credit():
    # quantum 100. A's only group (cost 40) is served at once, leaving deficit 60 that is
    # dropped when A's queue empties. Later A (cost 100) and B (cost 100) queue behind the
    # blocker: A: +100 → a2 (a deficit of 160 would have let a 150 one through too).
    queue = FairQueue(concurrency=1, quantum_tokens=100)
    async with queue.turn(A, 40):
        pass
    h = Harness(queue)
    await h.start()
    await h.add(A, "a2", 100)
    await h.add(A, "a3", 50)
    await h.add(B1, "b1", 100)
    assert await h.run() == ["a2", "b1", "a3"]


async def test_concurrency_bounds_the_groups_holding_a_turn():
    queue = FairQueue(concurrency=2, quantum_tokens=1000)
    release = asyncio.Event()
    inside: list[str] = []

    async def group(label: str) -> None:
        async with queue.turn(A, 10):
            inside.append(label)
            await release.wait()

    tasks = [asyncio.create_task(group(f"g{i}")) for i in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert inside == ["g0", "g1"]
    snap = queue.snapshot()
    assert (snap.inflight_groups, snap.queued_groups) == (2, 3)
    assert (snap.users[0].inflight_tokens, snap.users[0].queued_tokens) == (20, 30)
    release.set()
    await asyncio.gather(*tasks)
    assert inside == ["g0", "g1", "g2", "g3", "g4"]
    assert queue.snapshot().users[0].served_tokens == 50


async def test_cancelling_a_waiting_group_removes_it_from_the_queue():
    queue = FairQueue(concurrency=1, quantum_tokens=100)
    release = asyncio.Event()
    served: list[str] = []

    async def group(user: User, label: str, wait: bool = False) -> None:
        async with queue.turn(user, 100):
            served.append(label)
            if wait:
                await release.wait()

    holder = asyncio.create_task(group(A, "a1", wait=True))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(group(B1, "b1"))
    later = asyncio.create_task(group(A, "a2"))
    await asyncio.sleep(0)
    assert [u.queued_groups for u in queue.snapshot().users] == [1, 1]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    snap = queue.snapshot()
    assert [(u.user, u.queued_groups, u.queued_tokens) for u in snap.users] == [("A", 1, 100), ("B", 0, 0)]
    release.set()
    await asyncio.gather(holder, later)
    assert served == ["a1", "a2"]
    assert [(u.user, u.served_groups) for u in queue.snapshot().users] == [("A", 2), ("B", 0)]


async def test_cancelling_a_group_at_the_engine_frees_its_slot():
    queue = FairQueue(concurrency=1, quantum_tokens=100)
    never = asyncio.Event()
    served: list[str] = []

    async def stuck() -> None:
        async with queue.turn(A, 100):
            await never.wait()

    async def group() -> None:
        async with queue.turn(B1, 100):
            served.append("b1")

    holder = asyncio.create_task(stuck())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(group())
    await asyncio.sleep(0)
    assert queue.snapshot().inflight_groups == 1 and served == []
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    await asyncio.wait_for(waiter, 5)
    assert served == ["b1"]
    assert queue.snapshot().inflight_groups == 0


async def test_a_group_granted_and_cancelled_at_once_gives_its_slot_back():
    queue = FairQueue(concurrency=1, quantum_tokens=100)

    async def group(label: str, out: list[str]) -> None:
        async with queue.turn(B1, 100):
            out.append(label)

    served: list[str] = []
    async with queue.turn(A, 100):
        b1 = asyncio.create_task(group("b1", served))
        b2 = asyncio.create_task(group("b2", served))
        await asyncio.sleep(0)
    b1.cancel()  # leaving the turn above granted b1 its turn; b1 has not run since
    with pytest.raises(asyncio.CancelledError):
        await b1
    await asyncio.wait_for(b2, 5)
    assert served == ["b2"]
    snap = queue.snapshot()
    assert snap.inflight_groups == 0
    assert [(u.user, u.served_groups) for u in snap.users] == [("A", 1), ("B", 1)]


async def test_snapshot_throughput_and_estimated_wait():
    now = [100.0]
    queue = FairQueue(concurrency=1, quantum_tokens=100, clock=lambda: now[0])
    release = asyncio.Event()
    # 10 s after start, A's group of 600 tokens finishes: 600 tokens / 10 s = 60 tokens/s.
    now[0] = 110.0
    async with queue.turn(A, 600):
        pass

    async def group(user: User, cost: int, wait: bool = False) -> None:
        async with queue.turn(user, cost):
            if wait:
                await release.wait()

    tasks = [asyncio.create_task(group(A, 120, wait=True))]  # in flight: 120 tokens
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(group(A, 300)))  # A queued: 300
    tasks.append(asyncio.create_task(group(B, 100)))  # B (weight 2) queued: 100
    tasks.append(asyncio.create_task(group(B, 200)))  # B queued: 300 in all
    await asyncio.sleep(0)
    snap = queue.snapshot()
    a, b = snap.users
    assert snap.tokens_per_s == pytest.approx(60.0)
    assert (a.tokens_per_s, b.tokens_per_s) == (pytest.approx(60.0), 0.0)
    # A's wait: (its 300 + 120 in flight + B's share meanwhile: min(300, 300 × 2/1)) / 60 = 12 s.
    assert a.estimated_wait_s == pytest.approx((300 + 120 + 300) / 60)
    # B's wait: (its 300 + 120 in flight + A's share meanwhile: min(300, 300 × 1/2)) / 60 = 9.5 s.
    assert b.estimated_wait_s == pytest.approx((300 + 120 + 150) / 60)
    assert (a.queued_groups, a.inflight_groups, b.queued_groups, a.served_tokens) == (1, 1, 2, 600)
    release.set()
    await asyncio.gather(*tasks)
    assert [u.estimated_wait_s for u in queue.snapshot().users] == [0.0, 0.0]


async def test_no_throughput_yet_means_no_wait_estimate():
    queue = FairQueue(concurrency=1, quantum_tokens=100)
    release = asyncio.Event()

    async def group(wait: bool) -> None:
        async with queue.turn(A, 10):
            if wait:
                await release.wait()

    tasks = [asyncio.create_task(group(True)), asyncio.create_task(group(False))]
    await asyncio.sleep(0)
    assert queue.snapshot().users[0].estimated_wait_s is None
    release.set()
    await asyncio.gather(*tasks)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="concurrency: 0 must be an integer ≥ 1"):
        FairQueue(0, 100)
    with pytest.raises(ValueError, match="quantum_tokens: 0 must be an integer ≥ 1"):
        FairQueue(1, 0)
    with pytest.raises(ValueError, match="interactive_boost: 0.5 must be a number ≥ 1"):
        FairQueue(1, 100, interactive_boost=0.5)


async def test_turn_rejects_a_negative_cost_and_an_unknown_priority():
    queue = FairQueue(1, 100)
    with pytest.raises(ValueError, match="cost_tokens: -1"):
        async with queue.turn(A, -1):
            pass
    with pytest.raises(ValueError, match="priority: 'urgent'"):
        async with queue.turn(A, 1, "urgent"):  # type: ignore[arg-type]
            pass


def test_priority_header_values():
    assert parse_priority(None) == "batch"
    assert parse_priority(" Interactive ") == "interactive"
    assert parse_priority("batch") == "batch"
    # a trainer route's default: absent → interactive, a header still wins
    assert TRAINER_PRIORITY == "interactive"
    assert parse_priority(None, TRAINER_PRIORITY) == "interactive"
    assert parse_priority("batch", TRAINER_PRIORITY) == "batch"
    with pytest.raises(ValueError, match="default: 'urgent'"):
        parse_priority(None, "urgent")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as info:
        parse_priority("urgent")
    assert info.value.field == "X-RMServe-Priority"
    assert "interactive, batch" in info.value.message


async def test_a_waiter_cancelled_just_before_its_turn_is_skipped():
    queue = FairQueue(concurrency=1, quantum_tokens=100)
    served: list[str] = []

    async def group(label: str) -> None:
        async with queue.turn(B1, 100):
            served.append(label)

    async with queue.turn(A, 100):
        b1 = asyncio.create_task(group("b1"))
        b2 = asyncio.create_task(group("b2"))
        await asyncio.sleep(0)
        b1.cancel()  # still queued when the turn above ends and the dispatcher picks the next group
    with pytest.raises(asyncio.CancelledError):
        await b1
    await asyncio.wait_for(b2, 5)
    assert served == ["b2"]
    snap = queue.snapshot()
    assert (snap.inflight_groups, snap.queued_groups) == (0, 0)
    assert [(u.user, u.served_groups) for u in snap.users] == [("A", 1), ("B", 1)]


async def test_a_token_window_bounds_what_is_at_the_engine_but_always_admits_one():
    """Window 100 tokens, cap 10 groups, quantum 1000 (alice's visit covers all her groups):
    a's groups of 60 tokens go two at a time (the second is admitted while 60 < 100 are at the
    engine, then 120 ≥ 100 holds the rest); bob's 500-token group, over the window on its own,
    goes as soon as less than the window is at the engine."""
    queue = FairQueue(10, 1000, window_tokens=100)
    alice, bob = User("alice"), User("bob")
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("a1", "a2", "a3", "b1")}

    async def group(user, name, cost):
        async with queue.turn(user, cost):
            order.append(name)
            await release[name].wait()

    async def settle():
        for _ in range(5):
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(group(alice, n, 60)) for n in ("a1", "a2", "a3")]
    tasks.append(asyncio.create_task(group(bob, "b1", 500)))
    await settle()
    assert order == ["a1", "a2"]  # 120 tokens at the engine: nothing more until one ends
    release["a1"].set()
    await settle()
    assert order == ["a1", "a2", "a3"]  # 60 < 100 again: alice's turn goes on (120 again)
    release["a2"].set()
    await settle()
    assert order == ["a1", "a2", "a3", "b1"]  # 60 < 100: bob's 500 tokens go, 560 at the engine
    release["a3"].set()
    release["b1"].set()
    await asyncio.gather(*tasks)
    queue.set_window_tokens(None)
    assert queue.window_tokens is None
    with pytest.raises(ValueError, match="window_tokens"):
        FairQueue(1, 1, window_tokens=0)


def test_the_default_window_is_eight_engine_steps():
    from rmserve.server.config import ServerConfig, engine_window

    assert engine_window(ServerConfig(), 2048) == 16384
    assert engine_window(ServerConfig(), None) is None
    assert engine_window(ServerConfig(engine_window_tokens=5000), 2048) == 5000
    assert engine_window(ServerConfig(engine_window_tokens=0), 2048) is None
    with pytest.raises(ValueError, match="engine_window_tokens is -1"):
        ServerConfig(engine_window_tokens=-1)
