"""The change agent: change topic -> processor -> every tier, then the offsets.

The change topic's messages come from the app's :class:`~pipeline.faust_app.Intake` in batches (a
fetch's worth, at most ``FRESHKEY_WORKER_BATCH_MAX``), not one Faust event at a time; the agent is still
Faust's agent of the topic (supervised by Faust, seen by ``/freshkey/health``), it just does not read
its stream. Offsets are acknowledged only after every tier acknowledged the batch, so a crash replays at
most the unacknowledged batches, which the version checks make harmless. Outages are retried until the
service answers, never skipped. A message that cannot be processed for any other reason becomes a dead
letter and the stream goes on; a batch that fails with something unexpected is handled one message at a
time, so only the message that causes it is dead-lettered. An agent that crashes anyway ends the process
(``pipeline.outages.crash``) instead of living on without consuming.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import faust
from faust.types import TP, Message

from pipeline.context import Worker
from pipeline.faust_app import FreshkeyApp
from pipeline.outages import OUTAGES, crash, until_done
from pipeline.processor import Reject, describe
from schemas import DdlEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Received:
    """A message as the dead-letter writer takes it (``.message``), made only for the few that go there."""

    message: Message


def install(w: Worker) -> None:
    processor = w.processor
    by_namespace = {b.namespace: b for b in w.bindings.bindings}
    settings = w.settings.worker
    app = cast(FreshkeyApp, w.app)
    # Twice a batch: the next batch is fetched while one is applied, and no more is held in memory.
    intake = app.use_intake(w.topics["changes"], batch=settings.batch_max, capacity=2 * settings.batch_max)

    async def handle(messages: Sequence[Message]) -> None:
        """One batch: prepare, apply to every tier, dead letters, DDL. Outages are retried inside; any
        other exception escapes (the caller isolates the message that causes it)."""
        received_ms = time.time() * 1000
        pairs = [(m.key, m.value) for m in messages]
        topics = [m.topic for m in messages]
        prepared = await until_done("preparing a batch", lambda: processor.prepare(pairs, topics=topics))
        planned_ms = time.time() * 1000
        for namespace, fence in prepared.fences.items():
            await w.tiers.fence([by_namespace[namespace]], fence.reason, cause=fence.cause)

        async def apply() -> list[Reject]:
            with w.otel.trace_batch(prepared.planned, received_ms=received_ms, planned_ms=planned_ms):
                return await processor.apply(prepared.planned, received_ms=received_ms, planned_ms=planned_ms)

        refused = await until_done("applying a batch", apply)
        for reject in sorted([*prepared.rejects, *refused], key=lambda r: r.index):
            await w.dead_letters.send(Received(messages[reject.index]), reject.stage, reject.reason)
        for ddl_event in prepared.ddl:  # after the batch's changes: they were read under the old columns
            await apply_ddl(ddl_event)

    async def apply_ddl(ddl_event: DdlEvent) -> None:
        """Move the signatures the DDL concerns. Outages are retried (never acknowledged past); a DDL that
        cannot be applied for any other reason fences the namespaces of its database instead."""
        try:
            moved = await until_done(
                f"applying DDL {ddl_event.event_id}", lambda: w.cutovers.on_ddl(ddl_event)
            )
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

    async def isolate(messages: Sequence[Message], exc: BaseException) -> None:
        """A batch failed with something that is not an outage: handle each message alone, so that only
        the message that causes it becomes a dead letter (with the error's class) and the rest applies."""
        log.exception("a batch of %d failed (%r): handling each message alone", len(messages), exc)
        for message in messages:
            try:
                await handle([message])
            except asyncio.CancelledError:
                raise
            except Exception as one:
                processor.observers.on_event("unexpected")
                await w.dead_letters.send(Received(message), "unexpected", describe(one))

    def received(messages: Sequence[Message]) -> dict[TP, int]:
        """Tell the consumer progress what arrived (the oldest and the newest message of each partition:
        what it needs for the age of the oldest waiting change); the highest offset of each partition."""
        first: dict[TP, Message] = {}
        highest: dict[TP, int] = {}
        for message in messages:
            where = message.tp
            offset = message.offset
            seen = highest.get(where)
            if seen is None:
                first[where] = message
                highest[where] = offset
            elif offset > seen:
                highest[where] = offset
        for where, message in first.items():
            w.progress.on_received(*where, message.offset, _timestamp_ms(message))
        return highest

    @w.app.agent(w.topics["changes"])
    async def apply_changes(stream: faust.StreamT) -> None:
        """Faust's agent of the change topic, fed by the intake (its own stream stays empty)."""
        within_s = settings.batch_within_ms / 1000
        try:
            while True:
                messages = app.current_of(await intake.take(settings.batch_max, within_s))
                if not messages:
                    continue
                highest = received(messages)  # before anything can block: a wedged batch shows its age
                await w.tiers.ready.wait()
                try:
                    await handle(messages)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await isolate(messages, exc)
                app.ack(messages)
                for (topic, partition), offset in highest.items():
                    processor.observers.on_offset(topic, partition, offset)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            crash("the change agent", exc)


def _timestamp_ms(message: Message) -> float | None:
    return message.timestamp * 1000 if message.timestamp else None
