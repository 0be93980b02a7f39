"""``rmserve cluster up|status|down`` and the ``--ray`` options of ``eval`` and ``sweep``.

A replica set is ``N`` scoring servers on a Ray cluster (:mod:`rmserve.cluster`). ``cluster
up`` starts a named, long-lived set for a team; ``eval --ray`` and ``sweep --ray`` either use
one (``--cluster NAME``) or start a set for the job and stop it at the end. Needs the
``[ray]`` extra here and on every node. Exit codes follow :mod:`rmserve.cli_common`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rmserve.cli_common import Command, bad_parameter, guarded, print_table, with_default, with_engine_options
from rmserve.cli_users import TokenFileOpt, read_client_token

if TYPE_CHECKING:
    from rmserve.cluster.ray_cluster import ReplicaSet
    from rmserve.cluster.replica import ReplicaSpec

cluster_app = typer.Typer(
    name="cluster",
    help="Scoring servers as replicas on a Ray cluster: up, status, down.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

RAY_HELP = "Ray cluster: auto (the one this machine belongs to), HOST:PORT of its head node, or ray://HOST:10001."

RayAddressOpt = Annotated[str, typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)]
ReplicasOpt = Annotated[
    int, typer.Option("--replicas", metavar="N", min=1,
                      help="Replicas to start (≥ 1), each one scoring server on its own GPUs.")
]
GpusOpt = Annotated[
    float,
    typer.Option("--gpus-per-replica", metavar="N", min=0,
                 help="GPUs per replica (Ray num_gpus; set --tensor-parallel-size to match). 0 where the nodes "
                 "declare no GPU (CPU nodes)."),
]
CpusOpt = Annotated[float, typer.Option("--cpus-per-replica", metavar="N", min=0, help="CPUs Ray reserves per replica.")]
HostOpt = Annotated[
    Optional[str],
    typer.Option("--host", metavar="ADDRESS", show_default=False,
                 help=with_default("Address every replica's server binds and reports (127.0.0.1 for a cluster on "
                                   "one machine). A server others can reach needs --users-file in --serve-args.",
                                   "its node's IP as Ray knows it")),
]
ServeArgsOpt = Annotated[
    Optional[str],
    typer.Option("--serve-args", metavar="ARGS", show_default=False,
                 help="More rmserve serve options for every replica, as one shell-quoted string "
                 "(e.g. '--users-file /shared/users.jsonl'); not --host, --port, --model."),
]
LogDirOpt = Annotated[
    str, typer.Option("--log-dir", metavar="DIR", help="Folder on each node for the replicas' server logs.")
]
ClusterNameOpt = Annotated[
    Optional[str],
    typer.Option("--cluster", metavar="NAME", show_default=False,
                 help="With --ray: score on the running replica set NAME (rmserve cluster up) instead of starting "
                 "replicas for this job."),
]


JOB_REPLICA_OPTIONS: dict[str, tuple[Any, Any]] = {
    "cluster": (ClusterNameOpt, None),
    "replicas": (ReplicasOpt, 2),
    "gpus_per_replica": (GpusOpt, 1.0),
    "cpus_per_replica": (CpusOpt, 1.0),
    "host": (HostOpt, None),
    "serve_args": (ServeArgsOpt, None),
    "log_dir": (LogDirOpt, "/tmp/rmserve-cluster"),
}
"""The replica options ``eval --ray`` and ``sweep --ray`` share (name → annotation, default),
given to both by :func:`~rmserve.cli_common.with_option_group` as ``ray_job``."""


def job_spec(model: str, ray_job: dict[str, Any], **more: Any) -> ReplicaSpec:
    """The spec of the replicas a ``--ray`` job starts for ``model``, from its
    :data:`JOB_REPLICA_OPTIONS` values (``more``: other :func:`replica_spec` keywords).

    Raises:
        typer.BadParameter: a bad option (named).
    """
    return bad_parameter(lambda: replica_spec(
        model, serve_args=ray_job["serve_args"], gpus=ray_job["gpus_per_replica"], cpus=ray_job["cpus_per_replica"],
        host=ray_job["host"], log_dir=ray_job["log_dir"], **more,
    ))


def check_targets(server: object | None, ray: str | None, cluster: str | None, serve_model: str | None = None, *,
                  needs_model: bool = False) -> None:
    """Refuse what ``--server``, ``--ray``, ``--cluster`` and ``--serve-model`` cannot mean
    together, naming the option and what to give instead.

    Raises:
        typer.BadParameter: the first mistake found.
    """
    if cluster is not None and ray is None:
        raise typer.BadParameter("--cluster names a replica set on a Ray cluster: give --ray ADDRESS too",
                                 param_hint="'--cluster'")
    if serve_model is not None and ray is None:
        raise typer.BadParameter("--serve-model starts replicas on a Ray cluster: give --ray ADDRESS too",
                                 param_hint="'--serve-model'")
    if server is not None and ray is not None:
        raise typer.BadParameter("--server and --ray exclude each other: score on running servers or on a Ray "
                                 "cluster", param_hint="'--ray'")
    if server is None and ray is None:
        raise typer.BadParameter("give --server URL (running servers) or --ray ADDRESS (a Ray cluster)",
                                 param_hint="'--server'")
    if needs_model and ray is not None:
        if cluster is not None and serve_model is not None:
            raise typer.BadParameter("--cluster and --serve-model exclude each other: score on a running set, or "
                                     "start replicas of a model for this job", param_hint="'--serve-model'")
        if cluster is None and serve_model is None:
            raise typer.BadParameter("with --ray, give --cluster NAME (a running replica set) or --serve-model MODEL "
                                     "(replicas started for this job)", param_hint="'--ray'")


def replica_spec(
    model: str,
    *,
    engine_options: dict[str, Any] | None = None,
    serve_args: str | None = None,
    extra: Sequence[str] = (),
    gpus: float = 1.0,
    cpus: float = 1.0,
    host: str | None = None,
    log_dir: str = "/tmp/rmserve-cluster",
    admin_token: str | None = None,
    pin_cpus: bool = False,
) -> ReplicaSpec:
    """The :class:`~rmserve.cluster.replica.ReplicaSpec` of the command-line options.

    Raises:
        ValueError: a bad option (named).
    """
    from rmserve.cli_common import engine_argv, engine_options_of
    from rmserve.cluster.replica import ReplicaSpec

    try:
        more = shlex.split(serve_args or "")
    except ValueError as exc:
        raise ValueError(f"--serve-args: {exc}") from None
    known = serve_option_flags()
    unknown = [flag for flag in (arg.split("=", 1)[0] for arg in more if arg.startswith("--")) if flag not in known]
    if unknown:  # found here, not by every replica after Ray placed it
        raise ValueError(f"--serve-args: {', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'} "
                         "of rmserve serve (see rmserve serve --help)")
    try:
        engine_options_of(more)  # a bad engine option value, found here too
    except ValueError as exc:
        raise ValueError(f"--serve-args: {exc}") from None
    env = tuple((k, v) for k, v in os.environ.items() if k.startswith(("VLLM_CPU_", "HF_HUB_OFFLINE", "RMSERVE_TEST")))
    return ReplicaSpec(
        model=model, serve_args=(*engine_argv(engine_options or {}), *extra, *more), gpus=gpus, cpus=cpus, host=host,
        log_dir=log_dir, admin_token=admin_token, env=env, pin_cpus=pin_cpus,
    )


def serve_option_flags() -> frozenset[str]:
    """Every ``--flag`` of ``rmserve serve`` (``--no-`` forms of switches included)."""
    from rmserve.cli import app

    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return frozenset(o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))


def _start(
    name: str, spec: ReplicaSpec, replicas: int, *, detached: bool, placement_timeout_s: float | None = None
) -> tuple[ReplicaSet, list[str]]:
    from rmserve.cluster.ray_cluster import PLACEMENT_TIMEOUT_S, ReplicaSet

    typer.echo(f"starting {replicas} replica{'s' if replicas != 1 else ''} of {name} on Ray "
               f"({spec.model}; logs in {spec.log_dir} on each node)…", err=True)
    started = time.monotonic()
    replica_set = ReplicaSet.start(name, spec, replicas, detached=detached, max_restarts=-1 if detached else 1)
    problems = replica_set.wait_ready(placement_timeout_s=placement_timeout_s or PLACEMENT_TIMEOUT_S)
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    typer.echo(f"{len(replica_set.replicas)} of {replicas} replicas ready after {time.monotonic() - started:.0f} s",
               err=True)
    return replica_set, problems


@contextlib.contextmanager
def job_replicas(
    address: str, cluster: str | None, replicas: int, spec: ReplicaSpec | None
) -> Iterator[ReplicaSet]:
    """The replicas a ``--ray`` job scores on: the running set ``cluster``, or ``replicas``
    new ones started from ``spec`` and stopped when the block ends (whatever happens in it).

    Raises:
        rmserve.cluster.ray_cluster.ClusterError: Ray is missing, the address or set is not
            found, or no replica came up (each problem is printed on stderr first).
    """
    from rmserve.cluster.ray_cluster import ClusterError, ReplicaSet, connect, disconnect

    connect(address)
    try:
        if cluster is not None:
            replica_set = ReplicaSet.attach(cluster)
            problems = replica_set.refresh()
            for problem in problems:
                typer.echo(f"note: {problem}", err=True)
            if not replica_set.urls():
                raise ClusterError(f"no replica of {cluster!r} is running ({'; '.join(problems)}); see rmserve "
                                   f"cluster status {cluster}")
            yield replica_set
            return
        assert spec is not None
        name = f"job-{os.getpid()}-{secrets.token_hex(3)}"
        replica_set, problems = _start(name, spec, replicas, detached=False)
        try:
            if not replica_set.replicas:
                raise ClusterError(f"none of the {replicas} replicas started: " + "; ".join(p.splitlines()[0] for p in problems))
            yield replica_set
        finally:
            typer.echo(f"stopping the {len(replica_set.replicas)} replicas of {name}", err=True)
            replica_set.stop()
    finally:
        disconnect()


@cluster_app.command("up", cls=Command, short_help="Start a named set of replicas for a team; print where they are.")
@with_engine_options
def up_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Name of the replica set (letters, digits, -_.).")],
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Reward model: a path on every node, or a hub id.")],
    *,
    engine_options: dict[str, Any],
    ray: RayAddressOpt = "auto",
    replicas: ReplicasOpt = 1,
    gpus_per_replica: GpusOpt = 1.0,
    cpus_per_replica: CpusOpt = 1.0,
    host: HostOpt = None,
    serve_args: ServeArgsOpt = None,
    log_dir: LogDirOpt = "/tmp/rmserve-cluster",
    pin_cpus: Annotated[
        bool, typer.Option("--pin-cpus", help="CPU nodes: run replica i (server and engine) on core i mod the node's "
                           "cores, one core per replica.")
    ] = False,
    wait_placement_s: Annotated[
        float, typer.Option("--wait-placement-s", metavar="SECONDS", min=1,
                            help="Longest wait for Ray to place a replica (its GPUs free on one node) before it is "
                            "reported and left out.")
    ] = 120.0,
) -> None:
    """Start NAME: N replicas of rmserve serve MODEL on the Ray cluster, each on its own GPUs.

    The replicas outlive this command (Ray restarts one that dies) until rmserve cluster down NAME. The URLs are printed once every replica is ready; score on them with rmserve eval|sweep --ray ADDRESS --cluster NAME, or any client with --server URL.
    """  # noqa: E501 - typer keeps docstring line breaks in --help
    from rmserve.cluster.ray_cluster import check_name, connect

    spec = bad_parameter(lambda: replica_spec(
        model, engine_options=engine_options, serve_args=serve_args, gpus=gpus_per_replica, cpus=cpus_per_replica,
        host=host, log_dir=log_dir, pin_cpus=pin_cpus))
    bad_parameter(lambda: check_name(name))

    def call() -> list[str]:
        connect(ray)
        replica_set, problems = _start(name, spec, replicas, detached=True, placement_timeout_s=wait_placement_s)
        _print_status(replica_set.status(token=read_client_token(None)))
        return problems

    problems = guarded(call)
    if problems:
        raise typer.Exit(1)


@cluster_app.command("status", cls=Command, short_help="List the replicas of a set (or of every set).")
def status_command(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help=with_default("Replica set.", "every set"),
                                                  show_default=False)] = None,
    ray: RayAddressOpt = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    token_file: TokenFileOpt = None,
) -> None:
    """List each replica: node, GPUs, URL, fingerprint, state, groups scored and groups/s since it started."""
    from rmserve.cluster.ray_cluster import ReplicaSet, connect, set_names

    token = read_client_token(token_file)

    def call() -> list[dict[str, Any]]:
        connect(ray)
        names = [name] if name is not None else sorted(set_names())
        return [row for n in names for row in ReplicaSet.attach(n).status(token=token)]

    rows = guarded(call)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True))
    elif not rows:
        typer.echo("no rmserve replica set is running on this Ray cluster", err=True)
    else:
        _print_status(rows)


@cluster_app.command("down", cls=Command, short_help="Stop a set: its servers, actors and placement groups.")
def down_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Replica set to stop.")],
    ray: RayAddressOpt = "auto",
) -> None:
    """Stop every replica of NAME (each server shuts down cleanly) and free its GPUs."""
    from rmserve.cluster.ray_cluster import ReplicaSet, connect

    def call() -> int:
        connect(ray)
        replica_set = ReplicaSet.attach(name)
        count = len(replica_set.replicas)
        typer.echo(f"stopping the {count} replica{'s' if count != 1 else ''} of {name} (each server stops cleanly; "
                   "up to a minute)…", err=True)
        replica_set.stop()
        return count

    count = guarded(call)
    typer.echo(f"stopped {count} replica{'s' if count != 1 else ''} of {name}", err=True)


def _print_status(rows: list[dict[str, Any]]) -> None:
    def rate(row: dict[str, Any]) -> str:
        scored, uptime = row.get("groups_scored"), row.get("uptime_s")
        return f"{scored / uptime:.2f}" if scored is not None and uptime else "-"

    print_table(
        ("replica", "node", "GPU ids", "URL", "fingerprint", "state", "groups scored", "groups/s"),
        (
            (
                f"{row.get('name')}/{row.get('index')}",
                str(row.get("node_ip", "-")),
                ",".join(row.get("gpu_ids") or []) or "-",
                str(row.get("url", "-")),
                str(row.get("fingerprint") or "-"),
                str(row.get("state") or row.get("error", "-")),
                str(row.get("groups_scored", "-")),
                rate(row),
            )
            for row in rows
        ),
    )


def job_admin_token() -> str:
    """A fresh admin token for the replicas a sweep starts (kept in this process and the
    replicas' environment only)."""
    return secrets.token_urlsafe(24)


def checkpoint_root(folders: Sequence[Path]) -> Path:
    """The deepest folder holding every checkpoint folder (the replicas' ``--checkpoint-root``)."""
    return Path(os.path.commonpath([str(Path(f).absolute().parent) for f in folders]))
