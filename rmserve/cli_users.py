"""``rmserve users add | list | remove``: the users file of a shared server.

The file format is described in :mod:`rmserve.server.sharing.auth`. ``add`` prints the new user's token
once, on stdout alone (so ``rmserve users add bob --users-file F > bob.token`` keeps it in a
file); the users file keeps only its salted hash.
"""

from __future__ import annotations

import datetime as dt
import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from rmserve.cli_common import Command, print_table, with_default

users_app = typer.Typer(
    name="users",
    help="Add, list or remove the users of a shared server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class RoleChoice(str, enum.Enum):
    """Roles on the command line."""

    scorer = "scorer"
    admin = "admin"


UsersFileOpt = Annotated[
    Path,
    typer.Option(
        "--users-file",
        metavar="FILE",
        help="The users file (JSON Lines; created by the first add, readable by its owner only).",
        show_default=False,
    ),
]


def _expiry(value: str | None) -> dt.datetime | None:
    if value is None:
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time (e.g. 2027-03-31T00:00:00Z)", param_hint="'--expires'"
        ) from None
    if when.tzinfo is None:
        raise typer.BadParameter(
            f"{value!r} has no time zone; add one (e.g. 2027-03-31T00:00:00Z or +02:00)", param_hint="'--expires'"
        )
    return when


def _fail(exc: ValueError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@users_app.command("add", cls=Command, short_help="Add a user; print its new token once.")
def add_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="User name (letters, digits, _ . @ -; at most 64).",
                                        show_default=False)],
    users_file: UsersFileOpt,
    role: Annotated[RoleChoice, typer.Option("--role", help="scorer: score and read; admin: also swap checkpoints.")]
    = RoleChoice.scorer,
    weight: Annotated[
        float, typer.Option("--weight", metavar="WEIGHT", help="Share of the engine under contention (> 0).")
    ] = 1,
    max_inflight_groups: Annotated[
        Optional[int],
        typer.Option("--max-inflight-groups", help=with_default("Groups this user may have in flight (≥ 1).", "no cap"),
                     show_default=False),
    ] = None,
    tokens_per_minute: Annotated[
        Optional[int],
        typer.Option("--tokens-per-minute", help=with_default("Prompt tokens this user may send per minute (≥ 1).",
                                                              "no limit"), show_default=False),
    ] = None,
    expires: Annotated[
        Optional[str],
        typer.Option("--expires", metavar="TIME", help=with_default(
                     "Time the token stops working, with a zone (2027-03-31T00:00:00Z).", "never"), show_default=False),
    ] = None,
) -> None:
    """Add a user with a new token; the token is printed once (stdout) and never stored."""
    from rmserve.server.sharing.auth import UsersFileError, add_user

    try:
        token, line = add_user(
            users_file, name, role=role.value, weight=weight, max_inflight_groups=max_inflight_groups,
            tokens_per_minute=tokens_per_minute, expires=_expiry(expires),
        )
    except UsersFileError as exc:
        raise _fail(exc) from None
    typer.echo(
        f"added user {line.name!r} ({line.role}) to {users_file}; its token follows, shown this once "
        "(the file keeps only its hash; a running server takes it on SIGHUP):",
        err=True,
    )
    typer.echo(token)


@users_app.command("list", cls=Command, short_help="List the users and their limits.")
def list_command(users_file: UsersFileOpt) -> None:
    """List the users: name, role, weight, limits, expiry (never a token or hash)."""
    from rmserve.server.sharing.auth import UsersFileError, read_users_file

    try:
        lines = read_users_file(users_file)
    except UsersFileError as exc:
        raise _fail(exc) from None
    print_table(
        ("name", "role", "weight", "max_inflight_groups", "tokens_per_minute", "expires"),
        (
            (
                line.name, line.role, f"{line.weight:g}", f"{line.max_inflight_groups or '-'}",
                f"{line.tokens_per_minute or '-'}", line.expires.isoformat() if line.expires is not None else "never",
            )
            for line in lines
        ),
    )


@users_app.command("remove", cls=Command, short_help="Remove a user.")
def remove_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The user to remove.", show_default=False)],
    users_file: UsersFileOpt,
) -> None:
    """Remove a user (its token stops working once the server reads the file again: SIGHUP or a restart)."""
    from rmserve.server.sharing.auth import UsersFileError, remove_user

    try:
        removed = remove_user(users_file, name)
    except UsersFileError as exc:
        raise _fail(exc) from None
    typer.echo(f"removed user {removed.name!r} from {users_file}; send the server SIGHUP (or restart it) to apply it", err=True)


# --- the client's token (eval, sweep) --------------------------------------------------------

TOKEN_ENV = "RMSERVE_TOKEN"
"""Environment variable holding the client's bearer token when ``--token-file`` is not given."""

TokenFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--token-file",
        metavar="FILE",
        help=with_default("File holding your token for a server started with --users-file (from rmserve users add).",
                          f"the token in ${TOKEN_ENV}; neither: no token is sent"),
        show_default=False,
    ),
]
"""``--token-file`` of every command that talks to a running server."""


def read_client_token(token_file: Path | None) -> str | None:
    """The client's token: ``token_file``'s stripped text, else ``$RMSERVE_TOKEN``, else None.

    The file wins over the environment; a token is never taken from the command line itself
    (it would show in ``ps`` and the shell history).

    Raises:
        typer.BadParameter: the file cannot be read, is empty, or holds more than one token.
    """
    import os

    if token_file is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise typer.BadParameter(f"{str(token_file)!r} cannot be read: {reason}", param_hint="'--token-file'") from None
    if not token:
        raise typer.BadParameter(f"{str(token_file)!r} is empty", param_hint="'--token-file'")
    if any(c.isspace() for c in token):
        raise typer.BadParameter(
            f"{str(token_file)!r} holds more than one word; it must hold the token alone", param_hint="'--token-file'"
        )
    return token
