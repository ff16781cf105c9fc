"""Pipelines that work the same on one Redis and on a Redis Cluster, redirects and lost scripts included.

:func:`run_pipeline` sends commands as one non-transactional pipeline and returns one reply per command,
errors as exception instances (``raise_on_error=False``). On a cluster it follows the redirects itself
instead of leaving them to redis-py (checked against redis-py 8.1):

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

RedisClient: TypeAlias = aioredis.Redis | aioredis.RedisCluster
"""What the tiers and readers accept: one Redis, or a Redis Cluster client."""

MAX_ROUNDS = 16
"""Redirect rounds per call before the last redirect error is returned as the reply (redis-py uses 16)."""

_TRYAGAIN_PAUSE_S = 0.05

# Where a pending command goes next: None = by the client's slot map; else (node "host:port", asking).
_Target = tuple[str, bool] | None


@dataclass
class RedirectStats:
    """Counts of what :func:`run_pipeline` had to follow, summed over the calls it was passed to."""

    ask: int = 0
    moved: int = 0
    tryagain: int = 0
    noscript: int = 0


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, aioredis.RedisCluster)


async def run_pipeline(
    client: RedisClient,
    commands: Sequence[Sequence[Any]],
    *,
    scripts: Sequence[str] = (),
    stats: RedirectStats | None = None,
) -> list[Any]:
    """One reply per command, in order; errors come back as exception instances, never raised.

    Connection-level failures (the server is down) are raised as redis-py raises them.
    """
    if not commands:
        return []
    stats = stats if stats is not None else RedirectStats()
    if isinstance(client, aioredis.RedisCluster):
        return await _run_cluster(client, commands, scripts, stats)
    return await _run_single(client, commands, scripts, stats)


async def _run_single(
    client: aioredis.Redis, commands: Sequence[Sequence[Any]], scripts: Sequence[str], stats: RedirectStats
) -> list[Any]:
    replies: list[Any] = [None] * len(commands)
    pending = list(range(len(commands)))
    for attempt in range(2):
        async with client.pipeline(transaction=False) as pipe:
            for index in pending:
                pipe.execute_command(*commands[index])
            got = await pipe.execute(raise_on_error=False)
        refused = []
        for index, reply in zip(pending, got, strict=True):
            replies[index] = reply
            if isinstance(reply, NoScriptError) and scripts and attempt == 0:
                refused.append(index)
        if not refused:
            break
        stats.noscript += len(refused)
        for script in scripts:
            await client.script_load(script)
        pending = refused
    return replies


async def _run_cluster(
    client: aioredis.RedisCluster,
    commands: Sequence[Sequence[Any]],
    scripts: Sequence[str],
    stats: RedirectStats,
) -> list[Any]:
    replies: list[Any] = [None] * len(commands)
    pending: list[tuple[int, _Target]] = [(index, None) for index in range(len(commands))]
    loaded_on_primaries = False
    loaded_on: set[str] = set()
    temporary: dict[str, ClusterNode] = {}
    try:
        for _ in range(MAX_ROUNDS):
            answered = await _send_round(client, commands, pending, temporary)
            retry: list[tuple[int, _Target]] = []
            refresh = pause = load_primaries = False
            load_nodes: set[str] = set()
            for (index, target), reply in zip(pending, answered, strict=True):
                replies[index] = reply
                if isinstance(reply, MovedError):  # a subclass of AskError: test it first
                    retry.append((index, (_name(reply), False)))
                    refresh = True
                    stats.moved += 1
                elif isinstance(reply, AskError):
                    retry.append((index, (_name(reply), True)))
                    stats.ask += 1
                elif isinstance(reply, TryAgainError):
                    retry.append((index, target))
                    pause = True
                    stats.tryagain += 1
                elif isinstance(reply, NoScriptError) and scripts:
                    if target is None and not loaded_on_primaries:
                        load_primaries = True
                        retry.append((index, target))
                        stats.noscript += 1
                    elif target is not None and target[0] not in loaded_on:
                        load_nodes.add(target[0])
                        retry.append((index, target))
                        stats.noscript += 1
            if not retry:
                break
            if load_primaries:
                for script in scripts:
                    await client.script_load(script)  # SCRIPT LOAD goes to every primary
                loaded_on_primaries = True
            for name in sorted(load_nodes):
                node = await _node(client, name, temporary)
                for script in scripts:
                    await node.execute_command("SCRIPT", "LOAD", script)
                loaded_on.add(name)
            if refresh:
                await client.nodes_manager.initialize()
            if pause:
                await asyncio.sleep(_TRYAGAIN_PAUSE_S)
            pending = retry
    finally:
        for node in temporary.values():
            await node.disconnect()
    return replies


async def _send_round(
    client: aioredis.RedisCluster,
    commands: Sequence[Sequence[Any]],
    pending: Sequence[tuple[int, _Target]],
    temporary: dict[str, ClusterNode],
) -> list[Any]:
    """Send every pending command once: by slot map in one cluster pipeline, or to its named node."""
    answered: list[Any] = [None] * len(pending)
    routed = [position for position, (_, target) in enumerate(pending) if target is None]
    if routed:
        async with client.pipeline(transaction=False) as pipe:
            for position in routed:
                pipe.execute_command(*commands[pending[position][0]])
            # allow_redirections=False: redirects come back as replies and are followed by _run_cluster.
            got = await pipe.execute(raise_on_error=False, allow_redirections=False)
        for position, reply in zip(routed, got, strict=True):
            answered[position] = reply
    by_node: dict[str, list[int]] = {}
    for position, (_, target) in enumerate(pending):
        if target is not None:
            by_node.setdefault(target[0], []).append(position)
    for name, positions in by_node.items():
        node = await _node(client, name, temporary)
        stack: list[PipelineCommand] = []
        sent: list[PipelineCommand] = []
        for position in positions:
            index, target = pending[position]
            if target is not None and target[1]:
                stack.append(PipelineCommand(len(stack), "ASKING"))  # one-shot flag for the next command
            command = PipelineCommand(len(stack), *commands[index])
            stack.append(command)
            sent.append(command)
        await node.execute_pipeline(stack)  # one connection, in order
        for position, command in zip(positions, sent, strict=True):
            answered[position] = command.result
    return answered


async def _node(client: aioredis.RedisCluster, name: str, temporary: dict[str, ClusterNode]) -> ClusterNode:
    """The client's node ``host:port``; a node it does not know (an importing node without slots yet,
    when the cluster grows) gets a temporary connection pool, closed at the end of the call."""
    node = client.get_node(node_name=name) or temporary.get(name)
    if node is None:
        host, port = name.rsplit(":", 1)
        kwargs: dict[str, Any] = {
            k: v for k, v in client.get_connection_kwargs().items() if k not in ("host", "port")
        }
        node = ClusterNode(host, int(port), **kwargs)
        temporary[name] = node
    return node


def _name(redirect: AskError) -> str:
    return f"{redirect.host}:{redirect.port}"
