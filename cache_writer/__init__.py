"""Everything that addresses or touches a cache: key layout, tiers, their Lua scripts."""

from cache_writer.exceptions import CacheWriterError, TierUnavailableError
from cache_writer.layout import entry_key, namespace_pattern
from cache_writer.redis.tier import RedisTier
from cache_writer.settings import RedisSettings
from cache_writer.tier import ActionResult, CacheAction, CacheTier, Outcome

__all__ = [
    "ActionResult",
    "CacheAction",
    "CacheTier",
    "CacheWriterError",
    "Outcome",
    "RedisSettings",
    "RedisTier",
    "TierUnavailableError",
    "entry_key",
    "namespace_pattern",
]
