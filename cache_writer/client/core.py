"""The application side: read through the tiers, and fill after a miss only under a valid lease.

``get`` reads L1 (in-process) -> L2 (Redis) -> L3 (an optional second Redis); a miss returns a
:class:`Lease` when this caller is the one to fill the key (one holder per key at a time: stampede
protection) or ``lease=None`` when another caller already is (wait briefly, or read through without
filling). ``fill`` lands only if no pipeline write or invalidation touched the key since the lease was
issued (checked atomically in Redis: both remove the lease): the stale-fill race of cache-aside, where
a reader's database read happens before a change and its fill after the change's invalidation, cannot
leave old data behind. ``get_or_load`` wraps the whole dance around a loader.

Schema signatures (invariant 7): ``get`` reads the entry and the namespace's active signature in one
script; an entry built under another signature is a miss (and hands out a lease). The lease carries the
active signature, ``fill`` stamps it on the entry and lands only while it is still the active one.

Hotness: with ``hits=`` (a :class:`~cache_writer.hotness.HitRecorder`), every hit is counted by entry
key and the counts are flushed to Redis for the pipeline's prewarm (``cache_writer.hotness``).

:class:`CacheClient` is for asyncio applications, :class:`SyncCacheClient` for the rest; both speak the
Redis layout in the README.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.layout import entry_key
from schemas import row_key
from schemas.events import KeyValue


@dataclass(frozen=True, slots=True)
class Hit:
    value: bytes
    version: int
    tier: str
    signature: str = ""
    """The signature the entry was built under (the namespace's active one when read; '' none)."""


@dataclass(frozen=True, slots=True)
class Lease:
    key: str
    token: str
    held_version: int | None
    """The version the key held when the lease was issued (a tombstone's), None when absent."""
    signature: str = ""
    """The namespace's active signature when the lease was issued: the fill is made under it."""
    outer_fenced: bool = False
    """An outer tier (L3) is fenced by the pipeline: it may hold stale entries, do not read it."""


@dataclass(frozen=True, slots=True)
class Miss:
    key: str
    lease: Lease | None
    """None: another caller holds the lease for this key."""


class FillResult(StrEnum):
    FILLED = "filled"
    LEASE_VOID = "lease-void"
    """A write or invalidation reached the key after the lease was issued, or the lease expired."""
    STALE = "stale"
    """The key already holds a newer version than the row that was read."""
    SIGNATURE = "signature"
    """The namespace's signature changed since the lease was issued (a model cutover): the value was
    built under the old one and is not stored."""


Loaded = tuple[bytes, int | None] | None
"""What a loader returns: (value JSON, row version or None) or None when the row does not exist."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode_get(key: str, reply: Sequence[Any]) -> Hit | Miss:
    status = int(reply[0])
    signature = _text(reply[3]) if len(reply) > 3 else ""
    if status == 1:
        return Hit(bytes(reply[2]), int(reply[1]), "l2", signature)
    held = int(reply[2]) if reply[2] not in (b"", "") else None
    if status == 0:
        fenced = len(reply) > 4 and _text(reply[4]) != ""
        return Miss(key, Lease(key, _text(reply[1]), held, signature, outer_fenced=fenced))
    return Miss(key, None)


def _decode_fill(reply: Sequence[Any]) -> FillResult:
    if int(reply[0]) == 1:
        return FillResult.FILLED
    reason = _text(reply[1])
    if reason == "signature":
        return FillResult.SIGNATURE
    return FillResult.STALE if reason == "stale" else FillResult.LEASE_VOID


def _l3_entry(fields: dict[bytes, bytes], signature: str) -> tuple[int, bytes] | None:
    """A live L3 entry built under ``signature`` (the active one in L2), else None."""
    if b"v" in fields and b"d" in fields and b"tomb" not in fields:
        if fields.get(b"s", b"").decode() != signature:
            return None
        return int(fields[b"v"]), fields[b"d"]
    return None


class ClientBase:
    def __init__(
        self,
        *,
        prefix: str,
        l1: L1Cache | None,
        lease_ttl_ms: int,
        entry_ttl_ms: int | None,
        hits: HitRecorder | None = None,
    ) -> None:
        if lease_ttl_ms <= 0:
            raise ValueError("lease_ttl_ms must be positive")
        self.prefix = prefix
        self.l1 = l1
        self.lease_ttl_ms = lease_ttl_ms
        self._entry_ttl = str(entry_ttl_ms or 0)
        self.counts: Counter[str] = Counter()
        self.hits = hits

    def key(self, namespace: str, key_values: Sequence[KeyValue]) -> str:
        return entry_key(self.prefix, namespace, key_values)

    def _from_l1(self, key: str) -> Hit | None:
        if self.l1 is None:
            return None
        entry = self.l1.get(key)
        if entry is None:
            return None
        return Hit(entry.value, entry.version, "l1", entry.signature)

    def _count(self, key: str, result: Hit | Miss) -> None:
        self.counts["reads"] += 1
        if isinstance(result, Hit):
            self.counts[f"hits_{result.tier}"] += 1
            if self.hits is not None:
                self.hits.record(key)
        else:
            self.counts["misses"] += 1
            self.counts["leases" if result.lease else "lease_waits"] += 1

    def _fill_args(
        self, lease: Lease, value: bytes, version: int | None, row: Sequence[KeyValue] | None
    ) -> list[Any]:
        return [
            lease.token,
            value,
            "" if version is None else str(version),
            self._entry_ttl,
            lease.signature,
            row_key(row) if row is not None else "",
        ]

    def _keep_in_l1(self, lease: Lease, value: bytes, version: int | None) -> None:
        if self.l1 is not None:
            # The version a fill lands with is the row's, or the one the key held (tombstone) or 0.
            landed = version if version is not None else (lease.held_version or 0)
            self.l1.put(lease.key, landed, value, lease.signature)
