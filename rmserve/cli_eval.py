"""``rmserve eval`` and ``rmserve run``.

Each command parses its options into a config (:class:`~rmserve.pipelines.evaluate.EvalConfig`,
:class:`~rmserve.pipelines.launch.RunConfig`), makes one library call and prints the metrics
stage's table (or, with ``--json``, its results dict). Bad options exit 2 with one line;
a run that fails exits 1 with one line naming the error type.

The score store (``--store PATH``, :mod:`rmserve.client.score_store`) is used when ``--store`` is
given or ``$RMSERVE_STORE`` is set, and never with ``--no-store``.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer


class Bench(str, enum.Enum):
    """Benchmarks on the command line."""

    rm_bench = "rm-bench"
    rewardbench2 = "rewardbench2"


class Engine(str, enum.Enum):
    """Engine backends of ``rmserve serve``."""

    vllm = "vllm"
    hf = "hf"


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
):
    from rmserve.pipelines.evaluate import EvalConfig

    try:
        return EvalConfig(
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
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


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


def _call(fn, config, *, scores_path: Path, store_path: Path | None = None):
    """Run ``fn(config)``; turn failures into one line (bad --data: exit 2, else exit 1)."""
    from rmserve.errors import DataError, RMServeError

    try:
        return fn(config)
    except DataError as exc:
        if exc.path is not None and Path(exc.path) not in (scores_path, store_path):
            raise typer.BadParameter(str(exc), param_hint="'--data'") from None
        typer.echo(f"error: {exc.type}: {exc}", err=True)
        raise typer.Exit(1) from None
    except RMServeError as exc:
        field = f" (field {exc.field})" if exc.field else ""
        typer.echo(f"error: {exc.type}: {exc}{field}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted; scored groups are kept in {scores_path}; run again to resume", err=True)
        raise typer.Exit(130) from None


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


_BENCH = typer.Option(..., "--bench", help="Benchmark to score.")
_DATA = typer.Option(..., "--data", help="Benchmark data: file or folder path, or hub dataset id.")
_OUT = typer.Option(..., "--out", help="Output folder (scores.jsonl resumes; results.json, table.md, heatmaps).")
_MAX_IN_FLIGHT = typer.Option(32, "--max-in-flight", help="Most groups sent and not yet answered (1–4096).")
_GROUPS_PER_REQUEST = typer.Option(1, "--groups-per-request", help="Groups per POST /v1/score.")
_TIMEOUT = typer.Option(900.0, "--timeout-s", help="Limit of one scoring request, seconds.")
_ONLY = typer.Option(None, "--only", help="Score only this domain/subset (repeatable).")
_MODEL = typer.Option(None, "--model", help="Model name to request (default: the server's only model).")
_OVERWRITE = typer.Option(False, "--overwrite", help="Discard stored scores of a different model.")
_FSYNC = typer.Option(False, "--fsync", help="fsync the score file after every group.")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress bar or summary line.")
_JSON = typer.Option(False, "--json", help="Print results.json instead of the table.")
_RESAMPLES = typer.Option(1000, "--resamples", help="Bootstrap resamples for the intervals (0 = none).")
_SEED = typer.Option(0, "--seed", help="Bootstrap seed.")
_STORE = typer.Option(
    None,
    "--store",
    help="Score store (SQLite) shared across runs: groups stored for the server's model fingerprint are not sent "
    "again, new ones are added. Default: $RMSERVE_STORE when set, else no store.",
)
_NO_STORE = typer.Option(False, "--no-store", help="Use no score store, even when $RMSERVE_STORE is set.")


def eval_command(
    server: str = typer.Option(..., "--server", help="Scoring server base URL, e.g. http://127.0.0.1:8000."),
    bench: Bench = _BENCH,
    data: str = _DATA,
    out: Path = _OUT,
    max_in_flight: int = _MAX_IN_FLIGHT,
    groups_per_request: int = _GROUPS_PER_REQUEST,
    timeout_s: float = _TIMEOUT,
    ready_timeout_s: float = typer.Option(600.0, "--ready-timeout-s", help="How long to wait for /health, seconds."),
    only: Optional[list[str]] = _ONLY,
    model: Optional[str] = _MODEL,
    overwrite: bool = _OVERWRITE,
    fsync: bool = _FSYNC,
    quiet: bool = _QUIET,
    as_json: bool = _JSON,
    resamples: int = _RESAMPLES,
    seed: int = _SEED,
    store: Optional[Path] = _STORE,
    no_store: bool = _NO_STORE,
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
        store=_store_path(store, no_store),
    )
    result = _call(evaluate, config, scores_path=config.out_dir / "scores.jsonl", store_path=config.store)
    _render(result, as_json=as_json, quiet=quiet)


def run_command(
    model_path: str = typer.Argument(..., metavar="MODEL", help="Reward model: local path or hub id."),
    bench: Bench = _BENCH,
    data: str = _DATA,
    out: Path = _OUT,
    engine: Optional[Engine] = typer.Option(None, "--engine", help="Engine backend (rmserve serve default: vllm)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="auto, bfloat16, float16 or float32."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Longest sequence, tokens."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Prefix-cache block size, tokens."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="GPU memory fraction."),
    kv_cache_memory_bytes: Optional[int] = typer.Option(
        None, "--kv-cache-memory-bytes", help="KV-cache size in bytes (CPU build default: 4 GiB)."
    ),
    tensor_parallel_size: Optional[int] = typer.Option(None, "--tensor-parallel-size", help="GPUs to shard over."),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help="Jinja chat template file."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs / compilation."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", help="Most tokens per engine step (vLLM)."
    ),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Most sequences per engine step (vLLM)."),
    cpu_threads_bind: Optional[str] = typer.Option(
        None, "--cpu-threads-bind", help="CPU build: CPU ids for the engine threads, e.g. 0-1 (default: all usable)."
    ),
    startup_timeout_s: float = typer.Option(1800.0, "--startup-timeout-s", help="How long the model may take to load, s."),
    max_in_flight: int = _MAX_IN_FLIGHT,
    groups_per_request: int = _GROUPS_PER_REQUEST,
    timeout_s: float = _TIMEOUT,
    only: Optional[list[str]] = _ONLY,
    overwrite: bool = _OVERWRITE,
    fsync: bool = _FSYNC,
    quiet: bool = _QUIET,
    as_json: bool = _JSON,
    resamples: int = _RESAMPLES,
    seed: int = _SEED,
    store: Optional[Path] = _STORE,
    no_store: bool = _NO_STORE,
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
        store=_store_path(store, no_store),
    )
    try:
        serve = ServeOptions(
            model=model_path,
            engine=engine.value if engine is not None else None,
            dtype=dtype,
            max_model_len=max_model_len,
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            tensor_parallel_size=tensor_parallel_size,
            chat_template=chat_template,
            enforce_eager=enforce_eager,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            cpu_threads_bind=cpu_threads_bind,
            startup_timeout_s=startup_timeout_s,
        )
        config = RunConfig(serve=serve, evaluation=evaluation)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    result = _call(run, config, scores_path=evaluation.out_dir / "scores.jsonl", store_path=evaluation.store)
    _render(result, as_json=as_json, quiet=quiet)


def register(app: typer.Typer) -> None:
    """Add the evaluation commands to ``app``."""
    app.command("eval")(eval_command)
    app.command("run")(run_command)
