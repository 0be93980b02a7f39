"""A per-user fair queue in front of the engine: deficit round robin over prompt tokens.

Every group a ``POST /v1/score`` request sends to the engine first takes a *turn* of the
:class:`FairQueue` (``async with queue.turn(user, cost_tokens, priority): await
engine.score_group(...)``). At most ``concurrency`` groups are at the engine at once; the
others wait in their user's queue. When a slot frees, the next group is picked by deficit
round robin (M. Shreedhar and G. Varghese, "Efficient fair queuing using deficit round
robin", SIGCOMM 1995):

- the users with waiting groups form a ring, visited in the order they became active;
- on arriving at a user, its deficit grows by ``quantum_tokens × user.weight``;
- while the deficit covers the cost of the user's first waiting group, that group is served
  and its cost is taken from the deficit; when it does not, the ring moves to the next user
  (the deficit is kept for the next visit);
- a user whose queue empties leaves the ring and its deficit is reset to 0 (no credit is
  banked while idle).

The cost of a group is its prompt tokens: the tokens of all the sequences it sends to the
engine. So under contention each user is served prompt tokens in proportion to its weight,
whatever the size of its groups. A group is never split: all its sequences go to the engine
in the one call made inside its turn (they share the prompt's prefix-cache blocks).

Within one user's queue, ``interactive`` groups go before ``batch`` ones (first come, first
served within a priority). A request without the priority header is ``batch`` on
``/v1/score`` and ``interactive`` on the trainer routes (:data:`TRAINER_PRIORITY`). Across users, a visit that finds an ``interactive`` group at the
head of a user's queue credits ``interactive_boost`` times the quantum (1 = the priority never
changes the share between users; 2 = an interactive eval gets twice its weight's share while
it has groups waiting, so it is served ahead of a sweep without shutting the sweep out). The engine
call carries the priority too (``priority=`` of ``score_group`` / ``judge_group``, lower first: 0
interactive, 1 batch, see :data:`ENGINE_PRIORITY`); the vLLM engines pass it on to vLLM when the
server was started with ``--scheduling-policy priority``, so interactive requests also go first
among the groups already at the engine.

A waiting group whose caller goes away (client disconnect: the task is cancelled) leaves the
queue at once; a group cancelled at the engine frees its slot. :meth:`FairQueue.wait_turn` and
:meth:`FairQueue.end_turn` are the two halves of :meth:`FairQueue.turn`, for a slot that must
be held past the waiting task (the render threads' per-user order,
:mod:`rmserve.server.sharing.render_order`, is a second queue of this class, costed in characters). :meth:`FairQueue.snapshot`
reports, per user, queued and in-flight groups and tokens, tokens served, recent throughput
and an estimated wait (``GET /v1/queue`` and the status page read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec
from aiohttp import web
from rmserve.server.sharing.users import ANONYMOUS, User

from rmserve.errors import InvalidRequest

Priority = Literal["interactive", "batch"]
"""``interactive``: an eval someone waits for; ``batch``: a sweep (the default)."""

PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")

ENGINE_PRIORITY: dict[Priority, int] = {"interactive": 0, "batch": 1}
"""The vLLM request priority each hint maps to (vLLM schedules lower values first under
``--scheduling-policy priority``)."""

PRIORITY_HEADER = "X-RMServe-Priority"
"""Request header carrying the priority hint (``interactive`` or ``batch``; absent: the
route's default, :data:`DEFAULT_PRIORITY` or :data:`TRAINER_PRIORITY`)."""

DEFAULT_PRIORITY: Priority = "batch"
"""The priority of a ``POST /v1/score`` request that sends no :data:`PRIORITY_HEADER`."""

TRAINER_PRIORITY: Priority = "interactive"
"""The priority of a trainer route's request (``POST /get_reward``, ``/classify``, ``/pooling``)
that sends no :data:`PRIORITY_HEADER`: OpenRLHF and verl send none, and a training step waits
for its rewards as an eval's caller waits for its scores, so it gets the class ``rmserve eval``
sends (an eval on the node gets no boost over it; their shares are the users' weights). A
header still wins."""

THROUGHPUT_WINDOW_S = 30.0
"""Seconds of finished groups the recent-throughput figures average over."""

QUEUE_KEY = web.AppKey("fair_queue", object)
"""Where the app keeps its :class:`FairQueue` (typed ``object``: read it with :func:`queue_of`)."""


def queue_of(app: web.Application) -> FairQueue | None:
    """The app's :class:`FairQueue`, or None when the app has none (no fair share)."""
    queue = app.get(QUEUE_KEY)
    return queue if isinstance(queue, FairQueue) else None


def parse_priority(value: str | None, default: Priority = DEFAULT_PRIORITY) -> Priority:
    """The priority hint of a request from its :data:`PRIORITY_HEADER` value.

    Args:
        value: the header's value (case and surrounding spaces ignored); None = absent.
        default: the priority when absent (the route's: :data:`DEFAULT_PRIORITY` for
            ``/v1/score``, :data:`TRAINER_PRIORITY` for the trainer routes).

    Returns:
        ``interactive`` or ``batch`` (``default`` when absent).

    Raises:
        InvalidRequest: any other value (field :data:`PRIORITY_HEADER`).
    """
    if default not in PRIORITIES:
        raise ValueError(f"default: {default!r} is not one of {', '.join(PRIORITIES)}")
    if value is None:
        return default
    text = value.strip().lower()
    if text not in PRIORITIES:
        raise InvalidRequest(
            f"{PRIORITY_HEADER} is {value!r}; it must be one of {', '.join(PRIORITIES)}",
            field=PRIORITY_HEADER,
            value=value,
        )
    return text  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends a scoring request, and its priority hint."""

    user: User = ANONYMOUS
    priority: Priority = DEFAULT_PRIORITY


@dataclass(eq=False, slots=True)
class Ticket:
    """One group (or job) waiting for, or holding, a turn (opaque outside this module)."""

    user: str
    cost: int
    priority: Priority
    seq: int
    enqueued_s: float
    granted: asyncio.Future[None]
    started_s: float | None = None
    dropped: bool = False
    """Popped by the dispatcher after its waiter was cancelled (never held a slot)."""


@dataclass(slots=True)
class _UserQueue:
    """A user's waiting groups (per priority) and counters."""

    user: User
    waiting: dict[str, deque[Ticket]] = field(default_factory=lambda: {p: deque() for p in PRIORITIES})
    deficit: float = 0.0
    inflight_groups: int = 0
    inflight_tokens: int = 0
    served_groups: int = 0
    served_tokens: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    """(finish time, tokens) of groups finished in the last :data:`THROUGHPUT_WINDOW_S`."""

    def head(self) -> Ticket | None:
        for priority in PRIORITIES:
            if self.waiting[priority]:
                return self.waiting[priority][0]
        return None

    @property
    def queued_groups(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    @property
    def queued_tokens(self) -> int:
        return sum(t.cost for q in self.waiting.values() for t in q)


class UserQueueState(msgspec.Struct, frozen=True):
    """One user's share of the queue at one moment (also one user's entry of ``GET /v1/queue``,
    :class:`rmserve.server.http.queue_routes.QueueReply`).

    Attributes:
        user: the user's name.
        weight: the user's weight (share of prompt tokens under contention).
        queued_groups / queued_tokens: groups (and their prompt tokens) waiting for a turn.
        inflight_groups / inflight_tokens: groups (and tokens) at the engine now.
        served_groups / served_tokens: groups (and tokens) whose turn has ended since the
            server started (scored, failed or cancelled at the engine).
        tokens_per_s: tokens of this user's groups finished in the last
            :data:`THROUGHPUT_WINDOW_S` seconds, divided by that window (or by the time
            since the server started, when shorter).
        estimated_wait_s: seconds until this user's last queued group reaches the engine,
            estimated as (this user's queued tokens + the tokens the other users with queued
            work will be served meanwhile under the weights) / the engine's recent tokens/s;
            0 with nothing queued; None when no throughput has been measured yet.
    """

    user: str
    weight: float
    queued_groups: int
    queued_tokens: int
    inflight_groups: int
    inflight_tokens: int
    served_groups: int
    served_tokens: int
    tokens_per_s: float
    estimated_wait_s: float | None


@dataclass(frozen=True, slots=True)
class QueueState:
    """The whole queue at one moment (:meth:`FairQueue.snapshot`).

    Attributes:
        concurrency: most groups at the engine at once.
        inflight_groups: groups at the engine now (all users).
        queued_groups: groups waiting for a turn (all users).
        tokens_per_s: the engine's recent throughput over all users (prompt tokens/s).
        users: one entry per user seen since the server started, by name.
    """

    concurrency: int
    inflight_groups: int
    queued_groups: int
    tokens_per_s: float
    users: tuple[UserQueueState, ...]


class FairQueue:
    """Deficit-round-robin admission of groups to the engine (see the module docstring).

    Args:
        concurrency: most groups at the engine at once (≥ 1).
        quantum_tokens: prompt tokens a user of weight 1 is credited per round (≥ 1). Any
            value is fair over time; a quantum below the typical group cost makes the order
            finer-grained, one far above it lets a user send many groups in a row.
        interactive_boost: factor (≥ 1) on the quantum credited to a user whose next group
            is ``interactive``.
        window_tokens: with a value, no further group is admitted while the groups at the
            engine hold that many prompt tokens or more (at least one group always is). It
            bounds the engine's own queue, which runs first come first served: a group admitted
            behind a long queue waits for all of it however fair the admission order was.
            None: only ``concurrency`` bounds it. Settable after construction (the app sets it
            once the engine reports its step budget).
        clock: monotonic seconds (tests pass their own).

    Raises:
        ValueError: ``concurrency`` or ``quantum_tokens`` below 1, ``interactive_boost``
            below 1.
    """

    def __init__(self, concurrency: int, quantum_tokens: int, *, interactive_boost: float = 1.0,
                 window_tokens: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency: {concurrency!r} must be an integer ≥ 1")
        if not isinstance(quantum_tokens, int) or quantum_tokens < 1:
            raise ValueError(f"quantum_tokens: {quantum_tokens!r} must be an integer ≥ 1")
        if not isinstance(interactive_boost, (int, float)) or not interactive_boost >= 1:
            raise ValueError(f"interactive_boost: {interactive_boost!r} must be a number ≥ 1")
        if window_tokens is not None and (not isinstance(window_tokens, int) or window_tokens < 1):
            raise ValueError(f"window_tokens: {window_tokens!r} must be None or an integer ≥ 1")
        self.window_tokens = window_tokens
        self._inflight_tokens = 0
        self.concurrency = concurrency
        self.quantum_tokens = quantum_tokens
        self.interactive_boost = float(interactive_boost)
        self._clock = clock
        self._started_s = clock()
        self._users: dict[str, _UserQueue] = {}
        self._ring: deque[str] = deque()
        self._visited = False
        """Whether the user at the front of the ring has had its quantum for this visit."""
        self._inflight = 0
        self._seq = itertools.count()

    # --- public API ----------------------------------------------------------------------

    def set_window_tokens(self, window_tokens: int | None) -> None:
        """Change ``window_tokens`` (see the class docstring) and admit what now fits.

        Raises:
            ValueError: not None and not an integer ≥ 1.
        """
        if window_tokens is not None and (not isinstance(window_tokens, int) or window_tokens < 1):
            raise ValueError(f"window_tokens: {window_tokens!r} must be None or an integer ≥ 1")
        self.window_tokens = window_tokens
        self._dispatch()

    @contextlib.asynccontextmanager
    async def turn(self, user: User, cost_tokens: int, priority: Priority = DEFAULT_PRIORITY) -> AsyncIterator[None]:
        """Wait for this group's turn, hold an engine slot while the body runs, then free it.

        Args:
            user: whose group it is (its ``name`` keys the queue, its ``weight`` its share).
            cost_tokens: the group's prompt tokens (Σ tokens of the sequences it sends; ≥ 0).
            priority: ``interactive`` groups of a user go before its ``batch`` groups.

        Raises:
            ValueError: ``cost_tokens`` negative or ``priority`` unknown.
            asyncio.CancelledError: the waiting task was cancelled (the group has left the
                queue; no slot is held).
        """
        ticket = await self.wait_turn(user, cost_tokens, priority)
        try:
            yield
        finally:
            self.end_turn(ticket)

    async def wait_turn(self, user: User, cost_tokens: int, priority: Priority = DEFAULT_PRIORITY) -> Ticket:
        """Wait for a turn and hold its slot until :meth:`end_turn` (the two halves of
        :meth:`turn`, for a slot that must outlive the waiting task: e.g. a job running in a
        thread after its caller has gone, :mod:`rmserve.server.sharing.render_order`).

        Args: as :meth:`turn` (``cost_tokens`` is in whatever unit the queue's quantum is).

        Returns:
            The granted :class:`Ticket`; pass it to :meth:`end_turn` exactly once.

        Raises:
            ValueError: ``cost_tokens`` negative or ``priority`` unknown.
            asyncio.CancelledError: the waiting task was cancelled (the job has left the
                queue; no slot is held).
        """
        if not isinstance(cost_tokens, int) or cost_tokens < 0:
            raise ValueError(f"cost_tokens: {cost_tokens!r} must be an integer ≥ 0")
        if priority not in PRIORITIES:
            raise ValueError(f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
        ticket = self._enqueue(user, cost_tokens, priority)
        try:
            await ticket.granted
        except asyncio.CancelledError:
            if not ticket.granted.cancelled():
                self._finish(ticket, served=False)  # granted just as it was cancelled: give the slot back
            elif not ticket.dropped:
                self._withdraw(ticket)
            raise
        return ticket

    def end_turn(self, ticket: Ticket) -> None:
        """Free the slot of a ticket :meth:`wait_turn` granted, count it served, start the next
        waiting job."""
        self._finish(ticket)

    def snapshot(self) -> QueueState:
        """The queue's state now (see :class:`QueueState`)."""
        now = self._clock()
        window = max(min(THROUGHPUT_WINDOW_S, now - self._started_s), 1e-9)
        for state in self._users.values():
            self._trim(state, now)
        rates = {name: sum(t for _, t in s.recent) / window for name, s in self._users.items()}
        total_rate = sum(rates.values())
        users = []
        for name in sorted(self._users):
            state = self._users[name]
            users.append(
                UserQueueState(
                    user=name,
                    weight=state.user.weight,
                    queued_groups=state.queued_groups,
                    queued_tokens=state.queued_tokens,
                    inflight_groups=state.inflight_groups,
                    inflight_tokens=state.inflight_tokens,
                    served_groups=state.served_groups,
                    served_tokens=state.served_tokens,
                    tokens_per_s=rates[name],
                    estimated_wait_s=self._estimate_wait(state, total_rate),
                )
            )
        return QueueState(
            concurrency=self.concurrency,
            inflight_groups=self._inflight,
            queued_groups=sum(s.queued_groups for s in self._users.values()),
            tokens_per_s=total_rate,
            users=tuple(users),
        )

    # --- internals -----------------------------------------------------------------------

    def _enqueue(self, user: User, cost: int, priority: Priority) -> Ticket:
        state = self._users.get(user.name)
        if state is None:
            state = self._users[user.name] = _UserQueue(user=user)
        else:
            state.user = user  # the latest record (a weight change applies from now on)
        ticket = Ticket(
            user=user.name,
            cost=cost,
            priority=priority,
            seq=next(self._seq),
            enqueued_s=self._clock(),
            granted=asyncio.get_running_loop().create_future(),
        )
        if state.head() is None:
            self._ring.append(user.name)
        state.waiting[priority].append(ticket)
        self._dispatch()
        return ticket

    def _withdraw(self, ticket: Ticket) -> None:
        """Take a waiting ticket out of its user's queue (its caller went away)."""
        state = self._users[ticket.user]
        state.waiting[ticket.priority].remove(ticket)
        if state.head() is None:
            self._leave_ring(ticket.user)

    def _leave_ring(self, name: str) -> None:
        if self._ring and self._ring[0] == name:
            self._visited = False
        self._ring.remove(name)
        self._users[name].deficit = 0.0

    def _finish(self, ticket: Ticket, *, served: bool = True) -> None:
        """The ticket's turn is over: free its slot, count it served (when it reached the
        engine), start the next group."""
        state = self._users[ticket.user]
        now = self._clock()
        self._inflight -= 1
        self._inflight_tokens -= ticket.cost
        state.inflight_groups -= 1
        state.inflight_tokens -= ticket.cost
        if served:
            state.served_groups += 1
            state.served_tokens += ticket.cost
            state.recent.append((now, ticket.cost))
            self._trim(state, now)
        self._dispatch()

    def _trim(self, state: _UserQueue, now: float) -> None:
        while state.recent and state.recent[0][0] < now - THROUGHPUT_WINDOW_S:
            state.recent.popleft()

    def _dispatch(self) -> None:
        """Grant turns while a slot is free and a group waits."""
        while self._inflight < self.concurrency and self._ring and (
            self.window_tokens is None or self._inflight_tokens < self.window_tokens
        ):
            ticket = self._next()
            state = self._users[ticket.user]
            if ticket.granted.cancelled():  # its caller left after the last dispatch
                ticket.dropped = True
                state.deficit += ticket.cost if state.head() is not None else 0.0
                continue
            self._inflight += 1
            self._inflight_tokens += ticket.cost
            state.inflight_groups += 1
            state.inflight_tokens += ticket.cost
            ticket.started_s = self._clock()
            ticket.granted.set_result(None)

    def _credit(self, state: _UserQueue, head: Ticket) -> float:
        """What one visit credits a user whose next group is ``head``."""
        boost = self.interactive_boost if head.priority == "interactive" else 1.0
        return self.quantum_tokens * state.user.weight * boost

    def _next(self) -> Ticket:
        """Pop the next group by deficit round robin (the ring is not empty).

        After a whole pass of the ring serves nobody, the rounds that would serve nobody
        either are credited at once (:meth:`_skip_idle_rounds`), so a cost far above the
        quantum costs no more loop turns than a small one; the order is the same.
        """
        misses = 0
        while True:
            name = self._ring[0]
            state = self._users[name]
            head = state.head()
            assert head is not None
            if not self._visited:
                state.deficit += self._credit(state, head)
                self._visited = True
            if head.cost <= state.deficit:
                state.deficit -= head.cost
                state.waiting[head.priority].popleft()
                if state.head() is None:
                    self._leave_ring(name)
                return head
            self._visited = False
            self._ring.rotate(-1)
            misses += 1
            if misses >= len(self._ring):
                self._skip_idle_rounds()
                misses = 0

    def _skip_idle_rounds(self) -> None:
        """Credit at once the whole rounds of the ring in which no user could be served.

        Called at the start of a pass after a pass that served nobody: every user in the
        ring has had its credit and its deficit is below its head's cost. User ``u`` needs
        ``k_u = ⌈(cost_u − deficit_u) / credit_u⌉`` more visits; the first ``min k_u − 1``
        rounds serve nobody. One round fewer than that (``min k_u − 2``) is credited at once,
        a margin against rounding in the division, and the passes that follow serve the
        group plain deficit round robin would (exactly so when quantum × weight × boost are
        whole numbers, as with whole weights).
        """
        rounds = None
        for name in self._ring:
            state = self._users[name]
            head = state.head()
            assert head is not None
            need = math.ceil((head.cost - state.deficit) / self._credit(state, head))
            rounds = need if rounds is None else min(rounds, need)
        if rounds is None or rounds <= 2:
            return
        for name in self._ring:
            state = self._users[name]
            head = state.head()
            assert head is not None
            state.deficit += (rounds - 2) * self._credit(state, head)

    def _estimate_wait(self, state: _UserQueue, total_rate: float) -> float | None:
        """See :attr:`UserQueueState.estimated_wait_s`."""
        mine = state.queued_tokens
        if mine == 0:
            return 0.0
        if total_rate <= 0:
            return None
        ahead = float(sum(s.inflight_tokens for s in self._users.values()))
        weight = state.user.weight
        for other in self._users.values():
            if other is state or other.queued_tokens == 0:
                continue
            ahead += min(other.queued_tokens, mine * other.user.weight / weight)
        return (mine + ahead) / total_rate
