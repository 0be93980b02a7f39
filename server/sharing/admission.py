"""One admission of a scoring request's groups: every in-flight count taken and given back together.

A ``POST /v1/score`` request holds its groups, from admission until it is answered, against
four counts that must move together:

- the model app's ``max_inflight_groups`` (:class:`~rmserve.server.config.ServerConfig`; 0 = no
  limit), checked against :attr:`~rmserve.server.swaps.state.EngineState.inflight_groups`;
- the user's own ``max_inflight_groups`` and ``tokens_per_minute``
  (:class:`~rmserve.server.sharing.limits.UserLimits`, shared by every model of a node);
- the engine state's count (:meth:`~rmserve.server.swaps.state.EngineState.admit_groups`);
- the ``rmserve_inflight_groups`` gauge of the app's metrics.

:func:`admit` checks the first two (nothing is held when it refuses) and takes all four; the
:class:`Admission` it returns gives all of them back once, on :meth:`Admission.release` or at
the end of its ``with`` block::

    with admission.admit(app, caller.user, len(request.groups)) as held:
        ...  # render
        await held.charge_tokens(prompt_tokens)
        ...  # engine
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from rmserve.server.sharing.limits import LIMITS_KEY, UserHold
from rmserve.server.sharing.users import User
from rmserve.server.swaps.state import CONFIG_KEY, METRICS_KEY, STATE_KEY, EngineState

from rmserve.errors import OverLimit, Overloaded


def check_server_limit(state: EngineState, num_groups: int, limit: int) -> None:
    """Check ``num_groups`` against the app's ``max_inflight_groups`` (``limit``; 0 = no limit).

    Raises:
        OverLimit (413, field ``groups``): the request alone holds more than ``limit`` groups.
        Overloaded: the groups in flight plus these would exceed ``limit``.
    """
    if not limit:
        return
    if num_groups > limit:
        raise OverLimit(
            f"the request holds {num_groups:,} groups, more than the server admits at once ({limit:,}, "
            "--max-inflight-groups), so it can never be admitted; send at most "
            f"{limit:,} groups per request, or start the server with a larger --max-inflight-groups",
            limit_name="server.max_inflight_groups", unit="groups", limit=limit, value=num_groups,
        )
    if state.inflight_groups + num_groups > limit:
        raise Overloaded(
            f"{state.inflight_groups} groups in flight; admitting {num_groups} more would exceed "
            f"max_inflight_groups={limit}; retry later",
            limit=limit,
        )


@dataclass(slots=True)
class Admission:
    """A request's hold on every in-flight count of one model app (see the module docstring),
    from :func:`admit` until :meth:`release` (or the end of its ``with`` block).

    Attributes:
        num_groups: the groups held.
        user: whose request it is.
    """

    _state: EngineState
    _gauge: object
    _hold: UserHold
    num_groups: int
    released: bool = field(default=False)

    @property
    def user(self) -> User:
        """The user the groups are held for."""
        return self._hold.user

    async def charge_tokens(self, tokens: int) -> None:
        """Charge the request's prompt tokens against the user's ``tokens_per_minute``
        (:meth:`~rmserve.server.sharing.limits.UserHold.charge_tokens`).

        Raises:
            OverLimit (413): ``tokens`` alone exceed the user's ``tokens_per_minute``.
            Overloaded (429): the user's window has less than ``tokens`` left.
        """
        await self._hold.charge_tokens(tokens)

    def release(self) -> None:
        """Give every count back (the request is answered or failed); a second call does nothing."""
        if self.released:
            return
        self.released = True
        self._hold.release()
        self._state.release_groups(self.num_groups)
        self._gauge.dec(self.num_groups)

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def admit(app: web.Application, user: User, num_groups: int) -> Admission:
    """Admit ``num_groups`` groups of ``user`` on the model app ``app``.

    Checks, in order: the app's ``max_inflight_groups`` (:func:`check_server_limit`), then the
    user's ``max_inflight_groups`` (:meth:`~rmserve.server.sharing.limits.UserLimits.admit`);
    then counts the groups in the engine state and the ``rmserve_inflight_groups`` gauge.

    Returns:
        The :class:`Admission`; release it (use it as a context manager).

    Raises:
        OverLimit (413, field ``groups``): the request alone holds more groups than the
            app's or the user's cap.
        Overloaded (429): the groups in flight plus these would exceed the app's or the
            user's cap. Nothing is held after a refusal.
    """
    state = app[STATE_KEY]
    check_server_limit(state, num_groups, app[CONFIG_KEY].max_inflight_groups)
    hold = app[LIMITS_KEY].admit(user, num_groups)
    gauge = app[METRICS_KEY].inflight_groups
    state.admit_groups(num_groups)
    gauge.inc(num_groups)
    return Admission(state, gauge, hold, num_groups)
