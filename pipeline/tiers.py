"""The worker's cache tiers: connected once, fenced when they fail past the bound, trusted again after.

``cache_writer.retry`` decides *when* a tier is fenced; this module does what a fence means for the
pipeline (``pipeline.fence`` for namespaces, the outer-tier mark for readers, the flush before an outer
tier is trusted again) and keeps the tiers of the processor and the cutovers in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from cache_writer import CacheTier, RedisTier, TierUnavailableError
from connectors.database import table_columns
from pipeline.fence import fence_namespaces
from pipeline.outages import until_done
from schemas import Binding

if TYPE_CHECKING:
    from pipeline.config import AllSettings
    from pipeline.cutover import Cutovers
    from pipeline.processor import ChangeProcessor

log = logging.getLogger(__name__)

_ANOTHER_INCARNATION = (
    "another incarnation of the server (a snapshot or append-only file loaded at a restart, or a replica "
    "promoted after a failover): its entries may be older than the changes applied since"
)

INCARNATION_CHECK_S = 1.0
"""How often the worker asks L2 whether its data set was restored from another incarnation of the server
(:meth:`Tiers.check_incarnation`): the longest a restored snapshot's entries are served unfenced."""


class Tiers:
    """L2 (and L3 when configured) for one worker; ``ready`` is set once every tier has its scripts."""

    def __init__(
        self,
        settings: AllSettings,
        bindings: Sequence[Binding],
        processor: ChangeProcessor,
        cutovers: Cutovers,
        *,
        spawn: Callable[[asyncio.Future[None] | asyncio.Task[None]], object] | None = None,
        on_fence: Callable[[str, str], None] = lambda namespace, cause: None,
    ) -> None:
        self.settings = settings
        self.bindings = list(bindings)
        self.processor = processor
        self.cutovers = cutovers
        self.ready = asyncio.Event()
        self._l2: RedisTier | None = None
        self._outer: list[RedisTier] = []
        self._spawn = spawn
        self._on_fence = on_fence
        processor.on_primary_back = self._on_primary_back
        processor.on_outer_fenced = self._on_outer_fenced

    @property
    def l2(self) -> RedisTier:
        """The primary tier (the processor's first): it holds the signatures every reader checks, and the
        stream of the clients' hit counts. Set once :meth:`connect` returned."""
        if self._l2 is None:
            raise RuntimeError("cache tiers are not connected yet")
        return self._l2

    async def connect(self) -> None:
        """Connect every tier and load its scripts, retrying until each answers."""
        self._l2 = RedisTier.from_settings(self.settings.redis)
        tiers: list[CacheTier] = [self._l2]
        outer = RedisTier.outer_from_settings(self.settings.redis, self.settings.l3)
        if outer is not None:
            tiers.append(outer)
            self._outer = [outer]
        for tier in tiers:
            await until_done(f"loading the scripts into {tier.name}", tier.load_scripts)
        await until_done(f"reading the identity of {self._l2.name}", self.check_incarnation)
        self.processor.tiers[:] = tiers
        self.cutovers.tiers[:] = tiers
        for tier in self._outer:  # before the first batch; one that does not answer now is looked at later
            with contextlib.suppress(TierUnavailableError, RedisError, OSError):
                await self.check_outer_incarnation(tier)
        self.ready.set()
        log.info("cache tiers ready: %s", ", ".join(t.name for t in tiers))

    async def _columns(self, binding: Binding) -> tuple[str, ...]:
        mysql = self.settings.mysql
        return await asyncio.to_thread(table_columns, mysql, binding.database, binding.table_name)

    async def fence(self, bindings: Sequence[Binding], reason: str, *, cause: str) -> list[str]:
        """Fence the namespaces of ``bindings`` in L2 (``pipeline.fence``), retrying outages."""
        fenced = await until_done(
            f"fencing {len(bindings)} namespace(s)",
            lambda: fence_namespaces(
                self.l2, self.settings.redis.key_prefix, bindings, columns_of=self._columns, reason=reason
            ),
        )
        for namespace in fenced:
            self.processor.observers.on_event("fence")
            self._on_fence(namespace, cause)
        return fenced

    async def check_incarnation(self) -> bool:
        """Fence every namespace when L2's data set comes from another incarnation of the server than the
        one it was last seen under (``RedisTier.incarnation``: a snapshot loaded at a restart, a replica
        promoted after a failover): its entries may be older than what was applied since, and nothing
        else would ever tell. True when it fenced. The new identity is recorded only after the fence, so
        a fence that fails is tried again at the next look. Raises TierUnavailableError while L2 does not
        answer."""
        prefix = self.settings.redis.key_prefix
        current, recorded = await self.l2.incarnation(prefix)
        if recorded == current:
            return False
        fenced = False
        if recorded is not None:
            reason = f"{self.l2.name} holds a data set restored from {_ANOTHER_INCARNATION}"
            if self.settings.redis.fence_on_restore:
                log.error("%s; fencing every namespace", reason)
                self.processor.observers.on_event("tier_restored")
                await self.fence(self.bindings, reason, cause="tier-restored")
                fenced = True
            else:
                log.warning("%s; not fenced (FRESHKEY_REDIS_FENCE_ON_RESTORE=false)", reason)
        await self.l2.record_incarnation(prefix, current)
        return fenced

    async def check_outer_incarnation(self, tier: RedisTier) -> bool:
        """:meth:`check_incarnation` for an outer tier (L3): one restored from another incarnation is
        fenced as after an outage (skipped, marked for readers, flushed, then trusted again). True when it
        fenced. A tier fenced already is only recorded: its flush removes whatever it was restored with."""
        prefix = self.settings.redis.key_prefix
        current, recorded = await tier.incarnation(prefix)
        if recorded == current:
            return False
        guard = self.processor.guard(tier)
        fenced = False
        if recorded is not None and guard.state != "fenced":
            reason = f"{tier.name} holds a data set restored from {_ANOTHER_INCARNATION}"
            if self.settings.redis.fence_on_restore:
                log.error("%s; it is skipped and flushed before it is trusted again", reason)
                self.processor.observers.on_event("tier_restored")
                guard.fence()
                await self._on_outer_fenced(tier)
                fenced = True
            else:
                log.warning("%s; not fenced (FRESHKEY_REDIS_FENCE_ON_RESTORE=false)", reason)
        await tier.record_incarnation(prefix, current)
        return fenced

    async def watch_incarnation(self) -> None:
        """:meth:`check_incarnation` (and :meth:`check_outer_incarnation`) every
        :data:`INCARNATION_CHECK_S` once the tiers are ready; a tier that does not answer is the
        processor's to wait for and fence (its outage path)."""
        await self.ready.wait()
        while True:
            await asyncio.sleep(INCARNATION_CHECK_S)
            checks: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
                (self.l2.name, self.check_incarnation),
                *[(tier.name, partial(self.check_outer_incarnation, tier)) for tier in self._outer],
            ]
            for name, check in checks:
                try:
                    await check()
                except (TierUnavailableError, RedisError, OSError) as exc:
                    log.debug("identity of %s not checked now: %r", name, exc)

    async def _on_primary_back(self) -> None:
        reason = f"{self.l2.name} was out of reach past the fence bound"
        await self.fence(self.bindings, reason, cause="tier-outage")

    async def _on_outer_fenced(self, tier: CacheTier) -> None:
        since = int(time.time() * 1000)
        namespaces = [b.namespace for b in self.bindings]
        await until_done(
            f"marking {tier.name} fenced for readers",
            lambda: self.l2.mark_outer_fenced(self.settings.redis.key_prefix, namespaces, since),
        )
        self.processor.observers.on_event("tier_fenced")
        task = asyncio.ensure_future(self._recover_outer(tier, namespaces))
        if self._spawn is not None:
            self._spawn(task)

    async def _recover_outer(self, tier: CacheTier, namespaces: list[str]) -> None:
        """Probe a fenced outer tier until it answers, flush it, then trust it again."""
        guard = self.processor.guard(tier)
        policy = self.processor.policy
        flushdb = self.settings.l3.flush == "flushdb"
        attempt = 0
        while True:
            await asyncio.sleep(policy.backoff(attempt) + 0.1)
            attempt += 1
            try:
                await tier.ping()
                guard.recovering = True
                removed = await tier.flush(self.settings.redis.key_prefix, flushdb=flushdb)
                await self.l2.mark_outer_fenced(self.settings.redis.key_prefix, namespaces, None)
            except (TierUnavailableError, RedisError, OSError) as exc:
                guard.recovering = False
                if attempt % 10 == 1:
                    log.warning("fenced tier %s still out of reach (%r); attempt %d", tier.name, exc, attempt)
                continue
            guard.unfence()
            self.processor.observers.on_event("tier_recovered")
            log.warning(
                "tier %s answers again: flushed (%s keys) and trusted again",
                tier.name, "all" if removed < 0 else removed,
            )  # fmt: skip
            return
