"""Kafka producer of change events: idempotent, keyed so that one row's events stay on one partition.

What it guarantees to the connector:

- an event is reported delivered (``on_delivered``) only once Kafka acknowledged it (acks=all);
- a message over the size limit never raises nor fails the producer: whether librdkafka refuses it at
  ``produce()`` or the broker refuses it later (a broker limit below ours), ``on_too_large`` is called
  with the refused message's key and value (on the caller's thread, from
  :meth:`ChangeProducer.raise_if_failed`) so that the caller sends a smaller replacement that
  acknowledges the same event;
- every other failure (a delivery that failed, a fatal producer error such as UNKNOWN_PRODUCER_ID after
  a broker lost its state, every broker down while events wait) is kept and raised by
  :meth:`ChangeProducer.raise_if_failed` as a retriable :class:`DeliveryError` or
  :class:`KafkaUnavailableError`, or as a :class:`ConfigurationError` for credentials and
  authorizations; the caller then closes this producer and starts over from its checkpoint.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from connectors.exceptions import (
    KAFKA_CONFIGURATION_CODES,
    ConfigurationError,
    ConnectorError,
    DeliveryError,
    KafkaUnavailableError,
    kafka_error_code,
)
from connectors.kafka import topic_check
from connectors.kafka.acks import AckedOffsets
from connectors.kafka.librdkafka import LIBRDKAFKA_LOGGER
from connectors.kafka.limit import MessageLimit
from connectors.kafka.security import librdkafka_config
from connectors.kafka.settings import LINGER_MS, KafkaSettings
from connectors.kafka.topic_check import TOPIC_GONE_AFTER_S, TOPIC_GONE_CODES, TopicCheck, TopicWatch
from connectors.kafka.topics import admin_client

log = logging.getLogger(__name__)

OnDelivered = Callable[[], None]
OnTooLarge = Callable[[bytes, bytes], None]
"""Called with the key and value of a message refused as too large."""
Replacement = Callable[[], None]

_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
SERVE_HANDOVER_S = 0.005
"""The background thread serves delivery reports (and client errors) once the caller's thread has not
served them (:meth:`ChangeProducer.serve`) for this long: at most this much later than it would have
served them itself."""
PUSH_WAIT_S = 0.001
"""How long :meth:`ChangeProducer.push` lets librdkafka's broker threads see the flush (see there)."""
UNREACHABLE_AFTER_S = 5.0
"""Events waiting this long without any acknowledgement while librdkafka reports the brokers
unreachable end the session (rather than waiting for the delivery timeout)."""
_BY_KEY = -1
"""librdkafka's RD_KAFKA_PARTITION_UA (``produce``'s default): the partitioner picks by the key."""


class ChangeProducer:
    """Wraps confluent-kafka's Producer with idempotence on (acks=all, no reordering on retry).

    Delivery callbacks run on a background poll thread. Topics are never auto-created by producing
    (``allow.auto.create.topics`` off): a topic that vanished fails its deliveries instead of coming
    back with the broker's default partition count.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        linger_ms: float = LINGER_MS,
        delivery_timeout_s: float = 120.0,
        limit: MessageLimit | None = None,
        acknowledged: Mapping[tuple[str, int], int] | None = None,
        watch: Mapping[str, str] | None = None,
    ) -> None:
        self._bootstrap = settings.bootstrap
        self.limit = limit if limit is not None else MessageLimit(settings.max_message_bytes)
        self._producer = Producer(
            {
                **librdkafka_config(settings),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": linger_ms,
                "message.timeout.ms": int(delivery_timeout_s * 1000),
                "queue.buffering.max.messages": 1_000_000,
                "message.max.bytes": settings.max_message_bytes,
                "allow.auto.create.topics": False,
                "topic.metadata.propagation.max.ms": int(min(TOPIC_GONE_AFTER_S, delivery_timeout_s) * 1000),
                "error_cb": self.on_client_error,
                "logger": LIBRDKAFKA_LOGGER,
            }
        )
        self._failure: ConnectorError | None = None
        self._last_error = ""
        self._progress_at = time.monotonic()  # last acknowledgement, or when events started to wait
        self._topic_check = TopicCheck()
        self._watch = TopicWatch(partial(admin_client, settings), watch or {})
        self._ends: dict[tuple[str, int], int] = {}
        self._acked: dict[tuple[str, int], AckedOffsets] = {}
        self._floors = dict(acknowledged or {})
        self.rewound: str | None = None
        """Why acknowledged events cannot be vouched for (:meth:`_rewound`), None while they can."""
        self._ends_lock = threading.Lock()
        self._replacements: queue.SimpleQueue[Replacement] = queue.SimpleQueue()
        self._report_bound = self._report  # held by every message's callback (no bound method each)
        self._served_at = 0.0  # when the caller's thread last served delivery reports (serve())
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="kafka-delivery", daemon=True)
        self._poller.start()

    # -- background ---------------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._check_topics()
            wait = self._served_at + SERVE_HANDOVER_S - time.monotonic()
            if wait > 0:  # the caller's thread serves the reports: leave them to it
                self._stop.wait(wait)
                continue
            self._poll(0.05)

    def _poll(self, timeout_s: float) -> None:
        try:
            self._producer.poll(timeout_s)
        except KafkaException as exc:  # a fatal error is raised from poll() as well
            self._fail(DeliveryError(f"the Kafka producer failed: {exc.args[0] if exc.args else exc}"))
            self._stop.wait(0.05)

    def _check_topics(self) -> None:
        """End the session when the broker says a topic is gone (:mod:`connectors.kafka.topic_check`):
        a watched topic (the change topic) gone or created again, looked at every few seconds; a topic
        events wait for, asked once they waited with no acknowledgement. A broker that does not answer
        is left to :data:`UNREACHABLE_AFTER_S`; one that has the topics, to the delivery timeout."""
        now = time.monotonic()
        if self._failure is not None:
            return
        try:
            if self._watch.due(now):
                self._changed(self._watch.changed())
            if self._failure is not None or len(self._producer) == 0:
                return
            if not self._topic_check.due(now, self._progress_at):
                return
            gone = self._topic_check.gone(self._producer)
        except Exception:  # the check must not end the thread that serves the delivery reports
            log.warning("checking whether the topics events go to still exist failed", exc_info=True)
            return
        if gone is not None:
            topic, why = gone
            self._fail(self._topic_gone(topic, f"{why}; events waited {now - self._progress_at:.1f} s"))

    def _changed(self, changed: tuple[str, str, bool] | None) -> None:
        """What the watch found: a topic gone ends the session (the next recreates it and fences); one
        created again by someone else is a loss, as a rewound partition is (:meth:`_rewound`)."""
        if changed is None:
            return
        topic, why, recreated = changed
        if not recreated:
            self._fail(self._topic_gone(topic, why))
            return
        self._lost(topic_check.recreated_reason(self._bootstrap, topic, why))

    def _topic_gone(self, topic: str, detail: str) -> DeliveryError:
        return DeliveryError(topic_check.gone_reason(self._bootstrap, topic, detail))

    def _fail(self, failure: ConnectorError) -> None:
        if self._failure is None:  # the first failure is the cause; the rest follow from it
            self._failure = failure
            log.debug("%s", failure)

    def on_client_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (``error_cb``, poll thread): fatal errors, brokers down,
        authentication. Keeps the failure that ends the session, or logs what is no failure."""
        self._last_error = err.str()
        code = err.code()
        if code in KAFKA_CONFIGURATION_CODES:
            self._fail(ConfigurationError(f"Kafka at {self._bootstrap} refused freshkey: {err.str()}"))
        elif err.fatal():
            self._fail(DeliveryError(f"the Kafka producer failed for good: {err.str()}"))
        elif (
            code in _UNREACHABLE
            and len(self._producer) > 0
            and time.monotonic() - self._progress_at > UNREACHABLE_AFTER_S
        ):
            # Events wait and no broker answers: end the session rather than wait for the delivery
            # timeout. An idle producer whose connection was closed is not an outage: nothing waits.
            self._fail(KafkaUnavailableError(f"Kafka at {self._bootstrap} is unreachable: {err.str()}"))
        else:
            log.debug("librdkafka: %s", err.str())

    def _report(
        self,
        topic: str,
        on_delivered: OnDelivered,
        on_too_large: OnTooLarge | None,
        err: KafkaError | None,
        msg: Message,
    ) -> None:
        """A message's delivery report (``on_delivery``, with the first three arguments bound by
        :meth:`produce`): the acknowledged offset checked and kept, then ``on_delivered``; or the
        failure handled (:meth:`on_delivery_error`)."""
        if err is None:
            offset, partition = msg.offset(), msg.partition()
            if offset is not None and partition is not None and offset >= 0:
                where = (topic, partition)
                with self._ends_lock:  # flush() serves callbacks too, on the caller's thread
                    acked = self._acked.get(where)
                    if acked is None:
                        acked = self._acked[where] = AckedOffsets()
                    if offset < self._floors.get(where, 0) or not acked.add(offset):
                        self._rewound(topic, partition, offset)
                    elif offset + 1 > self._ends.get(where, 0):
                        self._ends[where] = offset + 1
            self._progress_at = time.monotonic()
            on_delivered()
            return
        self.on_delivery_error(err, topic, msg.key() or b"", msg.value() or b"", on_too_large)

    def _rewound(self, topic: str, partition: int, offset: int) -> None:
        """A partition's log went back: Kafka acknowledged an event at ``offset``, which it had
        acknowledged before (this session), or below the ends the sessions before saw acknowledged
        (``acknowledged``, verified against the topic when the session began). Those events cannot be
        vouched for (the broker's data gone, an unclean leader election, the topic recreated):
        :attr:`rewound` says so, and the session ends. The connector then records a gap, so that the next
        session fences before producing."""
        floor = self._floors.get((topic, partition), 0)
        before = (
            f"below offset {floor - 1} it had acknowledged before"
            if offset < floor
            else "which it had acknowledged before for another event"
        )
        reason = (
            f"Kafka acknowledged an event at offset {offset} of {topic!r} partition {partition}, {before}: "
            "events Kafka acknowledged may be lost"
        )
        self._lost(reason)

    def _lost(self, reason: str) -> None:
        """Events Kafka acknowledged cannot be vouched for: :attr:`rewound` says why (the connector
        records a gap, so that the next session fences before producing), and the session ends."""
        if self.rewound is None:
            self.rewound = reason
        self._fail(DeliveryError(reason))

    def on_delivery_error(
        self, err: KafkaError, topic: str, key: bytes, value: bytes, on_too_large: OnTooLarge | None
    ) -> None:
        """What a failed delivery report does (poll thread): a message the broker refused as too large
        lowers the limit and queues its stand-in (``on_too_large(key, value)``, called on the caller's
        thread); a purge is nothing (the session is over); anything else is kept as the failure that
        ends the session."""
        size = len(key) + len(value)
        code = err.code()
        if code in _PURGED:
            return  # purged by close(purge=True): the session is over already
        if code == KafkaError.MSG_SIZE_TOO_LARGE:
            if self.limit.refused(size):
                log.warning(
                    "Kafka refused a message of %d bytes as too large, under FRESHKEY_KAFKA_MAX_MESSAGE_BYTES"
                    "=%d: set it to the broker's (and topic's) max.message.bytes; larger changes are sent "
                    "as invalidations from now on",
                    size,
                    self.limit.configured,
                )
            if on_too_large is not None:
                self._replacements.put(partial(on_too_large, key, value))
                return
        if code in KAFKA_CONFIGURATION_CODES:
            self._fail(ConfigurationError(f"Kafka refused an event for {topic!r}: {err.str()}"))
        elif code in TOPIC_GONE_CODES:
            self._fail(self._topic_gone(topic, err.str()))
        else:
            self._fail(DeliveryError(f"Kafka did not accept an event for {topic!r}: {err.str()}"))

    # -- the caller's thread ---------------------------------------------------------------------------
    def serve(self, timeout_s: float = 0.0) -> None:
        """Serve the delivery reports that arrived (waiting up to ``timeout_s`` for one) on this thread.

        A caller that produces steadily calls this between messages: its callbacks then run where the
        GIL already is. Served from the background thread instead, every report took the GIL from the
        producing thread and gave it back (two forced switches per message); that thread still serves
        them whenever the caller has not for :data:`SERVE_HANDOVER_S` (a caller waiting on its input)."""
        self._served_at = time.monotonic()
        self._poll(timeout_s)

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivered: OnDelivered,
        *,
        on_too_large: OnTooLarge | None = None,
        partition: int | None = None,
    ) -> None:
        """Queue a message (to the partition of its key, or to ``partition``). Too large for librdkafka:
        ``on_too_large(key, value)`` at once (when given).

        Until its report, librdkafka holds the message's callback and what it refers to: one partial
        object here, never the caller's item (thousands wait at a time, and every object they keep
        alive is walked by the garbage collector)."""
        callback = partial(self._report_bound, topic, on_delivered, on_too_large)
        self._topic_check.sent(topic)
        if len(self._producer) == 0:
            self._progress_at = time.monotonic()  # nothing was waiting: the wait starts now
        while True:
            try:
                where = _BY_KEY if partition is None else partition
                self._producer.produce(topic, value=value, key=key, partition=where, on_delivery=callback)
                return
            except BufferError:
                self.raise_if_failed()
                time.sleep(0.01)  # the poll thread drains the queue
            except KafkaException as exc:
                if kafka_error_code(exc) == KafkaError.MSG_SIZE_TOO_LARGE and on_too_large is not None:
                    on_too_large(key, value)
                    return
                raise

    def push(self) -> None:
        """Send the messages that wait for their batch now, whatever ``linger.ms``: the caller has nothing
        more to add for the moment (the binlog is read to its end), and waiting would only add lag.

        librdkafka's ``flush()`` is what ignores the linger, and only while it runs: a ``flush(0)`` that
        returns before a broker thread woke leaves the batch to its linger (measured here: every one of
        300 messages waited the full 10 ms). So it waits up to :data:`PUSH_WAIT_S` (the acknowledgements
        at most; 0.25 ms p50 here), serving delivery reports on this thread meanwhile."""
        if len(self._producer) == 0:
            return
        self._served_at = time.monotonic()
        try:
            self._producer.flush(PUSH_WAIT_S)
        except KafkaException as exc:  # a fatal error is raised from flush() as from poll()
            self._fail(DeliveryError(f"the Kafka producer failed: {exc.args[0] if exc.args else exc}"))

    def raise_if_failed(self) -> None:
        """Send the replacements of messages the broker found too large, then raise a kept failure."""
        # Called once per binlog item: empty() first, as a get_nowait() that raises Empty costs more.
        # Only this thread takes from the queue, so what empty() saw stays there until taken.
        while not self._replacements.empty():
            self._replacements.get_nowait()()
        if self._failure is not None:
            raise self._failure

    @property
    def last_error(self) -> str:
        """The last error librdkafka reported (transport errors included), for messages."""
        return self._last_error

    def acked_ends(self, topic: str) -> dict[int, int]:
        """Partition -> the offset after the newest acknowledged message of ``topic``, this producer."""
        with self._ends_lock:
            return {p: end for (t, p), end in self._ends.items() if t == topic}

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries; returns how many are still unacknowledged."""
        deadline = time.monotonic() + timeout_s
        while True:
            while True:  # replacements produced now are flushed below as well
                try:
                    replace = self._replacements.get_nowait()
                except queue.Empty:
                    break
                if self._failure is None:
                    replace()
            remaining: int = self._producer.flush(max(0.0, min(0.1, deadline - time.monotonic())))
            if remaining == 0 and self._replacements.empty():
                return 0
            if time.monotonic() >= deadline:
                return remaining

    def close(self, timeout_s: float, *, purge: bool = False) -> int:
        """Flush for up to ``timeout_s``, then (``purge``) drop what is left, and stop the poll thread.

        Returns how many events were left unacknowledged; their checkpoint never moved past them.
        """
        try:
            remaining = self.flush(timeout_s)
        except KafkaException as exc:  # fatal: nothing more will be delivered
            log.debug("flush at close: %r", exc)
            remaining = len(self._producer)
        if remaining and purge:
            self._producer.purge(in_queue=True, in_flight=True)
            try:
                self._producer.flush(0.5)  # runs the purged messages' callbacks
            except KafkaException as exc:
                log.debug("flush after purge: %r", exc)
        self._stop.set()
        self._poller.join(timeout=2)
        return remaining
