"""The Redis tier (L2, and an outer L3): versioned compare-and-set in Lua, batched with pipelining, and
every other read and write the pipeline makes in a tier (the whole :class:`~cache_writer.tier.CacheTier`
contract: nobody reaches through to the redis-py client).

The scripts are loaded once and called with EVALSHA; a NOSCRIPT answer (the server restarted or its
script cache was flushed) reloads them and retries just the refused actions, in order.

:meth:`RedisTier.apply` sends the actions of one hash slot (one namespace) as calls of ``apply_batch.lua``
of up to ``script_batch`` actions each: one script call applies each action exactly as the single-key
scripts do (it is built from their functions), and its arguments and answer are one JSON array each.
Measured here, 20,000 writes from one process: pipelined single-key EVALSHA 28-48 µs of client CPU per
write (redis-py packs seven arguments and parses a reply array per call), the batch script 4-13 µs;
Redis itself spends about the same per action either way. A group of fewer than
:data:`BATCH_MIN_ACTIONS`, or one whose values are not UTF-8 (they travel as JSON strings), goes as
single-key calls.

On a Redis Cluster (``FRESHKEY_REDIS_CLUSTER=true``) the same batch goes out as one non-transactional
pipeline per node; MOVED, ASK and TRYAGAIN during a slot migration are followed and NOSCRIPT is answered
on the node that refused, see :mod:`cache_writer.redis.pipeline`.

Every method raises :class:`TierUnavailableError` when the tier does not answer (a retry may succeed).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError, ResponseError, TryAgainError

from cache_writer.entries import Entry, read_entries, read_fields, read_namespace, scan_keys
from cache_writer.exceptions import TierUnavailableError
from cache_writer.hotness import ack_hits, read_hits
from cache_writer.layout import invalidation_channel, is_signature_key, prefix_pattern, signature_key_of
from cache_writer.redis import scripts
from cache_writer.redis.pipeline import RedirectStats, RedisClient, is_cluster, run_pipeline
from cache_writer.redis.replies import as_bytes
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
from cache_writer.tier import ActionResult, CacheAction, Outcome

SINGLE_CALL_MARK = "-- @single"
"""Where a single-key script's call of its function begins: the batch script takes what is above it."""

BATCH_MIN_ACTIONS = 4
"""Fewer actions of one slot go as single-key calls: the JSON round trip buys nothing for one or two."""

MIGRATING_HOLD_S = 5.0
"""How long a cluster slot whose batch call was refused with TRYAGAIN (a migration) goes as single-key
calls."""

DEFAULT_SCRIPT_BATCH = 100
"""Actions per batch-script call: Redis runs a call as one command, about 5-10 µs per action here, so 100
keep any one call near a millisecond for the readers waiting behind it."""


def _functions_of(name: str) -> str:
    text = resources.files("cache_writer").joinpath("lua", name).read_text()
    head, mark, _ = text.partition(SINGLE_CALL_MARK)
    if not mark:
        raise RuntimeError(f"cache_writer/lua/{name} lacks its {SINGLE_CALL_MARK!r} line")
    return head


def _batch_script() -> scripts.Script:
    """``apply_batch.lua`` behind the prelude and the functions of the two single-key scripts."""
    loop = resources.files("cache_writer").joinpath("lua", "apply_batch.lua").read_text()
    parts = [
        scripts.PRELUDE,
        _functions_of("write_if_newer.lua"),
        _functions_of("invalidate_if_not_newer.lua"),
    ]
    text = "\n".join([*parts, loop])
    return scripts.Script("apply_batch.lua", text, hashlib.sha1(text.encode()).hexdigest())


BATCH = _batch_script()
TIER_SCRIPTS = (BATCH.text, scripts.WRITE.text, scripts.INVALIDATE.text)
"""What a NOSCRIPT answer to :meth:`RedisTier.apply` reloads."""


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
        self._cluster = is_cluster(client)
        self.script_batch = script_batch
        """Most actions per batch-script call on a single server (1: every action is a single-key call)."""
        self._migrating: dict[int, float] = {}
        """Cluster slots sent as single-key calls until the time (monotonic) given: see :meth:`_plan`."""
        self.name = name
        self.channel = channel
        self._channel = channel or ""
        self._tombstone_ttl = str(tombstone_ttl_ms)
        self._entry_ttl = str(entry_ttl_ms or 0)
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

    def command(self, action: CacheAction) -> tuple[Any, ...]:
        """The single-key EVALSHA command (arguments) that applies ``action`` in this tier."""
        if action.kind == "invalidate":
            args: tuple[Any, ...] = (action.version, action.commit_ts_us, self._tombstone_ttl, self._channel)
            return ("EVALSHA", scripts.INVALIDATE.sha, 1, action.key, *args)
        args = (action.version, action.value, action.commit_ts_us, self._entry_ttl, self._channel)
        if action.signature is None and action.row is None:
            return ("EVALSHA", scripts.WRITE.sha, 1, action.key, *args)
        keys = (action.key, signature_key_of(action.key))
        return ("EVALSHA", scripts.WRITE.sha, 2, *keys, *args, action.signature or "", action.row or "")

    def batch_command(self, actions: Sequence[CacheAction]) -> tuple[Any, ...] | None:
        """One ``apply_batch.lua`` call applying ``actions`` (all in one hash slot) in order; None when a
        value is not UTF-8 (JSON carries text only), so the actions go as single-key calls."""
        keys: list[str] = []
        items: list[tuple[str, ...]] = []
        for action in actions:
            keys.append(action.key)
            if action.kind == "invalidate":
                items.append(("i", str(action.version), str(action.commit_ts_us)))
                continue
            try:
                value = (action.value or b"").decode()
            except UnicodeDecodeError:
                return None
            taken = "1"
            if action.signature is not None or action.row is not None:
                keys.append(signature_key_of(action.key))
                taken = "2"
            items.append(
                (
                    "w",
                    str(action.version),
                    value,
                    str(action.commit_ts_us),
                    action.signature or "",
                    action.row or "",
                    taken,
                )
            )
        args = (orjson.dumps(items), self._entry_ttl, self._tombstone_ttl, self._channel)
        return ("EVALSHA", BATCH.sha, len(keys), *keys, *args)

    def _plan(self, actions: Sequence[CacheAction]) -> list[tuple[tuple[Any, ...], list[int]]]:
        """The commands for ``actions``, each with the positions of the actions it applies. Actions keep
        their order within a hash slot, which is all the order a key can see.

        On a single server the actions go as batch calls of up to ``script_batch`` actions. On a cluster
        each slot's actions go as one batch call (or all as single-key calls): during a slot migration a
        batch call whose keys are split between the two nodes is refused with TRYAGAIN, and its actions
        are then sent as single-key calls (:meth:`apply`); with two calls for one slot the second could
        apply before the refused first. A slot refused that way goes as single-key calls for
        :data:`MIGRATING_HOLD_S`, so that a migration costs the TRYAGAIN rounds once, not per batch."""
        slots: dict[int, list[int]] = {}
        if self._cluster:
            for position, action in enumerate(actions):
                slots.setdefault(key_slot(action.key.encode()), []).append(position)
            step = len(actions)
            now = time.monotonic()
            for slot, until in list(self._migrating.items()):
                if until <= now:
                    del self._migrating[slot]
        else:
            slots[0] = list(range(len(actions)))
            step = self.script_batch
        planned: list[tuple[tuple[Any, ...], list[int]]] = []
        for slot, positions in slots.items():
            batched = self.script_batch > 1 and len(positions) >= BATCH_MIN_ACTIONS
            if batched and slot not in self._migrating:
                chunks = [positions[i : i + step] for i in range(0, len(positions), step)]
                commands = [self.batch_command([actions[p] for p in chunk]) for chunk in chunks]
                if all(command is not None for command in commands):
                    planned += [(c, chunk) for c, chunk in zip(commands, chunks, strict=True) if c]
                    continue
            planned += [(self.command(actions[p]), [p]) for p in positions]
        return planned

    async def apply(self, actions: Sequence[CacheAction]) -> list[ActionResult]:
        planned = self._plan(actions)
        replies = await self._run([command for command, _ in planned])
        results: list[ActionResult | None] = [None] * len(actions)
        again: list[int] = []  # the actions of refused batch calls, in order: sent as single-key calls
        for (command, positions), reply in zip(planned, replies, strict=True):
            batch = command[1] == BATCH.sha
            if isinstance(reply, TryAgainError) and batch:
                # A slot mid-migration with the call's keys on both nodes: nothing of it ran.
                self._migrating[key_slot(actions[positions[0]].key.encode())] = (
                    time.monotonic() + MIGRATING_HOLD_S
                )
                again += positions
            elif isinstance(reply, Exception):
                if is_transient(reply):
                    raise TierUnavailableError(self.name, reply)
                if batch:
                    # The call failed as a whole (not one action: those are answered inside), so each
                    # action is tried alone for its own answer; the version checks make a repeat harmless.
                    again += positions
                    continue
                for p in positions:
                    results[p] = _result(actions[p], reply)
            elif batch:
                answers = orjson.loads(reply)
                for p, answer in zip(positions, answers, strict=True):
                    results[p] = self._batch_result(actions[p], answer)
            else:
                results[positions[0]] = _result(actions[positions[0]], reply)
        if again:
            replies = await self._run([self.command(actions[p]) for p in again])
            for p, reply in zip(again, replies, strict=True):
                if isinstance(reply, Exception) and is_transient(reply):
                    raise TierUnavailableError(self.name, reply)
                results[p] = _result(actions[p], reply)
        return [r for r in results if r is not None]

    async def _run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        with self._answering():
            return await run_pipeline(self._client, commands, scripts=TIER_SCRIPTS, stats=self.redirects)

    def _batch_result(self, action: CacheAction, answer: list[Any]) -> ActionResult:
        flag, detail = answer
        if flag == -1:
            error = ResponseError(detail)
            if is_transient(error):
                raise TierUnavailableError(self.name, error)
            return _result(action, error)
        return _result(action, (flag, detail))

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
    previous_version = int(previous) if previous not in (b"", "", None) else None
    return ActionResult(action, Outcome.APPLIED if applied == 1 else Outcome.NOT_NEWER, previous_version)
