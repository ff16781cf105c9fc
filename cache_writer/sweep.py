"""Background sweep of entries built under an old signature (``freshkey model sweep``).

A cutover never scans: old entries simply stop being served. They still hold memory until their TTL;
this sweep frees it sooner. It SCANs the namespace (every primary of a cluster) and runs
``sweep_entry.lua`` on each entry, which re-checks atomically that the entry is built under neither the
active nor the pending signature before deleting it; tombstones are never deleted.
"""

from __future__ import annotations

from cache_writer.entries import scan_keys
from cache_writer.layout import is_signature_key, namespace_pattern, signature_key
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedisClient, run_pipeline
from cache_writer.redis.replies import raise_errors


async def sweep_namespace(
    client: RedisClient, prefix: str, namespace: str, *, batch: int = 1000, dry_run: bool = False
) -> tuple[int, int]:
    """Returns (keys scanned, entries deleted or, with ``dry_run``, that would be)."""
    signature = signature_key(prefix, namespace)
    scanned = deleted = 0
    keys: list[bytes] = []

    async def flush() -> int:
        commands = [
            ("EVALSHA", scripts.SWEEP_ENTRY.sha, 2, k, signature, "1" if dry_run else "0") for k in keys
        ]
        replies = raise_errors(await run_pipeline(client, commands, scripts=(scripts.SWEEP_ENTRY.text,)))
        keys.clear()
        return sum(int(r) for r in replies)

    async for key in scan_keys(client, namespace_pattern(prefix, namespace), batch):
        scanned += 1
        if is_signature_key(key):
            continue
        keys.append(key)
        if len(keys) >= batch:
            deleted += await flush()
    if keys:
        deleted += await flush()
    return scanned, deleted
