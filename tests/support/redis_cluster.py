"""A private Redis Cluster of N masters, for the tests (slot migrations, growing the cluster)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from pipeline.embedded.process import (
    _LIVE_LOCK,
    HOST,
    PORT_ATTEMPTS,
    LocalService,
    ServiceStartError,
    find_binary,
    free_port,
    log_tail,
)

if TYPE_CHECKING:
    pass


from pipeline.embedded.redis import LocalRedis

_CLUSTER_SLOTS = 16384
_CLUSTER_BUS_OFFSET = 10000  # Redis puts a node's cluster bus on its port + 10000


def _free_cluster_port() -> int:
    """A port P on 127.0.0.1 such that P and its cluster bus port P + 10000 were both free when asked."""
    for _ in range(200):
        port = free_port()
        if port + _CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port + _CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise ServiceStartError("no free port P with P + 10000 free as well (the Redis Cluster bus port)")


class _LocalRedisClusterNode(LocalRedis):
    """One redis-server of a :class:`LocalRedisCluster`: a LocalRedis with cluster mode on."""

    def __init__(self, workdir: Path, port: int, start_timeout: float, node_timeout_ms: int) -> None:
        super().__init__(workdir, port, start_timeout)
        self._node_timeout_ms = node_timeout_ms

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(self.workdir / "nodes.conf"),
            "--cluster-node-timeout",
            str(self._node_timeout_ms),
        ]
        super()._spawn([*argv, *cluster_args], env)


_LIVE_CLUSTERS: set[LocalRedisCluster] = set()


def _stop_clusters_at_exit() -> None:
    """Stop every cluster still running at interpreter exit (runs before ``_stop_all_at_exit``)."""
    with _LIVE_LOCK:
        clusters = list(_LIVE_CLUSTERS)
    for cluster in clusters:
        if cluster._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                cluster.stop(timeout=LocalService._quick_grace)


atexit.register(_stop_clusters_at_exit)


class LocalRedisCluster:
    """A private Redis Cluster: ``masters`` redis-server processes in cluster mode, no replicas.

    Each node is a :class:`LocalRedis` child (own process group, atexit and PDEATHSIG cleanup) started
    with ``--cluster-enabled yes --cluster-node-timeout 2000`` and its own ``nodes.conf`` in
    ``<workdir>/node-<i>/`` on a free port P whose cluster bus port P + 10000 is free too. The cluster is
    formed without ``redis-cli``: each node gets a distinct config epoch and an even share of the 16384
    slots (``CLUSTER ADDSLOTS``), then every node ``CLUSTER MEET``s the others. ``start()`` returns once every
    node reports ``cluster_state:ok``, knows all ``masters`` nodes and sees the same slot map.

    Clients: ``url`` (``redis://127.0.0.1:<port of node 0>/0``) is a seed; a cluster client discovers the
    other nodes from it (``redis.asyncio.RedisCluster.from_url(url)``; for freshkey set
    ``FRESHKEY_REDIS_URL`` to it and ``FRESHKEY_REDIS_CLUSTER=true``). ``nodes`` lists every node as
    ``host:port``.

    A work directory passed in is kept by ``stop()``, but its ``node-<i>`` subdirectories are emptied by
    ``start()`` (a stale ``nodes.conf`` would bring back an old cluster); one created here is removed.
    """

    _kind = "redis-cluster"

    def __init__(
        self,
        workdir: Path | None = None,
        masters: int = 3,
        start_timeout: float = 30.0,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._masters = masters
        self._start_timeout = start_timeout
        self._node_timeout_ms = node_timeout_ms
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._nodes: list[_LocalRedisClusterNode] = []
        self._owner_pid = os.getpid()

    # public properties ---------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always 127.0.0.1."""
        return HOST

    @property
    def ports(self) -> list[int]:
        """The client port of every node, node 0 first."""
        if not self._nodes:
            raise RuntimeError("redis cluster not started")
        return [node.port for node in self._nodes]

    @property
    def nodes(self) -> list[str]:
        """Every node as ``127.0.0.1:<port>``, node 0 first (seeds for a cluster client)."""
        return [f"{HOST}:{port}" for port in self.ports]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port of node 0>/0``: a seed URL; a cluster client discovers the rest."""
        return f"redis://{HOST}:{self.ports[0]}/0"

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("redis cluster not started: no work directory yet")
        return self._workdir

    @property
    def pids(self) -> list[int]:
        """PIDs of the running nodes (each also its process-group id)."""
        return [node.pid for node in self._nodes if node.pid is not None]

    @property
    def running(self) -> bool:
        """True while every node process is alive."""
        return bool(self._nodes) and all(node.running for node in self._nodes)

    # lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the nodes, form the cluster and return once it is ``ok`` everywhere."""
        if self._nodes:
            raise RuntimeError(f"redis cluster already started (pids {self.pids})")
        find_binary(["redis-server"], "apt-get update && apt-get install -y redis-server")
        self._owner_pid = os.getpid()
        if self._workdir_arg is not None:
            self._workdir = self._workdir_arg
            self._workdir.mkdir(parents=True, exist_ok=True)
            self._owns_workdir = False
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"freshkey-{self._kind}-"))
            self._owns_workdir = True
        with _LIVE_LOCK:
            _LIVE_CLUSTERS.add(self)
        try:
            for index in range(self._masters):
                self._nodes.append(self._start_node(index))
            self._form()
        except BaseException:
            self.stop(timeout=LocalService._quick_grace)
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node and remove a work directory created here. Safe to call more than once."""
        nodes, self._nodes = self._nodes, []
        try:
            for node in nodes:
                node.stop(timeout)
        finally:
            if self._owns_workdir and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
                self._owns_workdir = False
            with _LIVE_LOCK:
                _LIVE_CLUSTERS.discard(self)

    def add_node(self) -> str:
        """Start one more node, join it to the cluster as a master without slots; its ``host:port``.

        What an operator does to grow a cluster before moving slots to the new node (a reshard). Returns
        once every node, the new one included, is ``ok``, knows every node and sees the same slot map
        (a new master turns ``ok`` no sooner than 2 s after it started: Redis's writable delay).
        """
        if not self._nodes:
            raise RuntimeError("redis cluster not started")
        import redis

        node = self._start_node(len(self._nodes))
        self._nodes.append(node)
        clients: list[Any] = [
            redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=5)
            for port in self.ports
        ]
        try:
            clients[0].execute_command("CLUSTER", "MEET", HOST, node.port)
            self._wait_formed(clients)
            return f"{HOST}:{node.port}"
        finally:
            for client in clients:
                client.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # helpers -------------------------------------------------------------------------------------------

    def _start_node(self, index: int) -> _LocalRedisClusterNode:
        node_dir = self.workdir / f"node-{index}"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            shutil.rmtree(node_dir, ignore_errors=True)  # no stale nodes.conf from an earlier cluster
            node = _LocalRedisClusterNode(
                node_dir, _free_cluster_port(), self._start_timeout, self._node_timeout_ms
            )
            try:
                return node.start()
            except ServiceStartError:
                # The port (or its bus port) may have been taken meanwhile: try another one.
                if attempt == PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _log_paths(self) -> list[Path]:
        return [path for node in self._nodes for path in node._log_paths()]

    def _form(self) -> None:
        import redis

        clients: list[Any] = [
            redis.Redis(host=HOST, port=port, socket_timeout=5, socket_connect_timeout=5)
            for port in self.ports
        ]
        try:
            bounds = [_CLUSTER_SLOTS * i // self._masters for i in range(self._masters + 1)]
            for index, client in enumerate(clients):
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(bounds[index], bounds[index + 1]))
            # Every node meets every other one: faster than waiting for gossip to spread the news.
            for index, client in enumerate(clients):
                for port in self.ports[index + 1 :]:
                    client.execute_command("CLUSTER", "MEET", HOST, port)
            self._wait_formed(clients)
        finally:
            for client in clients:
                client.close()

    def _wait_formed(self, clients: Sequence[Any]) -> None:
        """Until every node is ``ok``, knows every node and sees the same slot map."""
        deadline = time.monotonic() + self._start_timeout
        last = "no answer yet"
        while True:
            for node in self._nodes:
                if not node.running:
                    raise ServiceStartError(
                        f"redis cluster node on port {node.port} exited while the cluster formed\n"
                        + log_tail(self._log_paths())
                    )
            try:
                views = []
                for client, port in zip(clients, self.ports, strict=True):
                    info = _cluster_info(client)
                    if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(
                        len(self._nodes)
                    ):
                        last = f"node {port}: {info}"
                        break
                    views.append(_slot_map(client))
                else:
                    if all(view == views[0] for view in views):
                        return
                    last = f"the nodes disagree on the slot map: {views}"
            except Exception as exc:  # not ready yet
                last = repr(exc)
            if time.monotonic() >= deadline:
                raise ServiceStartError(
                    f"redis cluster on ports {self.ports} not ok within {self._start_timeout:.0f} s"
                    f" (last: {last})\n" + log_tail(self._log_paths())
                )
            time.sleep(0.05)


def _cluster_info(client: Any) -> dict[str, str]:
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _slot_map(client: Any) -> list[tuple[int, int, int]]:
    """``CLUSTER SLOTS`` as sorted (first slot, last slot, master port) ranges."""
    ranges = client.execute_command("CLUSTER", "SLOTS")
    return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in ranges)
