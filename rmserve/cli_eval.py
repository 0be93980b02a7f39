"""``rmserve eval`` and ``rmserve run``.

Each command parses its options into a config (:class:`~rmserve.pipelines.evaluate.EvalConfig`,
:class:`~rmserve.pipelines.launch.RunConfig`), makes one library call and prints the metrics
stage's table (or, with ``--json``, its results dict). Exit codes follow
:mod:`rmserve.cli_common`: bad options or bad ``--data`` 2, a run that fails 1 (one line
naming the error type), a run that finished with groups that could not be scored 3, Ctrl-C 130. ``run`` takes every engine option of ``serve``, declared
once (:func:`rmserve.cli_common.with_engine_options`).

The score store (``--store PATH``, :mod:`rmserve.client.score_store`) is used when ``--store`` is
given or ``$RMSERVE_STORE`` is set, and never with ``--no-store``.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rmserve.cli_users import TokenFileOpt, read_client_token
from rmserve.cli_common import (
    MODEL_HELP_JUDGE_URL,
    Command,
    EXIT_UNSCORED,
    MaxTokensOpt,
    Side,
    StrictOpt,
    TruncationOpt,
    bad_parameter,
    guarded,
    model_argument,
    truncation_option,
    QUIET_HELP,
    PRIORITY_HELP,
    PriorityHint,
    only_option,
    only_help,
    SEED_HELP,
    resamples_help,
    with_default,
    with_engine_options,
)


class Bench(str, enum.Enum):
    """Benchmarks on the command line."""

    rm_bench = "rm-bench"
    rewardbench2 = "rewardbench2"


def _eval_config(
    *,
    server_url: str | None,
    bench: Bench,
    data: str,
    out: Path,
    max_in_flight: int,
    groups_per_request: int,
    timeout_s: float,
    ready_timeout_s: float,
    only: list[str] | None,
    model: str | None,
    overwrite: bool,
    fsync: bool,
    quiet: bool,
    resamples: int,
    seed: int,
    store: Path | None = None,
    truncation: Side | None = None,
    max_tokens: int | None = None,
    strict: bool = False,
    wait_for_server: bool = False,
    token: str | None = None,
    priority: PriorityHint = PriorityHint.interactive,
):
    from rmserve.pipelines.evaluate import EvalConfig

    selected = only_option([bench.value], only)
    only = list(selected[bench.value]) if selected else None
    return bad_parameter(lambda: EvalConfig(
            bench=bench.value,
            data=data,
            out_dir=out,
            server_url=server_url,
            max_in_flight=max_in_flight,
            groups_per_request=groups_per_request,
            timeout_s=timeout_s,
            ready_timeout_s=ready_timeout_s,
            only=tuple(only) if only else None,
            model=model,
            overwrite=overwrite,
            fsync=fsync,
            quiet=quiet,
            resamples=resamples,
            seed=seed,
            store=store,
            truncation=truncation_option(truncation, max_tokens),
            strict=strict,
            wait_for_server=wait_for_server,
            token=token,
            priority=priority.value,
        )
    )


def _store_path(store: Path | None, no_store: bool) -> Path | None:
    """The score store of a run: ``--store``, else ``$RMSERVE_STORE``, else none; ``--no-store``: none."""
    if store is not None and no_store:
        raise typer.BadParameter("--store and --no-store exclude each other", param_hint="'--store'")
    if no_store:
        return None
    if store is not None:
        return store
    from rmserve.client.score_store import configured_store_path

    return configured_store_path()


def _kept(scores_path: Path) -> str | None:
    """``scores_path`` when it holds scored groups (something to resume), else None."""
    try:
        return str(scores_path) if scores_path.stat().st_size > 0 else None
    except OSError:
        return None


def _call(fn, config, *, scores_path: Path, store_path: Path | None = None):
    """Run ``fn(config)`` under the one exit-code rule (:func:`rmserve.cli_common.guarded`):
    bad ``--data`` exits 2; a corrupt score file or store of the run's own, or any other
    rmserve error, exits 1; Ctrl-C exits 130. The resume hint names the score file only when
    it holds scored groups."""
    return guarded(
        lambda: fn(config), own_files=(scores_path, store_path), input_option="--data", kept=lambda: _kept(scores_path)
    )


def _render(result, *, as_json: bool, quiet: bool) -> None:
    from rmserve.metrics.report import to_json

    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    if not quiet:
        typer.echo(
            f"{result.model.name} (fingerprint {result.model.fingerprint}): {result.n_scored} group{'' if result.n_scored == 1 else 's'} scored now, "
            f"{result.n_resumed} resumed{f', {result.n_from_store} from the store' if result.n_from_store else ''}; "
            f"wrote {', '.join(p.name for p in result.paths)} in "
            f"{result.scores_path.parent}",
            err=True,
        )
    typer.echo(to_json(result.results) if as_json else result.table_md.rstrip("\n"))
    if result.unscored is not None and result.unscored.count:
        raise typer.Exit(EXIT_UNSCORED)


BenchOpt = Annotated[Bench, typer.Option("--bench", help="Benchmark to score.", show_default=False)]
DataOpt = Annotated[
    str, typer.Option("--data", help="Benchmark data: file or folder path, or hub dataset id.", show_default=False)
]
OutOpt = Annotated[
    Path,
    typer.Option(
        "--out", help="Output folder (scores.jsonl resumes; results.json, table.md, heatmaps).", show_default=False
    ),
]
MaxInFlightOpt = Annotated[int, typer.Option("--max-in-flight", help="Most groups sent and not yet answered (1–4096).")]
GroupsPerRequestOpt = Annotated[int, typer.Option("--groups-per-request", help="Groups per POST /v1/score.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout-s", help="Limit of one scoring request, seconds.")]
OnlyOpt = Annotated[
    Optional[list[str]],
    typer.Option("--only", help=only_help(), show_default=False),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", help=with_default("Model name to request.", "the server's only model"), show_default=False),
]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Discard stored scores of a different model.")]
FsyncOpt = Annotated[bool, typer.Option("--fsync", help="fsync the score file after every group.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print results.json instead of the table.")]
ResamplesOpt = Annotated[int, typer.Option("--resamples", help=resamples_help(0))]
SeedOpt = Annotated[int, typer.Option("--seed", help=SEED_HELP)]
StoreOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--store",
        help=with_default(
            "Score store (SQLite) shared across runs: groups stored for the server's model fingerprint are not "
            "sent again, new ones are added.",
            "$RMSERVE_STORE when set, else no store",
        ),
        show_default=False,
    ),
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Use no score store, even when $RMSERVE_STORE is set.")]
def eval_command(
    server: Annotated[
        str,
        typer.Option(
            "--server", help="Scoring server base URL, e.g. http://127.0.0.1:8000.", show_default=False
        ),
    ],
    bench: BenchOpt,
    data: DataOpt,
    out: OutOpt,
    max_in_flight: MaxInFlightOpt = 32,
    groups_per_request: GroupsPerRequestOpt = 1,
    timeout_s: TimeoutOpt = 900.0,
    ready_timeout_s: Annotated[
        float, typer.Option("--ready-timeout-s", help="How long to wait for /health, seconds.")
    ] = 600.0,
    wait_for_server: Annotated[
        bool,
        typer.Option(
            "--wait-for-server",
            help="Wait (up to --ready-timeout-s) for a server that does not accept connections yet. Without it, "
            "a refused connection fails after a few seconds.",
        ),
    ] = False,
    only: OnlyOpt = None,
    model: ModelOpt = None,
    overwrite: OverwriteOpt = False,
    fsync: FsyncOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    store: StoreOpt = None,
    no_store: NoStoreOpt = False,
    truncation: TruncationOpt = None,
    max_tokens: MaxTokensOpt = None,
    strict: StrictOpt = False,
    token_file: TokenFileOpt = None,
    priority: Annotated[PriorityHint, typer.Option("--priority", help=PRIORITY_HELP)] = PriorityHint.interactive,
) -> None:
    """Score a benchmark on a running server, then print its table.

    Resumable: groups already in OUT/scores.jsonl are not sent again; with a score store
    (--store or $RMSERVE_STORE), neither are groups stored for the server's model.
    """
    from rmserve.pipelines.evaluate import evaluate

    config = _eval_config(
        server_url=server, bench=bench, data=data, out=out, max_in_flight=max_in_flight,
        groups_per_request=groups_per_request, timeout_s=timeout_s, ready_timeout_s=ready_timeout_s,
        only=only, model=model, overwrite=overwrite, fsync=fsync, quiet=quiet, resamples=resamples, seed=seed,
        store=_store_path(store, no_store), truncation=truncation, max_tokens=max_tokens, strict=strict,
        wait_for_server=wait_for_server, token=read_client_token(token_file), priority=priority,
    )
    result = _call(evaluate, config, scores_path=config.out_dir / "scores.jsonl", store_path=config.store)
    _render(result, as_json=as_json, quiet=quiet)


@with_engine_options
def run_command(
    model_path: Annotated[
        Optional[str],
        typer.Argument(metavar="MODEL", help=f"Reward model: local path or hub id. {MODEL_HELP_JUDGE_URL}", show_default=False),
    ] = None,
    *,
    bench: BenchOpt,
    data: DataOpt,
    out: OutOpt,
    engine_options: dict[str, Any],
    startup_timeout_s: Annotated[
        float, typer.Option("--startup-timeout-s", help="How long the model may take to load, seconds.")
    ] = 1800.0,
    max_in_flight: MaxInFlightOpt = 32,
    groups_per_request: GroupsPerRequestOpt = 1,
    timeout_s: TimeoutOpt = 900.0,
    only: OnlyOpt = None,
    overwrite: OverwriteOpt = False,
    fsync: FsyncOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    store: StoreOpt = None,
    no_store: NoStoreOpt = False,
    truncation: TruncationOpt = None,
    max_tokens: MaxTokensOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Start a server for MODEL, score a benchmark on it, stop it, print the table.

    The server's log goes to OUT/server.log; OUT/scores.jsonl resumes as with eval. With a
    score store, a checkpoint folder whose every group is stored starts no server.
    """
    from rmserve.pipelines.launch import RunConfig, ServeOptions, run

    evaluation = _eval_config(
        server_url=None, bench=bench, data=data, out=out, max_in_flight=max_in_flight,
        groups_per_request=groups_per_request, timeout_s=timeout_s, ready_timeout_s=startup_timeout_s,
        only=only, model=None, overwrite=overwrite, fsync=fsync, quiet=quiet, resamples=resamples, seed=seed,
        store=_store_path(store, no_store), truncation=truncation, max_tokens=max_tokens, strict=strict,
    )
    config = bad_parameter(
        lambda: RunConfig(
            serve=ServeOptions(model=model_argument(model_path, engine_options), engine_options=engine_options,
                               startup_timeout_s=startup_timeout_s),
            evaluation=evaluation,
        )
    )
    result = _call(run, config, scores_path=evaluation.out_dir / "scores.jsonl", store_path=evaluation.store)
    _render(result, as_json=as_json, quiet=quiet)


def register(app: typer.Typer) -> None:
    """Add the evaluation commands to ``app``."""
    app.command("eval", cls=Command, short_help="Score a benchmark on a running server; print its table.")(eval_command)
    app.command("run", cls=Command, short_help="Start a server for MODEL, score a benchmark, stop it.")(run_command)
