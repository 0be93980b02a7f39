"""One replica: an ``rmserve serve`` process owned by a Ray actor on the node Ray chose.

:class:`ReplicaServer` is the actor's body (plain Python: :mod:`rmserve.cluster.ray_cluster`
wraps it with ``ray.remote``). Its constructor starts the server, so a replica that Ray
restarts after a crash starts a new one by itself; the driver learns the new address from
:meth:`ReplicaServer.wait_ready` / :meth:`ReplicaServer.info`. The server watches the actor's
pid (``--parent-pid``) and gets SIGTERM from the kernel when the actor dies (Linux), so it
never outlives its replica.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESERVED_SERVE_ARGS = {
    "--host": "each replica binds its node's address (or the set's --host)",
    "--port": "each replica picks a free port on its node",
    "--parent-pid": "each replica's server watches its own actor",
    "--replica": "each replica names itself",
    "--model": "a replica serves the one model of its set",
}
"""``rmserve serve`` options a replica sets itself or does not take, and why: refused in
:attr:`ReplicaSpec.serve_args`."""


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica of a set runs.

    Raises:
        ValueError: from ``__post_init__``: an empty model, ``gpus`` or ``cpus`` negative or
            not finite, a non-positive ``startup_timeout_s``, a negative ``stop_grace_s``, or a
            reserved option in ``serve_args`` (:data:`RESERVED_SERVE_ARGS`, named).
    """

    model: str
    """Model path or hub id, as for ``rmserve serve`` (a path must exist on every node)."""

    serve_args: tuple[str, ...] = ()
    """More ``rmserve serve`` arguments, passed as given (``--dtype float32``, ``--users-file F``)."""

    gpus: float = 1.0
    """GPUs per replica (Ray ``num_gpus``): the engine's tensor-parallel size. Default 1."""

    cpus: float = 1.0
    """CPUs Ray reserves per replica (``num_cpus``). Default 1."""

    host: str | None = None
    """Address the server binds and reports; None: the node's IP as Ray knows it."""

    log_dir: str = "/tmp/rmserve-cluster"
    """Folder on each node for the servers' logs (``NAME-INDEX.log``)."""

    startup_timeout_s: float = 1800.0
    """Longest wait for a replica's model to load, seconds. Default 1800; > 0."""

    stop_grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when a replica stops. Default 30; ≥ 0."""

    pin_cpus: bool = False
    """Pin replica ``i`` (and its engine's processes) to core ``i mod cores`` of its node
    (CPU measurements: one core per replica). Default False."""

    env: tuple[tuple[str, str], ...] = ()
    """Environment variables set for the server (``VLLM_CPU_KVCACHE_SPACE``, …)."""

    admin_token: str | None = field(default=None, repr=False)
    """Admin token for in-place swaps, given to the server as ``$RMSERVE_ADMIN_TOKEN``."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a path or hub id, got an empty string")
        object.__setattr__(self, "serve_args", tuple(str(a) for a in self.serve_args))
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in self.env))
        for name in ("gpus", "cpus"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a number ≥ 0, got {value!r}")
        if not self.startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")
        if not self.stop_grace_s >= 0:
            raise ValueError(f"stop_grace_s must be ≥ 0, got {self.stop_grace_s!r}")
        for arg in self.serve_args:
            option = arg.split("=", 1)[0]
            if option in RESERVED_SERVE_ARGS:
                raise ValueError(f"serve_args: {option} cannot be given: {RESERVED_SERVE_ARGS[option]}")


def _ray_context() -> dict[str, Any]:
    """This actor's node id, node IP, GPU ids and restart flag from Ray (empty outside Ray)."""
    try:
        import ray
    except ImportError:  # used without Ray (tests of the body itself)
        return {}
    if not ray.is_initialized():
        return {}
    context = ray.get_runtime_context()
    return {
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "restarted": bool(context.was_current_actor_reconstructed),
    }


class ReplicaServer:
    """The body of one replica actor: starts, watches and stops one ``rmserve serve`` process.

    Args:
        spec: what to run.
        name: the replica set's name.
        index: this replica's index in the set (0-based).
    """

    def __init__(self, spec: ReplicaSpec, name: str, index: int) -> None:
        from rmserve.pipelines.launch import ServerProcess, free_port

        self.spec = spec
        self.name = name
        self.index = index
        self.context = _ray_context()
        self.host = spec.host or self.context.get("node_ip") or "127.0.0.1"
        self.port = free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self.log_path = Path(spec.log_dir).expanduser() / f"{name}-{index}.log"
        self.started_at = time.time()
        self.ready_after_s: float | None = None
        if spec.pin_cpus and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[index % len(cores)]})  # the server and its engine inherit it
        gpus = ",".join(self.context.get("gpu_ids", [])) or "none"
        label = f"{name}/{index} on node {self.context.get('node_ip', self.host)}, GPUs {gpus}"
        argv = [sys.executable, "-m", "rmserve.cli", "serve", spec.model, "--host", self.host, "--port",
                str(self.port), "--parent-pid", str(os.getpid()), "--replica", label, *spec.serve_args]
        self.process = ServerProcess(
            argv, url=self.url, log_path=self.log_path, startup_timeout_s=spec.startup_timeout_s,
            stop_grace_s=spec.stop_grace_s, name=f"{name}-{index}", quiet=True,
        )
        env = dict(spec.env)
        if spec.admin_token is not None:
            env["RMSERVE_ADMIN_TOKEN"] = spec.admin_token
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # ServerProcess copies os.environ into the child
        try:
            self.process.start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def wait_ready(self) -> dict[str, Any]:
        """Block until the server's ``/health`` answers 200; return :meth:`info`.

        Raises:
            RuntimeError: the server exited or was not ready in time; the message holds the
                reason and the last lines of its log (on the replica's node).
        """
        from rmserve import errors

        started = time.monotonic()
        try:
            self.process.wait_ready()
        except errors.RMServeError as exc:
            quoted = "\n".join(f"    {line}" for line in exc.quoted)
            raise RuntimeError(
                f"replica {self.name}/{self.index} on {self.context.get('node_ip', self.host)} did not start: "
                f"{exc.message}" + (f"\n{quoted}" if quoted else "")
            ) from None
        self.ready_after_s = time.monotonic() - started
        return self.info()

    def info(self) -> dict[str, Any]:
        """Where this replica is and how it runs: name, index, url, node_id, node_ip, gpu_ids,
        server pid, log path, the model it was started with (``model_path``), whether the server
        process is alive, ``restarted`` (Ray
        restarted this actor), start time (Unix s) and seconds its model took to load."""
        return {
            "name": self.name,
            "index": self.index,
            "url": self.url,
            "node_id": self.context.get("node_id"),
            "node_ip": self.context.get("node_ip", self.host),
            "gpu_ids": self.context.get("gpu_ids", []),
            "pid": self.process.process.pid if self.process.process is not None else None,
            "log_path": str(self.log_path),
            "model_path": self.spec.model,
            "alive": self.process.returncode is None,
            "restarted": self.context.get("restarted", False),
            "started_at": self.started_at,
            "ready_after_s": self.ready_after_s,
        }

    def status(self, token: str | None = None) -> dict[str, Any]:
        """:meth:`info` plus what the server says of itself: ``fingerprint`` and ``model``
        (``/v1/models``, first model), ``state``, ``groups_scored`` and ``uptime_s``
        (``/v1/status``), asked with ``token`` when given (a server with a users file needs
        one); ``error`` instead when the server does not answer or refuses."""
        found = self.info()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            models = _get_json(f"{self.url}/v1/models", headers)
            status = _get_json(f"{self.url}/v1/status", headers)
        except (OSError, ValueError) as exc:
            found["error"] = f"{type(exc).__name__}: {exc}"
            return found
        first = (models.get("models") or [{}])[0]
        found.update(
            fingerprint=first.get("fingerprint"), model=first.get("name"),
            state=status.get("status"), groups_scored=status.get("groups_scored"), uptime_s=status.get("uptime_s"),
        )
        return found

    def log_tail(self, lines: int = 30) -> list[str]:
        """The last ``lines`` lines of the server's log."""
        from rmserve.pipelines.launch import log_tail_lines

        return list(log_tail_lines(self.log_path, lines))

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, SIGKILL after the grace period); its exit status."""
        return self.process.stop()


def _get_json(url: str, headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 - the replica's own server
        return json.loads(reply.read())
