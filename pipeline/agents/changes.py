"""The change agent: change topic -> processor -> every tier, then the offsets.

Offsets are acknowledged only after every tier acknowledged the batch (``noack_take`` + manual ack), so
a crash replays at most the unacknowledged batches, which the version checks make harmless. Outages are
retried until the service answers, never skipped. A message that cannot be processed for any other
reason becomes a dead letter and the stream goes on; a batch that fails with something unexpected is
handled one message at a time, so only the message that causes it is dead-lettered. An agent that
crashes anyway ends the process (``pipeline.outages.crash``) instead of living on without consuming.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import faust

from pipeline.context import Worker
from pipeline.outages import OUTAGES, crash, retrying
from pipeline.processor import describe
from schemas import DdlEvent

log = logging.getLogger(__name__)


def install(w: Worker) -> None:
    processor = w.processor
    by_namespace = {b.namespace: b for b in w.bindings.bindings}

    async def handle(events: Sequence[Any]) -> None:
        """One batch: prepare, apply to every tier, dead letters, DDL. Outages are retried inside; any
        other exception escapes (the caller isolates the message that causes it)."""
        received_ms = time.time() * 1000
        messages = [(e.message.key, e.message.value) for e in events]
        topics = [e.message.topic for e in events]
        async for attempt in retrying("preparing a batch"):
            with attempt:
                prepared = await processor.prepare(messages, topics=topics)
        planned_ms = time.time() * 1000
        for namespace, reason in prepared.fences.items():
            await w.tiers.fence([by_namespace[namespace]], reason, cause="oversize")
        async for attempt in retrying("applying a batch"):
            with (
                attempt,
                w.otel.trace_batch(prepared.planned, received_ms=received_ms, planned_ms=planned_ms),
            ):
                refused = await processor.apply(
                    prepared.planned, received_ms=received_ms, planned_ms=planned_ms
                )
        for reject in sorted([*prepared.rejects, *refused], key=lambda r: r.index):
            await w.dead_letters.send(events[reject.index], reject.stage, reject.reason)
        for ddl_event in prepared.ddl:  # after the batch's changes: they were read under the old columns
            await apply_ddl(ddl_event)

    async def apply_ddl(ddl_event: DdlEvent) -> None:
        """Move the signatures the DDL concerns. Outages are retried (never acknowledged past); a DDL that
        cannot be applied for any other reason fences the namespaces of its database instead."""
        try:
            async for attempt in retrying(f"applying DDL {ddl_event.event_id}"):
                with attempt:
                    moved = await w.cutovers.on_ddl(ddl_event)
        except OUTAGES:
            raise
        except Exception as exc:
            log.exception(
                "DDL %s could not be applied; fencing the namespaces of %s",
                ddl_event.event_id, ddl_event.source.db,
            )  # fmt: skip
            concerned = [b for b in w.bindings.bindings if b.database == ddl_event.source.db]
            reason = f"DDL {ddl_event.query[:80]!r} could not be applied: {exc!r}"
            await w.tiers.fence(concerned, reason, cause="ddl-fence")
            return
        for namespace in moved:
            processor.observers.on_event("signature_ddl")
            w.signature_log.add(namespace, "ddl")

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
                await w.dead_letters.send(event, "unexpected", describe(one))

    settings = w.settings.worker

    @w.app.agent(w.topics["changes"])
    async def apply_changes(stream: faust.StreamT) -> None:
        batches = stream.noack_take(  # type: ignore[attr-defined]
            settings.batch_max, within=settings.batch_within_ms / 1000
        )
        try:
            async for events in batches:
                for event in events:  # before anything can block: a wedged batch shows its age
                    message = event.message
                    w.progress.on_received(
                        message.topic,
                        message.partition,
                        message.offset,
                        message.timestamp * 1000 if message.timestamp else None,
                    )
                await w.tiers.ready.wait()
                try:
                    await handle(events)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await isolate(events, exc)
                highest: dict[tuple[str, int], int] = {}
                for event in events:
                    message = event.message
                    where = (message.topic, message.partition)
                    highest[where] = max(highest.get(where, -1), message.offset)
                    await stream.ack(event)
                for (topic, partition), offset in highest.items():
                    processor.observers.on_offset(topic, partition, offset)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            crash("the change agent", exc)
