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
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import faust
import orjson
import pymysql
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from cache_writer import (
    ActionResult,
    CacheAction,
    CacheTier,
    Outcome,
    RedisSettings,
    RedisTier,
    TierUnavailableError,
    entry_key,
)
from cache_writer.keys import namespace_prefix
from cache_writer.retry import RetryPolicy, TierGuard
from cache_writer.semantic.exceptions import EmbeddingError
from cache_writer.settings import L3Settings
from cache_writer.signatures import mark_outer_fenced
from connectors.database import primary_key, table_columns
from connectors.exceptions import ConfigurationError
from connectors.heartbeat import HeartbeatSettings
from connectors.settings import KafkaSettings, MySQLSettings
from connectors.topics import ensure_topics
from pipeline.apply import BindError, commit_time_us, plan
from pipeline.config import load_settings
from pipeline.cutover import CutoverRejected, Cutovers
from pipeline.faust_app import FreshkeyApp
from pipeline.fence import fence_namespaces
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
from pipeline.sla import ConsumerProgress, SlaEvaluator, SlaSettings, SlaViolation
from pipeline.stats import WorkerStats
from pipeline.telemetry import BrokerOffsets, OtelObserver, TelemetrySettings, configure_telemetry
from pipeline.web import install_dashboard
from schemas import Binding, Bindings, ChangeEvent, DdlEvent, DecodeError, decode, encode
from schemas.codec import DEAD_LETTER_KEY_BYTES, dead_letter
from schemas.model_updates import decode_model_update

log = logging.getLogger(__name__)


OUTAGES: tuple[type[BaseException], ...] = (
    TierUnavailableError,
    RedisError,
    OSError,
    ModelUnavailableError,
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
)
"""Errors that say a service is out of reach (Redis, the database, the weights): the step is retried
with backoff until it succeeds, never skipped and never acknowledged past."""


@dataclass(frozen=True, slots=True)
class Planned:
    index: int
    event: ChangeEvent
    binding: Binding
    actions: list[CacheAction]


@dataclass(frozen=True, slots=True)
class Reject:
    """A message that cannot be processed: it goes to the dead-letter topic with ``stage`` and ``reason``."""

    index: int
    stage: str
    reason: str


@dataclass
class Prepared:
    planned: list[Planned]
    rejects: list[Reject]
    ddl: list[DdlEvent]
    fences: dict[str, str]
    """Namespaces to fence before the batch is applied, with the reason (oversized rows whose entry keys
    cannot be computed without the row)."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


class ChangeProcessor:
    """Turns a batch of raw messages into tier writes and reports to its observers.

    Independent of Faust's types, so it is tested and benchmarked without a broker. Per-message failures
    of any kind (decode, bind, keys, a value a tier refuses) become :class:`Reject`s; only outages are
    raised (:data:`OUTAGES`), so the caller retries the batch.
    """

    def __init__(
        self,
        bindings: Bindings,
        tiers: Sequence[CacheTier],
        *,
        key_prefix: str,
        stats: WorkerStats | None = None,
        models: ModelRegistry | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.bindings = bindings
        self.tiers = list(tiers)
        self.key_prefix = key_prefix
        self.stats = stats or WorkerStats()
        self.observers = Observers([self.stats])
        self.models = models
        self.policy = policy or RetryPolicy()
        self.guards: dict[str, TierGuard] = {}
        self.on_outer_fenced: Callable[[CacheTier], Awaitable[None]] | None = None
        """Called once when an outer tier is fenced (mark it for readers, start its recovery)."""
        self.on_primary_back: Callable[[], Awaitable[None]] | None = None
        """Called when L2 answers again after an outage past the fence bound, before anything else is
        applied (fences every namespace there)."""

    def guard(self, tier: CacheTier) -> TierGuard:
        guard = self.guards.get(tier.name)
        if guard is None:
            guard = self.guards[tier.name] = TierGuard(tier.name, self.policy)
        return guard

    async def prepare(self, messages: Sequence[tuple[bytes | None, bytes | None]]) -> Prepared:
        """Decode, read the namespaces' model state, key and plan (see the class docstring).

        A change of a semantic binding whose after image cannot be keyed is planned without that write
        (its before image's key is still invalidated) and also rejected (stage ``semantic-key``).
        """
        bound: list[tuple[int, ChangeEvent, Binding]] = []
        prepared = Prepared([], [], [], {})
        for index, (_key, value) in enumerate(messages):
            try:
                event = decode(value if value is not None else b"")
            except DecodeError as exc:
                prepared.rejects.append(Reject(index, "decode", exc.reason))
                continue
            except Exception as exc:  # the decoder itself failed on this input: still bad input
                prepared.rejects.append(Reject(index, "decode", _describe(exc)))
                continue
            if event.kind == "ddl":
                self.observers.on_event("ddl")
                log.info("DDL on %s: %s", event.source.db, event.query[:200])
                prepared.ddl.append(event)
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
        for index, event, binding in bound:
            actions: list[CacheAction] | tuple[list[CacheAction], str]
            try:
                if event.oversize:
                    actions = self._plan_oversize(event, binding, prepared)
                else:
                    actions = self._plan(index, event, binding, models.get(binding.namespace, NO_MODEL), keys)
            except BindError as exc:
                prepared.rejects.append(Reject(index, "bind", str(exc)))
                continue
            except OUTAGES:
                raise
            except Exception as exc:  # any other failure of this one change: dead letter, with its class
                log.exception("planning %s failed", event.event_id)
                prepared.rejects.append(Reject(index, "plan", _describe(exc)))
                continue
            if isinstance(actions, tuple):
                actions, reason = actions
                prepared.rejects.append(Reject(index, "semantic-key", reason))
            prepared.planned.append(Planned(index, event, binding, actions))
        return prepared

    def _plan_oversize(self, event: ChangeEvent, binding: Binding, prepared: Prepared) -> list[CacheAction]:
        """A row too large for a message: invalidate its entry when its key and version are known from
        the event alone (row-keyed by the primary key, binlog/GTID versions); else fence the namespace."""
        self.observers.on_event("oversize")
        key_columns = binding.key_columns or tuple(event.key)
        if binding.semantic is None and binding.version_column is None and set(key_columns) <= set(event.key):
            key = entry_key(self.key_prefix, binding.namespace, [event.key[c] for c in key_columns])
            log.warning("oversized row of %s (key %s): its entry is invalidated", binding.table, event.key)
            return [CacheAction("invalidate", key, event.version, event.commit_ts_us)]
        prepared.fences.setdefault(
            binding.namespace,
            f"an oversized row of {binding.table} whose entry key or version needs the row itself "
            "(raise FRESHKEY_KAFKA_MAX_MESSAGE_BYTES and the broker's limit to cache such rows)",
        )
        return []

    async def _semantic_keys(
        self, bound: Sequence[tuple[int, ChangeEvent, Binding]], models: dict[str, NamespaceModels]
    ) -> dict[tuple[int, int, str], str | EmbeddingError]:
        """Every image's key under every model state of its namespace, computed in one batch per keyer
        and modality: before and after images of an update are keyed together (invariant 6 makes the
        batch composition irrelevant to the keys). When the batch fails on something other than an
        outage, each request is keyed alone, so one bad row cannot fail the others."""
        requests: list[KeyRequest] = []
        where: list[tuple[int, int, str]] = []
        for index, event, binding in bound:
            if binding.semantic is None or event.oversize:
                continue
            for position, state in enumerate(models.get(binding.namespace, NO_MODEL).keyed_states):
                for role, image in (("before", event.before), ("after", event.after)):
                    if image is not None:
                        requests.append(KeyRequest(binding, state, image))
                        where.append((index, position, role))
        if not requests:
            return {}
        try:
            keys = await asyncio.to_thread(semantic_keys, requests, self.key_prefix)
        except OUTAGES:
            raise
        except Exception as exc:
            log.warning("semantic keys of the batch failed (%r): keying each row alone", exc)
            keys = []
            for request in requests:
                try:
                    keys.extend(await asyncio.to_thread(semantic_keys, [request], self.key_prefix))
                except OUTAGES:
                    raise
                except Exception as one:
                    keys.append(EmbeddingError(_describe(one)))
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
            if active is None:  # no signature yet: entries carry none
                return plan(binding, event, prefix=self.key_prefix)
            return plan(
                binding,
                event,
                prefix=self.key_prefix,
                signature_of=lambda image: active.signature_for(binding, image),
            )
        if not models.keyed_states:
            self.observers.on_event("unkeyed")  # no model yet: no key can be computed, nothing cached
            return []
        actions: list[CacheAction] = []
        failures: list[str] = []
        roles = {id(event.before): "before", id(event.after): "after"}
        for position, state in enumerate(models.keyed_states):

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

    async def apply(
        self, planned: Sequence[Planned], *, received_ms: float, planned_ms: float
    ) -> list[Reject]:
        """Apply to every tier, then report per change; returns the changes a tier refused for good.

        ``tiers`` are ordered inner (L2) to outer (L3...). Invalidations go outermost first, so no reader
        can refill an inner tier from an outer one that still holds the old entry; writes go innermost
        first. Within a tier the actions keep their order; across the two groups, the version checks
        make the order irrelevant for the final state. A tier that does not answer is retried until it
        does or until it is fenced (``cache_writer.retry``).
        """
        indexed = [(a, p) for p in planned for a in p.actions]
        if not indexed:
            return []
        # Per key only the newest action of the batch is sent (a later one wins a tie): under
        # compare-and-set the older ones would be refused anyway, whatever the order they arrive in.
        newest: dict[str, int] = {}
        for i, (action, _) in enumerate(indexed):
            j = newest.get(action.key)
            if j is None or action.version >= indexed[j][0].version:
                newest[action.key] = i
        kept = [indexed[i] for i in sorted(newest.values())]
        invalidations = [(a, p) for a, p in kept if a.kind == "invalidate"]
        writes = [(a, p) for a, p in kept if a.kind == "write"]
        steps = [(tier, invalidations) for tier in reversed(self.tiers)]
        steps += [(tier, writes) for tier in self.tiers]
        tier_done_ms: dict[str, float] = {}
        refused: dict[int, Reject] = {}
        in_l2: dict[int, set[Outcome]] = {}
        for tier, group in steps:
            if not group:
                continue
            results = await self._apply_to(tier, [a for a, _ in group])
            if results is None:  # fenced: it will be flushed before it is trusted again
                for _, p in group:
                    self.observers.on_outcome(tier.name, p.binding.namespace, "fenced")
                continue
            tier_done_ms[tier.name] = time.time() * 1000
            for result, (_, p) in zip(results, group, strict=True):
                outcome = result.outcome.value
                if result.outcome is Outcome.APPLIED and result.action.kind == "invalidate":
                    outcome = "tombstoned"
                elif result.outcome is Outcome.FAILED:
                    refused.setdefault(
                        p.index, Reject(p.index, f"apply:{tier.name}", result.error or "failed")
                    )
                if tier is self.tiers[0]:
                    in_l2.setdefault(p.index, set()).add(result.outcome)
                self.observers.on_outcome(tier.name, p.binding.namespace, outcome)
        now_ms = time.time() * 1000
        for p in planned:
            if p.index in refused or not p.actions:
                continue
            # Every change is accounted for once: applied in L2, superseded in its batch, or refused by
            # L2 as not newer (a replay, or overtaken); the refused ones go to the dead-letter topic.
            outcomes = in_l2.get(p.index)
            if outcomes is None:
                self.observers.on_event("change_superseded")
            elif Outcome.APPLIED in outcomes:
                self.observers.on_event("change_applied")
            else:
                self.observers.on_event("change_not_newer")
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
        return list(refused.values())

    async def _apply_to(self, tier: CacheTier, actions: list[CacheAction]) -> list[ActionResult] | None:
        """The tier's results, or None when the tier is fenced (skipped). A write the tier refuses for
        good is replaced by an invalidation of its key, so the entry cannot stay at an older value."""
        guard = self.guard(tier)
        primary = tier is self.tiers[0]
        if guard.state == "fenced" and not primary:
            return None
        while True:
            try:
                results = await tier.apply(actions)
                break
            except TierUnavailableError as exc:
                wait = guard.failed(exc)
                if guard.attempts == 1 or guard.attempts % 10 == 0:
                    log.warning(
                        "tier %s failing for %.1f s (%s); attempt %d, next in %.2f s; "
                        "nothing is acknowledged",
                        tier.name, guard.failing_for_s, exc.cause, guard.attempts, wait,
                    )  # fmt: skip
                if guard.due_to_fence():
                    guard.fence()
                    if not primary:
                        log.error(
                            "tier %s fenced after %.1f s of failures: the pipeline goes on without it; "
                            "it is flushed before it is trusted again",
                            tier.name, guard.failing_for_s,
                        )  # fmt: skip
                        if self.on_outer_fenced is not None:
                            await self.on_outer_fenced(tier)
                        return None
                    log.error(
                        "tier %s out of reach for %.1f s: changes wait for it (nothing is acknowledged); "
                        "when it answers, every namespace is fenced there before anything else is applied",
                        tier.name, guard.failing_for_s,
                    )  # fmt: skip
                await asyncio.sleep(wait)
        if primary and guard.state == "fenced":
            if self.on_primary_back is not None:
                await self.on_primary_back()
            guard.unfence()
            log.warning("tier %s answers again; its namespaces were fenced", tier.name)
        guard.succeeded()
        failed = [r for r in results if r.outcome is Outcome.FAILED and r.action.kind == "write"]
        if failed:
            fallback = [
                CacheAction("invalidate", r.action.key, r.action.version, r.action.commit_ts_us)
                for r in failed
            ]
            log.warning(
                "tier %s refused %d write(s) (%s): invalidating them", tier.name, len(failed), failed[0].error
            )
            try:
                await tier.apply(fallback)
            except TierUnavailableError as exc:
                log.warning("invalidating refused writes in %s failed (%r); batch retried", tier.name, exc)
                raise
        return results


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
        producer_max_request_size=kafka.max_message_bytes,
        consumer_max_fetch_size=kafka.max_fetch_bytes,
        # A stopping or rebalancing worker does not wait for its unacknowledged batch: it is replayed.
        stream_wait_empty=False,
    )
    changes = app.topic(kafka.change_topic, partitions=kafka.partitions, internal=False)
    dead_letters = app.topic(kafka.dead_letter_topic, internal=False)
    registry = ModelRegistry(
        bindings,
        prefix=redis.key_prefix,
        device=worker.device,
        weights_dir=load_model_settings().weights_dir,
    )
    sla_window_s = load_settings(SlaSettings).window_ms / 1000
    policy = RetryPolicy(
        fence_after_s=worker.fence_after_s if worker.fence_after_s is not None else sla_window_s
    )
    processor = ChangeProcessor(bindings, [], key_prefix=redis.key_prefix, models=registry, policy=policy)
    tiers_ready = asyncio.Event()

    # -- SLA evaluation and OpenTelemetry (issue 5) ---------------------------------------------------

    sla_settings = load_settings(SlaSettings)
    telemetry_settings = load_settings(TelemetrySettings)
    heartbeat = load_settings(HeartbeatSettings)
    heartbeat_binding = bindings.for_table(heartbeat.database, heartbeat.table)
    # create_app is the worker's entry point (``freshkey worker``): it installs the OpenTelemetry SDK.
    configure_telemetry(telemetry_settings, service="worker")
    # Consumer lag in messages and in time on the change topic (pipeline.sla.ConsumerProgress): fed by
    # the agent (received), the observers (acknowledged) and refresh_progress (assignment, figures).
    progress = ConsumerProgress(
        kafka.change_topic,
        partitions=kafka.partitions,
        window_ms=sla_settings.window_ms,
        refresh_interval_s=telemetry_settings.consumer_lag_interval_s,
    )
    broker_offsets = BrokerOffsets(kafka.bootstrap, group_id=worker.app_id, topic=kafka.change_topic)
    sla = SlaEvaluator(
        sla_settings,
        progress=progress,
        worker=f"{socket.gethostname()}:{worker.web_port}",
        heartbeat_namespace=heartbeat_binding.namespace if heartbeat_binding else None,
        heartbeat_interval_ms=heartbeat.interval_ms,
    )
    otel = OtelObserver(trace_sample_every=telemetry_settings.trace_sample_every)
    otel.watch_sla(lambda: sla.state)
    otel.watch_progress(progress)
    processor.observers.add(progress)
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

    async def refresh_progress() -> None:
        """Feed ConsumerProgress: the change topic's partitions assigned here, every partition's high
        watermark (the consumer's fetch figure where it has one, else the broker's) and the group's
        committed offsets. What cannot be read stays unknown, and counts against the SLA."""
        assigned: list[Any] = []
        try:
            assigned = [tp for tp in app.consumer.assignment() if tp.topic == kafka.change_topic]
        except Exception as exc:  # the consumer has not started: nothing is assigned
            log.debug("no assignment yet: %r", exc)
        progress.set_assignment(tp.partition for tp in assigned)
        highs: dict[int, int] = {}
        for tp in assigned:
            try:
                high = app.consumer.highwater(tp)
            except Exception:  # not fetched yet, or rebalancing
                continue
            if isinstance(high, int) and high >= 0:
                highs[tp.partition] = high
        try:
            figures = await asyncio.to_thread(broker_offsets.read)
        except Exception as exc:  # broker unreachable or slow: the figures stay as they were
            log.debug("no offsets from the broker: %r", exc)
        else:
            progress.set_committed(figures.committed)
            for partition, high in figures.highs.items():
                highs[partition] = max(high, highs.get(partition, high))
        progress.set_high_watermarks(highs)

    @app.timer(telemetry_settings.consumer_lag_interval_s)
    async def sample_high_watermarks() -> None:
        await refresh_progress()

    async def on_partitions_assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Right after each rebalance (even one that leaves this worker nothing): the timer only ticks
        # every interval.
        assigned = args[0] if args else kwargs.get("assigned", ())
        progress.set_assignment(tp.partition for tp in assigned if tp.topic == kafka.change_topic)

    app.on_partitions_assigned.connect(on_partitions_assigned)

    # -- end of SLA evaluation and OpenTelemetry ------------------------------------------------------

    @app.task
    async def connect_tiers() -> None:
        tiers: list[RedisTier] = [RedisTier.from_settings(redis)]
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
            async for attempt in _retrying(f"loading the scripts into {tier.name}"):
                with attempt:
                    await tier.load_scripts()
        processor.tiers[:] = tiers
        cutovers.tiers[:] = tiers
        tiers_ready.set()
        log.info("cache tiers ready: %s", ", ".join(t.name for t in tiers))

    async def columns_for_fence(binding: Binding) -> tuple[str, ...]:
        return await asyncio.to_thread(table_columns, mysql_settings, binding.database, binding.table_name)

    async def fence(namespaces_of: Sequence[Binding], reason: str) -> list[str]:
        l2 = processor.tiers[0]
        async for attempt in _retrying(f"fencing {len(namespaces_of)} namespace(s)"):
            with attempt:
                return await fence_namespaces(
                    l2.client,  # type: ignore[attr-defined]
                    redis.key_prefix,
                    namespaces_of,
                    columns_of=columns_for_fence,
                    channel=l2.channel,  # type: ignore[attr-defined]
                    reason=reason,
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def on_primary_back() -> None:
        reason = f"{processor.tiers[0].name} was out of reach past the fence bound"
        for namespace in await fence(bindings.bindings, reason):
            note_fence(namespace, "tier-outage")

    def note_fence(namespace: str, cause: str) -> None:
        processor.observers.on_event("fence")
        cutover_log.append({"namespace": namespace, "cause": cause, "ts_ms": int(time.time() * 1000)})

    async def on_outer_fenced(tier: CacheTier) -> None:
        since = int(time.time() * 1000)
        namespaces = [b.namespace for b in bindings.bindings]
        async for attempt in _retrying(f"marking {tier.name} fenced for readers"):
            with attempt:
                await mark_outer_fenced(processor.tiers[0].client, redis.key_prefix, namespaces, since)  # type: ignore[attr-defined]
        processor.observers.on_event("tier_fenced")
        app.add_future(recover_outer(tier, namespaces))

    async def recover_outer(tier: CacheTier, namespaces: list[str]) -> None:
        """Probe a fenced outer tier until it answers, flush it, then trust it again."""
        guard = processor.guard(tier)
        attempt = 0
        while True:
            await asyncio.sleep(policy.backoff(attempt) + 0.1)
            attempt += 1
            try:
                await tier.ping()  # type: ignore[attr-defined]
                guard.recovering = True
                removed = await tier.flush(redis.key_prefix, flushdb=l3 is not None and l3.flush == "flushdb")  # type: ignore[attr-defined]
                await mark_outer_fenced(processor.tiers[0].client, redis.key_prefix, namespaces, None)  # type: ignore[attr-defined]
            except (TierUnavailableError, RedisError, OSError) as exc:
                guard.recovering = False
                if attempt % 10 == 1:
                    log.warning("fenced tier %s still out of reach (%r); attempt %d", tier.name, exc, attempt)
                continue
            guard.unfence()
            processor.observers.on_event("tier_recovered")
            log.warning(
                "tier %s answers again: flushed (%s keys) and trusted again",
                tier.name, "all" if removed < 0 else removed,
            )  # fmt: skip
            return

    processor.on_primary_back = on_primary_back
    processor.on_outer_fenced = on_outer_fenced

    dead_letter_state: dict[str, Any] = {"blocked_since": None, "attempts": 0}

    async def send_dead_letter(event: Any, stage: str, reason: str, original: bytes | None = None) -> None:
        """Write a dead letter, retrying with backoff until the topic takes it: until then nothing of the
        batch is acknowledged (consumption pauses), and it says so in the log and the stats."""
        message = event.message
        payload = original if original is not None else message.value or b""
        limit = kafka.dead_letter_max_original_bytes
        attempt = 0
        while True:
            letter = dead_letter(
                reason,
                payload,
                stage=stage,
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                key=message.key,
                max_original_bytes=limit,
            )
            key = message.key[:DEAD_LETTER_KEY_BYTES] if message.key else None
            try:
                future = await dead_letters.send(key=key, value=encode(letter))
                await future
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if "TooLarge" in type(exc).__name__ and limit > 0:
                    limit = 0  # the broker's limit is below ours: keep only size and digest
                attempt += 1
                if dead_letter_state["blocked_since"] is None:
                    dead_letter_state["blocked_since"] = time.time()
                dead_letter_state["attempts"] = attempt
                wait = policy.backoff(attempt)
                log.error(
                    "dead-letter topic %s cannot be written (%r): consumption paused, nothing acknowledged; "
                    "attempt %d, next in %.2f s",
                    kafka.dead_letter_topic, exc, attempt, wait,
                )  # fmt: skip
                await asyncio.sleep(wait)
        if dead_letter_state["blocked_since"] is not None:
            log.warning("dead-letter topic writable again after %d attempt(s)", attempt)
            dead_letter_state["blocked_since"] = None
        processor.observers.on_event("dead_lettered")
        log.warning(
            "dead letter (%s) %s[%d]@%d: %s",
            stage, message.topic, message.partition, message.offset, reason[:300],
        )  # fmt: skip

    async def handle(events: Sequence[Any]) -> None:
        """One batch: prepare, apply to every tier, dead letters, DDL. Outages are retried inside; any
        other exception escapes (the caller isolates the message that causes it)."""
        received_ms = time.time() * 1000
        messages = [(e.message.key, e.message.value) for e in events]
        async for attempt in _retrying("preparing a batch"):
            with attempt:
                prepared = await processor.prepare(messages)
        planned_ms = time.time() * 1000
        if prepared.fences:
            by_namespace = {b.namespace: b for b in bindings.bindings}
            for namespace, reason in prepared.fences.items():
                for moved in await fence([by_namespace[namespace]], reason):
                    note_fence(moved, "oversize")
        async for attempt in _retrying("applying a batch"):
            with attempt, otel.trace_batch(prepared.planned, received_ms=received_ms, planned_ms=planned_ms):
                refused = await processor.apply(
                    prepared.planned, received_ms=received_ms, planned_ms=planned_ms
                )
        for reject in sorted([*prepared.rejects, *refused], key=lambda r: r.index):
            await send_dead_letter(events[reject.index], reject.stage, reject.reason)
        for ddl_event in prepared.ddl:  # after the batch's changes: they were read under the old columns
            await apply_ddl(ddl_event)

    async def apply_ddl(ddl_event: DdlEvent) -> None:
        """Move the signatures the DDL concerns. Outages are retried (never acknowledged past); a DDL that
        cannot be applied for any other reason fences the namespaces of its database instead."""
        cause = "ddl"
        try:
            async for attempt in _retrying(f"applying DDL {ddl_event.event_id}"):
                with attempt:
                    moved = await cutovers.on_ddl(ddl_event)
        except OUTAGES:
            raise
        except Exception as exc:
            log.exception(
                "DDL %s could not be applied; fencing the namespaces of %s",
                ddl_event.event_id, ddl_event.source.db,
            )  # fmt: skip
            concerned = [b for b in bindings.bindings if b.database == ddl_event.source.db]
            moved = await fence(concerned, f"DDL {ddl_event.query[:80]!r} could not be applied: {exc!r}")
            cause = "ddl-fence"
        for namespace in moved:
            processor.observers.on_event("signature_ddl")
            cutover_log.append({"namespace": namespace, "cause": cause, "ts_ms": int(time.time() * 1000)})

    async def isolate(events: Sequence[Any], exc: BaseException) -> None:
        """A batch failed with something that is not an outage: handle each message alone, so that only
        the message that causes it becomes a dead letter (with the error's class) and the rest applies."""
        log.exception("a batch of %d failed (%r): handling each message alone", len(events), exc)
        for event in events:
            try:
                await handle([event])
            except asyncio.CancelledError:
                raise
            except Exception as one:
                processor.observers.on_event("unexpected")
                await send_dead_letter(event, "unexpected", _describe(one))

    @app.agent(changes)
    async def apply_changes(stream: faust.StreamT) -> None:
        batches = stream.noack_take(  # type: ignore[attr-defined]
            worker.batch_max, within=worker.batch_within_ms / 1000
        )
        try:
            async for events in batches:
                for event in events:  # before anything can block: a wedged batch shows its age
                    message = event.message
                    progress.on_received(
                        message.topic,
                        message.partition,
                        message.offset,
                        message.timestamp * 1000 if message.timestamp else None,
                    )
                await tiers_ready.wait()
                try:
                    await handle(events)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await isolate(events, exc)
                for event in events:
                    message = event.message
                    processor.observers.on_offset(message.topic, message.partition, message.offset)
                    await stream.ack(event)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            crash("the change agent", exc)

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
        """Counts and lag figures (pipeline.stats), each tier's health (ok, failing, fenced) and whether
        the dead-letter topic is blocking consumption."""
        body = processor.stats.snapshot()
        body["tiers"] = {name: guard.snapshot() for name, guard in processor.guards.items()}
        blocked = dead_letter_state["blocked_since"]
        body["dead_letters_blocked_s"] = None if blocked is None else round(time.time() - blocked, 3)
        return web.json(body)

    @app.page("/freshkey/sla")
    async def sla_page(web: Any, request: Any) -> Any:
        """The SLA state (pipeline.sla.SlaState as JSON), as of the last evaluation."""
        return web.json(sla.state.model_dump(mode="json"))

    @app.page("/freshkey/consumer-lag")
    async def consumer_lag_page(web: Any, request: Any) -> Any:
        """``{"topic/partition": pipeline.sla.PartitionProgress JSON}`` (see the README)."""
        return web.json(progress.report())

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
                    async for attempt in _retrying("checking a model update"):
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
            async for attempt in _retrying(f"the cutover of {namespace}"):
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

    install_dashboard(app, processor, progress=progress)
    return app, processor


def _retrying(what: str) -> AsyncRetrying:
    """Retry a step that needs Redis, the database or the weights until it succeeds (never skipped):
    every retry is logged with what waits, the error and when the next attempt is."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s failed (%r); attempt %d, next in %.2f s; nothing is acknowledged meanwhile",
            what, error, state.attempt_number, wait,
        )  # fmt: skip

    return AsyncRetrying(
        retry=retry_if_exception_type(OUTAGES),
        wait=wait_exponential(multiplier=0.05, max=5),
        before_sleep=before_sleep,
        reraise=True,
    )


def crash(what: str, exc: BaseException) -> NoReturn:
    """End the process with a non-zero status, so that its supervisor restarts it: a worker that lives on
    without consuming breaks the promise worse than a restart (nothing unacknowledged is lost)."""
    log.critical(
        "%s crashed (%r): the worker exits with status 70 so that its supervisor restarts it",
        what, exc, exc_info=exc,
    )  # fmt: skip
    logging.shutdown()
    os._exit(70)


def load_model_settings() -> ModelSettings:
    return load_settings(ModelSettings)
