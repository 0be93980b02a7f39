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
from rmserve.cli_cluster import JOB_REPLICA_OPTIONS, RAY_HELP, check_targets, job_replicas, job_spec
from rmserve.cli_common import (
    MODEL_HELP_JUDGE_URL,
    Command,
    EXIT_UNSCORED,
    STORE_WHY,
    WAIT_READY_HELP,
    WAIT_READY_WHY,
    WaitRequestOpt,
    WaitRetryAfterOpt,
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
    with_option_group,
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
    max_retry_after_s: float = 60,
    more_servers: tuple[str, ...] = (),
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
            max_retry_after_s=max_retry_after_s,
            more_servers=more_servers,
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
    from rmserve.metrics.render_json import to_json

    for note in result.notes[result.notes_shown:]:
        typer.echo(f"note: {note}", err=True)
    if not quiet:
        typer.echo(
            f"{result.model.name} (fingerprint {result.model.fingerprint}): {result.n_scored} group{'' if result.n_scored == 1 else 's'} sent now, "
            f"{result.n_resumed} resumed{f', {result.n_from_store} from the store' if result.n_from_store else ''}; "
            f"wrote {', '.join(p.name for p in result.paths)} in "
            f"{result.scores_path.parent}",
            err=True,
        )
    typer.echo(to_json(result.results) if as_json else result.table_md.rstrip("\n"))
    judge = result.evaluation.judge
    if judge is not None and judge.summary.no_verdicts:
        typer.echo(f"error: {judge.summary.no_verdicts_sentence()}", err=True)
        raise typer.Exit(EXIT_UNSCORED)
    if result.unscored is not None and result.unscored.count:
        raise typer.Exit(EXIT_UNSCORED)


BenchOpt = Annotated[Bench, typer.Option("--bench", help="Benchmark to score.", show_default=False)]
DataOpt = Annotated[
    str,
    typer.Option("--data", metavar="DATA", help="Benchmark data: file or folder path, or hub dataset id.",
                 show_default=False),
]
OUT_HELP = (
    "Output folder: scores.jsonl (the same command resumes from it), results.json, table.md and, with "
    "--bench rm-bench only, the heatmap PNGs."
)
"""Help of ``eval --out``; ``run --out`` adds the server's log."""
OutOpt = Annotated[Path, typer.Option("--out", metavar="DIR", help=OUT_HELP, show_default=False)]
RunOutOpt = Annotated[
    Path,
    typer.Option("--out", metavar="DIR", help=f"{OUT_HELP[:-1]}, and server.log (the server's output).",
                 show_default=False),
]
MaxInflightOpt = Annotated[
    int, typer.Option("--max-inflight-groups", metavar="N", help="Most groups sent and not yet answered (1 to 4096).")
]
GroupsPerRequestOpt = Annotated[
    int, typer.Option("--groups-per-request", help="Groups per POST /v1/score (1 to --max-inflight-groups).")
]
OnlyOpt = Annotated[
    Optional[list[str]],
    typer.Option("--only", metavar="NAME", help=only_help(), show_default=False),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", metavar="NAME", help=with_default("Model name to request.", "the server's only model"),
                 show_default=False),
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
        metavar="FILE",
        help=with_default(
            "Score store (SQLite) shared across runs: groups stored for the server's model fingerprint are not "
            f"sent again, new ones are added ({STORE_WHY}).",
            "$RMSERVE_STORE when set, else no store",
        ),
        show_default=False,
    ),
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Use no score store, even when $RMSERVE_STORE is set.")]
SCORING_OPTIONS: dict[str, tuple[Any, Any]] = {
    "overwrite": (OverwriteOpt, False),
    "fsync": (FsyncOpt, False),
    "quiet": (QuietOpt, False),
    "as_json": (JsonOpt, False),
    "resamples": (ResamplesOpt, 1000),
    "seed": (SeedOpt, 0),
    "store": (StoreOpt, None),
    "no_store": (NoStoreOpt, False),
    "truncation": (TruncationOpt, None),
    "max_tokens": (MaxTokensOpt, None),
    "strict": (StrictOpt, False),
    "wait_retry_after_s": (WaitRetryAfterOpt, 60),
}
"""The options ``eval`` and ``run`` share (name → annotation, default), given to both by
:func:`~rmserve.cli_common.with_option_group` as ``scoring``."""


def _scoring_settings(scoring: dict[str, Any]) -> dict[str, Any]:
    """The :func:`_eval_config` keywords of the :data:`SCORING_OPTIONS` values (``--store`` /
    ``--no-store`` made one store path; ``--json`` left out, it is the printing's)."""
    skip = ("as_json", "store", "no_store", "wait_retry_after_s")
    settings = {name: value for name, value in scoring.items() if name not in skip}
    return {
        **settings,
        "store": _store_path(scoring["store"], scoring["no_store"]),
        "max_retry_after_s": scoring["wait_retry_after_s"],
    }


@with_option_group("ray_job", JOB_REPLICA_OPTIONS)
@with_option_group("scoring", SCORING_OPTIONS)
def eval_command(
    bench: BenchOpt,
    data: DataOpt,
    out: OutOpt,
    max_inflight_groups: MaxInflightOpt = 32,
    groups_per_request: GroupsPerRequestOpt = 1,
    wait_request_s: WaitRequestOpt = 900,
    wait_ready_s: Annotated[
        float, typer.Option("--wait-ready-s", metavar="SECONDS", help=f"{WAIT_READY_HELP}; {WAIT_READY_WHY}.")
    ] = 600,
    wait_for_server: Annotated[
        bool,
        typer.Option(
            "--wait-for-server",
            help="Wait (up to --wait-ready-s) for a server that does not accept connections yet. Without it, "
            "a refused connection fails after a few seconds.",
        ),
    ] = False,
    only: OnlyOpt = None,
    model: ModelOpt = None,
    *,
    scoring: dict[str, Any],
    token_file: TokenFileOpt = None,
    priority: Annotated[PriorityHint, typer.Option("--priority", help=PRIORITY_HELP)] = PriorityHint.interactive,
    server: Annotated[
        Optional[list[str]],
        typer.Option("--server", metavar="URL",
                     help="Scoring server base URL, e.g. http://127.0.0.1:8000. Repeat it for replicas serving the "
                     "same model: the groups are spread over them. Give --server or --ray.", show_default=False),
    ] = None,
    ray: Annotated[
        Optional[str],
        typer.Option("--ray", metavar="ADDRESS", show_default=False,
                     help=f"Score on a Ray cluster instead of --server: {RAY_HELP} Uses --cluster NAME, or starts "
                     "--replicas replicas of --serve-model for the job and stops them at the end; the groups are "
                     "spread over the replicas."),
    ] = None,
    serve_model: Annotated[
        Optional[str],
        typer.Option("--serve-model", metavar="MODEL", show_default=False,
                     help="With --ray and no --cluster: the reward model the job's replicas serve (a path on every "
                     "node, or a hub id)."),
    ] = None,
    ray_job: dict[str, Any],
) -> None:
    """Score a benchmark on a running server (or replicas), then print its table.

    Resumable: groups already in OUT/scores.jsonl are not sent again; with a score store
    (--store or $RMSERVE_STORE), neither are groups stored for the server's model.
    """
    from dataclasses import replace

    from rmserve.pipelines.evaluate import evaluate

    cluster = ray_job["cluster"]
    check_targets(server, ray, cluster, serve_model, needs_model=True)
    urls = list(server) if server is not None else ["http://ray-replicas.invalid:1"]  # filled in below
    config = _eval_config(
        server_url=urls[0], more_servers=tuple(urls[1:]), bench=bench, data=data, out=out,
        max_in_flight=max_inflight_groups,
        groups_per_request=groups_per_request, timeout_s=wait_request_s, ready_timeout_s=wait_ready_s,
        only=only, model=model, **_scoring_settings(scoring),
        wait_for_server=wait_for_server, token=read_client_token(token_file), priority=priority,
    )
    spec = None
    if serve_model is not None:
        spec = job_spec(serve_model, ray_job)

    def run(config):
        if ray is None:
            return evaluate(config)
        with job_replicas(ray, cluster, ray_job["replicas"], spec) as replica_set:
            found = replica_set.urls()
            return evaluate(replace(config, server_url=found[0], more_servers=tuple(found[1:])))

    result = _call(run, config, scores_path=config.out_dir / "scores.jsonl", store_path=config.store)
    _render(result, as_json=scoring["as_json"], quiet=scoring["quiet"])


@with_engine_options
@with_option_group("scoring", SCORING_OPTIONS)
def run_command(
    model_path: Annotated[
        Optional[str],
        typer.Argument(metavar="MODEL", help=f"Reward model: local path or hub id. {MODEL_HELP_JUDGE_URL}", show_default=False),
    ] = None,
    *,
    bench: BenchOpt,
    data: DataOpt,
    out: RunOutOpt,
    engine_options: dict[str, Any],
    wait_ready_s: Annotated[
        float,
        typer.Option("--wait-ready-s", metavar="SECONDS",
                     help="Longest wait for the server started here to be ready (its model loaded), seconds; 1800 by "
                     "default, longer than the 600 of rmserve eval and sweep (which wait for a running server), as "
                     "run also starts the server and loads the model."),
    ] = 1800,
    max_inflight_groups: MaxInflightOpt = 32,
    groups_per_request: GroupsPerRequestOpt = 1,
    wait_request_s: WaitRequestOpt = 900,
    only: OnlyOpt = None,
    scoring: dict[str, Any],
) -> None:
    """Start a server for MODEL, score a benchmark on it, stop it, print the table.

    The server's log goes to OUT/server.log; OUT/scores.jsonl resumes as with eval. With a
    score store, a checkpoint folder whose every group is stored starts no server.
    """
    from rmserve.pipelines.launch import RunConfig, ServeOptions, run

    evaluation = _eval_config(
        server_url=None, bench=bench, data=data, out=out, max_in_flight=max_inflight_groups,
        groups_per_request=groups_per_request, timeout_s=wait_request_s, ready_timeout_s=wait_ready_s,
        only=only, model=None, **_scoring_settings(scoring),
    )
    config = bad_parameter(
        lambda: RunConfig(
            serve=ServeOptions(model=model_argument(model_path, engine_options), engine_options=engine_options,
                               startup_timeout_s=wait_ready_s),
            evaluation=evaluation,
        )
    )
    result = _call(run, config, scores_path=evaluation.out_dir / "scores.jsonl", store_path=evaluation.store)
    _render(result, as_json=scoring["as_json"], quiet=scoring["quiet"])


def register(app: typer.Typer) -> None:
    """Add the evaluation commands to ``app``."""
    app.command("eval", cls=Command, short_help="Score a benchmark on a running server; print its table.")(eval_command)
    app.command("run", cls=Command, short_help="Start a server for MODEL, score a benchmark, stop it.")(run_command)
