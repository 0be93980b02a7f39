"""A stand-in for the authentication middleware in app tests over fake engines."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from rmserve.server.sharing.users import USER_KEY, User


def user_header_middleware(users: Mapping[str, User]):
    """An aiohttp middleware that puts ``users[name]`` on the request for the header
    ``X-Test-User: name`` (no header: no user, as a server without a users file sees it)."""

    @web.middleware
    async def user_from_test_header(request: web.Request, handler):
        name = request.headers.get("X-Test-User")
        if name is not None:
            request[USER_KEY] = users[name]
        return await handler(request)

    return user_from_test_header
