"""The blocking application client (see cache_writer.client)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from cache_writer.client.core import (
    ClientBase,
    FillResult,
    Hit,
    Lease,
    Loaded,
    Miss,
    _decode_fill,
    _decode_get,
    _l3_entry,
)
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.layout import signature_key_of
from cache_writer.redis import scripts
from schemas.events import KeyValue


class SyncCacheClient(ClientBase):
    """The same protocol for synchronous applications (redis-py's blocking client)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "fk",
        l1: L1Cache | None = None,
        l3: redis.Redis | None = None,
        lease_ttl_ms: int = 2_000,
        entry_ttl_ms: int | None = None,
        hits: HitRecorder | None = None,
    ) -> None:
        super().__init__(
            prefix=prefix, l1=l1, lease_ttl_ms=lease_ttl_ms, entry_ttl_ms=entry_ttl_ms, hits=hits
        )
        self.redis = client
        self.l3 = l3

    def _evalsha(self, sha: str, script: str, key: str, *args: Any) -> Any:
        keys = (key, signature_key_of(key))
        try:
            return self.redis.evalsha(sha, 2, *keys, *args)
        except redis.exceptions.NoScriptError:
            self.redis.script_load(script)
            return self.redis.evalsha(sha, 2, *keys, *args)

    def get(self, namespace: str, key_values: Sequence[KeyValue]) -> Hit | Miss:
        key = self.key(namespace, key_values)
        result = self._from_l1(key) or self._get_l2(key)
        self._count(key, result)
        if self.hits is not None and self.hits.due():
            self.hits.flush_sync(self.redis)
        return result

    def _get_l2(self, key: str) -> Hit | Miss:
        reply = self._evalsha(
            scripts.GET_OR_LEASE.sha, scripts.GET_OR_LEASE.text, key, secrets.token_hex(8), self.lease_ttl_ms
        )
        result = _decode_get(key, reply)
        if isinstance(result, Hit):
            if self.l1 is not None:
                self.l1.put(key, result.version, result.value, result.signature)
            return result
        if self.l3 is not None and result.lease is not None and not result.lease.outer_fenced:
            outer = _l3_entry(self.l3.hgetall(key), result.lease.signature)  # type: ignore[arg-type]
            if outer is not None and self.fill(result.lease, outer[1], outer[0]) is FillResult.FILLED:
                return Hit(outer[1], outer[0], "l3", result.lease.signature)
        return result

    def fill(
        self,
        lease: Lease,
        value: bytes,
        version: int | None = None,
        row: Sequence[KeyValue] | None = None,
    ) -> FillResult:
        outcome = _decode_fill(
            self._evalsha(
                scripts.FILL.sha, scripts.FILL.text, lease.key, *self._fill_args(lease, value, version, row)
            )
        )
        self.counts[f"fill_{outcome.value}"] += 1
        if outcome is FillResult.FILLED:
            self._keep_in_l1(lease, value, version)
        return outcome

    def get_or_load(
        self,
        namespace: str,
        key_values: Sequence[KeyValue],
        loader: Callable[[], Loaded],
        *,
        wait_s: float = 0.01,
        attempts: int = 5,
    ) -> bytes | None:
        for _ in range(attempts):
            result = self.get(namespace, key_values)
            if isinstance(result, Hit):
                return result.value
            if result.lease is not None:
                loaded = loader()
                if loaded is None:
                    return None
                self.fill(result.lease, loaded[0], loaded[1])
                return loaded[0]
            time.sleep(wait_s)
        self.counts["read_through"] += 1
        loaded = loader()
        return None if loaded is None else loaded[0]
