"""``GET /v1/queue``: the fair queue as the caller may see it; and the app's fair-queue setup.

:func:`setup` (called once by :func:`rmserve.server.app.create_app`) puts a
:class:`~rmserve.server.fair_queue.FairQueue` on the app when ``ServerConfig.fair_share`` is
on, and adds ``GET /v1/queue`` plus the status page (:mod:`rmserve.server.status_page`).

``GET /v1/queue`` answers a :class:`QueueReply`: the totals of the queue, and the caller's own
queued and in-flight groups and estimated wait; an admin (:attr:`User.is_admin`, also the
anonymous user of a server without a users file) gets every user's entry.
"""

from __future__ import annotations

import msgspec
from aiohttp import web
from rmserve.server import status_page
from rmserve.server.fair_queue import QUEUE_KEY, FairQueue, QueueState, UserQueueState, queue_of
from rmserve.server.middleware import json_response
from rmserve.server.state import CONFIG_KEY
from rmserve.server.users import ANONYMOUS, USER_KEY


class UserQueue(msgspec.Struct, frozen=True):
    """One user's entry of ``GET /v1/queue`` (fields as
    :class:`~rmserve.server.fair_queue.UserQueueState`: token counts are prompt tokens,
    ``tokens_per_s`` over the last 30 s, ``estimated_wait_s`` None until a throughput has
    been measured)."""

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


class QueueReply(msgspec.Struct, frozen=True):
    """Body of ``GET /v1/queue``.

    Attributes:
        user: the caller's name.
        admin: whether ``users`` lists every user (admin) or only the caller.
        fair_share: False when the server runs without a fair queue (every count is then 0
            and ``users`` lists the caller with zeros).
        concurrency: most groups at the engine at once (0 without a fair queue).
        inflight_groups / queued_groups: all users together.
        tokens_per_s: the engine's recent prompt tokens/s, all users together.
        users: see ``admin``; by name.
    """

    user: str
    admin: bool
    fair_share: bool
    concurrency: int
    inflight_groups: int
    queued_groups: int
    tokens_per_s: float
    users: tuple[UserQueue, ...]


_encoder = msgspec.json.Encoder()


def _entry(state: UserQueueState) -> UserQueue:
    return UserQueue(**{f: getattr(state, f) for f in UserQueue.__struct_fields__})


def queue_reply(snapshot: QueueState | None, user_name: str, weight: float, admin: bool) -> QueueReply:
    """The reply for a caller named ``user_name`` from a queue snapshot (None: no fair queue).

    A caller the queue has not seen yet gets an entry of zeros (wait 0).
    """
    if snapshot is None:
        empty = UserQueue(user_name, weight, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
        return QueueReply(user_name, admin, False, 0, 0, 0, 0.0, (empty,))
    entries = [_entry(s) for s in snapshot.users if admin or s.user == user_name]
    if not any(e.user == user_name for e in entries):
        entries.append(UserQueue(user_name, weight, 0, 0, 0, 0, 0, 0, 0.0, 0.0))
        entries.sort(key=lambda e: e.user)
    return QueueReply(
        user=user_name,
        admin=admin,
        fair_share=True,
        concurrency=snapshot.concurrency,
        inflight_groups=snapshot.inflight_groups,
        queued_groups=snapshot.queued_groups,
        tokens_per_s=snapshot.tokens_per_s,
        users=tuple(entries),
    )


async def queue(request: web.Request) -> web.Response:
    """``GET /v1/queue``: :class:`QueueReply` for the request's user (see the module docstring)."""
    user = request.get(USER_KEY, ANONYMOUS)
    fair = queue_of(request.app)
    snapshot = fair.snapshot() if fair is not None else None
    reply = queue_reply(snapshot, user.name, user.weight, user.is_admin)
    return json_response(_encoder.encode(reply), 200)


def setup(app: web.Application) -> None:
    """Add the fair queue (when ``fair_share`` is on), ``GET /v1/queue`` and the status page."""
    config = app[CONFIG_KEY]
    if config.fair_share:
        app[QUEUE_KEY] = FairQueue(config.engine_concurrency_groups, config.fair_share_quantum_tokens,
                                   interactive_boost=config.fair_share_interactive_boost)
    app.router.add_get("/v1/queue", queue)
    status_page.setup(app)
