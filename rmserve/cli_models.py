"""``rmserve models list | load | release``: the models of a running server and their leases.

``list`` prints one line per served model: name, fingerprint, kind, who holds its lease and
since when (``GET /v1/models``). ``load`` makes the server score with another checkpoint
folder (``POST /v1/models/load``) and prints how it was loaded (``reload``: weights into the
running engine; ``restart``: the engine restarted on it). A load takes the model's lease; while
another user holds it or has pinned work in flight, the server refuses with 409 and the
command prints the server's message and exits 1, unless an admin passes ``--force``.
``release`` ends the caller's lease (``POST /v1/models/release``).

Tokens as for ``rmserve eval``: ``--token-file`` or ``$RMSERVE_TOKEN`` (a server started with a
users file; ``load`` needs an admin's token there). For a server started with an admin token
instead, ``load`` and ``release`` send ``--admin-token-file`` / ``$RMSERVE_ADMIN_TOKEN``.
Exit codes follow :mod:`rmserve.cli_common`: 0 done, 1 refused or failed (the server's message
on stderr), 2 bad options.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rmserve.cli_common import (
    EXIT_ERROR,
    Command,
    ServerOpt,
    WaitLoadOpt,
    WaitRetryAfterOpt,
    bad_parameter,
    error_line,
    guarded,
    read_admin_token,
    table_lines,
    with_default,
)
from rmserve.cli_users import TOKEN_ENV, TokenFileOpt, read_client_token

if TYPE_CHECKING:
    from rmserve.client.client import RewardClient
    from rmserve.schema import ModelInfo

models_app = typer.Typer(
    name="models",
    help="List models and leases; load a checkpoint; release a lease.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

LIST_COLUMNS = ("name", "fingerprint", "kind", "lease_holder", "lease_since")
"""Header of ``rmserve models list`` (tab-separated, one line per model)."""

NO_LEASE = "-"
"""What ``list`` shows in the lease columns of a model nobody holds."""

FORCE_HINT = (
    "an admin may add --force to swap anyway; runs pinned to the served checkpoint then stop with a 409, "
    "keep what they scored and resume once it is served again"
)
"""Printed after a load refused for another user's lease or pinned work (without ``--force``):
true whoever blocks it, a lease holder or other users' pinned work (the server's message says which)."""

SWAP_REFUSED = "checkpoint swap refused for "
"""How the server's message of a swap refused for a lease or pinned work begins
(:func:`rmserve.server.sharing.leases.swap_refusal`)."""

AdminTokenFileOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--admin-token-file",
        metavar="FILE",
        help=with_default(
            "File holding the admin token of a server started with --admin-token-file (no users file).",
            "the token in $RMSERVE_ADMIN_TOKEN, else the token of --token-file",
        ),
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the server's JSON reply instead of text.")]


def utc_time(unix_s: float) -> str:
    """``unix_s`` (Unix seconds) as an ISO 8601 UTC time to the second, e.g. ``2027-01-15T08:00:00Z``."""
    return dt.datetime.fromtimestamp(unix_s, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lease_columns(info: ModelInfo) -> tuple[str, str]:
    """(holder, since) of ``info``'s lease as ``list`` shows them; :data:`NO_LEASE` twice when nobody holds it."""
    import msgspec

    if info.lease_holder is msgspec.UNSET:
        return NO_LEASE, NO_LEASE
    since = NO_LEASE if info.lease_since is msgspec.UNSET else utc_time(info.lease_since)
    return info.lease_holder, since


def list_rows(models: tuple[ModelInfo, ...]) -> list[str]:
    """The lines ``rmserve models list`` prints: the header (:data:`LIST_COLUMNS`), then one
    tab-separated line per model, in the server's order; fingerprints are printed whole."""
    return table_lines(LIST_COLUMNS, ((info.name, info.fingerprint, info.kind, *lease_columns(info)) for info in models))


def _client(url: str, token: str | None, max_retry_after_s: float) -> RewardClient:
    """A client of the server at ``url`` (``--server``) waiting at most ``max_retry_after_s``
    (``--wait-retry-after-s``) on a Retry-After.

    Raises:
        typer.BadParameter: a bad wait or URL, blamed on its option.
    """
    from rmserve.client.client import RewardClient
    from rmserve.client.config import Retry

    try:
        retry = Retry(max_retry_after_s=max_retry_after_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--wait-retry-after-s'") from None
    try:
        return RewardClient(url, token=token, retry=retry)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--server'") from None


def _swap_token(admin_token_file: Path | None, token: str | None) -> str:
    """The token ``load`` and ``release`` send: the admin token, else the client's token.

    Raises:
        typer.BadParameter: neither is given, or ``--admin-token-file`` cannot be read.
    """
    admin = bad_parameter(lambda: read_admin_token(admin_token_file))
    chosen = admin or token
    if chosen is None:
        raise typer.BadParameter(
            f"no token to send: give --token-file FILE or set ${TOKEN_ENV} (a server with a users file: an admin's "
            "token), or --admin-token-file FILE (a server started with an admin token)",
            param_hint="'--token-file'",
        )
    return chosen


def _run(make: Any) -> Any:
    """``asyncio.run(make())`` under the one exit-code rule (:func:`rmserve.cli_common.guarded`)."""
    return guarded(lambda: asyncio.run(make()))


@models_app.command("list", cls=Command, short_help="List the served models, their fingerprints and leases.")
def list_command(
    server: ServerOpt,
    token_file: TokenFileOpt = None,
    as_json: JsonOpt = False,
    wait_retry_after_s: WaitRetryAfterOpt = 60,
) -> None:
    """List the models a server scores with: name, fingerprint, kind, lease holder and since when (UTC).

    A model nobody holds shows - in both lease columns.
    """
    from rmserve.schema import ModelList, encode

    client = _client(server, read_client_token(token_file), wait_retry_after_s)

    async def fetch():
        async with client:
            return await client.models()

    models = _run(fetch)
    if as_json:
        typer.echo(encode(ModelList(models=models)).decode())
        return
    for line in list_rows(models):
        typer.echo(line)


@models_app.command("load", cls=Command, short_help="Make a running server score with another checkpoint.")
def load_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Name the server reports for the checkpoint.",
                                        show_default=False)],
    path: Annotated[str, typer.Argument(metavar="PATH", help="Checkpoint folder as the server sees it (under one of "
                                        "its --checkpoint-root folders; an absolute path is safest).",
                                        show_default=False)],
    server: ServerOpt,
    force: Annotated[
        bool,
        typer.Option("--force", help="Swap even though another user holds the lease or has pinned work in flight "
                     "(admins only; runs pinned to the served checkpoint then stop with a 409 and keep what they "
                     "scored)."),
    ] = False,
    model: Annotated[
        Optional[str],
        typer.Option("--model", metavar="NAME", help=with_default("Served model the checkpoint replaces (a server with several).",
                                                  "the server's only model"), show_default=False),
    ] = None,
    wait_load_s: WaitLoadOpt = 1800,
    token_file: TokenFileOpt = None,
    admin_token_file: AdminTokenFileOpt = None,
    as_json: JsonOpt = False,
    wait_retry_after_s: WaitRetryAfterOpt = 60,
) -> None:
    """Load the checkpoint folder PATH as NAME on a running server; print the model now served and the swap kind.

    The load takes the model's lease. While another user holds it or has pinned work in flight the server refuses (409): its message is printed and the command exits 1; an admin may add --force.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve import errors
    from rmserve.schema import encode

    token = read_client_token(token_file)
    swap_token = _swap_token(admin_token_file, token)
    if not wait_load_s > 0:
        raise typer.BadParameter(f"{wait_load_s:g}; it must be > 0 seconds", param_hint="'--wait-load-s'")
    client = _client(server, token, wait_retry_after_s)

    async def load():
        async with client:
            return await client.load_checkpoint_reply(
                name, path, admin_token=swap_token, timeout_s=wait_load_s, force=force, model=model
            )

    def call():
        try:
            return asyncio.run(load())
        except errors.Conflict as exc:
            if force or not exc.message.startswith(SWAP_REFUSED):
                raise
            typer.echo(error_line(exc), err=True)
            typer.echo(FORCE_HINT, err=True)
            raise typer.Exit(EXIT_ERROR) from None

    reply = guarded(call)
    if as_json:
        typer.echo(encode(reply).decode())
        return
    (info,) = reply.models
    holder, since = lease_columns(info)
    lease = f"lease held by {holder} since {since}" if holder != NO_LEASE else "no lease held"
    typer.echo(
        f"loaded {path} as {info.name} (swap kind {reply.swap_kind}): fingerprint {info.fingerprint}, "
        f"kind {info.kind}, {lease}; swaps since the server started: {info.swap_count}"
    )


@models_app.command("release", cls=Command, short_help="End your lease on a served model.")
def release_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The served model whose lease ends.", show_default=False)],
    server: ServerOpt,
    token_file: TokenFileOpt = None,
    admin_token_file: AdminTokenFileOpt = None,
    wait_retry_after_s: WaitRetryAfterOpt = 60,
) -> None:
    """End the lease on the served model NAME (its holder or an admin), so another user may load a checkpoint."""
    token = read_client_token(token_file)
    swap_token = _swap_token(admin_token_file, token)
    client = _client(server, token, wait_retry_after_s)

    async def release():
        async with client:
            return await client.release_checkpoint(name, admin_token=swap_token)

    info = _run(release)
    typer.echo(f"released the lease on {info.name} (fingerprint {info.fingerprint})")
