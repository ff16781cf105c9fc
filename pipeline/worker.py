"""The Faust worker: change topic -> bindings -> versioned compare-and-set in every cache tier.

Offsets are acknowledged only after every tier acknowledged the batch (``noack_take`` + manual ack), so
a crash replays at most the unacknowledged batches, which the version checks make harmless. A tier
failure is retried with backoff, never skipped. A message that cannot be decoded or bound goes to the
dead-letter topic with the reason and its original bytes, and is counted; the stream goes on.

Models (issue 4): before planning a batch the worker reads the model state of its namespaces from Redis
(``pipeline.models``). Writes of a namespace with a model carry the signature they were built under; a
semantic binding's keys are computed for the whole batch at once on the configured device, before and
after images together, under the active and (during a prewarm) the pending model. Model updates arrive
on their own topic, are checked, and become cutover commands on the hotness topic, where the worker
that holds the namespace's hit counts (a Faust table) prewarms and switches (``pipeline.cutover``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import faust
import orjson
import pymysql
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, wait_exponential

from cache_writer import CacheAction, CacheTier, Outcome, RedisSettings, RedisTier, TierUnavailableError
from cache_writer.keys import namespace_prefix
from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.settings import L3Settings
from connectors.database import primary_key, table_columns
from connectors.settings import KafkaSettings, MySQLSettings
from pipeline.apply import BindError, commit_time_us, plan
from pipeline.config import load_settings
from pipeline.cutover import CutoverRejected, Cutovers
from pipeline.faust_app import FreshkeyApp
from pipeline.hotness import HitForwarder, merge_count, top_entries
from pipeline.loaders import Loaders
from pipeline.models import (
    NO_MODEL,
    KeyRequest,
    ModelRegistry,
    ModelUnavailableError,
    NamespaceModels,
    semantic_keys,
)
from pipeline.observe import (
    STAGE_PLAN,
    STAGE_SOURCE,
    STAGE_TRANSPORT,
    TIER_STAGE_PREFIX,
    Observers,
)
from pipeline.settings import HotnessSettings, ModelSettings, WorkerSettings
from pipeline.stats import WorkerStats
from pipeline.web import install_dashboard
from schemas import Binding, Bindings, ChangeEvent, DdlEvent, DecodeError, decode, encode
from schemas.codec import dead_letter
from schemas.model_updates import decode_model_update

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
        models: ModelRegistry | None = None,
    ) -> None:
        self.bindings = bindings
        self.tiers = list(tiers)
        self.key_prefix = key_prefix
        self.stats = stats or WorkerStats()
        self.observers = Observers([self.stats])
        self.models = models

    async def prepare(
        self, messages: Sequence[tuple[bytes | None, bytes]]
    ) -> tuple[list[Planned], list[tuple[int, str, str]], list[DdlEvent]]:
        """Decode, read the namespaces' model state, key and plan.

        Returns (planned changes, rejects as (index, stage, reason), DDL events in order). A change of a
        semantic binding whose after image cannot be keyed is planned without that write (its before
        image's key is still invalidated) and also rejected (stage ``semantic-key``).
        """
        bound: list[tuple[int, ChangeEvent, Binding]] = []
        rejects: list[tuple[int, str, str]] = []
        ddl: list[DdlEvent] = []
        for index, (_key, value) in enumerate(messages):
            try:
                event = decode(value)
            except DecodeError as exc:
                rejects.append((index, "decode", exc.reason))
                continue
            if event.kind == "ddl":
                self.observers.on_event("ddl")
                log.info("DDL on %s: %s", event.source.db, event.query[:200])
                ddl.append(event)
                continue
            binding = self.bindings.for_table(event.source.db, event.source.table)
            if binding is None:
                self.observers.on_event("unbound")
                continue
            bound.append((index, event, binding))
        models: dict[str, NamespaceModels] = {}
        if self.models is not None and bound and self.tiers:
            models = await self.models.refresh(
                self.tiers[0].client,  # type: ignore[attr-defined]
                {binding.namespace for _, _, binding in bound},
            )
        keys = await self._semantic_keys(bound, models)
        planned: list[Planned] = []
        for index, event, binding in bound:
            try:
                actions = self._plan(index, event, binding, models.get(binding.namespace, NO_MODEL), keys)
            except BindError as exc:
                rejects.append((index, "bind", str(exc)))
                continue
            if isinstance(actions, tuple):
                actions, reason = actions
                rejects.append((index, "semantic-key", reason))
            planned.append(Planned(index, event, binding, actions))
        return planned, rejects, ddl

    async def _semantic_keys(
        self, bound: Sequence[tuple[int, ChangeEvent, Binding]], models: dict[str, NamespaceModels]
    ) -> dict[tuple[int, int, str], str | EmbeddingError]:
        """Every image's key under every model state of its namespace, computed in one batch per keyer
        and modality: before and after images of an update are keyed together (invariant 6 makes the
        batch composition irrelevant to the keys)."""
        requests: list[KeyRequest] = []
        where: list[tuple[int, int, str]] = []
        for index, event, binding in bound:
            if binding.semantic is None:
                continue
            for position, state in enumerate(models.get(binding.namespace, NO_MODEL).states):
                for role, image in (("before", event.before), ("after", event.after)):
                    if image is not None:
                        requests.append(KeyRequest(binding, state, image))
                        where.append((index, position, role))
        if not requests:
            return {}
        keys = await asyncio.to_thread(semantic_keys, requests, self.key_prefix)
        return dict(zip(where, keys, strict=True))

    def _plan(
        self,
        index: int,
        event: ChangeEvent,
        binding: Binding,
        models: NamespaceModels,
        keys: dict[tuple[int, int, str], str | EmbeddingError],
    ) -> list[CacheAction] | tuple[list[CacheAction], str]:
        if binding.semantic is None:
            active = models.active
            if active is None:  # no model: exactly as always, entries carry no signature
                return plan(binding, event, prefix=self.key_prefix)
            return plan(
                binding,
                event,
                prefix=self.key_prefix,
                signature_of=lambda image: active.signature_for(binding, image),
            )
        if not models.states:
            self.observers.on_event("unkeyed")  # no model yet: no key can be computed, nothing cached
            return []
        actions: list[CacheAction] = []
        failures: list[str] = []
        roles = {id(event.before): "before", id(event.after): "after"}
        for position, state in enumerate(models.states):

            def key_of(image: Any, position: int = position) -> str | None:
                key = keys[(index, position, roles[id(image)])]
                if isinstance(key, EmbeddingError):
                    if roles[id(image)] == "after" and binding.on_change == "write":
                        failures.append(f"no semantic key for the new row: {key}")
                    return None
                return key

            actions += plan(
                binding,
                event,
                prefix=self.key_prefix,
                key_of=key_of,
                signature_of=lambda image, state=state: state.signature_for(binding, image),  # type: ignore[misc]
            )
        if failures:
            return actions, failures[0]
        return actions

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
    mysql: MySQLSettings | None = None,
) -> tuple[faust.App, ChangeProcessor]:
    """The worker's Faust app. ``mysql`` (default: from the environment) is read for cutovers only:
    the columns of tables bound without ``value_columns``, primary keys, and rows to prewarm."""
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
    registry = ModelRegistry(
        bindings,
        prefix=redis.key_prefix,
        device=worker.device,
        weights_dir=load_model_settings().weights_dir,
    )
    processor = ChangeProcessor(bindings, [], key_prefix=redis.key_prefix, models=registry)

    # -- SLA evaluation and OpenTelemetry (issue 5) ---------------------------------------------------
    import asyncio

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
        cutovers.tiers[:] = tiers
        log.info("cache tiers ready: %s", ", ".join(t.name for t in tiers))

    async def send_dead_letter(event: Any, stage: str, reason: str, original: bytes | None = None) -> None:
        message = event.message
        letter = dead_letter(
            reason,
            original if original is not None else message.value or b"",
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
            messages = [(e.message.key, e.message.value) for e in events]
            async for attempt in _retrying():
                with attempt:
                    planned, rejects, ddl = await processor.prepare(messages)
            planned_ms = time.time() * 1000
            with otel.trace_batch(planned, received_ms=received_ms, planned_ms=planned_ms):
                await processor.apply(planned, received_ms=received_ms, planned_ms=planned_ms)
            for index, stage, reason in rejects:
                await send_dead_letter(events[index], stage, reason)
            for ddl_event in ddl:  # after the batch's changes: they were read under the old columns
                try:
                    async for attempt in _retrying():
                        with attempt:
                            moved = await cutovers.on_ddl(ddl_event)
                except Exception:  # outages are retried above; anything else must not stop changes
                    log.exception("DDL %s not applied to the signatures", ddl_event.event_id)
                    moved = []
                for namespace in moved:
                    processor.observers.on_event("signature_ddl")
                    cutover_log.append(
                        {"namespace": namespace, "cause": "ddl", "ts_ms": int(time.time() * 1000)}
                    )
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

    # -- model updates, hotness and cutovers (issue 4) ------------------------------------------------
    model_settings = load_model_settings()
    hotness_settings = load_settings(HotnessSettings)
    mysql_settings = mysql if mysql is not None else load_settings(MySQLSettings)

    async def columns_of(binding: Binding) -> tuple[str, ...]:
        return await asyncio.to_thread(table_columns, mysql_settings, binding.database, binding.table_name)

    async def key_columns_of(binding: Binding) -> tuple[str, ...]:
        if binding.key_columns is not None:
            return binding.key_columns
        return await asyncio.to_thread(primary_key, mysql_settings, binding.database, binding.table_name)

    cutovers = Cutovers(
        bindings,
        registry,
        prefix=redis.key_prefix,
        settings=model_settings,
        columns_of=columns_of,
        key_columns_of=key_columns_of,
        loaders=Loaders(mysql_settings),
    )
    cutover_log: list[dict[str, Any]] = []
    model_updates = app.topic(kafka.model_update_topic, internal=False)
    hotness_topic = app.topic(kafka.hotness_topic, partitions=kafka.partitions, internal=False)
    hot_table = app.Table("hotness", default=None, key_type=str, value_type=str, partitions=kafka.partitions)
    forwarder: list[HitForwarder] = []

    @app.agent(model_updates)
    async def check_model_updates(stream: faust.StreamT) -> None:
        """Check each model update; an accepted one becomes one cutover command per namespace, sent to
        the hotness topic keyed by namespace (where that namespace's hit counts are)."""
        async for events in stream.noack_take(16, within=0.05):  # type: ignore[attr-defined]
            while not processor.tiers:
                await app.sleep(0.05)
            for event in events:
                raw = event.message.value or b""
                try:
                    async for attempt in _retrying():
                        with attempt:
                            checked = await cutovers.check(raw)
                except CutoverRejected as exc:
                    processor.observers.on_event("model_update_rejected")
                    await send_dead_letter(event, "model-update", exc.reason)
                    continue
                except Exception as exc:  # bad input never stops the pipeline (invariant 8)
                    log.exception("model update could not be checked")
                    processor.observers.on_event("model_update_rejected")
                    await send_dead_letter(event, "model-update", f"check-failed: {exc!r}")
                    continue
                if checked is None:
                    processor.observers.on_event("model_update_duplicate")
                    log.info("model update already active on every namespace it serves: %s", raw[:200])
                    continue
                for namespace in checked.namespaces:
                    command = {
                        "kind": "cutover",
                        "prefix": redis.key_prefix,
                        "namespace": namespace,
                        "update": raw.decode(),
                    }
                    future = await hotness_topic.send(key=namespace.encode(), value=orjson.dumps(command))
                    await future
                processor.observers.on_event("model_update")
            for event in events:
                await stream.ack(event)

    @app.agent(hotness_topic)
    async def hotness(stream: faust.StreamT) -> None:
        """Fold hit counts into the hotness table; run cutover commands (prewarm + switch)."""
        async for event in stream.events():
            try:
                data = orjson.loads(event.message.value or b"{}")
            except orjson.JSONDecodeError:
                continue
            if not isinstance(data, dict) or data.get("prefix") != redis.key_prefix:
                continue  # another deployment's message on a shared topic
            if data.get("kind") == "hits" and isinstance(data.get("counts"), dict):
                for key, count in data["counts"].items():
                    if isinstance(count, list) and len(count) == 2 and all(isinstance(c, int) for c in count):
                        hot_table[key] = merge_count(hot_table.get(key), count[0], count[1])
            elif data.get("kind") == "cutover" and isinstance(data.get("update"), str):
                await run_cutover(event, str(data.get("namespace")), data["update"].encode())

    async def run_cutover(event: Any, namespace: str, raw: bytes) -> None:
        while not processor.tiers:
            await app.sleep(0.05)
        try:
            update = decode_model_update(raw)
        except DecodeError as exc:
            await send_dead_letter(event, "model-update", f"invalid: {exc.reason}", original=raw)
            return
        hot = top_entries(
            list(hot_table.items()),
            namespace_prefix(redis.key_prefix, namespace),
            model_settings.prewarm_top_n,
            int(time.time() * 1000),
            hotness_settings,
        )
        try:
            async for attempt in _retrying():
                with attempt:
                    report = await cutovers.cutover(namespace, update, None, hot)
        except CutoverRejected as exc:
            processor.observers.on_event("model_update_rejected")
            await send_dead_letter(event, "model-update", exc.reason, original=raw)
            return
        except Exception as exc:  # never let one cutover stop the hotness agent (invariant 8)
            log.exception("cutover of %s failed", namespace)
            processor.observers.on_event("model_update_rejected")
            await send_dead_letter(event, "model-update", f"cutover-failed: {exc!r}", original=raw)
            return
        processor.observers.on_event("cutover")
        cutover_log.append(
            {
                "namespace": namespace,
                "cause": "model-update",
                "model": update.model,
                "model_version": update.model_version,
                "signature": report.signature,
                "previous": report.previous,
                "mode": report.mode,
                "switch_ms": report.switch_ms,
                "prewarm": dataclasses.asdict(report.prewarm),
                "ts_ms": int(time.time() * 1000),
            }
        )
        del cutover_log[:-100]

    @app.timer(hotness_settings.forward_interval_s)
    async def forward_hits() -> None:
        if not processor.tiers:
            return
        if not forwarder:
            consumer = f"{worker.app_id}@{socket.gethostname()}:{worker.web_port}"
            forwarder.append(HitForwarder(processor.tiers[0].client, redis.key_prefix, consumer))  # type: ignore[attr-defined]

        async def send(key: bytes, value: bytes) -> None:
            future = await hotness_topic.send(key=key, value=value)
            await future

        try:
            await forwarder[0].forward(send)
        except (RedisError, OSError) as exc:
            log.debug("hit counts not forwarded this time: %r", exc)

    @app.page("/freshkey/cutovers")
    async def cutovers_page(web: Any, request: Any) -> Any:
        """The last cutovers (signature changes) this worker made, oldest first."""
        return web.json(cutover_log)

    @app.page("/freshkey/hotness")
    async def hotness_page(web: Any, request: Any) -> Any:
        """Entries with hit counts in this worker's partitions of the hotness table."""
        return web.json({"entries": len(hot_table)})

    install_dashboard(app, processor)
    return app, processor


def _retrying() -> AsyncRetrying:
    """Retry a step that needs Redis, the database or the weights until it succeeds (never skipped)."""
    return AsyncRetrying(
        retry=retry_if_exception_type(
            (TierUnavailableError, RedisError, OSError, ModelUnavailableError, pymysql.err.Error)
        ),
        wait=wait_exponential(multiplier=0.05, max=5),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


def load_model_settings() -> ModelSettings:
    return load_settings(ModelSettings)
