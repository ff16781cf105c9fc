"""Pipelines that work the same on one Redis and on a Redis Cluster, redirects and lost scripts included.

:func:`run_pipeline` (asyncio) and :func:`run_pipeline_sync` (blocking) send commands as one
non-transactional pipeline and return one reply per command, errors as exception instances
(``raise_on_error=False``). The rules live once in :mod:`cache_writer.redis.redirects`; the two functions
only carry them out. On a cluster they follow the redirects themselves instead of leaving them to
redis-py (checked against redis-py 8.1):

- redis-py's own ASK handling sends ``ASKING`` and the redirected command as two separate requests, each
  on a connection taken from the target node's pool. When that pool holds two or more idle connections
  (any concurrent use of the client), ``ASKING`` lands on one connection and the command on another; the
  importing node answers MOVED back to the source, which answers ASK again, until redis-py gives up with
  ``ClusterError('TTL exhausted.')``. The cluster test shows it. Here each redirected command is sent in a
  pipeline on one connection of the node the server named, right behind its own ``ASKING``.
- MOVED: the command is resent to the node named in the reply (no ``ASKING``), and the client's slot map
  is refreshed (``CLUSTER SLOTS``) for later batches.
- TRYAGAIN (multi-key commands during a migration): resent after a short pause.
- NOSCRIPT, when ``scripts`` are given: they are loaded on the node that refused (every primary when the
  command went through the slot map, since the reply does not say which node answered) and only the
  refused commands are resent; a node that refuses again after a load keeps its NoScriptError reply.
  An ASK to a master that joined without slots (growing the cluster) reaches a node the client does not
  know yet and that has no scripts: it gets a temporary connection pool and the scripts.

Resending is safe for freshkey because every write and invalidation is a compare-and-set on the
version: a command that did run before its connection broke runs again as a stale no-op.

A rule for the Lua scripts: a script must never make its key vanish midway (``DEL`` then ``HSET``).
While the key's slot migrates, Redis checks every command inside a script like a client command; on
the source, a command on a key that does not exist (any more) is refused with "Script attempted to
access a non local key", after the earlier commands have run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, TypeAlias

import redis
import redis.asyncio as aioredis
import redis.cluster as sync_cluster
from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from cache_writer.redis.redirects import (
    MAX_ROUNDS,
    RedirectStats,
    Step,
    Target,
    by_node,
    pipeline_steps,
    routed,
)
from cache_writer.steps import StepRunner

RedisClient: TypeAlias = aioredis.Redis | aioredis.RedisCluster
"""What the asyncio tiers and readers accept: one Redis, or a Redis Cluster client."""

SyncRedisClient: TypeAlias = redis.Redis | redis.RedisCluster
"""What the blocking readers accept: one Redis, or a Redis Cluster client."""

Commands = Sequence[Sequence[Any]]
Pending = list[tuple[int, Target]]

__all__ = [
    "MAX_ROUNDS",
    "RedirectStats",
    "RedisClient",
    "SyncRedisClient",
    "is_cluster",
    "run_pipeline",
    "run_pipeline_sync",
]


def is_cluster(client: RedisClient | SyncRedisClient) -> bool:
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


def _runner(
    count: int, scripts: Sequence[str], cluster: bool, stats: RedirectStats | None
) -> StepRunner[Step, list[Any]]:
    return StepRunner(pipeline_steps(count, scripts=bool(scripts), follow_redirects=cluster, stats=stats))


# --- asyncio ---------------------------------------------------------------------------------------------


async def run_pipeline(
    client: RedisClient,
    commands: Commands,
    *,
    scripts: Sequence[str] = (),
    stats: RedirectStats | None = None,
) -> list[Any]:
    """One reply per command, in order; errors come back as exception instances, never raised.

    Connection-level failures (the server is down) are raised as redis-py raises them.
    """
    if not commands:
        return []
    driver: _AsyncCluster | _AsyncSingle
    if isinstance(client, aioredis.RedisCluster):
        driver = _AsyncCluster(client, commands, scripts)
    else:
        driver = _AsyncSingle(client, commands, scripts)
    steps = _runner(len(commands), scripts, isinstance(driver, _AsyncCluster), stats)
    try:
        step = steps.next(None)
        while step is not None:
            step = steps.next(await getattr(driver, step.op)(*step.args))
        return steps.result
    finally:
        await driver.close()


class _AsyncSingle:
    def __init__(self, client: aioredis.Redis, commands: Commands, scripts: Sequence[str]) -> None:
        self.client, self.commands, self.scripts = client, commands, scripts

    async def send(self, pending: Pending) -> list[Any]:
        if len(pending) == 1:  # one command: no pipeline object (a client read is one script call)
            try:
                return [await self.client.execute_command(*self.commands[pending[0][0]])]  # type: ignore[no-untyped-call]
            except ResponseError as exc:  # an error reply, as a pipeline returns it
                return [exc]
        async with self.client.pipeline(transaction=False) as pipe:
            for index, _ in pending:
                pipe.execute_command(*self.commands[index])
            return list(await pipe.execute(raise_on_error=False))

    async def load(self, node: str | None) -> None:
        for script in self.scripts:
            await self.client.script_load(script)

    async def close(self) -> None:
        pass


class _AsyncCluster:
    def __init__(self, client: aioredis.RedisCluster, commands: Commands, scripts: Sequence[str]) -> None:
        self.client, self.commands, self.scripts = client, commands, scripts
        self.temporary: dict[str, ClusterNode] = {}

    async def send(self, pending: Pending) -> list[Any]:
        """Every pending command once: by slot map in one cluster pipeline, or to its named node."""
        answered: list[Any] = [None] * len(pending)
        positions = routed(pending)
        if positions:
            async with self.client.pipeline(transaction=False) as pipe:
                for position in positions:
                    pipe.execute_command(*self.commands[pending[position][0]])
                # allow_redirections=False: redirects come back as replies, for pipeline_steps.
                got = await pipe.execute(raise_on_error=False, allow_redirections=False)
            for position, reply in zip(positions, got, strict=True):
                answered[position] = reply
        for name, positions in by_node(pending).items():
            node = self._node(name)
            stack: list[PipelineCommand] = []
            sent: list[PipelineCommand] = []
            for position in positions:
                index, target = pending[position]
                if target is not None and target[1]:
                    stack.append(PipelineCommand(len(stack), "ASKING"))  # one-shot flag for the next command
                sent.append(PipelineCommand(len(stack), *self.commands[index]))
                stack.append(sent[-1])
            await node.execute_pipeline(stack)  # one connection, in order
            for position, command in zip(positions, sent, strict=True):
                answered[position] = command.result
        return answered

    async def load(self, node: str | None) -> None:
        for script in self.scripts:
            if node is None:
                await self.client.script_load(script)  # SCRIPT LOAD goes to every primary
            else:
                await self._node(node).execute_command("SCRIPT", "LOAD", script)

    async def refresh(self) -> None:
        await self.client.nodes_manager.initialize()

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _node(self, name: str) -> ClusterNode:
        """The client's node ``host:port``; a node it does not know (an importing node without slots yet,
        when the cluster grows) gets a temporary connection pool, closed at the end of the call."""
        node = self.client.get_node(node_name=name) or self.temporary.get(name)
        if node is None:
            host, port = name.rsplit(":", 1)
            kwargs = self.client.get_connection_kwargs()
            kept: dict[str, Any] = {k: v for k, v in kwargs.items() if k not in ("host", "port")}
            node = self.temporary[name] = ClusterNode(host, int(port), **kept)
        return node

    async def close(self) -> None:
        for node in self.temporary.values():
            await node.disconnect()


# --- blocking --------------------------------------------------------------------------------------------


def run_pipeline_sync(
    client: SyncRedisClient,
    commands: Commands,
    *,
    scripts: Sequence[str] = (),
    stats: RedirectStats | None = None,
) -> list[Any]:
    """:func:`run_pipeline` for redis-py's blocking clients: the same replies, redirects and reloads."""
    if not commands:
        return []
    driver: _SyncCluster | _SyncSingle
    if isinstance(client, redis.RedisCluster):
        driver = _SyncCluster(client, commands, scripts)
    else:
        driver = _SyncSingle(client, commands, scripts)
    steps = _runner(len(commands), scripts, isinstance(driver, _SyncCluster), stats)
    try:
        step = steps.next(None)
        while step is not None:
            step = steps.next(getattr(driver, step.op)(*step.args))
        return steps.result
    finally:
        driver.close()


class _SyncSingle:
    def __init__(self, client: redis.Redis, commands: Commands, scripts: Sequence[str]) -> None:
        self.client, self.commands, self.scripts = client, commands, scripts

    def send(self, pending: Pending) -> list[Any]:
        if len(pending) == 1:  # one command: no pipeline object (a client read is one script call)
            try:
                return [self.client.execute_command(*self.commands[pending[0][0]])]  # type: ignore[no-untyped-call]
            except ResponseError as exc:  # an error reply, as a pipeline returns it
                return [exc]
        pipe: Any
        with self.client.pipeline(transaction=False) as pipe:
            for index, _ in pending:
                pipe.execute_command(*self.commands[index])
            return list(pipe.execute(raise_on_error=False))

    def load(self, node: str | None) -> None:
        for script in self.scripts:
            self.client.script_load(script)

    def close(self) -> None:
        pass


class _SyncCluster:
    def __init__(self, client: redis.RedisCluster, commands: Commands, scripts: Sequence[str]) -> None:
        self.client: Any = client  # redis-py's blocking cluster client has no type hints
        self.commands, self.scripts = commands, scripts
        self.temporary: dict[str, Any] = {}

    def send(self, pending: Pending) -> list[Any]:
        """As :meth:`_AsyncCluster.send`; a connection that failed is raised, not returned as a reply."""
        answered: list[Any] = [None] * len(pending)
        positions = routed(pending)
        pipe: Any
        if positions:
            command: Any = sync_cluster.PipelineCommand
            stack = [
                command(tuple(self.commands[pending[p][0]]), position=i) for i, p in enumerate(positions)
            ]
            with self.client.pipeline(transaction=False) as pipe:
                # allow_redirections=False: redirects come back as replies, for pipeline_steps.
                got = pipe.send_cluster_commands(stack, raise_on_error=False, allow_redirections=False)
            for position, reply in zip(positions, got, strict=True):
                answered[position] = reply
        for name, positions in by_node(pending).items():
            sent: list[int] = []  # where each command's reply is among the node's replies
            with self._node(name).pipeline(transaction=False) as pipe:  # one connection, in order
                for position in positions:
                    index, target = pending[position]
                    if target is not None and target[1]:
                        pipe.execute_command("ASKING")  # one-shot flag for the next command
                    sent.append(len(pipe))
                    pipe.execute_command(*self.commands[index])
                got = pipe.execute(raise_on_error=False)
            for position, at in zip(positions, sent, strict=True):
                answered[position] = got[at]
        for reply in answered:
            if isinstance(reply, ConnectionError | TimeoutError):
                raise reply
        return answered

    def load(self, node: str | None) -> None:
        for script in self.scripts:
            if node is None:
                self.client.script_load(script)  # SCRIPT LOAD goes to every primary
            else:
                self._node(node).script_load(script)

    def refresh(self) -> None:
        self.client.nodes_manager.initialize()

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def _node(self, name: str) -> Any:
        """As :meth:`_AsyncCluster._node`: the node's client, or a temporary one for a node the client does
        not know yet."""
        node = self.client.get_node(node_name=name)
        if node is not None:
            return self.client.get_redis_connection(node)
        if name not in self.temporary:
            host, port = name.rsplit(":", 1)
            kwargs = dict(self.client.get_connection_kwargs())
            self.temporary[name] = self.client.nodes_manager.create_redis_node(host, int(port), **kwargs)
        return self.temporary[name]

    def close(self) -> None:
        for node in self.temporary.values():
            node.close()
