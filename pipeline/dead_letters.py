"""Writing dead letters: bounded, and never skipped.

A message that cannot be processed goes to the dead-letter topic with the reason, its origin and a
bounded copy of its bytes (``schemas.codec.dead_letter``). When the topic cannot be written, the writer
retries with backoff until it can: the caller acknowledges nothing of the batch meanwhile, so consumption
pauses instead of skipping, and the log and ``/freshkey/stats`` (``dead_letters_blocked_s``) say so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from cache_writer.retry import RetryPolicy
from connectors.kafka.settings import KafkaSettings
from pipeline.observe import Observers
from schemas import encode
from schemas.codec import DEAD_LETTER_KEY_BYTES, dead_letter

log = logging.getLogger(__name__)


def too_large(exc: BaseException | None) -> bool:
    """Whether a send failed because the message is too large, for the producer (faust wraps aiokafka's
    error: it is the ``__cause__``) or for the broker."""
    while exc is not None:
        if isinstance(exc, MessageSizeTooLargeError | RecordTooLargeError):
            return True
        exc = exc.__cause__
    return False


class DeadLetterWriter:
    """Sends dead letters of Faust events to ``topic`` (a Faust topic)."""

    def __init__(self, topic: Any, kafka: KafkaSettings, policy: RetryPolicy, observers: Observers) -> None:
        self.topic = topic
        self.kafka = kafka
        self.policy = policy
        self.observers = observers
        self.blocked_since: float | None = None
        """When the topic stopped taking dead letters (epoch s), None while it takes them."""

    @property
    def blocked_s(self) -> float | None:
        return None if self.blocked_since is None else round(time.time() - self.blocked_since, 3)

    async def send(self, event: Any, stage: str, reason: str, original: bytes | None = None) -> None:
        """Write one dead letter for ``event`` (its message's bytes, or ``original``); returns once the
        topic took it, however long that takes."""
        message = event.message
        payload = original if original is not None else message.value or b""
        limit = self.kafka.dead_letter_max_original_bytes
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
                future = await self.topic.send(key=key, value=encode(letter))
                await future
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any Kafka error: retried, never skipped
                if limit > 0 and too_large(exc):
                    limit = 0  # the producer's or the broker's limit: keep only size and digest
                attempt += 1
                if self.blocked_since is None:
                    self.blocked_since = time.time()
                wait = self.policy.backoff(attempt)
                log.error(
                    "dead-letter topic %s cannot be written (%r): consumption paused, nothing acknowledged; "
                    "attempt %d, next in %.2f s",
                    self.kafka.dead_letter_topic, exc, attempt, wait,
                )  # fmt: skip
                await asyncio.sleep(wait)
        if self.blocked_since is not None:
            log.warning("dead-letter topic writable again after %d attempt(s)", attempt)
            self.blocked_since = None
        self.observers.on_event("dead_lettered")
        log.warning(
            "dead letter (%s) %s[%d]@%d: %s",
            stage, message.topic, message.partition, message.offset, reason[:300],
        )  # fmt: skip
