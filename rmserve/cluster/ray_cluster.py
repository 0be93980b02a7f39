"""The driver side of rmserve on Ray: start, find, watch and stop sets of replicas.

A *replica set* is ``N`` actors named ``NAME/0`` … ``NAME/N-1`` in the Ray namespace
:data:`NAMESPACE`, each in its own placement group (one bundle: the replica's GPUs and CPUs, so
a tensor-parallel replica is packed on one node) and each owning one ``rmserve serve``
(:class:`~rmserve.cluster.replica.ReplicaServer`). A set started by ``rmserve cluster up`` is
*detached* (it outlives the command, for a team, until ``rmserve cluster down``); one started
by ``rmserve sweep|eval --ray`` belongs to the job and is stopped when it ends.

Ray does the placement, the restarts (``max_restarts``) and the failure detection; nothing here
schedules or probes nodes itself. Needs the ``[ray]`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rmserve import errors
from rmserve.cluster.replica import ReplicaServer, ReplicaSpec

logger = logging.getLogger("rmserve.cluster")

NAMESPACE = "rmserve"
"""The Ray namespace of every rmserve replica set."""

PLACEMENT_TIMEOUT_S = 120.0
"""Longest wait for Ray to place a replica (its GPUs free on one node) before it is reported."""

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class ClusterError(errors.ServerFault, type="cluster_error"):
    """A replica set could not be started, found or reached (the message says which and why)."""


def check_name(name: str) -> str:
    """``name`` when it can name a replica set (letters, digits, ``-_.``; 1–64 characters).

    Raises:
        ValueError: otherwise (names the rule).
    """
    if not 1 <= len(name) <= 64 or not set(name) <= _NAME_CHARS:
        raise ValueError(f"name {name!r}: use 1 to 64 letters, digits, '-', '_' or '.'")
    return name


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "Ray is not installed here: install rmserve's [ray] extra (pip install 'rmserve[ray]') on this machine "
            "and on every node of the cluster",
        ) from None
    return ray


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` as a driver (``auto``, ``HOST:PORT`` of a head node,
    or ``ray://HOST:10001``), in namespace :data:`NAMESPACE`. Joining twice is harmless.

    A ``HOST:PORT`` or ``ray://HOST:PORT`` address is probed first (a TCP connection, 5 s): Ray
    itself would retry a port where nothing listens for minutes (or 30 s for Ray Client).

    Raises:
        ClusterError: Ray is not installed, or nothing answers at ``address`` (names it).
    """
    ray = _ray()
    if ray.is_initialized():
        return
    scheme, _, rest = address.rpartition("://")
    host, sep, port = rest.rpartition(":")
    if sep and port.isdigit() and scheme in ("", "ray"):
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise ClusterError(
                f"cannot join the Ray cluster at {address!r}: nothing answers there ({exc.strerror or exc}); give the "
                + ("head node's address and the port of its Ray client server (10001 unless ray start was given "
                   "--ray-client-server-port)" if scheme else
                   "head node's address and the --port of its ray start (ray status on a node of the cluster shows it)")
            ) from None
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address!r}: {exc}") from None


def gcs_address() -> str:
    """The address of the Ray cluster this process joined (its GCS), as Ray reports it."""
    ray = _ray()
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - only for messages
        return "(unknown address)"


def disconnect() -> None:
    """Leave the Ray cluster (the detached replica sets go on)."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


@dataclass
class Replica:
    """The driver's view of one replica: its actor, placement group and last known info."""

    index: int
    actor: Any
    placement_group: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str | None:
        """The server's base URL (None before it reported one)."""
        return self.info.get("url")


def _actor_class():
    ray = _ray()
    # A threaded actor: status calls are answered while wait_ready blocks.
    return ray.remote(max_concurrency=4)(ReplicaServer)


class ReplicaSet:
    """A named set of replicas on the Ray cluster (see the module docstring).

    Use :meth:`start` (new replicas) or :meth:`attach` (a running set, by name); then
    :meth:`wait_ready`, :meth:`urls`, :meth:`status`, :meth:`watch`, :meth:`stop`.
    """

    def __init__(self, name: str, replicas: Sequence[Replica], *, owned: bool) -> None:
        self.name = name
        self.replicas = list(replicas)
        self.owned = owned
        """True for a set this process started (a job's): :meth:`stop` is called at its end."""

    @classmethod
    def start(cls, name: str, spec: ReplicaSpec, replicas: int, *, detached: bool, max_restarts: int = 1) -> ReplicaSet:
        """Create ``replicas`` actors named ``NAME/i``, each in its own placement group.

        Returns at once; :meth:`wait_ready` waits for placement and model loading.

        Raises:
            ValueError: ``replicas`` < 1, a bad name.
            ClusterError: a set with this name is running already (names it).
        """
        _ray()  # installed, or a ClusterError naming the extra
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        check_name(name)
        if replicas < 1:
            raise ValueError(f"replicas must be ≥ 1, got {replicas}")
        if names_in_use(name):
            raise ClusterError(
                f"a replica set named {name!r} is already running on this cluster (rmserve cluster status {name}; "
                f"rmserve cluster down {name} to stop it)"
            )
        lifetime = "detached" if detached else None
        actor_class = _actor_class()
        # Ray warns at every restartable detached actor in a placement group that removing the
        # group kills it for good: only cluster down removes it, which is meant to.
        quiet = logging.getLogger("ray.actor")
        made = []
        bundle = {key: value for key, value in (("CPU", spec.cpus), ("GPU", spec.gpus)) if value}
        for index in range(replicas):
            # A replica that asks for nothing (0 CPUs, 0 GPUs) needs no placement group.
            group = (placement_group([bundle], strategy="STRICT_PACK", name=f"{name}/{index}", lifetime=lifetime)
                     if bundle else None)
            placed = {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group)} if group else {}
            with _level(quiet, logging.ERROR):
                actor = actor_class.options(
                    name=f"{name}/{index}", namespace=NAMESPACE, lifetime=lifetime, num_gpus=spec.gpus,
                    num_cpus=spec.cpus, max_restarts=max_restarts, **placed,
                ).remote(spec, name, index)
            made.append(Replica(index, actor, group))
        return cls(name, made, owned=not detached)

    @classmethod
    def attach(cls, name: str) -> ReplicaSet:
        """The running set named ``name`` (started by ``rmserve cluster up``).

        Raises:
            ClusterError: no replica of that name on this cluster (names the sets there are).
        """
        ray = _ray()
        check_name(name)
        indices = names_in_use(name)
        if not indices:
            sets = sorted(set_names())
            there = f"; running sets: {', '.join(sets)}" if sets else "; no rmserve replica set is running there"
            raise ClusterError(f"no replica set named {name!r} on the Ray cluster at {gcs_address()}{there}")
        replicas = []
        for index in indices:
            actor = ray.get_actor(f"{name}/{index}", namespace=NAMESPACE)
            try:
                group = ray.util.get_placement_group(f"{name}/{index}")
            except ValueError:
                group = None
            replicas.append(Replica(index, actor, group))
        return cls(name, replicas, owned=False)

    def wait_ready(self, *, placement_timeout_s: float = PLACEMENT_TIMEOUT_S) -> list[str]:
        """Wait until every replica is placed and its server ready; return the problems.

        A replica Ray cannot place within ``placement_timeout_s`` (no node with its GPUs
        free) and one whose server does not start are each named in one line (the latter
        with the last lines of its log); they are stopped. The others keep running.

        Returns:
            One sentence per replica that did not come up (empty when all did).
        """
        ray = _ray()
        problems: list[str] = []
        pending = {r.placement_group.ready(): r for r in self.replicas if r.placement_group is not None}
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=placement_timeout_s)
            for ref in set(pending) - set(ready):
                replica = pending[ref]
                bundle = replica.placement_group.bundle_specs[0]
                problems.append(
                    f"replica {self.name}/{replica.index}: Ray could not place it within {placement_timeout_s:g} s "
                    f"(no node has {_bundle_text(bundle)} free; ray status shows the cluster's resources)"
                )
                self._remove(replica)
        waits = {r.actor.wait_ready.remote(): r for r in self.replicas}
        for ref, replica in waits.items():
            try:
                replica.info = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                problems.append(str(exc.cause) if exc.cause is not None else str(exc))
                self._remove(replica)
            except ray.exceptions.RayActorError as exc:
                problems.append(f"replica {self.name}/{replica.index} died while starting: {_first_line(exc)}")
                self._remove(replica)
        return problems

    def refresh(self, timeout_s: float = 10.0) -> list[str]:
        """Ask every replica of a running set where it is; keep those whose server runs.

        A replica that does not answer within ``timeout_s`` (Ray is restarting it, or cannot
        place it) or whose server has exited is left out of :meth:`urls` for now, and never
        stopped: the set is the team's, not this job's.

        Returns:
            One sentence per replica left out (empty when all answered).
        """
        ray = _ray()
        problems = []
        for replica in self.replicas:
            replica.info = {}
            try:
                info = ray.get(replica.actor.info.remote(), timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - reported, the others go on
                problems.append(f"replica {self.name}/{replica.index} left out: it did not answer "
                                f"({type(exc).__name__}: {_first_line(exc)})")
                continue
            if not info.get("alive", True):
                problems.append(f"replica {self.name}/{replica.index} left out: its server exited (log on node "
                                f"{info.get('node_ip')}: {info.get('log_path')})")
                continue
            replica.info = info
        return problems

    def _remove(self, replica: Replica) -> None:
        self._remove_all([replica])

    def _remove_all(self, replicas: Sequence[Replica]) -> None:
        """Stop ``replicas`` together: each server is asked to stop cleanly (an actor that is
        dead, restarting or unplaced answers nothing and is skipped), then the actors are
        killed and their placement groups removed."""
        ray = _ray()
        from ray.util.placement_group import remove_placement_group

        for replica in replicas:
            if replica in self.replicas:
                self.replicas.remove(replica)
        answering = []
        for replica in replicas:
            try:
                ray.get(replica.actor.info.remote(), timeout=5)
                answering.append(replica)
            except Exception:  # noqa: BLE001 - nothing to stop (the server watches the actor's pid anyway)
                pass
        stops = [replica.actor.stop.remote() for replica in answering]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=45)
        for replica in replicas:
            ray.kill(replica.actor, no_restart=True)
            if replica.placement_group is not None:
                with contextlib.suppress(Exception):  # already gone
                    remove_placement_group(replica.placement_group)

    def model_paths(self) -> dict[str, str]:
        """Each replica's URL → the model it was started with (a path on its node, or a hub id)."""
        return {r.url: r.info["model_path"] for r in self.replicas if r.url is not None and "model_path" in r.info}

    def urls(self) -> list[str]:
        """The base URLs of the replicas that reported one (index order)."""
        return [r.url for r in self.replicas if r.url is not None]

    def status(self, timeout_s: float = 10.0, token: str | None = None) -> list[dict[str, Any]]:
        """Each replica's :meth:`~rmserve.cluster.replica.ReplicaServer.status` (index order),
        asked with ``token`` (servers with a users file need one); a replica that does not
        answer in ``timeout_s`` gets ``{"name", "index", "error"}``."""
        ray = _ray()
        found = []
        for replica in self.replicas:
            try:
                found.append(ray.get(replica.actor.status.remote(token), timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                found.append({"name": self.name, "index": replica.index, "error": _first_line(exc)})
        return found

    async def watch(self, url: str, *, poll_s: float = 2.0) -> str | None:
        """Return once the replica serving ``url`` is lost: the URL of its new server when Ray
        has already restarted it elsewhere (the caller waits for it to be ready), else None
        (dropped for this job; Ray may still restart it later).

        Lost means Ray reports the actor dead or restarting, or its server process exited.
        Runs until cancelled while the replica is fine.
        """
        ray = _ray()
        replica = next((r for r in self.replicas if r.url == url), None)
        if replica is None:
            raise ValueError(f"{url} is not a replica of {self.name}")
        while True:
            await asyncio.sleep(poll_s)
            try:
                info = await asyncio.to_thread(ray.get, replica.actor.info.remote(), timeout=30)
            except ray.exceptions.GetTimeoutError:
                continue
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                logger.warning("replica %s/%d (%s) lost: Ray reports its actor dead or restarting",
                               self.name, replica.index, url)
                return None
            if info.get("url") != url:
                logger.warning("replica %s/%d (%s) was restarted by Ray: now %s", self.name, replica.index, url,
                               info.get("url"))
                replica.info = info
                return info.get("url")
            if not info.get("alive", True):
                logger.warning("replica %s/%d (%s) lost: its server exited", self.name, replica.index, url)
                return None

    def stop(self) -> None:
        """Stop every replica's server (all at once), kill the actors and remove their
        placement groups."""
        self._remove_all(list(self.replicas))


def _running_sets() -> dict[str, list[int]]:
    """Set name → the sorted indices of its running actors (``NAME/i`` in :data:`NAMESPACE`)."""
    ray = _ray()
    sets: dict[str, list[int]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        base, _, index = entry.get("name", "").rpartition("/")
        if entry.get("namespace") == NAMESPACE and index.isdigit():
            sets.setdefault(base, []).append(int(index))
    return {name: sorted(indices) for name, indices in sets.items()}


def names_in_use(name: str) -> list[int]:
    """The indices of the running actors named ``NAME/i`` in :data:`NAMESPACE`, sorted."""
    return _running_sets().get(name, [])


def set_names() -> set[str]:
    """The names of the replica sets running on this cluster."""
    return set(_running_sets())


@contextlib.contextmanager
def _level(logger_: logging.Logger, level: int):
    saved = logger_.level
    logger_.setLevel(level)
    try:
        yield
    finally:
        logger_.setLevel(saved)


def _bundle_text(bundle: dict[str, float]) -> str:
    return " and ".join(f"{value:g} {key}" for key, value in bundle.items())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
