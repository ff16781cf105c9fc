"""Reading entries back from Redis (for the verifier and for tests), in the documented layout."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from cache_writer.keys import namespace_pattern


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    version: int
    value: bytes | None
    """None for a tombstone."""
    commit_ts_us: int | None

    @property
    def tombstone(self) -> bool:
        return self.value is None


def parse_entry(key: str, fields: dict[bytes, bytes]) -> Entry | None:
    if b"v" not in fields:
        return None
    commit = fields.get(b"c")
    return Entry(
        key=key,
        version=int(fields[b"v"]),
        value=None if fields.get(b"tomb") == b"1" else fields.get(b"d"),
        commit_ts_us=int(commit) if commit is not None else None,
    )


async def read_namespace(
    client: aioredis.Redis, prefix: str, namespace: str, *, batch: int = 1000
) -> dict[str, Entry]:
    """Every entry (and tombstone) of a namespace, by key. SCAN-based: safe on a live server."""
    entries: dict[str, Entry] = {}
    keys: list[bytes] = []

    async def flush() -> None:
        async with client.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hgetall(k)
            replies = await pipe.execute()
        for k, fields in zip(keys, replies, strict=True):
            entry = parse_entry(k.decode(), fields)
            if entry is not None:
                entries[entry.key] = entry
        keys.clear()

    async for key in client.scan_iter(match=namespace_pattern(prefix, namespace), count=batch):
        keys.append(key)
        if len(keys) >= batch:
            await flush()
    if keys:
        await flush()
    return entries
