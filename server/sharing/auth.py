"""Users file and bearer-token authentication of a shared scoring server.

**The users file** is JSON Lines: one JSON object per line, one user per object. Blank lines
and lines whose first non-blank character is ``#`` are ignored (comments), so the file can be
edited by hand. Fields (unknown fields are refused, so a misspelt limit is never ignored):

=====================  ==========================================================================
``name``               unique user name, 1-64 characters of ``A-Z a-z 0-9 _ . @ -`` starting with a
                       letter or digit (shown in logs, Prometheus labels and the status page)
``token_sha256``       hex SHA-256 of the salt bytes followed by the token's UTF-8 bytes
``salt``               hex of 16 random bytes, the user's own salt
``role``               ``scorer`` (score, read models and queue) or ``admin`` (also checkpoint swaps);
                       default ``scorer``
``weight``             share of the engine under contention (> 0); default 1
``max_inflight_groups``  groups this user may have admitted at once (≥ 1), or null: no per-user cap
``tokens_per_minute``  prompt tokens this user may submit per minute (≥ 1), or null: no limit
``expires``            RFC 3339 time with a zone (``2027-03-31T00:00:00Z``) after which the token is
                       refused, or null: never
=====================  ==========================================================================

``rmserve users add NAME`` writes a line and prints the new token once; the file never holds a
token, only its salted hash.

**Why a salted SHA-256 and not a password hash.** A token is 32 random bytes
(:func:`new_token`, 256 bits), so there is no dictionary to try and no need for a slow hash
(bcrypt, scrypt, Argon2): a preimage of SHA-256 is out of reach whatever the attacker's
hardware, and a fast hash keeps authentication at a few microseconds per user. The per-user
salt makes equal tokens give different lines and rules out precomputed tables should a weak
token ever be put in by hand. Every request's token is hashed with every user's salt and
compared in constant time (:func:`hmac.compare_digest`) against every line, without stopping
at a match, so the time taken does not depend on which user (if any) matched.

**Which routes need a token** (:func:`route_user`): with a users file, every route but
``GET /health``, the status page ``/`` and its ``/static/…`` files needs
``Authorization: Bearer <token>`` (or ``Basic`` credentials whose password is the token, for
clients that only take a URL); ``POST /v1/models/load`` needs the ``admin`` role. Without
a users file, ``POST /v1/models/load`` and ``POST /v1/models/release`` need the server's admin
token (``--admin-token-file``; 403 when it has none) and every other route is open.

**One token check** (:func:`check_token`) serves both: the header's token is taken as the
bytes the client sent (:func:`bearer_token`; aiohttp hands non-UTF-8 header bytes over as
surrogate escapes, which are turned back into those bytes), hashed with each credential's
salt and compared in constant time on the digests. The admin token is a credential of its own
(:class:`AdminToken`), so a header of any bytes is a 401 (or 403) in every mode, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from aiohttp import web
from rmserve.server.sharing.users import ANONYMOUS, User

from rmserve.errors import Forbidden, Unauthorized, field_path, validation_reason

TOKEN_BYTES = 32
"""Random bytes in a new token (:func:`secrets.token_urlsafe`; 43 URL-safe characters)."""

SALT_BYTES = 16
"""Random bytes in a user's salt."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,63}$"
"""What a user name may be: safe in a log line, a Prometheus label value and a URL."""

PUBLIC_PATHS: frozenset[str] = frozenset({"/health", "/"})
"""Paths answered without a token (they show no secrets)."""

PUBLIC_PREFIXES: tuple[str, ...] = ("/static/",)
"""Path prefixes answered without a token (the status page's files)."""

ADMIN_ROUTES: frozenset[tuple[str, str]] = frozenset({("POST", "/v1/models/load")})
"""(method, path) pairs only the ``admin`` role may use."""

ADMIN_TOKEN_ROUTES: frozenset[tuple[str, str]] = frozenset({("POST", "/v1/models/load"), ("POST", "/v1/models/release")})
"""(method, path) pairs that need the admin token on a server without a users file."""

RejectReason = Literal["missing", "malformed", "unknown", "expired", "forbidden"]
"""Why a request was refused, the ``reason`` label of ``rmserve_auth_rejections_total``:
no ``Authorization`` header; a header that is not ``Bearer <token>``; a token no user has;
the token of a user whose ``expires`` has passed; a route the user's role may not use."""

REJECT_REASONS: tuple[RejectReason, ...] = ("missing", "malformed", "unknown", "expired", "forbidden")


class AuthRejected(Unauthorized):
    """401 ``unauthorized``: no valid token. ``reason`` is a :data:`RejectReason`."""

    def __init__(self, message: str, reason: RejectReason) -> None:
        super().__init__(message)
        self.reason = reason


class RoleForbidden(Forbidden):
    """403 ``forbidden``: the user's role may not use the route, or (no users file) the route
    needs an admin token the server was not given (reason ``forbidden``)."""

    reason: RejectReason = "forbidden"


class UsersFileError(ValueError):
    """The users file cannot be read or a line is invalid; the message names the file, the
    line (1-based) and the field."""


# --- the file's records ----------------------------------------------------------------------

UserName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
HexDigest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
HexSalt = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}$")]
Weight = Annotated[float, msgspec.Meta(gt=0, le=1_000_000)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
ZonedTime = Annotated[dt.datetime, msgspec.Meta(tz=True)]


class UserLine(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=False):
    """One line of the users file (see the module docstring for the fields)."""

    name: UserName
    token_sha256: HexDigest
    salt: HexSalt
    role: Literal["scorer", "admin"] = "scorer"
    weight: Weight = 1.0
    max_inflight_groups: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    expires: ZonedTime | None = None

    def user(self) -> User:
        """The :class:`User` this line describes (without its secret)."""
        return User(
            name=self.name,
            role=self.role,
            weight=self.weight,
            max_inflight_groups=self.max_inflight_groups,
            tokens_per_minute=self.tokens_per_minute,
        )


def new_token() -> str:
    """A fresh bearer token: :data:`TOKEN_BYTES` random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str, salt_hex: str) -> str:
    """Hex SHA-256 of ``bytes.fromhex(salt_hex) + token.encode("utf-8")``."""
    return hashlib.sha256(bytes.fromhex(salt_hex) + token.encode("utf-8")).hexdigest()


# --- reading the file ----------------------------------------------------------------------


def _content_lines(text: str) -> Iterable[tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, stripped


def parse_users(text: str, path: str = "<users file>") -> tuple[UserLine, ...]:
    """The users of a users file's ``text`` (``path`` names it in errors).

    Raises:
        UsersFileError: a line that is not a JSON object of the right fields and values
            (names the file, the line and the field), or a name that appears twice (names
            both lines).
    """
    users: list[UserLine] = []
    seen: dict[str, int] = {}
    decoder = msgspec.json.Decoder(UserLine)
    for number, line in _content_lines(text):
        try:
            entry = decoder.decode(line.encode("utf-8"))
        except msgspec.ValidationError as exc:
            field = field_path(exc)
            where = f", field {field!r}" if field else ""
            raise UsersFileError(f"users file {path!r}, line {number}{where}: {validation_reason(exc)}") from None
        except msgspec.DecodeError as exc:
            raise UsersFileError(f"users file {path!r}, line {number}: not a JSON object ({exc})") from None
        if entry.name in seen:
            raise UsersFileError(
                f"users file {path!r}, line {number}, field 'name': user {entry.name!r} is already on line "
                f"{seen[entry.name]}; names must be unique"
            )
        seen[entry.name] = number
        users.append(entry)
    return tuple(users)


def read_users_file(path: str | os.PathLike[str]) -> tuple[UserLine, ...]:
    """Read and check a users file (:func:`parse_users`); a missing file is an error.

    Raises:
        UsersFileError: the file cannot be read, holds no user, or a line is invalid.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsersFileError(f"users file {name!r} cannot be read: {reason}") from None
    users = parse_users(text, name)
    if not users:
        raise UsersFileError(
            f"users file {name!r} holds no user; add one with: rmserve users add NAME --users-file {name}"
        )
    return users


# --- authentication --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Credential:
    user: User
    salt: bytes
    digest: bytes
    expires_s: float | None


_WHITESPACE = b" \t\r\n\x0b\x0c"

MISSING_MESSAGE = (
    "this server needs a token: send the header Authorization: Bearer <token>, or Basic credentials whose "
    "password is the token (a URL http://NAME:TOKEN@HOST:PORT/...; NAME is not checked)"
)
"""The message of a 401 for a request without a token."""

MALFORMED_MESSAGE = (
    "malformed Authorization header: expected 'Bearer <token>' (one token, no spaces) or Basic credentials "
    "whose password is the token"
)
"""The message of a 401 for a header that is neither ``Bearer <token>`` nor ``Basic``."""

NOT_UTF8_MESSAGE = (
    "malformed Authorization header: the token is not UTF-8 (a client that sends a token with non-ASCII "
    "characters as Latin-1?)"
)
"""The message of a 401 for a token whose bytes are not UTF-8 text."""


def _basic_password(credentials: bytes) -> bytes:
    """The password of ``Basic`` credentials (RFC 7617: base64 of ``user-id:password``).

    The user-id is not checked: the token alone says who is asking, so a client that can only
    put credentials in its URL (``http://NAME:TOKEN@host:8000/…``; aiohttp and requests send
    them as ``Basic``) authenticates with the token as the password and any name.

    Raises:
        AuthRejected: reason ``malformed`` (not base64, no ``:``, or an empty password).
    """
    try:
        decoded = base64.b64decode(credentials, validate=True)
    except (binascii.Error, ValueError):
        raise AuthRejected(
            "malformed Authorization header: Basic credentials are not base64 (RFC 7617)", "malformed"
        ) from None
    _, colon, password = decoded.partition(b":")
    if not colon or not password:
        raise AuthRejected(
            "malformed Authorization header: Basic credentials need the token as the password (NAME:TOKEN, "
            "e.g. http://NAME:TOKEN@host:8000/… in a client's URL)", "malformed"
        )
    return password


def bearer_token(authorization: str | None) -> bytes:
    """The token of an ``Authorization`` header, as the bytes the client sent.

    Two schemes carry it: ``Bearer <token>`` (what rmserve's own clients send) and ``Basic``
    with the token as the password (RFC 7617; for clients that take no header option but
    accept credentials in a URL, e.g. OpenRLHF's ``--reward.remote_url``).

    Args:
        authorization: the header's value as aiohttp gives it (bytes that are not UTF-8 come as
            surrogate escapes, ``\\udcf6`` for the byte 0xf6), or None when absent.

    Returns:
        The token's bytes (the scheme is matched in any case; spaces around the token are
        ignored).

    Raises:
        AuthRejected: reason ``missing`` (no header, or only spaces) or ``malformed`` (another
            scheme, no token, more than one word, Basic credentials that are not base64 or have
            no password, or a token that is not UTF-8: no token this server knows can be, as
            every token is UTF-8 text).
    """
    if authorization is None:
        raise AuthRejected(MISSING_MESSAGE, "missing")
    try:
        raw = authorization.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is not an escaped byte: not from the wire
        raise AuthRejected(MALFORMED_MESSAGE, "malformed") from None
    raw = raw.strip(_WHITESPACE)
    if not raw:
        raise AuthRejected(MISSING_MESSAGE, "missing")
    words = raw.split()
    scheme = words[0].lower()
    if len(words) != 2 or scheme not in (b"bearer", b"basic"):
        raise AuthRejected(MALFORMED_MESSAGE, "malformed")
    token = words[1] if scheme == b"bearer" else _basic_password(words[1])
    try:
        token.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthRejected(NOT_UTF8_MESSAGE, "malformed") from None
    return token


def check_token(
    authorization: str | None, credentials: Sequence[_Credential], *, now_s: float,
    unknown: str = "unknown token: no user of this server has it",
) -> User:
    """The one token check of the server, for users and for the admin token alike.

    The header's token (:func:`bearer_token`, the bytes the client sent) is hashed with every
    credential's salt and each SHA-256 digest compared in constant time
    (:func:`hmac.compare_digest`) with the credential's, without stopping at a match, so the
    time taken does not tell which credential (if any) matched.

    Args:
        authorization: the ``Authorization`` header's value, or None when absent.
        credentials: who may be matched (a users file's lines, or :class:`AdminToken`'s one).
        now_s: the current time (Unix seconds), for a credential's expiry.
        unknown: the message of a token that matches no credential.

    Returns:
        The matching credential's user.

    Raises:
        AuthRejected: reason ``missing`` / ``malformed`` (:func:`bearer_token`), ``unknown``
            (no credential has the token) or ``expired`` (names the user and the time).
    """
    raw = bearer_token(authorization)
    found: _Credential | None = None
    for credential in credentials:  # every one, no early exit: time does not tell who matched
        if hmac.compare_digest(hashlib.sha256(credential.salt + raw).digest(), credential.digest):
            found = credential
    if found is None:
        raise AuthRejected(unknown, "unknown")
    if found.expires_s is not None and now_s >= found.expires_s:
        when = dt.datetime.fromtimestamp(found.expires_s, dt.timezone.utc).isoformat(timespec="seconds")
        raise AuthRejected(f"the token of user {found.user.name!r} expired at {when}; ask an admin for a new one", "expired")
    return found.user


class AdminToken:
    """The admin token of a server without a users file (``--admin-token-file`` or
    ``RMSERVE_ADMIN_TOKEN``), checked by :func:`check_token` like a user's token: kept only as
    a salted SHA-256 of its UTF-8 bytes (a fresh random salt per server).

    Args:
        token: the admin token (non-empty text).
    """

    def __init__(self, token: str) -> None:
        salt = secrets.token_bytes(SALT_BYTES)
        digest = hashlib.sha256(salt + token.encode("utf-8", "surrogateescape")).digest()
        self._credentials = (_Credential(user=ANONYMOUS, salt=salt, digest=digest, expires_s=None),)

    def authenticate(self, authorization: str | None, *, now_s: float) -> User:
        """:data:`~rmserve.server.sharing.users.ANONYMOUS` when the header carries the admin token.

        Raises:
            AuthRejected (401): reason ``missing``, ``malformed`` or ``unknown`` (the wrong token).
        """
        return check_token(
            authorization, self._credentials, now_s=now_s,
            unknown="wrong admin token: it is not the token this server was started with (--admin-token-file or "
            "RMSERVE_ADMIN_TOKEN)",
        )


class UserRegistry:
    """The users a server knows, and token → user.

    Args:
        lines: the users file's records (:func:`read_users_file`).
    """

    def __init__(self, lines: Sequence[UserLine]) -> None:
        self.replace(lines)

    def replace(self, lines: Sequence[UserLine]) -> tuple[list[str], list[str]]:
        """Know exactly the users of ``lines`` from now on (a reloaded users file); requests
        already past authentication keep the user they had. Returns (added, removed) names."""
        before = set(getattr(self, "users", {}))
        credentials = tuple(
            _Credential(
                user=line.user(),
                salt=bytes.fromhex(line.salt),
                digest=bytes.fromhex(line.token_sha256),
                expires_s=None if line.expires is None else line.expires.timestamp(),
            )
            for line in lines
        )
        users = {c.user.name: c.user for c in credentials}
        self._credentials, self.users = credentials, users  # one step: no request sees half of each
        return sorted(users.keys() - before), sorted(before - users.keys())

    users: dict[str, User]
    """Name → user, in file order."""

    async def reload(self, path: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
        """Read the users file ``path`` again (in a thread) and :meth:`replace` the users with
        its records; returns (added, removed) names. A user whose line changed (role, weight,
        limits, token, expiry) has the new values for every later request.

        Raises:
            UsersFileError: the file cannot be read or is invalid; the users stay as they were.
        """
        import asyncio

        lines = await asyncio.to_thread(read_users_file, path)
        return self.replace(lines)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> UserRegistry:
        """The registry of a users file (raises :class:`UsersFileError`, see :func:`read_users_file`)."""
        return cls(read_users_file(path))

    def authenticate(self, authorization: str | None, *, now_s: float) -> User:
        """The user whose token the ``Authorization`` header carries (:func:`check_token`).

        Args:
            authorization: the header's value, or None when absent.
            now_s: the current time (Unix seconds), for ``expires``.

        Raises:
            AuthRejected: reason ``missing`` (no header), ``malformed`` (not ``Bearer`` and one
                UTF-8 token), ``unknown`` (no user has the token) or ``expired`` (names the user
                and the time).
        """
        return check_token(authorization, self._credentials, now_s=now_s)


def is_public(path: str) -> bool:
    """Whether ``path`` is answered without a token (``/health``, ``/``, ``/static/…``)."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def check_role(user: User, method: str, path: str) -> None:
    """Raise :class:`RoleForbidden` when ``user``'s role may not use ``method path``."""
    if (method.upper(), path) in ADMIN_ROUTES and not user.is_admin:
        raise RoleForbidden(
            f"user {user.name!r} has the role {user.role!r}; {method.upper()} {path} needs the role 'admin'"
        )


def route_user(
    registry: UserRegistry | None, request: web.Request, *, now_s: float, admin: AdminToken | None = None
) -> User | None:
    """Who a request is from, or None for a public path of a server with users.

    Without a registry (no users file) every request is :data:`ANONYMOUS`; the routes of
    :data:`ADMIN_TOKEN_ROUTES` then need the ``admin`` token (:meth:`AdminToken.authenticate`),
    and are refused when the server has none.

    Raises:
        AuthRejected (401): see :func:`check_token`.
        RoleForbidden (403): see :func:`check_role`; or no users file and no admin token for a
            route of :data:`ADMIN_TOKEN_ROUTES`.
    """
    if registry is None:
        if (request.method.upper(), request.path) in ADMIN_TOKEN_ROUTES:
            if admin is None:
                raise RoleForbidden(
                    f"{request.method.upper()} {request.path} is disabled: the server was started without a users "
                    "file and without an admin token (--admin-token-file or RMSERVE_ADMIN_TOKEN)"
                )
            admin.authenticate(request.headers.get("Authorization"), now_s=now_s)
        return ANONYMOUS
    if is_public(request.path):
        return None
    user = registry.authenticate(request.headers.get("Authorization"), now_s=now_s)
    check_role(user, request.method, request.path)
    return user


USERS_KEY = web.AppKey("rmserve_users", UserRegistry)
"""Where the app keeps its :class:`UserRegistry` (absent: no users file, every request is anonymous)."""

ADMIN_TOKEN_KEY = web.AppKey("rmserve_admin_token", AdminToken)
"""Where the app keeps its :class:`AdminToken` (only without a users file, and only when one was given)."""


def install(app: web.Application, config) -> None:
    """Give the front door ``app`` what :func:`route_user` checks against: the users file's
    :class:`UserRegistry` under :data:`USERS_KEY`, else the admin token (when the
    :class:`~rmserve.server.config.ServerConfig` ``config`` has one) under :data:`ADMIN_TOKEN_KEY`."""
    if config.users_file is not None:
        app[USERS_KEY] = UserRegistry(config.users)
    elif config.admin_token is not None:
        app[ADMIN_TOKEN_KEY] = AdminToken(config.admin_token)


# --- writing the file ------------------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, readable by its owner only (mode 0600)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_user(
    path: str | os.PathLike[str],
    name: str,
    *,
    role: Literal["scorer", "admin"] = "scorer",
    weight: float = 1.0,
    max_inflight_groups: int | None = None,
    tokens_per_minute: int | None = None,
    expires: dt.datetime | None = None,
) -> tuple[str, UserLine]:
    """Append a user with a fresh token to the users file (created, mode 0600, if missing).

    Returns:
        (the token, the line written). The token is not stored anywhere: show it once.

    Raises:
        UsersFileError: the existing file is invalid, already has ``name``, or a value is
            invalid (names the field).
    """
    file = Path(path)
    existing = file.read_text(encoding="utf-8") if file.exists() else ""
    lines = parse_users(existing, str(file))
    if any(line.name == name for line in lines):
        raise UsersFileError(f"users file {str(file)!r} already has a user {name!r}; remove it first or pick another name")
    token = new_token()
    salt = secrets.token_hex(SALT_BYTES)
    raw = {
        "name": name,
        "token_sha256": hash_token(token, salt),
        "salt": salt,
        "role": role,
        "weight": weight,
        "max_inflight_groups": max_inflight_groups,
        "tokens_per_minute": tokens_per_minute,
        "expires": None if expires is None else expires.isoformat(),
    }
    try:
        line = msgspec.convert(raw, UserLine)
    except msgspec.ValidationError as exc:
        raise UsersFileError(f"{field_path(exc) or 'user'}: {validation_reason(exc)}") from None
    text = existing if not existing or existing.endswith("\n") else existing + "\n"
    _write_private(file, text + msgspec.json.encode(line).decode("utf-8") + "\n")
    return token, line


def remove_user(path: str | os.PathLike[str], name: str) -> UserLine:
    """Remove user ``name`` from the users file (comments and other lines are kept as they are).

    Returns:
        The removed line.

    Raises:
        UsersFileError: the file cannot be read, is invalid, or has no user ``name``.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsersFileError(f"users file {str(file)!r} cannot be read: {exc.strerror}") from None
    lines = parse_users(text, str(file))
    removed = next((line for line in lines if line.name == name), None)
    if removed is None:
        names = ", ".join(line.name for line in lines) or "none"
        raise UsersFileError(f"users file {str(file)!r} has no user {name!r} (users: {names})")
    kept = []
    for raw_line in text.splitlines(keepends=True):
        stripped = raw_line.strip()
        if stripped and not stripped.startswith("#"):
            if msgspec.json.decode(stripped.encode("utf-8"), type=UserLine).name == name:
                continue
        kept.append(raw_line)
    _write_private(file, "".join(kept))
    return removed
