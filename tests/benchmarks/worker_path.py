"""CPU per change of the worker's own path, without Kafka: decode, plan and apply (a private Redis) of
batches shaped like ``freshkey bench pipeline``'s single-row backlog (row-keyed, ``updated_at`` as version
and commit time, value columns projected).

    .venv/bin/python -m tests.benchmarks.worker_path [--changes 20000] [--batch 500] [--runs 5] [--default-gc]

The collector is set as the worker sets it (:func:`pipeline.faust_app.freeze_gc`); ``--default-gc`` leaves
CPython's collector as it is (nothing frozen, default thresholds), to compare: 25.0 against 17.8 µs.

Prints the CPU µs per change of each stage (``time.process_time``, the minimum over runs: the figure the
least disturbed by other processes) so that two trees can be compared side by side with ``farm-bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import random
import time

from cache_writer.redis.tier import RedisTier, connect
from cache_writer.settings import RedisSettings
from pipeline.embedded.redis import LocalRedis
from pipeline.faust_app import freeze_gc
from pipeline.processor import ChangeProcessor
from schemas import Binding, Bindings, ChangeEvent, encode
from schemas.versions import datetime_to_us

BINDING = Binding(
    table="bench.rows",
    namespace="bench_single",
    value_columns=("modality", "content", "embedding", "updated_at"),
    version_column="updated_at",
    commit_time_column="updated_at",
    on_change="write",
)


def _row(row_id: int, change: int, at: dt.datetime, rng: random.Random) -> dict[str, object]:
    return {
        "id": row_id,
        "modality": rng.choice(("text", "image", "audio")),
        "content": f"change {change} of row {row_id}",
        "embedding": base64.b64encode(rng.randbytes(32)).decode(),
        "updated_at": at.isoformat(timespec="microseconds"),
    }


def messages(changes: int, rows: int = 1000, seed: int = 7) -> list[tuple[bytes | None, bytes | None]]:
    """Encoded UPDATE events cycling over ``rows`` rows, newer each time."""
    rng = random.Random(seed)
    start = dt.datetime(2026, 1, 1, 12, 0, 0)
    out: list[tuple[bytes | None, bytes | None]] = []
    previous: dict[int, dict[str, object]] = {}
    for change in range(changes):
        row_id = change % rows
        at = start + dt.timedelta(microseconds=change * 37)
        after = _row(row_id, change, at, rng)
        before = previous.get(row_id) or _row(row_id, -1, start, rng)
        previous[row_id] = after
        us = datetime_to_us(at)
        event = ChangeEvent(
            event_id=f"1:binlog.000001:{1000 + change}:0",
            op="u",
            key={"id": row_id},
            before=before,
            after=after,
            source={  # type: ignore[arg-type]
                "server_id": 1,
                "file": "binlog.000001",
                "pos": 1000 + change,
                "row": 0,
                "ts_ms": us // 1_000_000 * 1000,
                "db": "bench",
                "table": "rows",
            },
            ts_ms=us // 1000 + 3,
            version=us,
            commit_ts_us=us,
            commit_ts_coarse=False,
        )
        out.append((f"bench/rows/{row_id}".encode(), encode(event)))
    return out


async def run(changes: int, batch: int, runs: int) -> None:
    data = messages(changes)
    with LocalRedis() as redis:
        tier = RedisTier(connect(RedisSettings(url=redis.url)), tombstone_ttl_ms=60_000)
        await tier.load_scripts()
        processor = ChangeProcessor(Bindings(bindings=[BINDING]), [tier], key_prefix="fk")
        best = {"prepare": float("inf"), "apply": float("inf"), "total": float("inf")}
        for _ in range(runs):
            await tier.client.flushdb()
            spent = {"prepare": 0.0, "apply": 0.0}
            for first in range(0, len(data), batch):
                chunk = data[first : first + batch]
                t0 = time.process_time()
                prepared = await processor.prepare(chunk)
                t1 = time.process_time()
                now = time.time() * 1000
                await processor.apply(prepared.planned, received_ms=now, planned_ms=now)
                t2 = time.process_time()
                spent["prepare"] += t1 - t0
                spent["apply"] += t2 - t1
                assert not prepared.rejects, prepared.rejects[:1]
            spent["total"] = spent["prepare"] + spent["apply"]
            for stage, seconds in spent.items():
                best[stage] = min(best[stage], seconds)
        await tier.close()
    print("  ".join(f"{stage} {seconds / changes * 1e6:.1f} µs" for stage, seconds in best.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--default-gc", action="store_true", help="leave CPython's collector as it is")
    args = parser.parse_args()
    if not args.default_gc:
        freeze_gc()
    asyncio.run(run(args.changes, args.batch, args.runs))


if __name__ == "__main__":
    main()
