"""The Redis tier (L2): versioned compare-and-set in Lua, batched with pipelining.

The two scripts are loaded once and called with EVALSHA; a NOSCRIPT answer (the server restarted or its
script cache was flushed) reloads them and retries just the refused actions, in order.

On a Redis Cluster (``FRESHKEY_REDIS_CLUSTER=true``) the same batch goes out as one non-transactional
pipeline per node; MOVED, ASK and TRYAGAIN during a slot migration are followed and NOSCRIPT is answered
on the node that refused, see :mod:`cache_writer.redis.pipeline`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from cache_writer.entries import scan_keys
from cache_writer.exceptions import TierUnavailableError
from cache_writer.layout import invalidation_channel, signature_key_of
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedirectStats, RedisClient, run_pipeline
from cache_writer.settings import RedisSettings
from cache_writer.tier import ActionResult, CacheAction, Outcome


def connect(settings: RedisSettings) -> RedisClient:
    """An asyncio client for the configured Redis (the password comes from settings, never the log).

    With ``settings.cluster`` the URL names one node of a Redis Cluster (a seed) and the client is a
    ``RedisCluster`` that discovers the others; the URL's database must then be 0 (or absent).
    """
    password = settings.password.get_secret_value() if settings.password else None
    if settings.cluster:
        return aioredis.RedisCluster.from_url(settings.url, password=password, decode_responses=False)
    return aioredis.Redis.from_url(settings.url, password=password, decode_responses=False)


class RedisTier:
    """L2: one Redis (or one Redis Cluster node set) holding ``fk:{namespace}:row`` hashes."""

    def __init__(
        self,
        client: RedisClient,
        *,
        tombstone_ttl_ms: int,
        entry_ttl_ms: int | None = None,
        channel: str | None = None,
        name: str = "redis",
    ) -> None:
        if tombstone_ttl_ms <= 0:
            raise ValueError("tombstone_ttl_ms must be positive")
        self._client = client
        self.name = name
        self.channel = channel
        self._channel = channel or ""
        self._tombstone_ttl = str(tombstone_ttl_ms)
        self._entry_ttl = str(entry_ttl_ms or 0)
        self.redirects = RedirectStats()
        """MOVED/ASK/TRYAGAIN followed and NOSCRIPT answered so far (cluster slot migrations, restarts)."""

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisTier:
        return cls(
            connect(settings),
            tombstone_ttl_ms=settings.tombstone_ttl_s * 1000,
            entry_ttl_ms=settings.entry_ttl_s * 1000 if settings.entry_ttl_s else None,
            channel=invalidation_channel(settings.key_prefix) if settings.broadcast else None,
        )

    @property
    def client(self) -> RedisClient:
        return self._client

    async def load_scripts(self) -> None:
        """Load both scripts (on a cluster: on every primary, which is where SCRIPT LOAD goes)."""
        try:
            await self._client.script_load(scripts.WRITE.text)
            await self._client.script_load(scripts.INVALIDATE.text)
        except RedisError as exc:
            raise TierUnavailableError(self.name, exc) from exc

    def command(self, action: CacheAction) -> tuple[Any, ...]:
        """The EVALSHA command (arguments) that applies ``action`` in this tier."""
        if action.kind == "write" and (action.signature is not None or action.row is not None):
            return (
                "EVALSHA",
                scripts.WRITE.sha,
                2,
                action.key,
                signature_key_of(action.key),
                action.version,
                action.value,
                action.commit_ts_us,
                self._entry_ttl,
                self._channel,
                action.signature or "",
                action.row or "",
            )
        elif action.kind == "write":
            return (
                "EVALSHA",
                scripts.WRITE.sha,
                1,
                action.key,
                action.version,
                action.value,
                action.commit_ts_us,
                self._entry_ttl,
                self._channel,
            )
        else:
            return (
                "EVALSHA",
                scripts.INVALIDATE.sha,
                1,
                action.key,
                action.version,
                action.commit_ts_us,
                self._tombstone_ttl,
                self._channel,
            )

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        commands = [self.command(action) for action in actions]
        try:
            replies = await run_pipeline(
                self._client,
                commands,
                scripts=(scripts.WRITE.text, scripts.INVALIDATE.text),
                stats=self.redirects,
            )
        except RedisError as exc:
            raise TierUnavailableError(self.name, exc) from exc
        for reply in replies:
            if isinstance(reply, Exception) and is_transient(reply):
                raise TierUnavailableError(self.name, reply)
        return [_result(action, reply) for action, reply in zip(actions, replies, strict=True)]

    async def ping(self) -> None:
        """Raise TierUnavailableError unless the tier answers now."""
        try:
            await self._client.ping()
        except RedisError as exc:
            raise TierUnavailableError(self.name, exc) from exc

    async def flush(self, prefix: str, *, flushdb: bool = False, batch: int = 1000) -> int:
        """Remove every entry and tombstone freshkey wrote under ``prefix`` (the namespaces' ``$signature``
        hashes stay); returns how many keys went. ``flushdb``: FLUSHDB instead, when the tier's database
        is freshkey's alone (one command, atomic). For a fenced tier, before it is trusted again."""
        try:
            if flushdb:
                await self._client.flushdb()
                return -1
            removed = 0
            keys: list[bytes] = []
            async for key in scan_keys(self._client, f"{prefix}:{{*}}:*", batch):
                if not key.endswith(b"$signature"):
                    keys.append(key)
                if len(keys) >= batch:
                    removed += await self._unlink(keys)
            if keys:
                removed += await self._unlink(keys)
            return removed
        except RedisError as exc:
            raise TierUnavailableError(self.name, exc) from exc

    async def _unlink(self, keys: list[bytes]) -> int:
        replies = await run_pipeline(self._client, [("UNLINK", key) for key in keys])
        keys.clear()
        return sum(int(r) for r in replies if not isinstance(r, Exception))

    async def close(self) -> None:
        await self._client.aclose()


TRANSIENT_ERROR_PREFIXES = (
    "OOM",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "READONLY",
    "NOREPLICAS",
    "MISCONF",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "MOVED",
    "ASK",
)
"""Error replies that say the server cannot take writes now (memory, loading, fail-over, redirects not
settled, credentials): the whole batch is retried. Any other error reply concerns one action."""


def is_transient(reply: Exception) -> bool:
    """An error reply of one command that a retry of the batch may cure (see TRANSIENT_ERROR_PREFIXES)."""
    if isinstance(reply, NoScriptError) or not isinstance(reply, RedisError):
        return True  # scripts still missing after a reload, or not an error reply at all
    text = str(reply).lstrip()
    return text.startswith(TRANSIENT_ERROR_PREFIXES) or "Redis is loading" in text


def _result(action: CacheAction, reply: Any) -> ActionResult:
    if isinstance(reply, Exception):
        return ActionResult(action, Outcome.FAILED, None, error=f"{type(reply).__name__}: {reply}"[:500])
    applied, previous = reply
    previous_version = int(previous) if previous not in (b"", "") else None
    return ActionResult(action, Outcome.APPLIED if applied == 1 else Outcome.NOT_NEWER, previous_version)
