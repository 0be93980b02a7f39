"""``rmserve sweep``: score every checkpoint of a training run through running servers.

Parses the options into a :class:`~rmserve.pipelines.sweep.SweepConfig`, makes one library
call (:func:`rmserve.pipelines.sweep.sweep`) and prints ``summary.md`` (or, with ``--json``,
``sweep.json``). Bad options exit 2 with one line; a sweep that fails exits 1 with one line
naming the error type, and everything scored so far stays in the store.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Optional

import typer

from rmserve.schema import BENCHMARKS


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
            raise ValueError(f"--bench {bench!r} is not one of {', '.join(BENCHMARKS)}")
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


def sweep_command(
    checkpoint_args: Optional[list[str]] = typer.Argument(
        None, metavar="[CHECKPOINT]...", help="More checkpoint folders (what a shell makes of --checkpoints DIR/step-*)."
    ),
    server: list[str] = typer.Option(..., "--server", help="Scoring server URL (repeatable; groups go to the least busy)."),
    checkpoints: Optional[list[str]] = typer.Option(
        None, "--checkpoints", help="Checkpoint folder or glob such as 'runs/x/step-*' (repeatable); sorted by step."
    ),
    bench: str = typer.Option(..., "--bench", help="Benchmarks, comma-separated: rm-bench,rewardbench2."),
    data: list[str] = typer.Option(
        ..., "--data", help="Benchmark data: PATH for one benchmark, else BENCH=PATH per benchmark (repeatable)."
    ),
    out: Path = typer.Option(..., "--out", help="Output folder: sweep.csv, sweep.json, summary.md, plots."),
    store: Optional[Path] = typer.Option(
        None, "--store", help="SQLite score store (default: $RMSERVE_STORE, else ~/.local/share/rmserve/scores.sqlite)."
    ),
    admin_token_file: Optional[Path] = typer.Option(
        None, "--admin-token-file", help="File holding the servers' admin token (else env RMSERVE_ADMIN_TOKEN)."
    ),
    max_in_flight: int = typer.Option(32, "--max-in-flight", help="Most groups outstanding per server (1–4096)."),
    timeout_s: float = typer.Option(900.0, "--timeout-s", help="Limit of one scoring request, seconds."),
    load_timeout_s: float = typer.Option(1800.0, "--load-timeout-s", help="Limit of one checkpoint load, seconds."),
    server_wait_s: float = typer.Option(
        600.0, "--server-wait-s", help="How long to wait for a server that stopped answering, seconds."
    ),
    only: Optional[list[str]] = typer.Option(None, "--only", help="Only this domain/subset (repeatable)."),
    resamples: int = typer.Option(1000, "--resamples", help="Bootstrap resamples (≥ 1)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar or run summary on stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print sweep.json instead of summary.md."),
) -> None:
    """Score every checkpoint (in step order) on one or more running servers; report the sweep.

    Each server loads each checkpoint in place (POST /v1/models/load; start the servers with --admin-token-file and a --checkpoint-root holding the checkpoints) and must report the same fingerprint. Scores go to the SQLite store as they arrive, so running the same command again resumes; checkpoints already stored are not loaded again.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.cli_server import _admin_token
    from rmserve.client.score_store import default_store_path
    from rmserve.pipelines.sweep import SweepConfig, order_checkpoints, sweep
    from rmserve.errors import DataError, FingerprintMismatch, RMServeError
    try:
        benches = [b.strip() for b in bench.split(",") if b.strip()]
        if not benches:
            raise ValueError("--bench names no benchmark")
        folders = expand_checkpoints(list(checkpoints or []) + list(checkpoint_args or []))
        config = SweepConfig(
            servers=tuple(server),
            checkpoints=tuple(folders),
            data=parse_data(benches, data),
            out_dir=out,
            store=store or default_store_path(),
            admin_token=_admin_token(admin_token_file),
            max_in_flight=max_in_flight,
            timeout_s=timeout_s,
            load_timeout_s=load_timeout_s,
            server_wait_s=server_wait_s,
            only=tuple(only) if only else None,
            resamples=resamples,
            seed=seed,
            quiet=quiet,
        )
        order_checkpoints(config.checkpoints)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        result = sweep(config)
    except DataError as exc:
        typer.echo(f"error: {exc.type}: {exc}", err=True)
        raise typer.Exit(2 if exc.path is not None else 1) from None
    except RMServeError as exc:
        field = f" (field {exc.field})" if exc.field else ""
        typer.echo(f"error: {exc.type}: {exc}{field}", err=True)
        if exc.retryable or isinstance(exc, FingerprintMismatch):
            typer.echo(f"scored groups are kept in {config.store}; run the same command again to resume", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted; scored groups are kept in {config.store}; run again to resume", err=True)
        raise typer.Exit(130) from None
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    for message in result.refused:
        typer.echo(f"refused: {message}", err=True)
    if not quiet:
        for run in result.runs:
            where = ", ".join(f"{url} {n}" for url, n in run.per_server.items() if n)
            typer.echo(
                f"{run.checkpoint.name} (step {run.checkpoint.step}, fingerprint {run.fingerprint}): "
                f"{run.n_scored} scored{f' ({where})' if where else ''}, {run.n_stored} from the store",
                err=True,
            )
        typer.echo(f"wrote {', '.join(p.name for p in result.paths)} in {config.out_dir}", err=True)
    if as_json:
        typer.echo((config.out_dir / "sweep.json").read_text().rstrip("\n"))
    else:
        typer.echo(result.summary_md.rstrip("\n"))


def register(app: typer.Typer) -> None:
    """Add ``rmserve sweep`` to ``app``."""
    app.command("sweep")(sweep_command)
