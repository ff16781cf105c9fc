"""Reading entries back from Redis (for the verifier, prewarm and tests), in the documented layout.

Every read is one pipeline that follows cluster redirects (:func:`~cache_writer.redis.pipeline.run_pipeline`);
an error reply of any command is raised. ``RedisTier`` offers the same reads as methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from cache_writer.layout import namespace_pattern
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from cache_writer.redis.replies import hash_fields, raise_errors


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    version: int
    value: bytes | None
    """None for a tombstone."""
    commit_ts_us: int | None
    signature: str | None = None
    """The schema signature it was built under (field ``s``); None: none (a namespace without model)."""
    row: str | None = None
    """Semantic entries: the row key of the row it was built from (field ``k``)."""

    @property
    def tombstone(self) -> bool:
        return self.value is None


def parse_entry(key: str, fields: dict[bytes, bytes]) -> Entry | None:
    """The entry (or tombstone) held in the fields of ``key``'s hash; None when it holds none (absent, or
    only a fill lease)."""
    if b"v" not in fields:
        return None
    commit = fields.get(b"c")
    return Entry(
        key=key,
        version=int(fields[b"v"]),
        value=None if fields.get(b"tomb") == b"1" else fields.get(b"d"),
        commit_ts_us=int(commit) if commit is not None else None,
        signature=fields[b"s"].decode() if b"s" in fields else None,
        row=fields[b"k"].decode() if b"k" in fields else None,
    )


async def read_entries(client: RedisClient, keys: Sequence[str]) -> dict[str, Entry | None]:
    """The entry at each key (None where there is none), in one pipeline of HGETALLs."""
    keys = list(dict.fromkeys(keys))
    replies = raise_errors(await run_pipeline(client, [("HGETALL", key) for key in keys]))
    return {key: parse_entry(key, hash_fields(reply)) for key, reply in zip(keys, replies, strict=True)}


async def read_fields(
    client: RedisClient, keys: Sequence[str], fields: Sequence[str]
) -> list[list[bytes | None]]:
    """The values of ``fields`` of each key's hash (None where absent), in one pipeline of HMGETs."""
    replies = raise_errors(await run_pipeline(client, [("HMGET", key, *fields) for key in keys]))
    return [list(reply) for reply in replies]


async def read_namespace(
    client: RedisClient, prefix: str, namespace: str, *, batch: int = 1000
) -> dict[str, Entry]:
    """Every entry (and tombstone) of a namespace, by key. SCAN-based: safe on a live server.

    On a Redis Cluster every primary is scanned, not only the one that owns the namespace's slot: while
    that slot migrates, its keys sit on two nodes. As with SCAN on one server, a key that moves while the
    scan runs may be missed; the HGETALLs follow MOVED/ASK (:func:`run_pipeline`).
    """
    entries: dict[str, Entry] = {}
    keys: list[str] = []

    async def flush() -> None:
        for entry in (await read_entries(client, keys)).values():
            if entry is not None:
                entries[entry.key] = entry
        keys.clear()

    async for key in scan_keys(client, namespace_pattern(prefix, namespace), batch):
        keys.append(key.decode())
        if len(keys) >= batch:
            await flush()
    if keys:
        await flush()
    return entries


async def scan_keys(client: RedisClient, pattern: str, count: int) -> AsyncIterator[bytes]:
    """Every key matching ``pattern`` (SCAN MATCH), on every primary of a cluster, each key once."""
    if not isinstance(client, aioredis.RedisCluster):
        async for key in client.scan_iter(match=pattern, count=count):
            yield key
        return
    seen: set[bytes] = set()
    for node in client.get_primaries():
        cursor = 0
        while True:
            cursor, keys = await node.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", count)
            for key in keys:
                if key not in seen:  # a key that migrated between two scans would come twice
                    seen.add(key)
                    yield key
            if int(cursor) == 0:
                break
