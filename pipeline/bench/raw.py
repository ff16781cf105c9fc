"""The two ceilings ``freshkey bench pipeline`` compares freshkey with, measured without freshkey code.

- :func:`raw_decode`: plain pymysqlreplication reading a range of the binlog (the same row-event
  filters as the connector, values decoded because every row's ``values`` are touched), one stream,
  in this process: the Python ceiling of one binlog stream.
- :func:`raw_redis_cas`: pipelined ``EVALSHA`` of ``cache_writer/lua/write_if_newer.lua`` from this
  process (redis-py, one round trip per ``batch`` writes, the batch size of a worker): the Redis
  ceiling of one Python process doing the same compare-and-set as the worker.
- :func:`raw_kafka_lag`: the broker's own delivery lag at a fixed rate (a librdkafka producer sending
  as the connector does, a plain aiokafka consumer fetching as the worker does): what the broker alone
  gives the ``connector->worker`` stage at that rate. The embedded Tansu broker slows as a partition
  grows and with every produce request (measured here at 2,000/s for 8 s, p50 of each second: 2.9 ms
  rising to 149 ms with a push per message, 7.0 to 13.4 ms when librdkafka's 10 ms linger batches
  them); ``p50_by_second`` shows it.

Both time only the work itself: the stream's first connection is inside the timed section (a few
milliseconds), the values are prepared before it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cache_writer.redis import scripts
from connectors.kafka.producer import PUSH_WAIT_S
from connectors.kafka.settings import LINGER_MS

RAW_KAFKA_MESSAGE_BYTES = 400
"""The size of each message :func:`raw_kafka_lag` sends: about a single-row change of the bench's table."""


@dataclass(frozen=True)
class RawResult:
    """``items`` done in ``seconds``."""

    items: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


def raw_decode(
    connection: dict[str, object],
    *,
    server_id: int,
    start: tuple[str, int],
    rows: int,
    schema: str,
    table: str,
) -> RawResult:
    """Read ``rows`` row images of ``schema.table`` from the binlog at ``start`` with plain
    pymysqlreplication; stops after that many rows or at the end of the binlog (non-blocking).

    ``connection``: ``host``, ``port``, ``user``, ``passwd`` of an account allowed to read the binlog.
    """
    stream = BinLogStreamReader(
        connection_settings=connection,
        server_id=server_id,
        resume_stream=True,
        log_file=start[0],
        log_pos=start[1],
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[schema],
        only_tables=[table],
        enable_logging=False,
    )
    seen = 0
    began = time.perf_counter()
    try:
        for event in stream:
            for row in event.rows:  # decodes the values (pymysqlreplication parses rows lazily)
                seen += 1
                _ = row.get("after_values", row.get("values"))
            if seen >= rows:
                break
        seconds = time.perf_counter() - began
    finally:
        stream.close()
    return RawResult(seen, seconds)


def write_script() -> bytes:
    """The worker's write script, as the tier loads it (with the shared prelude)."""
    return scripts.WRITE.text.encode()


def raw_redis_cas(
    url: str,
    writes: Sequence[tuple[str, int, bytes, int]],
    *,
    channel: str,
    batch: int = 500,
) -> RawResult:
    """Run ``write_if_newer.lua`` once per ``(key, version, value, commit_us)``, ``batch`` per pipeline.

    ``channel``: the invalidation channel the script publishes on ('' for none), like a worker with
    broadcast on. The result counts the scripts run; a write rejected as not newer still counts (the
    caller makes versions grow so that they land).
    """
    client = redis.Redis.from_url(url)
    try:
        sha = client.script_load(write_script())
        began = time.perf_counter()
        for first in range(0, len(writes), batch):
            pipe = client.pipeline(transaction=False)
            for key, version, value, commit_us in writes[first : first + batch]:
                pipe.evalsha(sha, 1, key, version, value, commit_us, 0, channel)
            pipe.execute()
        seconds = time.perf_counter() - began
    finally:
        client.close()
    return RawResult(len(writes), seconds)


def raw_kafka_lag(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    seconds: float,
    partitions: int,
    fetch_max_wait_ms: int,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """The broker alone at ``rate`` messages/s for ``seconds``, on a new ``topic`` of ``partitions``:
    a producer thread sends every message that is due and then pushes them as the connector does at the
    binlog's end (``linger.ms`` :data:`~connectors.kafka.settings.LINGER_MS`, ``flush(PUSH_WAIT_S)``); a plain
    aiokafka consumer (no group, ``fetch_max_wait_ms`` as the worker's) fetches them. Each message's lag
    is from just before its ``produce()`` to the fetch that returned it.

    Returns ``p50``, ``p99``, ``max`` (ms), ``samples`` and ``p50_by_second`` (the p50 of the messages
    sent in each second of the run: whether the broker slows as its partitions grow)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=timeout_s)
    total = max(1, round(rate * seconds))
    sent_at: list[float] = [0.0] * total
    lags: list[float] = [0.0] * total
    return asyncio.run(
        _raw_kafka_lag(bootstrap, topic, rate, partitions, fetch_max_wait_ms, timeout_s, sent_at, lags)
    )


async def _raw_kafka_lag(
    bootstrap: str,
    topic: str,
    rate: float,
    partitions: int,
    fetch_max_wait_ms: int,
    timeout_s: float,
    sent_at: list[float],
    lags: list[float],
) -> dict[str, Any]:
    total = len(sent_at)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=fetch_max_wait_ms,
        fetch_min_bytes=1,
    )
    await consumer.start()
    failures: list[BaseException] = []
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        for tp in assigned:
            consumer.seek(tp, 0)
        await consumer.getmany(timeout_ms=fetch_max_wait_ms)  # the first fetch, before the clock starts
        thread = threading.Thread(
            target=_send_at_rate, args=(bootstrap, topic, rate, sent_at, failures), daemon=True
        )
        thread.start()
        received = 0
        seen = bytearray(total)
        deadline = time.monotonic() + total / rate + timeout_s
        while received < total and not failures:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker delivered {received} of {total} messages on {topic}")
            batches = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for messages in batches.values():
                for message in messages:
                    index = int(message.key or b"-1")
                    if 0 <= index < total and not seen[index]:  # a redelivery counts once
                        seen[index] = 1
                        lags[index] = (now - sent_at[index]) * 1000
                        received += 1
        thread.join(timeout_s)
    finally:
        await consumer.stop()
    if failures:
        raise failures[0]
    return _lag_figures(sent_at, lags)


def _send_at_rate(
    bootstrap: str, topic: str, rate: float, sent_at: list[float], failures: list[BaseException]
) -> None:
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS, "acks": "all"})
        padding = b"x" * RAW_KAFKA_MESSAGE_BYTES
        start = time.perf_counter()
        sent = 0
        while sent < len(sent_at):
            now = time.perf_counter()
            due = min(len(sent_at), int((now - start) * rate) + 1)
            if due <= sent:
                time.sleep(max(0.0, start + sent / rate - now))
                continue
            for index in range(sent, due):
                sent_at[index] = time.perf_counter()
                producer.produce(topic, key=b"%d" % index, value=padding)
            sent = due
            producer.flush(PUSH_WAIT_S)
        if producer.flush(30):
            raise RuntimeError(f"messages to {topic} unacknowledged after 30 s")
    except BaseException as exc:  # handed to the consumer's side, which raises it
        failures.append(exc)


def _lag_figures(sent_at: Sequence[float], lags: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(lags)
    count = len(ordered)
    by_second: list[list[float]] = []
    start = sent_at[0]
    for when, lag in zip(sent_at, lags, strict=True):
        second = int(when - start)
        while len(by_second) <= second:
            by_second.append([])
        by_second[second].append(lag)
    return {
        "samples": count,
        "p50": round(ordered[count // 2], 2),
        "p99": round(ordered[min(count - 1, int(count * 0.99))], 2),
        "max": round(ordered[-1], 2),
        "p50_by_second": [round(sorted(s)[len(s) // 2], 2) for s in by_second if s],
    }
