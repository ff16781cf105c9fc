"""Kafka producer of change events: idempotent, keyed so that one row's events stay on one partition."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from connectors.exceptions import DeliveryError
from connectors.settings import KafkaSettings

log = logging.getLogger(__name__)

OnDelivered = Callable[[], None]


class ChangeProducer:
    """Wraps confluent-kafka's Producer with idempotence on (acks=all, no reordering on retry).

    Delivery callbacks run on a background poll thread; a permanent delivery failure is kept and raised
    by :meth:`raise_if_failed`, so the connector stops without moving its checkpoint past the event.
    """

    def __init__(self, settings: KafkaSettings, *, linger_ms: float = 2.0) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": settings.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": linger_ms,
                "message.timeout.ms": 120_000,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        self._failure: DeliveryError | None = None
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="kafka-delivery", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def produce(self, topic: str, key: bytes, value: bytes, on_delivered: OnDelivered) -> None:
        def callback(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                on_delivered()
            elif self._failure is None:
                self._failure = DeliveryError(f"Kafka did not accept an event for {topic!r}: {err}")
                log.error("%s", self._failure)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=callback)
                return
            except BufferError:
                time.sleep(0.01)  # the poll thread drains the queue

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding deliveries; returns how many are still unacknowledged."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining

    def close(self, timeout_s: float) -> int:
        remaining = self.flush(timeout_s)
        self._stop.set()
        self._poller.join(timeout=2)
        return remaining
