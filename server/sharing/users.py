"""Who is asking: the users of a shared scoring server.

A server started with a users file knows its users by the hash of their bearer token; one
without a users file serves a single :data:`ANONYMOUS` user on loopback only. The request's
:class:`User` is stored on the aiohttp request under :data:`USER_KEY` by the authentication
middleware, before any route runs; the scoring path, the fair queue, the limits, the logs and
the Prometheus labels read it from there.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

Role = Literal["scorer", "admin"]
"""``scorer``: may score and read the queue and models; ``admin``: also swaps checkpoints,
forces a swap past another user's lease and sees every user's queue."""


@dataclass(frozen=True, slots=True)
class User:
    """One user of the server.

    Attributes:
        name: unique name, shown in logs, metrics labels and the status page.
        role: :data:`Role`.
        weight: share of the engine under contention, relative to other users (> 0; the fair
            queue serves prompt tokens in proportion to it).
        max_inflight_groups: groups this user may have queued or at the engine at once
            (None = only the server-wide cap).
        tokens_per_minute: prompt tokens this user may submit per minute (None = no limit).
    """

    name: str
    role: Role = "scorer"
    weight: float = 1.0
    max_inflight_groups: int | None = None
    tokens_per_minute: int | None = None

    @property
    def is_admin(self) -> bool:
        """True for the ``admin`` role."""
        return self.role == "admin"


ANONYMOUS = User(name="anonymous", role="admin")
"""The only user of a server without a users file (it listens on loopback only)."""

USER_KEY = web.RequestKey("rmserve_user", User)
"""Where the authentication middleware puts the request's :class:`User`."""


CURRENT_USER: contextvars.ContextVar[User | None] = contextvars.ContextVar("rmserve_current_user", default=None)
"""The user of the request being handled in this task (set by the authentication middleware
around the route, None outside a request): read by the log filter
:class:`RequestUserLogFilter`, so every log line written while a request is handled names its
user, whichever module writes it."""


class RequestUserLogFilter(logging.Filter):
    """Appends ``[user NAME]`` to every log record written while a request is handled.

    Install it on a handler (``handler.addFilter(RequestUserLogFilter())``): handler filters
    see the records of every logger. Records written outside a request are left unchanged;
    the filter never drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the request's user to ``record``'s message; always True (keep the record)."""
        user = CURRENT_USER.get()
        if user is not None and not getattr(record, "rmserve_user", None):
            record.msg = f"{record.getMessage()} [user {user.name}]"
            record.args = None
            record.rmserve_user = user.name
        return True
