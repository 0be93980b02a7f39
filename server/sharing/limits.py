"""Per-user limits of a shared server: groups in flight and prompt tokens per minute.

A user of the users file may carry ``max_inflight_groups`` (groups admitted and not yet
answered) and ``tokens_per_minute`` (prompt tokens admitted per minute). The scoring path asks
here at admission (:meth:`UserLimits.admit`, through
:func:`rmserve.server.sharing.admission.admit`: the groups, before rendering) and once the
request is rendered (:meth:`UserHold.charge_tokens`: its prompt tokens, before the engine).
A request over either limit is refused whole with 429 ``overloaded``, a ``Retry-After`` and a
message naming the limit, its value and the user; nothing of it reaches the engine, and other
users are not affected. The server-wide ``max_inflight_groups`` and the engine's own queue
limits stay as back-stops behind these.

**Tokens per minute** use the fixed-window limiter of the ``limits`` library
(``limits.aio.strategies.FixedWindowRateLimiter`` on its in-process memory storage): a window
of 60 s opens with the user's first admitted tokens, and at most ``tokens_per_minute`` tokens
are admitted in it. ``Retry-After`` is the time until that window ends, when the whole budget
is free again. (A fixed window lets a user send up to twice the budget across a window
boundary; the limit is a fairness guard, not a billing meter.)

**Groups in flight** are counted here per user. Such a slot frees when one of the user's own
requests is answered, which the server cannot foretell: ``Retry-After`` is the server's
``retry_after_s``.

**A request over a whole limit.** A request whose tokens alone exceed ``tokens_per_minute``,
or whose groups alone exceed ``max_inflight_groups``, could never be admitted, however long it
waited: it is 413 ``request_over_limit`` (:class:`~rmserve.errors.OverLimit`, no
``Retry-After``), naming the limit, its value, what the request holds and the fix (fewer groups
per request, or a larger limit), with the numbers in ``error.limit`` so a client can split it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from aiohttp import web
from rmserve.server.swaps.state import METRICS_KEY
from rmserve.server.sharing.users import User

if TYPE_CHECKING:  # the limits library is a server extra: the CLI imports this module without it
    from limits import RateLimitItemPerMinute

from rmserve.errors import OverLimit, Overloaded

WINDOW_S = 60.0
"""Length of a ``tokens_per_minute`` window, seconds."""


@dataclass(slots=True)
class UserHold:
    """A request's hold on its user's limits, from :meth:`UserLimits.admit` until :meth:`release`.

    Attributes:
        user: whose request it is.
        num_groups: groups the request holds against ``max_inflight_groups``.
        tokens: prompt tokens charged so far against ``tokens_per_minute``.
    """

    limits: UserLimits
    user: User
    num_groups: int
    tokens: int = 0
    released: bool = field(default=False)

    async def charge_tokens(self, tokens: int) -> None:
        """Charge the request's prompt tokens (Σ tokens of the sequences it sends) against the
        user's ``tokens_per_minute``.

        Raises:
            OverLimit (413): ``tokens`` alone exceed ``tokens_per_minute``.
            Overloaded (429): the window's budget has less than ``tokens`` left;
                ``retry_after_s`` is the time until the window ends.
        """
        await self.limits.charge_tokens(self.user, tokens)
        self.tokens += tokens

    def release(self) -> None:
        """Give the groups back (the request is answered or failed); a second call does nothing."""
        if not self.released:
            self.released = True
            self.limits.release(self.user, self.num_groups)


class UserLimits:
    """The per-user limit state of one app.

    Args:
        metrics: the app's :class:`~rmserve.server.http.observability.ServerMetrics` (user series).
        retry_after_s: ``Retry-After`` of a refusal by ``max_inflight_groups``, seconds.
        clock: Unix time in seconds (a test seam; the ``limits`` storage keeps its own clock).
    """

    def __init__(self, metrics, retry_after_s: int, clock=time.time) -> None:
        self._metrics = metrics
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._inflight: Counter[str] = Counter()
        from limits.aio.storage import MemoryStorage
        from limits.aio.strategies import FixedWindowRateLimiter

        self._window = FixedWindowRateLimiter(MemoryStorage())
        self._items: dict[int, RateLimitItemPerMinute] = {}
        self._lock = asyncio.Lock()

    def inflight(self, user: User) -> int:
        """Groups of ``user`` admitted and not yet released."""
        return self._inflight[user.name]

    def admit(self, user: User, num_groups: int) -> UserHold:
        """Hold ``num_groups`` against ``user``'s ``max_inflight_groups``.

        Returns:
            The :class:`UserHold`; the caller must :meth:`~UserHold.release` it.

        Raises:
            OverLimit (413, field ``groups``): the request alone holds more groups than the
                user's cap.
            Overloaded (429): the user's groups in flight plus these would exceed the cap.
        """
        cap = user.max_inflight_groups
        if cap is not None:
            if num_groups > cap:
                raise OverLimit(
                    f"the request holds {num_groups:,} groups, more than user {user.name!r} may have in flight at "
                    f"once ({cap:,}, max_inflight_groups of the users file), so it can never be admitted; send at "
                    f"most {cap:,} groups per request, or ask an admin for a larger max_inflight_groups",
                    limit_name="user.max_inflight_groups", unit="groups", limit=cap, value=num_groups,
                )
            held = self._inflight[user.name]
            if held + num_groups > cap:
                self._metrics.user_limit_rejections.labels(user=user.name, limit="max_inflight_groups").inc()
                raise Overloaded(
                    f"user {user.name!r} has {held} groups in flight; {num_groups} more would exceed the user's "
                    f"max_inflight_groups={cap}; retry when some are answered",
                    value=held + num_groups, limit=cap, retry_after_s=float(self._retry_after_s),
                )
        self._inflight[user.name] += num_groups
        self._metrics.user_groups.labels(user=user.name).inc(num_groups)
        self._metrics.user_inflight_groups.labels(user=user.name).inc(num_groups)
        return UserHold(self, user, num_groups)

    def release(self, user: User, num_groups: int) -> None:
        """Give back ``num_groups`` of ``user``'s held groups (use :meth:`UserHold.release`)."""
        self._inflight[user.name] -= num_groups
        if self._inflight[user.name] <= 0:
            del self._inflight[user.name]
        self._metrics.user_inflight_groups.labels(user=user.name).dec(num_groups)

    def _item(self, tokens_per_minute: int) -> RateLimitItemPerMinute:
        item = self._items.get(tokens_per_minute)
        if item is None:
            from limits import RateLimitItemPerMinute

            item = self._items[tokens_per_minute] = RateLimitItemPerMinute(tokens_per_minute, namespace="rmserve-tpm")
        return item

    async def charge_tokens(self, user: User, tokens: int) -> None:
        """Admit ``tokens`` prompt tokens of ``user`` in the current window (see :meth:`UserHold.charge_tokens`)."""
        budget = user.tokens_per_minute
        if budget is not None and tokens > 0:
            if tokens > budget:
                raise OverLimit(
                    f"the request holds {tokens:,} prompt tokens, more than user {user.name!r}'s whole budget of "
                    f"{budget:,} tokens per minute (tokens_per_minute of the users file), so it can never be "
                    "admitted; send fewer groups per request (a group that alone holds more cannot be scored "
                    "under this budget), or ask an admin for a larger tokens_per_minute",
                    limit_name="user.tokens_per_minute", unit="tokens", limit=budget, value=tokens,
                )
            item = self._item(budget)
            async with self._lock:  # test then hit: a refused request must not use up the budget
                if not await self._window.test(item, user.name, cost=tokens):
                    stats = await self._window.get_window_stats(item, user.name)
                    wait_s = max(1.0, math.ceil(stats.reset_time - self._clock()))
                    used = budget - stats.remaining
                    self._metrics.user_limit_rejections.labels(user=user.name, limit="tokens_per_minute").inc()
                    raise Overloaded(
                        f"user {user.name!r} has sent {used:,} prompt tokens in this minute; {tokens:,} more would "
                        f"exceed the user's tokens_per_minute={budget:,}; retry in {wait_s:.0f} s",
                        value=used + tokens, limit=budget, retry_after_s=wait_s,
                    )
                await self._window.hit(item, user.name, cost=tokens)
        self._metrics.user_prompt_tokens.labels(user=user.name).inc(tokens)


LIMITS_KEY = web.AppKey("rmserve_user_limits", UserLimits)
"""Where the app keeps its :class:`UserLimits`."""


def install(app: web.Application) -> None:
    """Give ``app`` its :class:`UserLimits` (under :data:`LIMITS_KEY`); call after its metrics are set."""
    from rmserve.server.swaps.state import CONFIG_KEY

    app[LIMITS_KEY] = UserLimits(app[METRICS_KEY], app[CONFIG_KEY].retry_after_s)
