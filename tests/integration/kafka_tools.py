"""Reading a whole topic back, for assertions (aiokafka: fast against the local broker)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 30
) -> list[tuple[bytes | None, bytes]]:
    """All messages of ``topic`` in (partition, offset) order once at least ``expect`` are there."""

    async def read() -> list[tuple[bytes | None, bytes]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        messages: list[tuple[int, int, bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout
        try:
            while len(messages) < expect and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    messages.extend((m.partition, m.offset, m.key, m.value or b"") for m in records)
        finally:
            await consumer.stop()
        if len(messages) < expect:
            raise AssertionError(f"only {len(messages)} of {expect} messages on {topic} after {timeout}s")
        return [(k, v) for _, _, k, v in sorted(messages, key=lambda m: (m[0], m[1]))]

    return asyncio.run(read())
