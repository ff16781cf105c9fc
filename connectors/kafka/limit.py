"""The largest message freshkey sends to Kafka, and what it learns from a broker that refuses less."""

from __future__ import annotations

import threading

RECORD_OVERHEAD_BYTES = 1024
"""Room kept under ``message.max.bytes`` for the record and batch headers around key and value
(librdkafka counts some of them: measured here, key + value + about 90 bytes)."""


class MessageLimit:
    """The largest key + value freshkey sends: FRESHKEY_KAFKA_MAX_MESSAGE_BYTES less room for headers,
    lowered below the smallest message a broker refused as too large (a broker or topic whose limit is
    under ours), so that a replay after a restart does not send that message again. Thread-safe."""

    def __init__(self, max_message_bytes: int) -> None:
        self._lock = threading.Lock()
        self.configured = max_message_bytes
        self._limit = max_message_bytes - RECORD_OVERHEAD_BYTES

    @property
    def max_bytes(self) -> int:
        return self._limit  # an int read is atomic; it only goes down, under the lock

    def fits(self, key: bytes, value: bytes) -> bool:
        """True when a message with this key and value is under the limit."""
        return len(key) + len(value) <= self.max_bytes

    def refused(self, size: int) -> bool:
        """A broker refused a message of ``size`` bytes (key + value); True when the limit went down."""
        with self._lock:
            if size - 1 < self._limit:
                self._limit = max(0, size - 1)
                return True
            return False
