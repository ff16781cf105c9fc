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
import redis.asyncio as aioredis
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, wait_exponential

from cache_writer import CacheAction, CacheTier, Outcome, RedisSettings, RedisTier, TierUnavailableError
from cache_writer.settings import L3Settings
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
from pipeline.web import install_dashboard
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
        """Apply to every tier (each retried until it answers), then report per change.

        ``tiers`` are ordered inner (L2) to outer (L3...). Invalidations go outermost first, so no reader
        can refill an inner tier from an outer one that still holds the old entry; writes go innermost
        first. Within a tier the actions keep their order; across the two groups, the version checks
        make the order irrelevant for the final state.
        """
        indexed = [(a, p.binding.namespace) for p in planned for a in p.actions]
        if not indexed:
            return
        invalidations = [(a, ns) for a, ns in indexed if a.kind == "invalidate"]
        writes = [(a, ns) for a, ns in indexed if a.kind == "write"]
        steps = [(tier, invalidations) for tier in reversed(self.tiers)]
        steps += [(tier, writes) for tier in self.tiers]
        tier_done_ms: dict[str, float] = {}
        for tier, group in steps:
            if not group:
                continue
            actions = [a for a, _ in group]
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(TierUnavailableError),
                wait=wait_exponential(multiplier=0.05, max=5),
                before_sleep=before_sleep_log(log, logging.WARNING),
                reraise=True,
            ):
                with attempt:
                    results = await tier.apply(actions)
            tier_done_ms[tier.name] = time.time() * 1000
            for result, (_, namespace) in zip(results, group, strict=True):
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
            for name, done in sorted(tier_done_ms.items(), key=lambda item: item[1]):
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
    l3: L3Settings | None = None,
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

    # -- SLA evaluation and OpenTelemetry (issue 5) ---------------------------------------------------
    import asyncio
    import socket

    from connectors.exceptions import ConfigurationError
    from connectors.heartbeat import HeartbeatSettings
    from connectors.topics import ensure_topics
    from pipeline.config import load_settings
    from pipeline.sla import SlaEvaluator, SlaSettings, SlaViolation
    from pipeline.telemetry import OtelObserver, TelemetrySettings, configure_telemetry

    sla_settings = load_settings(SlaSettings)
    telemetry_settings = load_settings(TelemetrySettings)
    heartbeat = load_settings(HeartbeatSettings)
    heartbeat_binding = bindings.for_table(heartbeat.database, heartbeat.table)
    # create_app is the worker's entry point (``freshkey worker``): it installs the OpenTelemetry SDK.
    configure_telemetry(telemetry_settings, service="worker")
    sla = SlaEvaluator(
        sla_settings,
        worker=f"{socket.gethostname()}:{worker.web_port}",
        heartbeat_namespace=heartbeat_binding.namespace if heartbeat_binding else None,
        heartbeat_interval_ms=heartbeat.interval_ms,
    )
    otel = OtelObserver(trace_sample_every=telemetry_settings.trace_sample_every)
    otel.watch_sla(lambda: sla.state)
    processor.observers.add(sla)
    processor.observers.add(otel)
    violations_topic = app.topic(sla_settings.violations_topic, internal=False)
    violations_ready = asyncio.Event()
    pending_violations: list[SlaViolation] = []

    @app.task
    async def create_violations_topic() -> None:
        try:
            await asyncio.to_thread(ensure_topics, kafka, [sla_settings.violations_topic])
        except ConfigurationError as exc:
            log.error("SLA violations will not be published: %s", exc)
            return
        violations_ready.set()

    @app.timer(sla_settings.evaluation_interval_s)
    async def evaluate_sla() -> None:
        _, transitions = sla.evaluate()
        for event in transitions:
            otel.on_sla_event(event)
            log.log(logging.WARNING if event.kind == "violation" else logging.INFO, "%s", event.message)
        pending_violations.extend(transitions)
        while pending_violations and violations_ready.is_set():
            await violations_topic.send(key=sla.worker.encode(), value=pending_violations[0].to_json())
            pending_violations.pop(0)

    @app.timer(telemetry_settings.consumer_lag_interval_s)
    async def sample_high_watermarks() -> None:
        try:
            assigned = [tp for tp in app.consumer.assignment() if tp.topic == kafka.change_topic]
            highs = {tp.partition: app.consumer.highwater(tp) for tp in assigned}
        except Exception as exc:  # not started yet, or rebalancing: try again at the next tick
            log.debug("no high watermarks: %r", exc)
            return
        otel.set_high_watermarks(kafka.change_topic, {p: h for p, h in highs.items() if h is not None})

    # -- end of SLA evaluation and OpenTelemetry ------------------------------------------------------

    @app.task
    async def connect_tiers() -> None:
        tiers = [RedisTier.from_settings(redis)]
        if l3 is not None and l3.url:
            password = l3.password.get_secret_value() if l3.password else None
            tiers.append(
                RedisTier(
                    aioredis.Redis.from_url(l3.url, password=password),
                    tombstone_ttl_ms=redis.tombstone_ttl_s * 1000,
                    entry_ttl_ms=l3.entry_ttl_s * 1000 if l3.entry_ttl_s else None,
                    name="redis-l3",
                )
            )
        for tier in tiers:
            await tier.load_scripts()
        processor.tiers[:] = tiers
        log.info("cache tiers ready: %s", ", ".join(t.name for t in tiers))

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
            planned_ms = time.time() * 1000
            with otel.trace_batch(planned, received_ms=received_ms, planned_ms=planned_ms):
                await processor.apply(planned, received_ms=received_ms, planned_ms=planned_ms)
            for index, stage, reason in rejects:
                await send_dead_letter(events[index], stage, reason)
            for event in events:
                message = event.message
                processor.observers.on_offset(message.topic, message.partition, message.offset)
                await stream.ack(event)

    @app.page("/freshkey/verify")
    async def verify_page(web: Any, request: Any) -> Any:
        """The latest ``freshkey verify`` result (it stores it in Redis), 404 before the first run."""
        if not processor.tiers:
            return web.json({"error": "tiers not ready"}, status=503)
        raw = await processor.tiers[0].client.get(f"{redis.key_prefix}:verify:latest")  # type: ignore[attr-defined]
        if raw is None:
            return web.json({"error": "no verification yet"}, status=404)
        return web.bytes(raw, content_type="application/json")

    @app.page("/freshkey/stats")
    async def stats_page(web: Any, request: Any) -> Any:
        return web.json(processor.stats.snapshot())

    @app.page("/freshkey/sla")
    async def sla_page(web: Any, request: Any) -> Any:
        """The SLA state (pipeline.sla.SlaState as JSON), as of the last evaluation."""
        return web.json(sla.state.model_dump(mode="json"))

    @app.page("/freshkey/consumer-lag")
    async def consumer_lag_page(web: Any, request: Any) -> Any:
        """``{"topic/partition": messages not yet applied}`` for the partitions this worker owns."""
        return web.json({f"{t}/{p}": lag for (t, p), lag in sorted(otel.consumer_lag().items())})

    install_dashboard(app, processor)
    return app, processor
