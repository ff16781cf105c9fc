"""The application side: read through the tiers, and fill after a miss only under a valid lease.

``core`` holds the protocol (replies, leases, fills, L1/L3 handling) once; ``aio`` and ``sync`` are the
asyncio and blocking clients over it.
"""

from cache_writer.client.aio import CacheClient
from cache_writer.client.core import FillResult, Hit, Lease, Miss
from cache_writer.client.sync import SyncCacheClient

__all__ = ["CacheClient", "FillResult", "Hit", "Lease", "Miss", "SyncCacheClient"]
