"""Fences: when freshkey cannot vouch for what a namespace's entries hold, it stops them being served.

A fence moves the namespace's signature to its next epoch (``cache_writer.signatures.fence_namespace``):
one compare-and-set per namespace, whatever its size. From that write on, every reader (the Lua read
script, in-process L1 caches through the broadcast, fills under a lease) treats each entry built before
it as a miss; the entries go by their TTL or ``freshkey model sweep``. Used where changes may have been
lost or cannot be applied: a binlog gap (``freshkey connector --accept-gap``, a broker that lost its
topics), a Redis tier that was out of reach for longer than the fence bound, an oversized row of a
namespace whose keys depend on the row's content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import pymysql
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, wait_exponential

from cache_writer import CacheTier, RedisTier
from cache_writer.exceptions import TierUnavailableError
from connectors.database import table_columns
from pipeline.config import AllSettings
from schemas import Binding, Bindings

log = logging.getLogger(__name__)

ColumnsOf = Callable[[Binding], Awaitable[tuple[str, ...]]]


async def fence_namespaces(
    tier: CacheTier,
    prefix: str,
    bindings: Sequence[Binding],
    *,
    columns_of: ColumnsOf,
    reason: str,
) -> list[str]:
    """Fence each binding's namespace in ``tier`` (the primary, L2: announced on its channel; see the
    module docstring); returns the namespaces fenced.

    ``columns_of`` gives a table's columns; it is asked only for a namespace that has no signature yet
    and no ``value_columns`` (its first signature covers its projection). Raises
    :class:`TierUnavailableError` (Redis) or the database's error when one does not answer.
    """
    fenced: list[str] = []
    for binding in dict.fromkeys(bindings):
        columns = binding.value_columns
        try:
            await tier.fence_namespace(prefix, binding.namespace, value_columns=columns)
        except ValueError:
            columns = tuple(sorted(await columns_of(binding)))
            await tier.fence_namespace(prefix, binding.namespace, value_columns=columns)
        fenced.append(binding.namespace)
    if fenced:
        log.warning(
            "fenced %d namespace(s) (%s): entries cached before now are no longer served: %s",
            len(fenced),
            reason,
            ", ".join(fenced),
        )
    return fenced


def fence_all(settings: AllSettings, bindings: Bindings, reason: str) -> list[str]:
    """Fence every bound namespace in L2 (blocking; for the connector's gap handling). Retries Redis and
    database outages with backoff until it succeeds: nothing may be produced after a gap before this."""

    async def columns_of(binding: Binding) -> tuple[str, ...]:
        return await asyncio.to_thread(table_columns, settings.mysql, binding.database, binding.table_name)

    async def run() -> list[str]:
        tier = RedisTier.from_settings(settings.redis)
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((TierUnavailableError, RedisError, OSError, pymysql.err.Error)),
                wait=wait_exponential(multiplier=0.1, max=10),
                before_sleep=before_sleep_log(log, logging.WARNING),
                reraise=True,
            ):
                with attempt:
                    return await fence_namespaces(
                        tier,
                        settings.redis.key_prefix,
                        bindings.bindings,
                        columns_of=columns_of,
                        reason=reason,
                    )
        finally:
            await tier.close()
        raise AssertionError("unreachable")  # pragma: no cover

    return asyncio.run(run())
