"""``rmserve sweep``: score every checkpoint of a training run through running servers.

Parses the options into a :class:`~rmserve.pipelines.sweep.SweepConfig`, makes one library
call (:func:`rmserve.pipelines.sweep.sweep`) and prints ``summary.md`` (or, with ``--json``,
the ``sweep.json`` document). Exit codes follow :mod:`rmserve.cli_common`: bad options or data
2, a failed sweep 1 (one line naming the error type; everything scored so far stays in the
store), Ctrl-C 130.
"""

from __future__ import annotations

import asyncio
import functools
import glob
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rmserve.cli_users import TokenFileOpt, read_client_token
from rmserve.cli_cluster import (
    JOB_REPLICA_OPTIONS,
    RAY_HELP,
    check_targets,
    checkpoint_root,
    job_admin_token,
    job_replicas,
    job_spec,
)
from rmserve.cli_common import (
    Command,
    EXIT_UNSCORED,
    STORE_WHY,
    WAIT_READY_HELP,
    WAIT_READY_WHY,
    WaitLoadOpt,
    WaitRequestOpt,
    WaitRetryAfterOpt,
    MaxTokensOpt,
    StrictOpt,
    TruncationOpt,
    bad_parameter,
    guarded,
    read_admin_token,
    QUIET_HELP,
    PRIORITY_HELP,
    PriorityHint,
    only_help,
    only_option,
    SEED_HELP,
    resamples_help,
    truncation_option,
    with_default,
    with_option_group,
)
from rmserve.schema import BENCHMARKS

if TYPE_CHECKING:
    from rmserve.cluster.replica import ReplicaSpec
    from rmserve.pipelines.sweep import SweepConfig


def expand_checkpoints(patterns: list[str]) -> list[Path]:
    """Folders named by ``patterns``: each a folder or a glob pattern (``runs/x/step-*``).

    Raises:
        ValueError: a pattern that matches no folder (named).
    """
    found: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser()))) if glob.has_magic(pattern) else [pattern]
        folders = [Path(m) for m in matches if Path(m).is_dir()]
        if not folders:
            raise ValueError(f"--checkpoints {pattern!r} matches no checkpoint folder")
        found += [f for f in folders if f not in found]
    return found


def parse_data(benches: list[str], data: list[str]) -> tuple[tuple[str, str], ...]:
    """Pair each benchmark with its data: ``BENCH=PATH`` items, or one plain path for one benchmark.

    Raises:
        ValueError: an unknown benchmark, a benchmark without data, or data for a benchmark
            not asked for.
    """
    for bench in benches:
        if bench not in BENCHMARKS:
            raise ValueError(f"--bench {bench!r} is not one of {', '.join(map(repr, BENCHMARKS))}.")
    named: dict[str, str] = {}
    plain: list[str] = []
    for item in data:
        bench, sep, path = item.partition("=")
        if sep and bench in BENCHMARKS:
            named[bench] = path
        else:
            plain.append(item)
    if plain:
        if len(plain) > 1 or len(benches) > 1:
            raise ValueError("--data: with several benchmarks, give each as BENCH=PATH (e.g. rm-bench=./rm-bench)")
        named.setdefault(benches[0], plain[0])
    extra = sorted(set(named) - set(benches))
    if extra:
        raise ValueError(f"--data names {', '.join(extra)}, which --bench does not ask for")
    missing = [b for b in benches if b not in named]
    if missing:
        raise ValueError(f"--data: no data for {', '.join(missing)} (give BENCH=PATH)")
    return tuple((b, named[b]) for b in benches)


@with_option_group("ray_job", JOB_REPLICA_OPTIONS)
def sweep_command(
    bench: Annotated[
        str,
        typer.Option("--bench", metavar="BENCH[,BENCH]",
                     help="Benchmarks to score, comma-separated: rm-bench, rewardbench2 or rm-bench,rewardbench2.",
                     show_default=False),
    ],
    data: Annotated[
        list[str],
        typer.Option(
            "--data", metavar="[BENCH=]DATA",
            help="Benchmark data (file or folder path, or hub dataset id): DATA for one benchmark, else BENCH=DATA per "
            "benchmark (repeatable).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="Output folder: sweep.csv, sweep.json, summary.md, plots.",
                           show_default=False)
    ],
    server: Annotated[
        Optional[list[str]],
        typer.Option("--server", metavar="URL", help="Scoring server base URL, e.g. http://127.0.0.1:8000 (repeatable; "
                     "groups go to the least busy). Give --server or --ray.", show_default=False),
    ] = None,
    checkpoint_args: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="CHECKPOINT",
            help="More checkpoint folders (what a shell makes of --checkpoints DIR/step-*).",
            show_default=False,
        ),
    ] = None,
    checkpoints: Annotated[
        Optional[list[str]],
        typer.Option(
            "--checkpoints",
            metavar="DIR|GLOB",
            help="Checkpoint folder or glob such as 'runs/x/step-*' (repeatable); sorted by step.",
            show_default=False,
        ),
    ] = None,
    store: Annotated[
        Optional[Path],
        typer.Option(
            "--store",
            metavar="FILE",
            help=with_default(
                "Score store (SQLite) shared across runs: scores are kept there as they arrive, and groups stored "
                f"for a checkpoint's fingerprint are not sent again ({STORE_WHY}; there is no --no-store here).",
                "$RMSERVE_STORE when set, else ~/.local/share/rmserve/scores.sqlite",
            ),
            show_default=False,
        ),
    ] = None,
    admin_token_file: Annotated[
        Optional[Path],
        typer.Option(
            "--admin-token-file",
            metavar="FILE",
            help=with_default("File holding the servers' admin token.", "the token in $RMSERVE_ADMIN_TOKEN"),
            show_default=False,
        ),
    ] = None,
    max_inflight_groups: Annotated[
        int, typer.Option("--max-inflight-groups", metavar="N", help="Most groups outstanding per server (1 to 4096).")
    ] = 32,
    wait_request_s: WaitRequestOpt = 900,
    wait_load_s: WaitLoadOpt = 1800,
    wait_ready_s: Annotated[
        float,
        typer.Option("--wait-ready-s", metavar="SECONDS",
                     help=f"{WAIT_READY_HELP}, at the start (with --wait-for-server) and for a server that stopped "
                     f"answering; {WAIT_READY_WHY}."),
    ] = 600,
    wait_retry_after_s: WaitRetryAfterOpt = 60,
    only: Annotated[
        Optional[list[str]],
        typer.Option("--only", metavar="NAME", help=only_help(), show_default=False),
    ] = None,
    resamples: Annotated[int, typer.Option("--resamples", help=resamples_help(1))] = 1000,
    seed: Annotated[int, typer.Option("--seed", help=SEED_HELP)] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
    wait_for_server: Annotated[
        bool,
        typer.Option(
            "--wait-for-server",
            help="At the start, wait (up to --wait-ready-s) for a server that does not accept connections yet. "
            "Without it, a refused connection fails after a few seconds.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print sweep.json instead of summary.md.")] = False,
    truncation: TruncationOpt = None,
    max_tokens: MaxTokensOpt = None,
    strict: StrictOpt = False,
    token_file: TokenFileOpt = None,
    priority: Annotated[PriorityHint, typer.Option("--priority", help=PRIORITY_HELP)] = PriorityHint.batch,
    ray: Annotated[
        Optional[str],
        typer.Option("--ray", metavar="ADDRESS", show_default=False,
                     help=f"Score on a Ray cluster instead of --server: {RAY_HELP} Starts --replicas replicas for "
                     "the job (serving the first checkpoint, swapping in place) and stops them at the end, or uses "
                     "--cluster NAME; each replica takes the next checkpoint, and a lost replica's checkpoint goes "
                     "to another."),
    ] = None,
    *,
    ray_job: dict[str, Any],
) -> None:
    """Score every checkpoint (in step order) on running servers or Ray replicas; report the sweep.

    With --server, each server loads each checkpoint in place (POST /v1/models/load; start the servers with --admin-token-file and a --checkpoint-root holding the checkpoints) and must report the same fingerprint. With --ray, each replica takes the next checkpoint; replicas started for the job get their token and root by themselves, a running set (--cluster) must have been started with them and is left serving its model again. Scores go to the SQLite store as they arrive, so running the same command again resumes; checkpoints already stored are not loaded again.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.client.score_store import default_store_path
    from rmserve.errors import FingerprintMismatch
    from rmserve.metrics.render_json import to_json
    from rmserve.pipelines.sweep import (
        SweepConfig,
        SweepResult,
        SweepTally,
        order_checkpoints,
        restore_models,
        served_models,
        summary_line,
        sweep,
        sweep_from_store,
    )

    token = read_client_token(token_file)

    cluster = ray_job["cluster"]
    check_targets(server, ray, cluster)
    job_token = job_admin_token() if ray is not None and cluster is None else None

    def build() -> SweepConfig:
        benches = [b.strip() for b in bench.split(",") if b.strip()]
        if not benches:
            raise ValueError("--bench names no benchmark")
        folders = expand_checkpoints(list(checkpoints or []) + list(checkpoint_args or []))
        config = SweepConfig(
            servers=tuple(server) if server is not None else ("http://ray-replicas.invalid:1",),  # filled in below
            checkpoints=tuple(folders),
            data=parse_data(benches, data),
            out_dir=out,
            store=store or default_store_path(),
            # users file: an admin's own token; replicas started for the job: the job's
            admin_token=job_token or read_admin_token(admin_token_file) or token,
            token=token,
            max_in_flight=max_inflight_groups,
            timeout_s=wait_request_s,
            load_timeout_s=wait_load_s,
            server_wait_s=wait_ready_s,
            max_retry_after_s=wait_retry_after_s,
            only=tuple(only) if only else None,
            resamples=resamples,
            seed=seed,
            quiet=quiet,
            truncation=truncation_option(truncation, max_tokens),
            strict=strict,
            wait_for_server=wait_for_server,
            priority=priority.value,
            spread="checkpoints" if ray is not None else "groups",
        )
        only_option(benches, only)
        order_checkpoints(config.checkpoints)
        return config

    config = bad_parameter(build)
    spec = None
    if ray is not None and cluster is None:
        first = order_checkpoints(config.checkpoints)[0].path
        spec = job_spec(str(first), ray_job, admin_token=job_token,
                        extra=("--checkpoint-root", str(checkpoint_root(config.checkpoints))))
    tally = SweepTally()

    def run() -> SweepResult:
        if ray is None:
            return sweep(config, tally=tally)
        replicas = ray_job["replicas"]
        job_spec_ = spec
        if spec is not None:  # replicas of the job's own: none for what the store already holds
            stored = stored_for_job(config, spec, ray_job["gpus_per_replica"])
            left = [c for c in order_checkpoints(config.checkpoints) if c.path not in stored]
            if not left:
                typer.echo(f"note: every checkpoint's groups are in {config.store} under the fingerprint its replicas "
                           "would report: no replica started", err=True)
                return sweep_from_store(config, stored)
            if len(left) < replicas:
                typer.echo(f"note: {len(stored)} of {len(config.checkpoints)} checkpoints are complete in "
                           f"{config.store}: starting {len(left)} replica{'s' if len(left) != 1 else ''}, not "
                           f"{replicas}", err=True)
                replicas = len(left)
            job_spec_ = replace(spec, model=str(left[0].path))  # the first load serves a checkpoint to score
        with job_replicas(ray, cluster, replicas, job_spec_) as replica_set:
            on_replicas = replace(config, servers=tuple(replica_set.urls()))
            if cluster is None:  # the job's own replicas: stopped at the end
                return sweep(on_replicas, tally=tally, watch=replica_set.watch)
            # A running set is left serving what it served before the sweep.
            before = asyncio.run(served_models(on_replicas))
            try:
                return sweep(on_replicas, tally=tally, watch=replica_set.watch)
            finally:
                for note in asyncio.run(restore_models(on_replicas, before, replica_set.model_paths())):
                    typer.echo(f"note: {note}", err=True)

    result = guarded(
        run,
        own_files=(config.store,),
        kept=lambda: str(config.store) if tally.groups_kept else None,
        resume_hint=lambda exc: exc.retryable or isinstance(exc, FingerprintMismatch),
    )
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    for message in result.refused:
        typer.echo(f"refused: {message}", err=True)
    if not quiet:
        for run in result.runs:
            typer.echo(run.line(), err=True)
        typer.echo(summary_line(result.runs, result.wall_s), err=True)
        typer.echo(f"wrote {', '.join(p.name for p in result.paths)} in {config.out_dir}", err=True)
    if as_json:
        assert result.document is not None  # sweep() always sets it
        typer.echo(to_json(result.document).rstrip("\n"))
    else:
        typer.echo(result.summary_md.rstrip("\n"))
    if any(run.n_unscored for run in result.runs):
        raise typer.Exit(EXIT_UNSCORED)


def stored_for_job(config: SweepConfig, spec: ReplicaSpec, gpus_per_replica: float) -> dict[Path, str]:
    """The checkpoints of a ``sweep --ray`` job whose every group is already in its store under
    the fingerprint the job's replicas would report (checkpoint folder → fingerprint), found
    here without starting any: :func:`~rmserve.pipelines.sweep.stored_checkpoints` keyed by
    :func:`~rmserve.pipelines.launch.store_key` of the engine options in the replicas'
    arguments (``spec.serve_args``, checked when the spec was made), the ``auto`` dtype read
    as the replicas would read it (bfloat16 with ``gpus_per_replica`` > 0, float32 without),
    and each checkpoint's context limit as they would give it
    (:func:`~rmserve.pipelines.launch.server_context_limit`). ``{}`` when that key cannot be
    known here (a kind other than a classifier or a DPO policy, or no store file yet): the
    replicas find out.

    Raises:
        rmserve.errors.DataError: bad benchmark data.
    """
    from rmserve.cli_common import engine_options_of
    from rmserve.pipelines.launch import ServeOptions, server_context_limit, store_key
    from rmserve.pipelines.sweep import stored_checkpoints
    from rmserve.schema import CLASSIFIER_KIND, DPO_KIND

    options = engine_options_of(spec.serve_args)
    if (options.get("kind") or CLASSIFIER_KIND) not in (CLASSIFIER_KIND, DPO_KIND):
        return {}
    cuda = gpus_per_replica > 0

    @functools.cache  # one check of each folder for its key and its limit
    def serve_options(folder: Path) -> ServeOptions | None:
        try:
            return ServeOptions(model=str(folder), engine_options=options)
        except ValueError:
            return None

    def key_of(folder: Path) -> str | None:
        serve = serve_options(folder)
        return None if serve is None else store_key(serve, cuda_available=cuda)

    def limit_of(folder: Path) -> int | None:
        serve = serve_options(folder)
        return None if serve is None else server_context_limit(serve)

    return stored_checkpoints(config, key_of, limit_of)


def register(app: typer.Typer) -> None:
    """Add ``rmserve sweep`` to ``app``."""
    app.command("sweep", cls=Command, short_help="Score every checkpoint of a training run; report the sweep.")(
        sweep_command
    )
