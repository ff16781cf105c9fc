"""The Redis tier without a Redis: every operation names the tier when nothing answers."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cache_writer import RedisTier, TierUnavailableError
from tests.support.cas import W


def test_every_tier_operation_says_the_tier_is_unavailable_when_redis_does_not_answer() -> None:
    async def main() -> list[str]:
        nothing_there = aioredis.Redis(port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        tier = RedisTier(nothing_there, tombstone_ttl_ms=1, name="l9")
        calls = [
            tier.ping(),
            tier.apply([W("k", 1, b"v")]),
            tier.read_entries(["k"]),
            tier.get("k"),
            tier.read_signatures("fk", ["a"]),
            tier.fence_namespace("fk", "a", value_columns=["x"]),
            tier.read_hits("fk", "g", "c"),
        ]
        names = []
        for call in calls:
            with pytest.raises(TierUnavailableError) as raised:
                await call
            names.append(raised.value.tier)
        await tier.close()
        return names

    assert asyncio.run(main()) == ["l9"] * 7
