"""The Faust worker: change topic -> bindings -> versioned compare-and-set in every cache tier.

Offsets are acknowledged only after every tier acknowledged the batch (``noack_take`` + manual ack), so
a crash replays at most the unacknowledged batches, which the version checks make harmless. A tier
failure is retried with backoff, never skipped. A message that cannot be decoded or bound goes to the
dead-letter topic with the reason and its original bytes, and is counted; the stream goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faust
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, wait_exponential

from cache_writer import CacheAction, CacheTier, Outcome, RedisSettings, RedisTier, TierUnavailableError
from connectors.settings import KafkaSettings
from pipeline.apply import BindError, commit_time_us, plan
from pipeline.faust_app import FreshkeyApp
from pipeline.observe import (
    STAGE_PLAN,
    STAGE_SOURCE,
    STAGE_TRANSPORT,
    TIER_STAGE_PREFIX,
    Observers,
)
from pipeline.settings import WorkerSettings
from pipeline.stats import WorkerStats
from schemas import Binding, Bindings, ChangeEvent, DecodeError, decode, encode
from schemas.codec import dead_letter

log = logging.getLogger(__name__)


class ChangeProcessor:
    """Turns a batch of raw messages into tier writes and reports to its observers.

    Independent of Faust's types, so it is tested and benchmarked without a broker.
    """

    def __init__(
        self,
        bindings: Bindings,
        tiers: Sequence[CacheTier],
        *,
        key_prefix: str,
        stats: WorkerStats | None = None,
    ) -> None:
        self.bindings = bindings
        self.tiers = list(tiers)
        self.key_prefix = key_prefix
        self.stats = stats or WorkerStats()
        self.observers = Observers([self.stats])

    def prepare(
        self, messages: Sequence[tuple[bytes | None, bytes]]
    ) -> tuple[list[Planned], list[tuple[int, str, str]]]:
        """Decode and plan. Returns (planned changes, rejects as (index, stage, reason))."""
        planned: list[Planned] = []
        rejects: list[tuple[int, str, str]] = []
        for index, (_key, value) in enumerate(messages):
            try:
                event = decode(value)
            except DecodeError as exc:
                rejects.append((index, "decode", exc.reason))
                continue
            if event.kind == "ddl":
                self.observers.on_event("ddl")
                log.info("DDL on %s: %s", event.source.db, event.query[:200])
                continue
            binding = self.bindings.for_table(event.source.db, event.source.table)
            if binding is None:
                self.observers.on_event("unbound")
                continue
            try:
                planned.append(Planned(index, event, binding, plan(binding, event, prefix=self.key_prefix)))
            except BindError as exc:
                rejects.append((index, "bind", str(exc)))
        return planned, rejects

    async def apply(self, planned: Sequence[Planned], *, received_ms: float, planned_ms: float) -> None:
        """Apply to every tier in order (each retried until it answers), then report per change."""
        actions = [a for p in planned for a in p.actions]
        if not actions:
            return
        namespaces = [p.binding.namespace for p in planned for _ in p.actions]
        tier_done_ms: dict[str, float] = {}
        for tier in self.tiers:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(TierUnavailableError),
                wait=wait_exponential(multiplier=0.05, max=5),
                before_sleep=before_sleep_log(log, logging.WARNING),
                reraise=True,
            ):
                with attempt:
                    results = await tier.apply(actions)
            tier_done_ms[tier.name] = time.time() * 1000
            for result, namespace in zip(results, namespaces, strict=True):
                outcome = result.outcome.value
                if result.outcome is Outcome.APPLIED and result.action.kind == "invalidate":
                    outcome = "tombstoned"
                self.observers.on_outcome(tier.name, namespace, outcome)
        now_ms = time.time() * 1000
        for p in planned:
            commit_us, coarse = commit_time_us(p.binding, p.event)
            commit_ms = commit_us / 1000
            stages = {
                STAGE_TRANSPORT: received_ms - p.event.ts_ms,
                STAGE_PLAN: planned_ms - received_ms,
            }
            if not coarse:
                stages[STAGE_SOURCE] = p.event.ts_ms - commit_ms
            previous = planned_ms
            for name, done in tier_done_ms.items():
                stages[TIER_STAGE_PREFIX + name] = done - previous
                previous = done
            self.observers.on_event(p.event.op)
            self.observers.on_applied(
                p.binding.namespace, p.event.op, now_ms - commit_ms, coarse=coarse, stages=stages
            )


@dataclass(frozen=True, slots=True)
class Planned:
    index: int
    event: ChangeEvent
    binding: Binding
    actions: list[CacheAction]


def create_app(
    worker: WorkerSettings,
    kafka: KafkaSettings,
    redis: RedisSettings,
    bindings: Bindings,
) -> tuple[faust.App, ChangeProcessor]:
    app = FreshkeyApp(
        worker.app_id,
        fetch_max_wait_ms=worker.fetch_max_wait_ms,
        broker=f"kafka://{kafka.bootstrap}",
        value_serializer="raw",
        key_serializer="raw",
        datadir=str(worker.data_dir),
        web_bind=worker.web_bind,
        web_port=worker.web_port,
        web_host=worker.web_bind,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=worker.commit_interval_s,
        broker_session_timeout=worker.session_timeout_s,
        broker_heartbeat_interval=max(worker.session_timeout_s / 5, 0.5),
        broker_rebalance_timeout=max(worker.session_timeout_s, 10.0),
        topic_disable_leader=True,
        topic_partitions=kafka.partitions,
        producer_acks=-1,
    )
    changes = app.topic(kafka.change_topic, partitions=kafka.partitions, internal=False)
    dead_letters = app.topic(kafka.dead_letter_topic, internal=False)
    processor = ChangeProcessor(bindings, [], key_prefix=redis.key_prefix)

    @app.task
    async def connect_tiers() -> None:
        tier = RedisTier.from_settings(redis)
        await tier.load_scripts()
        processor.tiers.append(tier)
        log.info("Redis tier ready at %s", redis.url)

    async def send_dead_letter(event: Any, stage: str, reason: str) -> None:
        message = event.message
        letter = dead_letter(
            reason,
            message.value or b"",
            stage=stage,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
        )
        future = await dead_letters.send(key=message.key, value=encode(letter))
        await future
        processor.observers.on_event("dead_lettered")
        log.warning(
            "dead letter (%s) %s[%d]@%d: %s", stage, message.topic, message.partition, message.offset, reason
        )

    @app.agent(changes)
    async def apply_changes(stream: faust.StreamT) -> None:
        batches = stream.noack_take(  # type: ignore[attr-defined]
            worker.batch_max, within=worker.batch_within_ms / 1000
        )
        async for events in batches:
            while not processor.tiers:
                await app.sleep(0.05)
            received_ms = time.time() * 1000
            planned, rejects = processor.prepare([(e.message.key, e.message.value) for e in events])
            await processor.apply(planned, received_ms=received_ms, planned_ms=time.time() * 1000)
            for index, stage, reason in rejects:
                await send_dead_letter(events[index], stage, reason)
            for event in events:
                message = event.message
                processor.observers.on_offset(message.topic, message.partition, message.offset)
                await stream.ack(event)

    @app.page("/freshkey/stats")
    async def stats_page(web: Any, request: Any) -> Any:
        return web.json(processor.stats.snapshot())

    return app, processor
