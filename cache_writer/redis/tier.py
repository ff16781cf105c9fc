"""The Redis tier (L2, and an outer L3): versioned compare-and-set in Lua, batched with pipelining, and
every other read and write the pipeline makes in a tier (the whole :class:`~cache_writer.tier.CacheTier`
contract: nobody reaches through to the redis-py client).

The scripts are loaded once and called with EVALSHA; a NOSCRIPT answer (the server restarted or its
script cache was flushed) reloads them and retries just the refused actions, in order.

:meth:`RedisTier.apply` sends the actions of one hash slot (one namespace) as calls of ``apply_batch.lua``
of up to ``script_batch`` actions each, and falls back to the single-key scripts where a batch call
buys nothing or was refused: :mod:`cache_writer.redis.batch`.

On a Redis Cluster (``FRESHKEY_REDIS_CLUSTER=true``) the same batch goes out as one non-transactional
pipeline per node; MOVED, ASK and TRYAGAIN during a slot migration are followed and NOSCRIPT is answered
on the node that refused, see :mod:`cache_writer.redis.pipeline`.

Every method raises :class:`TierUnavailableError` when the tier does not answer (a retry may succeed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from cache_writer.entries import Entry, read_entries, read_fields, read_namespace, scan_keys
from cache_writer.exceptions import TierUnavailableError
from cache_writer.hotness import ack_hits, read_hits
from cache_writer.layout import incarnation_key, invalidation_channel, is_signature_key, prefix_pattern
from cache_writer.redis import scripts
from cache_writer.redis.batch import BATCH, DEFAULT_SCRIPT_BATCH, TIER_SCRIPTS, Command, ScriptCalls
from cache_writer.redis.batch import SINGLE_CALL_MARK as SINGLE_CALL_MARK
from cache_writer.redis.pipeline import RedirectStats, RedisClient, is_cluster, run_pipeline
from cache_writer.redis.replies import as_bytes, as_text
from cache_writer.redis.security import client_kwargs, l3_client_kwargs
from cache_writer.settings import L3Settings, RedisSettings
from cache_writer.signatures import (
    NamespaceSignatures,
    SetResult,
    SignatureRecord,
    clear_pending,
    fence_namespace,
    mark_outer_fenced,
    read_active_signatures,
    read_signatures,
    set_signature,
)
from cache_writer.tier import ActionResult, CacheAction


def connect(settings: RedisSettings) -> RedisClient:
    """An asyncio client for the configured Redis: the ACL user from the URL, the password from settings
    (never the log), TLS for ``rediss://`` (:mod:`cache_writer.redis.security`).

    With ``settings.cluster`` the URL names one node of a Redis Cluster (a seed) and the client is a
    ``RedisCluster`` that discovers the others (with the same user and TLS); the URL's database must then
    be 0 (or absent).
    """
    options = {**client_options(settings.socket_timeout_s), **client_kwargs(settings)}
    if settings.cluster:
        return aioredis.RedisCluster.from_url(settings.url, **options)
    return aioredis.Redis.from_url(settings.url, **options)


def client_options(socket_timeout_s: float) -> dict[str, Any]:
    """What freshkey's own Redis clients are created with: no retries inside redis-py (the pipeline's
    retry policy waits, counts and fences: a retry hidden in the client would hide an outage from it),
    and socket timeouts, so a server that stops answering is an error, not a hang."""
    return {
        "decode_responses": False,
        "retry": Retry(NoBackoff(), 0),
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": min(socket_timeout_s, 2.0),
    }


class RedisTier:
    """One Redis (or one Redis Cluster node set) holding freshkey's hashes (README, "Redis layout")."""

    def __init__(
        self,
        client: RedisClient,
        *,
        tombstone_ttl_ms: int,
        entry_ttl_ms: int | None = None,
        channel: str | None = None,
        name: str = "redis",
        script_batch: int = DEFAULT_SCRIPT_BATCH,
    ) -> None:
        if tombstone_ttl_ms <= 0:
            raise ValueError("tombstone_ttl_ms must be positive")
        if script_batch < 1:
            raise ValueError("script_batch must be at least 1")
        self._client = client
        self._calls = ScriptCalls(
            name=name,
            cluster=is_cluster(client),
            script_batch=script_batch,
            tombstone_ttl_ms=tombstone_ttl_ms,
            entry_ttl_ms=entry_ttl_ms,
            channel=channel,
        )
        self.name = name
        self.channel = channel
        self.redirects = RedirectStats()
        """MOVED/ASK/TRYAGAIN followed and NOSCRIPT answered so far (cluster slot migrations, restarts)."""

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisTier:
        """L2 as configured (``FRESHKEY_REDIS_*``)."""
        return cls(
            connect(settings),
            tombstone_ttl_ms=settings.tombstone_ttl_s * 1000,
            entry_ttl_ms=settings.entry_ttl_s * 1000 if settings.entry_ttl_s else None,
            channel=invalidation_channel(settings.key_prefix) if settings.broadcast else None,
        )

    @classmethod
    def outer_from_settings(cls, settings: RedisSettings, l3: L3Settings) -> RedisTier | None:
        """L3 as configured (``FRESHKEY_REDIS_L3_*``), None when it is not; tombstones live as in L2."""
        if not l3.url:
            return None
        options = {**client_options(settings.socket_timeout_s), **l3_client_kwargs(l3)}
        return cls(
            aioredis.Redis.from_url(l3.url, **options),
            tombstone_ttl_ms=settings.tombstone_ttl_s * 1000,
            entry_ttl_ms=l3.entry_ttl_s * 1000 if l3.entry_ttl_s else None,
            name="redis-l3",
        )

    @property
    def client(self) -> RedisClient:
        """The redis-py client, for applications and tests that speak the layout themselves; the pipeline
        uses the methods below."""
        return self._client

    @contextmanager
    def _answering(self) -> Iterator[None]:
        try:
            yield
        except RedisError as exc:
            raise TierUnavailableError(self.name, exc) from exc

    # --- entries ---------------------------------------------------------------------------------------

    async def load_scripts(self) -> None:
        """Load every script (on a cluster: on every primary, which is where SCRIPT LOAD goes)."""
        with self._answering():
            for script in (*scripts.ALL, BATCH):
                await self._client.script_load(script.text)

    @property
    def script_batch(self) -> int:
        """Most actions per batch-script call on a single server (1: every action is a single-key call)."""
        return self._calls.script_batch

    def command(self, action: CacheAction) -> Command:
        """The single-key EVALSHA command (arguments) that applies ``action`` in this tier."""
        return self._calls.command(action)

    def batch_command(self, actions: Sequence[CacheAction]) -> Command | None:
        """One ``apply_batch.lua`` call applying ``actions`` (all in one hash slot) in order; None when a
        value is not UTF-8 (JSON carries text only), so the actions go as single-key calls."""
        return self._calls.batch_command(actions)

    def _plan(self, actions: Sequence[CacheAction]) -> list[tuple[Command, list[int]]]:
        """The commands for ``actions``, each with the positions of the actions it applies
        (:meth:`cache_writer.redis.batch.ScriptCalls.plan`)."""
        return self._calls.plan(actions)

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        return await self._calls.apply(actions, self._run)

    async def _run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        with self._answering():
            return await run_pipeline(self._client, commands, scripts=TIER_SCRIPTS, stats=self.redirects)

    async def read_entries(self, keys: Sequence[str]) -> dict[str, Entry | None]:
        """The entry (or tombstone) at each key; None where there is none."""
        with self._answering():
            return await read_entries(self._client, keys)

    async def read_namespace(self, prefix: str, namespace: str) -> dict[str, Entry]:
        """Every entry and tombstone of a namespace (SCAN of every primary), by key."""
        with self._answering():
            return await read_namespace(self._client, prefix, namespace)

    async def read_fields(self, keys: Sequence[str], fields: Sequence[str]) -> list[list[bytes | None]]:
        """The values of ``fields`` in each key's hash (None where absent), in order."""
        with self._answering():
            return await read_fields(self._client, keys, fields)

    async def get(self, key: str) -> bytes | None:
        """The string value at ``key`` (e.g. :func:`~cache_writer.layout.latest_verification_key`)."""
        with self._answering():
            value = await self._client.get(key)
        return None if value is None else as_bytes(value)

    async def ping(self) -> None:
        """Raise TierUnavailableError unless the tier answers now."""
        with self._answering():
            await self._client.ping()

    async def flush(self, prefix: str, *, flushdb: bool = False, batch: int = 1000) -> int:
        """Remove every entry and tombstone freshkey wrote under ``prefix`` (the namespaces' ``$signature``
        hashes stay); returns how many keys went. ``flushdb``: FLUSHDB instead, when the tier's database
        is freshkey's alone (one command, atomic). For a fenced tier, before it is trusted again."""
        with self._answering():
            if flushdb:
                await self._client.flushdb()
                return -1
            removed = 0
            keys: list[bytes] = []
            async for key in scan_keys(self._client, prefix_pattern(prefix), batch):
                if not is_signature_key(key):
                    keys.append(key)
                if len(keys) >= batch:
                    removed += await self._unlink(keys)
            if keys:
                removed += await self._unlink(keys)
            return removed

    async def _unlink(self, keys: list[bytes]) -> int:
        replies = await run_pipeline(self._client, [("UNLINK", key) for key in keys])
        keys.clear()
        return sum(int(r) for r in replies if not isinstance(r, Exception))

    async def close(self) -> None:
        await self._client.aclose()

    # --- signatures (cache_writer.signatures) ----------------------------------------------------------

    async def read_signatures(self, prefix: str, namespaces: Iterable[str]) -> dict[str, NamespaceSignatures]:
        """The signature state of each namespace, in one pipeline."""
        with self._answering():
            return await read_signatures(self._client, prefix, namespaces)

    async def read_active_signatures(self, prefix: str, namespaces: Sequence[str]) -> list[str]:
        """``<active>/<pending>`` of each namespace: cheap enough to check on every batch."""
        with self._answering():
            return await read_active_signatures(self._client, prefix, namespaces)

    async def set_signature(
        self,
        prefix: str,
        namespace: str,
        record: SignatureRecord,
        *,
        mode: Literal["active", "pending"] = "active",
    ) -> SetResult:
        """Compare-and-set the namespace's signature; an activation is announced on this tier's channel."""
        with self._answering():
            return await set_signature(
                self._client, prefix, namespace, record, mode=mode, channel=self.channel, tier=self.name
            )

    async def clear_pending(self, prefix: str, namespace: str, signature: str) -> bool:
        """Drop the namespace's pending signature when it is ``signature``; whether it was dropped."""
        with self._answering():
            return await clear_pending(self._client, prefix, namespace, signature, tier=self.name)

    async def fence_namespace(
        self, prefix: str, namespace: str, *, value_columns: Iterable[str] | None
    ) -> SetResult:
        """Move the namespace's signature to its next epoch (announced on this tier's channel); ValueError
        when it has none yet and ``value_columns`` is None."""
        with self._answering():
            return await fence_namespace(
                self._client,
                prefix,
                namespace,
                value_columns=value_columns,
                channel=self.channel,
                tier=self.name,
            )

    async def incarnation(self, prefix: str) -> tuple[str, str | None]:
        """The server's identity now, and the one its data set was last seen under (None: never, or the
        data set is new). :meth:`record_incarnation` records the current one, once whatever a difference
        calls for is done (a fence that failed is then tried again at the next look).

        The identity is Redis's ``run_id`` (on a cluster, every primary's, sorted): it changes with every
        restart and every failover. A recorded identity that differs means this data set comes from
        another incarnation of the server: a snapshot or an append-only file loaded at a restart, or a
        replica promoted after a failover. Either can hold entries older than what was applied since.
        A server that came back empty has no record, and nothing stale."""
        with self._answering():
            if is_cluster(self._client):
                infos = await self._client.info("server", target_nodes=aioredis.RedisCluster.PRIMARIES)
                if "run_id" in infos:  # one primary: redis-py returns its answer, not a dict of them
                    infos = {"": infos}
                current = ",".join(sorted(str(info["run_id"]) for info in infos.values()))
            else:
                current = str((await self._client.info("server"))["run_id"])
            recorded = await self._client.get(incarnation_key(prefix))
        return current, None if recorded is None else as_text(recorded)

    async def record_incarnation(self, prefix: str, identity: str) -> None:
        """Record ``identity`` (:meth:`incarnation`) as the one the data set is seen under."""
        with self._answering():
            await self._client.set(incarnation_key(prefix), identity)

    async def mark_outer_fenced(self, prefix: str, namespaces: Iterable[str], since_ms: int | None) -> None:
        """Set (``since_ms``) or clear (None) the mark that tells readers an outer tier is fenced."""
        with self._answering():
            await mark_outer_fenced(self._client, prefix, namespaces, since_ms, tier=self.name)

    # --- hit counts (cache_writer.hotness) -------------------------------------------------------------

    async def read_hits(
        self, prefix: str, group: str, consumer: str, *, count: int = 100
    ) -> list[tuple[bytes, dict[str, tuple[int, int]]]]:
        """Up to ``count`` new hit-count messages for ``consumer`` of ``group``: (id, counts) each."""
        with self._answering():
            return await read_hits(self._client, prefix, group, consumer, count=count)

    async def ack_hits(self, prefix: str, group: str, ids: Sequence[bytes]) -> None:
        """Acknowledge hit-count messages once their counts are safe elsewhere."""
        with self._answering():
            await ack_hits(self._client, prefix, group, ids)
