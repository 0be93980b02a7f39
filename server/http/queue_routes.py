"""``GET /v1/queue``: the fair queue as the caller may see it.

The app's :class:`~rmserve.server.sharing.fair_queue.FairQueue` is put on it by
:func:`rmserve.server.http.app.create_app` (when ``ServerConfig.fair_share`` is on); the route is
in the one route table (:func:`rmserve.server.http.routes.setup`), which answers a node of
several models with :func:`rmserve.server.http.node.merge_queue_replies` over their replies.

``GET /v1/queue`` answers a :class:`QueueReply`: the totals of the queue, and the caller's own
queued and in-flight groups and estimated wait; an admin (:attr:`User.is_admin`, also the
anonymous user of a server without a users file) gets every user's entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from aiohttp import web
from rmserve.server.sharing.fair_queue import QueueState, UserQueueState, queue_of
from rmserve.server.sharing.users import ANONYMOUS, USER_KEY

UserQueue = UserQueueState
"""One user's entry of ``GET /v1/queue``: the queue's own record,
:class:`~rmserve.server.sharing.fair_queue.UserQueueState` (token counts are prompt tokens,
``tokens_per_s`` over the last 30 s, ``estimated_wait_s`` None until a throughput has been
measured)."""


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


def queue_reply(snapshot: QueueState | None, user_name: str, weight: float, admin: bool) -> QueueReply:
    """The reply for a caller named ``user_name`` from a queue snapshot (None: no fair queue).

    A caller the queue has not seen yet gets an entry of zeros (wait 0).
    """
    if snapshot is None:
        empty = UserQueue(user_name, weight, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
        return QueueReply(user_name, admin, False, 0, 0, 0, 0.0, (empty,))
    entries = [s for s in snapshot.users if admin or s.user == user_name]
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


def queue_reply_of(request: web.Request, app: web.Application) -> QueueReply:
    """:func:`queue_reply` for the request's user from the model app ``app``'s fair queue."""
    user = request.get(USER_KEY, ANONYMOUS)
    fair = queue_of(app)
    return queue_reply(fair.snapshot() if fair is not None else None, user.name, user.weight, user.is_admin)


def merge_queue_replies(replies: Sequence[QueueReply]) -> QueueReply:
    """Several models' :class:`QueueReply` as one: counts, tokens and tokens/s summed (per
    user and in total), a user's estimated wait the longest of its models' (None if any is
    None while that user has work queued there), ``fair_share`` true if any model has a queue.

    Raises:
        ValueError: no reply given.
    """
    if not replies:
        raise ValueError("merge_queue_replies: no reply to merge")
    if len(replies) == 1:
        return replies[0]
    users: dict[str, list[UserQueue]] = {}
    for reply in replies:
        for entry in reply.users:
            users.setdefault(entry.user, []).append(entry)
    merged = []
    for name in sorted(users):
        entries = users[name]
        waits = [e.estimated_wait_s for e in entries]
        merged.append(UserQueue(
            user=name,
            weight=entries[0].weight,
            queued_groups=sum(e.queued_groups for e in entries),
            queued_tokens=sum(e.queued_tokens for e in entries),
            inflight_groups=sum(e.inflight_groups for e in entries),
            inflight_tokens=sum(e.inflight_tokens for e in entries),
            served_groups=sum(e.served_groups for e in entries),
            served_tokens=sum(e.served_tokens for e in entries),
            tokens_per_s=sum(e.tokens_per_s for e in entries),
            estimated_wait_s=None if any(w is None for w in waits) else max(waits),  # type: ignore[type-var]
        ))
    first = replies[0]
    return QueueReply(
        user=first.user,
        admin=first.admin,
        fair_share=any(r.fair_share for r in replies),
        concurrency=sum(r.concurrency for r in replies),
        inflight_groups=sum(r.inflight_groups for r in replies),
        queued_groups=sum(r.queued_groups for r in replies),
        tokens_per_s=sum(r.tokens_per_s for r in replies),
        users=tuple(merged),
    )
