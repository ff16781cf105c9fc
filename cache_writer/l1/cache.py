"""L1: an in-process cache tier, bounded by entries and bytes, with a TTL, kept honest by broadcasts.

Every write and tombstone the pipeline applies to Redis is announced on ``<prefix>:invalidations`` in
the same atomic script (``w|i <version> <key>``). :class:`InvalidationListener` feeds those messages to
:meth:`L1Cache.on_broadcast`, which drops entries that are not newer and raises a per-key *floor*: a
later :meth:`L1Cache.put` of an older version (a reader that read Redis before the change and puts after
the broadcast) is refused. If the broadcast connection drops, the L1 is flushed and serves nothing until
it is subscribed again (invariant 9: when it cannot vouch for its entries, it does not serve them).

A model cutover is announced on the same channel as ``a <signature> <prefix>:{<namespace>}:`` by the
script that switches the namespace's signature (``set_signature.lua``): :meth:`L1Cache.on_signature`
drops the namespace's entries and remembers the signature, and a later :meth:`L1Cache.put` of an entry
read under another signature (a reader that read Redis before the switch) is refused (invariant 7).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from cachetools import TTLCache

from cache_writer.layout import namespace_prefix_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class L1Entry:
    version: int
    value: bytes
    signature: str = ""


class L1Cache:
    """Thread-safe. ``max_entries`` and ``max_bytes`` both bound it: an entry is charged
    ``max(len(value) + 64, max_bytes // max_entries)`` against ``max_bytes``."""

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        ttl_s: float = 300.0,
        floor_ttl_s: float = 60.0,
        max_floors: int = 1_000_000,
    ) -> None:
        if max_entries < 1 or max_bytes < max_entries:
            raise ValueError("need max_entries >= 1 and max_bytes >= max_entries")
        self._min_charge = max_bytes // max_entries
        self._entries: TTLCache[str, L1Entry] = TTLCache(maxsize=max_bytes, ttl=ttl_s, getsizeof=self._charge)
        self._floors: TTLCache[str, int] = TTLCache(maxsize=max_floors, ttl=floor_ttl_s)
        self._signatures: dict[str, str] = {}
        self._lock = threading.Lock()
        self._healthy = False
        self.flushes = 0

    def _charge(self, entry: L1Entry) -> int:
        return max(len(entry.value) + 64, self._min_charge)

    @property
    def healthy(self) -> bool:
        """True while subscribed to the broadcast; an unhealthy L1 answers every get with a miss."""
        return self._healthy

    def get(self, key: str) -> L1Entry | None:
        if not self._healthy:
            return None
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, version: int, value: bytes, signature: str = "") -> bool:
        """Keep ``value`` unless an equal-or-newer entry is there or a broadcast made it stale.

        ``signature``: the one the entry was read under; refused when a cutover announced another one
        for its namespace since this cache was last flushed.
        """
        if not self._healthy:
            return False
        with self._lock:
            if version < self._floors.get(key, 0):
                return False
            announced = self._signatures.get(namespace_prefix_of(key))
            if announced is not None and announced != signature:
                return False
            current = self._entries.get(key)
            if current is not None and current.version >= version:
                return False
            try:
                self._entries[key] = L1Entry(version, value, signature)
            except ValueError:  # larger than the whole cache
                return False
            return True

    def on_broadcast(self, kind: str, version: int, key: str) -> None:
        """A write (``w``) of ``version``: older entries go. A tombstone (``i``): entries up to it go."""
        floor = version + 1 if kind == "i" else version
        with self._lock:
            if floor > self._floors.get(key, 0):
                self._floors[key] = floor
            current = self._entries.get(key)
            if current is not None and current.version < floor:
                del self._entries[key]

    def on_signature(self, namespace_prefix: str, signature: str) -> None:
        """A cutover: ``namespace_prefix`` (``<prefix>:{<namespace>}:``) now has ``signature``; its
        entries go, and only entries read under that signature may come in again."""
        with self._lock:
            self._signatures[namespace_prefix] = signature
            for key in [k for k in self._entries if namespace_prefix_of(k) == namespace_prefix]:
                del self._entries[key]

    def flush(self) -> None:
        with self._lock:
            self._entries.clear()
            self._signatures.clear()  # unknown again: the next read tells (entries are gone anyway)
            self.flushes += 1

    def mark(self, healthy: bool) -> None:
        """Called by the listener: flushing on every change of state, since messages may be missed."""
        self.flush()
        self._healthy = healthy

    def items(self) -> list[tuple[str, L1Entry]]:
        """A snapshot of the live entries (for verification)."""
        with self._lock:
            return list(self._entries.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
