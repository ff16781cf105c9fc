"""The two ceilings ``freshkey bench pipeline`` compares freshkey with, measured without freshkey code.

- :func:`raw_decode`: plain pymysqlreplication reading a range of the binlog (the same row-event
  filters as the connector, values decoded because every row's ``values`` are touched), one stream,
  in this process: the Python ceiling of one binlog stream.
- :func:`raw_redis_cas`: pipelined ``EVALSHA`` of ``cache_writer/lua/write_if_newer.lua`` from this
  process (redis-py, one round trip per ``batch`` writes, the batch size of a worker): the Redis
  ceiling of one Python process doing the same compare-and-set as the worker.

Both time only the work itself: the stream's first connection is inside the timed section (a few
milliseconds), the values are prepared before it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cache_writer.redis import scripts


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
