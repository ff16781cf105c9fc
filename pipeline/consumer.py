"""The worker's Kafka consumer (Faust's aiokafka consumer, specialised): a fetch waits at most
``fetch_max_wait_ms``, the change topic's messages go from the fetch loop straight into an
:class:`~pipeline.intake.Intake` a partition's worth at a time, a batch is acknowledged in one step, and a
fetch or a commit that a rebalance or a seek overtook is dropped. The app that uses it is
:class:`pipeline.faust_app.FreshkeyApp`.

faust-streaming creates its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no setting to change
it. Measured here against the Tansu broker (4 partitions, one event every 10 ms): send -> agent p50
373 ms / p99 752 ms with 1500; 28 ms / 55 ms with 100; 4.4 ms / 8.2 ms with 10. Apache Kafka answers a
fetch as soon as ``fetch_min_bytes`` arrive, so a short wait costs only idle fetch requests there.

Faust delivers every message through its conductor, a channel queue, an event and a stream, and its
fetch loop waits on two new tasks per message (the delivery and a rebalance): py-spy put that machinery
at about 60 % of a worker draining a backlog, three times the Redis writes. The change topic does not
need any of it (one consumer task, acknowledging after the tiers answered), so its messages go straight
from the fetch loop into the intake; every other topic (model updates, hit counts) still goes through
Faust's agents. Group membership, assignment, offsets and commits stay Faust's and aiokafka's.

Faust's ``getmany`` still cost per message an async-generator step, its round-robin scheduler, a check
of flow and generation, and an end-offset lookup through the consumer thread; the agent then acked each
message under Faust's lock. The fetch loop now takes aiokafka's records by partition and puts each
partition's messages into the intake together (:meth:`Consumer._deliver`, the same checks once per
partition), and a batch is acknowledged in one step (:meth:`Consumer.ack_many`): worker CPU per change
66.0 -> 48.8 µs (medians of three alternating rounds of ``freshkey bench pipeline --only
single,worker,raw-redis --changes 30000 --rows 30000``, this 2-core machine under its own noise). A batch
now holds runs of one partition's messages rather than the partitions interleaved message by message, so
repeated changes of one key (a key has one partition) meet in a batch more often, and all but the newest
are superseded instead of written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, ConsumerMessage, Message
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

from pipeline.intake import Intake


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.fetch_max_wait_ms  # type: ignore[attr-defined]
        consumer._fetch_min_bytes = self.app.fetch_min_bytes  # type: ignore[attr-defined]
        return consumer


class Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    _seeks = 0
    """Seeks begun plus seeks ended (:meth:`perform_seek`): what the fetch loop compares to tell whether a
    fetch is older than the latest seek."""

    async def perform_seek(self) -> None:
        """Faust's seek of every assigned partition to its committed offset (which also sets the read
        offsets to them), counted where it begins and where it ends."""
        self._seeks += 1
        try:
            await super().perform_seek()
        finally:
            self._seeks += 1

    async def _drain_messages(self, fetcher: Any) -> None:
        """faust-streaming 0.15's fetch loop, except that the messages of the intake's topics go into the
        intake a partition's worth at a time (no task, no async-generator step and no end-offset lookup
        per message: :meth:`_deliver`), a fetch is flushed to the intake as a whole, and a fetch older
        than the consumer's generation or latest seek is dropped and fetched again
        (:meth:`_fetch_is_current`)."""
        intake: Intake | None = getattr(self.app, "intake", None)
        if intake is None:
            await super()._drain_messages(fetcher)
            return
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        fetching = faust_consumer.CONSUMER_FETCHING
        app = self.app
        reseek = False
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                if self._seeks % 2:  # a seek is under way: what a fetch returns now may be from before it
                    await asyncio.sleep(0.005)
                    continue
                if reseek:
                    reseek = not await self._seek_again()
                    continue
                set_flag(fetching)
                fetched_in = (app.consumer_generation_id, self._seeks)
                records, active = await self._wait_next_records(1.0)
                await asyncio.sleep(0)  # a fetch may return at once, again and again
                if records and not self.should_stop:
                    reseek = not await self._deliver(records, active, fetched_in, intake)
                intake.flush()
                unset_flag(fetching)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(fetching)

    async def _deliver(
        self, records: Mapping[TP, Any], active: Any, fetched_in: tuple[int, int], intake: Intake
    ) -> bool:
        """Deliver one fetch (aiokafka's records by partition), as Faust's ``getmany`` and fetch loop
        would, message by message: the intake's topics into ``intake``, other topics to their agents
        through Faust's callback. False when the fetch stopped being current (a rebalance or a seek
        began while it was delivered): what is left of it is dropped, to be fetched again.

        The intake's messages of one partition go in together, after the checks Faust makes per message
        (the fetch is current, the partition active, already delivered offsets skipped, the offsets it
        passed over counted as a gap) made once for the partition where nothing can change in between:
        nothing here awaits within a partition's messages, and the consumer's generation, its flow and
        its seeks only change in this event loop. When the intake is full, delivery waits for room
        first; it is then at most one partition's fetch over its capacity."""
        current = self._fetch_is_current
        if not current(fetched_in):
            self.log.debug("dropped a fetch from before a rebalance or seek")
            return False
        intake_topics = intake.topics
        read_offsets = self._read_offset
        buffered = self._buffered_partitions
        acks_enabled_for = self.app.topics.acks_enabled_for
        track_end = self.app.monitor.track_tp_end_offset
        highwater = self.highwater
        commit_every = self._commit_every
        generation = fetched_in[0]
        for tp, batch in records.items():
            if active is not None and tp not in active and tp not in buffered:
                continue
            if commit_every is not None and self._n_acked >= commit_every:
                self._n_acked = 0
                await self.commit()
            if tp.topic in intake_topics and intake.full:
                intake.flush()
                await self.wait_first(intake.wait_room(), self.suspend_flow.wait())
            if not current(fetched_in):
                self.log.debug("dropped a fetch from before a rebalance or seek at %s", tp)
                return False
            track_end(tp, highwater(tp))
            if tp.topic not in intake_topics:
                if not await self._deliver_to_agents(tp, batch, fetched_in):
                    return False
                continue
            read = read_offsets[tp]
            gaps = acks_enabled_for(tp.topic)
            topic, partition = tp
            messages: list[Message] = []
            for record in batch:
                offset = record.offset
                if read is not None and not self._passes(tp, read, offset, gaps):
                    continue
                timestamp = record.timestamp
                messages.append(
                    ConsumerMessage(
                        topic,
                        partition,
                        offset,
                        timestamp / 1000.0 if timestamp is not None else None,  # type: ignore[arg-type]
                        record.timestamp_type,
                        record.headers,
                        record.key,
                        record.value,
                        record.checksum,
                        record.serialized_key_size,
                        record.serialized_value_size,
                        tp,
                        generation_id=generation,
                    )
                )
                read = offset
            if messages:
                intake.put_many(messages)
                read_offsets[tp] = read
        return True

    async def _deliver_to_agents(self, tp: TP, batch: Any, fetched_in: tuple[int, int]) -> bool:
        """A partition's messages of a topic that is not the intake's, one at a time through Faust's
        callback (its agents), as Faust's fetch loop delivers them. False when the fetch stopped being
        current meanwhile."""
        callback = self.callback
        gaps = self.app.topics.acks_enabled_for(tp.topic)
        for record in batch:
            offset = record.offset
            read = self._read_offset[tp]
            if read is not None and not self._passes(tp, read, offset, gaps):
                continue
            await self.wait_first(callback(self._to_message(tp, record)), self.suspend_flow.wait())
            if not self._fetch_is_current(fetched_in):
                return False
            self._read_offset[tp] = offset
        return True

    def _passes(self, tp: TP, read: int, offset: int, gaps: bool) -> bool:
        """Faust's check of a fetched message against the partition's read offset: False when it was
        already delivered (Faust logs these at dev level only); offsets it jumps over (compacted away,
        or transaction markers) count as acknowledged when acks count for the topic (``gaps``)."""
        if offset < read:
            return False
        if read and offset - read > 1 and gaps:
            self._add_gap_now(tp, read + 1, offset)
        return True

    def _fetch_is_current(self, fetched_in: tuple[int, int]) -> bool:
        """Whether a fetch begun at ``fetched_in`` (the consumer generation and :attr:`_seeks` then) may
        still be delivered: flow is on, and no rebalance and no seek began since it was asked for.

        Faust seeks every partition back to its committed offset after a rebalance, but resumes flow
        before that seek, and a fetch asked for before a rebalance can come back after it (labelled with
        the new generation). Delivered, such a fetch sets read offsets past the seek, or the seek resets
        them below it: either way the next fetch skips, as already delivered, messages nobody applied,
        or Faust counts them as a gap to commit past (seen: a partition's committed offset stuck behind
        the worker's, and 37 changes skipped in one rebalance). Dropped, its messages are fetched again
        after :meth:`_seek_again`."""
        return (
            self.flow_active
            and not self.suspend_flow.is_set()
            and (self.app.consumer_generation_id, self._seeks) == fetched_in
            and not fetched_in[1] % 2
        )

    _seek_failures = 0
    """Consecutive failed :meth:`_seek_again` calls (its backoff, and what its warning counts)."""

    async def _seek_again(self) -> bool:
        """After a dropped fetch: seek every assigned partition back to its committed offset (the
        dropped messages were taken from the consumer's position), once flow is on; until then a
        rebalance is under way and ends with its own seek. False when the seek failed or took longer
        than ``broker_request_timeout`` (the broker away): the loop fetches nothing until one succeeds,
        retrying with a backoff from 0.1 s to 2 s and a warning for each failure."""
        if not self.flow_active or self.suspend_flow.is_set():
            await self.wait_first(self.can_resume_flow.wait(), self._stopped.wait())
            return False
        if not self.assignment():
            return True
        try:
            await asyncio.wait_for(self.perform_seek(), self.app.conf.broker_request_timeout)
        except Exception as exc:  # a rebalance under way, or the broker
            self._seek_failures += 1
            self.log.warning(
                "seeking back to the committed offsets after a dropped fetch failed (%d in a row; "
                "nothing is fetched until it succeeds): %r",
                self._seek_failures,
                exc,
            )
            await asyncio.sleep(min(2.0, 0.1 * 2 ** min(self._seek_failures - 1, 5)))
            return False
        self._seek_failures = 0
        return True

    def ack_many(self, messages: Sequence[Message]) -> None:
        """Faust's :meth:`ack` of each of ``messages``, in one step: the same bookkeeping (the message
        marked acknowledged, its offset added once to what the next commit may pass, unless below the
        committed offset), with its lock taken and its waiter woken once instead of per message."""
        acks_enabled_for = self.app.topics.acks_enabled_for
        committed_offsets = self._committed_offset
        acked_indexes = self._acked_index
        acked_lists = self._acked
        unacked = self._unacked_messages
        enabled: dict[str, bool] = {}
        added = 0
        with ack_lock:
            try:
                for message in messages:
                    if message.acked:
                        continue
                    message.acked = True
                    topic = message.topic
                    on = enabled.get(topic)
                    if on is None:
                        on = enabled[topic] = acks_enabled_for(topic)
                    if not on:
                        continue
                    tp = message.tp
                    offset = message.offset
                    committed = committed_offsets[tp]
                    if committed is None or offset >= committed:
                        index = acked_indexes[tp]
                        if offset not in index:
                            if unacked:
                                unacked.discard(message)
                            index.add(offset)
                            acked_lists[tp].append(offset)
                            added += 1
            finally:
                self._n_acked += added
                notify(self._waiting_for_ack)

    def _add_gap_now(self, tp: TP, offset_from: int, offset_to: int) -> None:
        """Faust's ``_add_gap`` without its ``sleep(0)``: offsets the fetch passed over (compacted, or
        transaction markers) count as acknowledged. Added in the same step as the check that the fetch is
        still the consumer's, so no gap of an older generation outlives a rebalance."""
        committed = self._committed_offset[tp]
        if committed is not None:
            offset_from = max(offset_from, committed + 1)
        if offset_from <= offset_to:
            gap = self._gap[tp]
            gap.addi(offset_from, offset_to + 1)  # intervals exclude their end
            gap.merge_overlaps()

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Faust's commit of ``offsets``, except that a commit during which a rebalance or a seek came
        leaves the consumer's record of committed offsets to that seek.

        Faust records the offsets as committed even when the commit failed. A commit still waiting when
        a rebalance ended then overwrote the committed offsets the new generation had just read (its
        seek): ``ack`` refuses messages below that record, so the group's committed offset stayed behind
        what the worker had applied, until the partition's next message."""
        if self.in_transaction:  # exactly-once commits go through Faust's transaction manager
            return await super()._commit_offsets(offsets, start_new_transaction)
        before = (self.app.consumer_generation_id, self._seeks)
        assignment = self.assignment()
        committable = {tp: offset for tp, offset in offsets.items() if tp in assignment}
        if len(committable) < len(offsets):
            self.log.info(
                "Discarded commit for revoked partitions that will be eventually processed again: %r",
                {tp: offset for tp, offset in offsets.items() if tp not in assignment},
            )
        if not committable:
            return False
        await self.app.producer.flush()
        did_commit = await self._commit(committable)
        if (self.app.consumer_generation_id, self._seeks) != before:
            return did_commit
        if did_commit:
            self.app.tables.on_commit(committable)
        self._committed_offset.update(committable)
        self.app.monitor.on_tp_commit(committable)
        return did_commit


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer


__all__ = ["Consumer", "ConsumerThread", "Transport"]
