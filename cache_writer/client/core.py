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

The protocol is written once, here, without I/O: :class:`ClientCore`'s ``*_steps`` methods are
generators that yield an :class:`Op` for each thing to do in Redis (or in the loader) and take its result
back. :class:`~cache_writer.client.aio.CacheClient` (asyncio) and
:class:`~cache_writer.client.sync.SyncCacheClient` (blocking) only carry the operations out; both speak
the Redis layout in the README and follow Redis Cluster redirects (``cache_writer.redis.pipeline``).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.layout import entry_key, signature_key_of
from cache_writer.redis import scripts
from cache_writer.redis.redirects import RedirectStats
from cache_writer.redis.replies import as_text, hash_fields
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


class Op(NamedTuple):
    """One thing for a client to do, and what it sends back into the steps:

    - ``script`` (command, script text): run an EVALSHA on L2, reloading the script on NOSCRIPT and
      following cluster redirects; its reply (an error reply is raised).
    - ``outer`` (key,): HGETALL of the key on L3; its reply.
    - ``load`` (): call the loader; what it returned (:data:`Loaded`).
    - ``wait`` (seconds,): sleep; None.
    - ``flush_hits`` (): flush the hit recorder to L2; None.
    """

    name: Literal["script", "outer", "load", "wait", "flush_hits"]
    args: tuple[Any, ...] = ()


T = TypeVar("T")
L2 = TypeVar("L2")
L3 = TypeVar("L3")
Steps = Generator[Op, Any, T]


class ClientCore(Generic[L2, L3]):
    """The read/fill/lease protocol over L1, L2 and L3, as steps (module docstring), and what a client
    holds: ``redis`` (L2: one Redis or a Redis Cluster client), ``l3`` (an optional outer Redis read on
    an L2 miss, and used to fill L2), the counts and the redirects followed."""

    def __init__(
        self,
        client: L2,
        *,
        prefix: str = "fk",
        l1: L1Cache | None = None,
        l3: L3 | None = None,
        lease_ttl_ms: int = 2_000,
        entry_ttl_ms: int | None = None,
        hits: HitRecorder | None = None,
    ) -> None:
        if lease_ttl_ms <= 0:
            raise ValueError("lease_ttl_ms must be positive")
        self.redis = client
        self.l3 = l3
        self.prefix = prefix
        self.l1 = l1
        self.lease_ttl_ms = lease_ttl_ms
        self._entry_ttl = str(entry_ttl_ms or 0)
        self.counts: Counter[str] = Counter()
        self.hits = hits
        self.redirects = RedirectStats()
        """Cluster redirects followed and lost scripts reloaded so far (``cache_writer.redis.pipeline``)."""

    def key(self, namespace: str, key_values: Sequence[KeyValue]) -> str:
        """The entry key of a row (``cache_writer.layout``)."""
        return entry_key(self.prefix, namespace, key_values)

    def get_steps(self, namespace: str, key_values: Sequence[KeyValue]) -> Steps[Hit | Miss]:
        """The entry from L1, L2 (then L3), or a miss with or without a lease.

        An L2 entry is a hit only when it was built under the namespace's active signature.
        """
        key = self.key(namespace, key_values)
        result: Hit | Miss | None = self._from_l1(key)
        if result is None:
            result = yield from self._l2_steps(key)
        self.counts["reads"] += 1
        if isinstance(result, Hit):
            self.counts[f"hits_{result.tier}"] += 1
            if self.hits is not None:
                self.hits.record(key)
        else:
            self.counts["misses"] += 1
            self.counts["leases" if result.lease else "lease_waits"] += 1
        if self.hits is not None and self.hits.due():
            yield Op("flush_hits")
        return result

    def fill_steps(
        self, lease: Lease, value: bytes, version: int | None = None, row: Sequence[KeyValue] | None = None
    ) -> Steps[FillResult]:
        """Fill after a miss. ``version``: the row's version when the binding has a version column;
        ``row``: the row's key column values (recorded in the entry, so a prewarm can reload it)."""
        args = (
            lease.token,
            value,
            "" if version is None else str(version),
            self._entry_ttl,
            lease.signature,
            row_key(row) if row is not None else "",
        )
        outcome = _decode_fill((yield _script(scripts.FILL, lease.key, *args)))
        self.counts[f"fill_{outcome.value}"] += 1
        if outcome is FillResult.FILLED and self.l1 is not None:
            # The version a fill lands with is the row's, or the one the key held (tombstone) or 0.
            landed = version if version is not None else (lease.held_version or 0)
            self.l1.put(lease.key, landed, value, lease.signature)
        return outcome

    def get_or_load_steps(
        self, namespace: str, key_values: Sequence[KeyValue], *, wait_s: float, attempts: int
    ) -> Steps[bytes | None]:
        """The value from the cache, else from the loader (filled under a lease when this caller holds it).

        When another caller holds the lease, wait ``wait_s`` and look again, up to ``attempts`` times,
        then read through (load without filling).
        """
        for _ in range(attempts):
            result = yield from self.get_steps(namespace, key_values)
            if isinstance(result, Hit):
                return result.value
            if result.lease is not None:
                loaded: Loaded = yield Op("load")
                if loaded is not None:
                    yield from self.fill_steps(result.lease, loaded[0], loaded[1])
                return None if loaded is None else loaded[0]
            yield Op("wait", (wait_s,))
        self.counts["read_through"] += 1
        loaded = yield Op("load")
        return None if loaded is None else loaded[0]

    def _from_l1(self, key: str) -> Hit | None:
        entry = self.l1.get(key) if self.l1 is not None else None
        return Hit(entry.value, entry.version, "l1", entry.signature) if entry is not None else None

    def _l2_steps(self, key: str) -> Steps[Hit | Miss]:
        reply = yield _script(scripts.GET_OR_LEASE, key, secrets.token_hex(8), self.lease_ttl_ms)
        result = _decode_get(key, reply)
        if isinstance(result, Hit):
            if self.l1 is not None:
                self.l1.put(key, result.version, result.value, result.signature)
            return result
        lease = result.lease
        if self.l3 is not None and lease is not None and not lease.outer_fenced:
            outer = _outer_entry(hash_fields((yield Op("outer", (key,)))), lease.signature)
            if (
                outer is not None
                and (yield from self.fill_steps(lease, outer[1], outer[0])) is FillResult.FILLED
            ):
                return Hit(outer[1], outer[0], "l3", lease.signature)
        return result


def _script(script: scripts.Script, key: str, *args: Any) -> Op:
    """The EVALSHA of a client script on an entry key and its namespace's signature key."""
    return Op("script", (("EVALSHA", script.sha, 2, key, signature_key_of(key), *args), script.text))


def _decode_get(key: str, reply: Sequence[Any]) -> Hit | Miss:
    status = int(reply[0])
    signature = as_text(reply[3]) if len(reply) > 3 else ""
    if status == 1:
        return Hit(bytes(reply[2]), int(reply[1]), "l2", signature)
    held = int(reply[2]) if reply[2] not in (b"", "") else None
    if status == 0:
        fenced = len(reply) > 4 and as_text(reply[4]) != ""
        return Miss(key, Lease(key, as_text(reply[1]), held, signature, outer_fenced=fenced))
    return Miss(key, None)


def _decode_fill(reply: Sequence[Any]) -> FillResult:
    if int(reply[0]) == 1:
        return FillResult.FILLED
    reason = as_text(reply[1])
    if reason == "signature":
        return FillResult.SIGNATURE
    return FillResult.STALE if reason == "stale" else FillResult.LEASE_VOID


def _outer_entry(fields: dict[bytes, bytes], signature: str) -> tuple[int, bytes] | None:
    """A live L3 entry built under ``signature`` (the active one in L2), else None."""
    if b"v" in fields and b"d" in fields and b"tomb" not in fields:
        if fields.get(b"s", b"").decode() != signature:
            return None
        return int(fields[b"v"]), fields[b"d"]
    return None
