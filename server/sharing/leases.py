"""Pinned fingerprints and checkpoint leases: who may swap the served model, and when.

A scoring request may carry the fingerprint it expects (``ScoreRequest.fingerprint``). It is
checked at admission, before any engine work (:meth:`LeaseBook.check_fingerprint`): another
fingerprint is answered 409 ``conflict`` (field ``fingerprint``) naming both fingerprints,
the model and, when known, who loaded the served checkpoint and whether that load was forced.
While it is scored, the request's groups count as the user's *pinned work* on that
fingerprint (:meth:`LeaseBook.pinned`).

A checkpoint load (``POST /v1/models/load``) takes a :class:`Lease` on the model for the
requesting user. Before the swap starts (with the scoring gate already closed, so nothing
slips in between the check and the swap) :meth:`LeaseBook.check_swap` refuses it with 409
when

- a live lease on the model is held by another user, or
- another user has pinned work on the served fingerprint in flight or queued;

the message names the holder (and since when) and how many groups of whom are in flight.
The holder swaps again freely as long as nobody else's pinned work is in flight. An admin
may pass ``force: true``: the swap then goes ahead. A forced swap, like every swap, first
drains the requests already admitted, which finish and are answered on the checkpoint they
pinned, so no scored group is lost and no reply mixes checkpoints; every later request
pinned to the old fingerprint gets 409 naming the new fingerprint and who forced the swap.

A lease ends when its holder has had no pinned work in flight for ``lease_idle_s`` seconds
(``ServerConfig.lease_idle_s``; checked lazily, with the book's clock) or on
``POST /v1/models/release`` by its holder or an admin (:meth:`LeaseBook.release`).
Without a users file every request is the anonymous user's, so no swap is ever refused.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from aiohttp import web
from rmserve.server.sharing.users import User

from rmserve.errors import Conflict, Forbidden
from rmserve.schema import ModelInfo

RECENT_SWAPS = 20
"""Swaps remembered to explain a stale fingerprint (who replaced it, forced or not)."""


@dataclass(slots=True)
class Lease:
    """One user's lease on a served model.

    Attributes:
        model: the model name the lease is on (the name the load gave it).
        holder: the user who loaded it.
        since: Unix time (seconds) the lease was taken.
        fingerprint: the fingerprint loaded.
        idle_since: the book's clock reading (seconds) since which the holder has had no
            pinned work in flight; None while some is.
    """

    model: str
    holder: str
    since: float
    fingerprint: str
    idle_since: float | None


@dataclass(frozen=True, slots=True)
class SwapRecord:
    """One finished swap: who loaded what over which fingerprint, and whether it was forced.

    Attributes:
        user: who loaded it.
        model: the new model name.
        old_fingerprint / new_fingerprint: before and after.
        forced: True when an admin's ``force`` overrode a lease or other users' pinned work.
        overridden: ``(user, groups)`` pinned in flight by others when it was forced.
        time: Unix time (seconds) it finished.
    """

    user: str
    model: str
    old_fingerprint: str
    new_fingerprint: str
    forced: bool
    overridden: tuple[tuple[str, int], ...]
    time: float


class PinnedWork(msgspec.Struct, frozen=True):
    """One user's pinned groups in flight (admitted or queued) on a fingerprint."""

    user: str
    groups: int


class LeaseState(msgspec.Struct, frozen=True):
    """The lease section of ``GET /v1/status`` for one model.

    Attributes:
        model / fingerprint: the served model.
        holder: who holds its lease; None when nobody does.
        since: Unix time (seconds) the lease was taken; None without a lease.
        expires_in_s: seconds until the lease ends if its holder stays idle; None without a
            lease or while the holder has pinned work in flight.
        pinned: every user's pinned groups in flight on ``fingerprint``, by name.
    """

    model: str
    fingerprint: str
    holder: str | None
    since: float | None
    expires_in_s: float | None
    pinned: tuple[PinnedWork, ...]


class SwapEntry(msgspec.Struct, frozen=True):
    """One recent checkpoint swap in ``GET /v1/status`` (a :class:`SwapRecord` on the wire).

    Attributes:
        time: Unix time (seconds) it finished.
        user: who loaded the checkpoint.
        model: the name it serves under.
        old_fingerprint / new_fingerprint: before and after.
        forced: an admin's ``force`` overrode a lease or others' pinned work.
        overridden: the pinned work of others in flight when it was forced, by user.
    """

    time: float
    user: str
    model: str
    old_fingerprint: str
    new_fingerprint: str
    forced: bool
    overridden: tuple[PinnedWork, ...]

    @classmethod
    def of(cls, record: SwapRecord) -> SwapEntry:
        """The wire form of ``record``."""
        return cls(record.time, record.user, record.model, record.old_fingerprint, record.new_fingerprint,
                   record.forced, tuple(PinnedWork(u, n) for u, n in record.overridden))


def _utc(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def _who(work: dict[str, int]) -> str:
    return ", ".join(f"{user}: {n} group{'s' if n != 1 else ''}" for user, n in sorted(work.items()))


FORCE_SENTENCE = (
    "An admin may force the swap (force: true): runs pinned to that fingerprint then stop with 409, keep what they "
    "scored and resume once it is served again"
)
"""How a refused swap ends when only a lease blocks it (no pinned work of others in flight)."""

FORCE_PINNED_SENTENCE = (
    "An admin may force the swap (force: true), which stops those pinned runs with 409; they keep what they scored "
    "and resume once that fingerprint is served again"
)
"""How a refused swap ends when other users' pinned work is in flight: forcing stops those runs."""


def swap_refusal(user: str, info: ModelInfo, lease: Lease | None, others: dict[str, int], idle_s: float) -> str:
    """The message of a checkpoint swap refused for ``user``: what blocks it, who can unblock it.

    Args:
        user: who asked for the swap.
        info: the served model.
        lease: a live lease on it held by another user, or None (no lease, or ``user``'s own:
            neither blocks ``user``).
        others: pinned groups in flight on ``info.fingerprint`` of users other than ``user``,
            by name; at least one of ``lease`` and ``others`` blocks the swap.
        idle_s: the lease's idle limit, seconds.

    Returns:
        A lease held by another: who holds it since when and how it ends. Pinned work: how many
        users, each one's groups, and that a retry once it is done goes through; no word of a
        lease holder when there is none. Then what an admin's ``force`` does: with pinned
        work, that it stops those runs (which keep what they scored).

    Raises:
        ValueError: neither ``lease`` nor ``others`` (nothing blocks the swap).
    """
    if lease is None and not others:
        raise ValueError("swap_refusal: nothing blocks the swap")
    where = f"model {info.name!r} (fingerprint {info.fingerprint})"
    blockers = []
    if lease is not None:
        blockers.append(
            f"{lease.holder} holds the lease on {where} since {_utc(lease.since)}; it ends after {idle_s:g} s "
            f"without {lease.holder}'s pinned work in flight, or when {lease.holder} or an admin releases it "
            "(POST /v1/models/release)"
        )
    if others:
        users = f"{len(others)} other user{'s' if len(others) != 1 else ''}"
        on = "on it" if lease is not None else f"on {where}"
        when = "once it is done and the lease has ended" if lease is not None else "once it is done"
        blockers.append(f"pinned work of {users} is in flight {on}: {_who(others)}; retry {when}")
    force = FORCE_PINNED_SENTENCE if others else FORCE_SENTENCE
    return f"checkpoint swap refused for {user}: {'; '.join(blockers)}. {force}"


@dataclass(slots=True)
class LeaseBook:
    """Leases and pinned work of one server (the single model it serves, by name).

    Args:
        idle_s: seconds without pinned work in flight after which the holder's lease ends (> 0).
        clock: monotonic seconds (a test seam).
        wall: Unix seconds, for ``since`` and swap times (a test seam).
    """

    idle_s: float
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    leases: dict[str, Lease] = field(default_factory=dict)
    pinned_groups: dict[tuple[str, str], int] = field(default_factory=dict)
    """(fingerprint, user) → groups in flight."""
    swaps: collections.deque[SwapRecord] = field(default_factory=lambda: collections.deque(maxlen=RECENT_SWAPS))

    # --- pinned work ---------------------------------------------------------------------

    def check_fingerprint(self, expected: str | None, info: ModelInfo) -> None:
        """Refuse a request pinned to another fingerprint than the served model's.

        Raises:
            Conflict (409, field ``fingerprint``): ``expected`` is set and differs from
                ``info.fingerprint``; names both, the model, and the swap that replaced the
                expected fingerprint when this server made it (who, forced or not).
        """
        if expected is None or expected == info.fingerprint:
            return
        message = (
            f"this request is pinned to fingerprint {expected} but model {info.name!r} is now served with "
            f"fingerprint {info.fingerprint}"
        )
        swap = next((s for s in reversed(self.swaps) if s.old_fingerprint == expected), None)
        if swap is not None:
            how = "forced the swap" if swap.forced else "swapped it"
            message += f" ({swap.user} {how} at {_utc(swap.time)})"
        message += (
            "; nothing was scored with it. Load the expected checkpoint again (or wait for the lease holder to do so) "
            "and resume, or start a new run for the new model"
        )
        raise Conflict(message, field="fingerprint", value=expected)

    @contextlib.contextmanager
    def pinned(self, user: str, fingerprint: str | None, groups: int) -> Iterator[None]:
        """Count ``groups`` of ``user`` as pinned to ``fingerprint`` while the block runs
        (nothing when ``fingerprint`` is None: the request does not care which model scores it).
        The holder of a lease on that fingerprint is not idle meanwhile."""
        if fingerprint is None or groups <= 0:
            yield
            return
        key = (fingerprint, user)
        self.pinned_groups[key] = self.pinned_groups.get(key, 0) + groups
        for lease in self.leases.values():
            if lease.holder == user:
                lease.idle_since = None
        try:
            yield
        finally:
            left = self.pinned_groups[key] - groups
            if left:
                self.pinned_groups[key] = left
            else:
                del self.pinned_groups[key]
            if not any(u == user for _, u in self.pinned_groups):
                for lease in self.leases.values():
                    if lease.holder == user and lease.idle_since is None:
                        lease.idle_since = self.clock()

    def work_on(self, fingerprint: str) -> dict[str, int]:
        """Pinned groups in flight on ``fingerprint``, per user."""
        return {user: n for (fp, user), n in self.pinned_groups.items() if fp == fingerprint}

    # --- leases --------------------------------------------------------------------------

    def lease_of(self, model: str) -> Lease | None:
        """The live lease on ``model``; an idle one past ``idle_s`` is ended here (None)."""
        lease = self.leases.get(model)
        if lease is None:
            return None
        if lease.idle_since is not None and self.clock() - lease.idle_since >= self.idle_s:
            del self.leases[model]
            return None
        return lease

    def check_swap(self, user: User, force: bool, info: ModelInfo) -> tuple[bool, tuple[tuple[str, int], ...]]:
        """May ``user`` swap away from the served model ``info``?

        Returns:
            ``(forced, overridden)``: whether ``force`` overrode a lease or other users'
            pinned work, and that work — ``(user, groups)`` by name (empty otherwise).

        Raises:
            Forbidden (403, field ``force``): ``force`` asked by a user who is not an admin.
            Conflict (409): not forced, and another user holds a live lease on the model or
                has pinned work in flight on its fingerprint (:func:`swap_refusal`'s message:
                what blocks the load, who can unblock it, what forcing it stops).
        """
        if force and not user.is_admin:
            raise Forbidden(f"force: only an admin may force a checkpoint swap; {user.name} is a {user.role}",
                            field="force")
        lease = self.lease_of(info.name)
        held = lease if lease is not None and lease.holder != user.name else None  # one's own lease never blocks
        others = {u: n for u, n in self.work_on(info.fingerprint).items() if u != user.name}
        if held is None and not others:
            return False, ()
        if force:
            return True, tuple(sorted(others.items()))
        raise Conflict(swap_refusal(user.name, info, held, others, self.idle_s))

    def granted(self, user: str, info: ModelInfo, old_fingerprint: str, overridden: tuple[tuple[str, int], ...],
                forced: bool) -> None:
        """A swap by ``user`` finished and serves ``info``: the lease on it is now ``user``'s
        (idle from now unless ``user`` has pinned work in flight); the swap is
        remembered for :meth:`check_fingerprint`."""
        now = self.wall()
        self.leases.clear()  # one model per server: a lease on the previous name ends with it
        busy = any(u == user for _, u in self.pinned_groups)
        self.leases[info.name] = Lease(info.name, user, now, info.fingerprint, None if busy else self.clock())
        self.swaps.append(SwapRecord(user, info.name, old_fingerprint, info.fingerprint, forced, overridden, now))

    def release(self, user: User, model: str) -> Lease:
        """End the lease on ``model`` (by its holder or an admin).

        Returns:
            The lease ended.

        Raises:
            Conflict (409, field ``name``): no live lease on ``model``.
            Forbidden (403): ``user`` is neither its holder nor an admin (names the holder).
        """
        lease = self.lease_of(model)
        if lease is None:
            raise Conflict(f"no lease is held on model {model!r}; nothing to release", field="name", value=model)
        if lease.holder != user.name and not user.is_admin:
            raise Forbidden(f"the lease on model {model!r} is held by {lease.holder}; only its holder or an admin "
                            f"may release it ({user.name} is a {user.role})")
        del self.leases[model]
        return lease

    # --- views ---------------------------------------------------------------------------

    def annotate(self, info: ModelInfo) -> ModelInfo:
        """``info`` with ``lease_holder`` / ``lease_since`` set when its lease is held
        (unchanged, both fields left out of the JSON, when not)."""
        lease = self.lease_of(info.name)
        if lease is None:
            return info
        return msgspec.structs.replace(info, lease_holder=lease.holder, lease_since=lease.since)

    def state(self, info: ModelInfo) -> LeaseState:
        """The :class:`LeaseState` of the served model ``info``."""
        lease = self.lease_of(info.name)
        expires = None
        if lease is not None and lease.idle_since is not None:
            expires = max(0.0, self.idle_s - (self.clock() - lease.idle_since))
        pinned = tuple(PinnedWork(u, n) for u, n in sorted(self.work_on(info.fingerprint).items()))
        return LeaseState(
            model=info.name, fingerprint=info.fingerprint, holder=lease.holder if lease else None,
            since=lease.since if lease else None, expires_in_s=expires, pinned=pinned,
        )


LEASES_KEY = web.AppKey("leases", LeaseBook)


def setup(app: web.Application, idle_s: float) -> None:
    """Put a :class:`LeaseBook` on ``app`` (leases end after ``idle_s`` idle seconds)."""
    app[LEASES_KEY] = LeaseBook(idle_s)


def leases_of(app: web.Application) -> LeaseBook:
    """The app's :class:`LeaseBook`."""
    return app[LEASES_KEY]
