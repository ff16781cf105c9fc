"""L1: an in-process cache kept honest by the pipeline's broadcast (see README, "Reading the cache")."""

from cache_writer.l1.cache import L1Cache, L1Entry
from cache_writer.l1.listener import (
    InvalidationListener,
    ThreadedInvalidationListener,
    dispatch_broadcast,
    parse_broadcast,
    parse_signature_broadcast,
)

__all__ = [
    "InvalidationListener",
    "L1Cache",
    "L1Entry",
    "ThreadedInvalidationListener",
    "dispatch_broadcast",
    "parse_broadcast",
    "parse_signature_broadcast",
]
