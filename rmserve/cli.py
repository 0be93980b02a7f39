"""The ``rmserve`` command line: one typer sub-app per command group.

Commands parse options, build a config, call one library function and render its result.
Heavy imports (vllm, torch, transformers) happen inside the commands that need them.
Every command follows one exit-code rule (:mod:`rmserve.cli_common`): 0 success, 1 an error
other than bad input, 2 bad user input (option values, data files), 130 interrupted.
"""

from __future__ import annotations

import typer

from rmserve.cli_eval import register as _register_eval
from rmserve.cli_metrics import metrics_app
from rmserve.cli_server import register as _register_server
from rmserve.cli_sweep import register as _register_sweep

app = typer.Typer(
    name="rmserve",
    help="Score reward models on RM-Bench and RewardBench 2 through a scoring server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(metrics_app, name="metrics")
_register_server(app)
_register_eval(app)
_register_sweep(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
