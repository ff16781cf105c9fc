"""A large table's snapshot, end to end: rows/s to Kafka by the connector's clock, and until every row is
in Redis.

Private MariaDB, Redis and Kafka (Tansu) are started and removed; ``--rows`` rows are written before the
connector starts (so only the snapshot brings them in), then the real ``freshkey connector`` and
``freshkey worker`` run and ``freshkey snapshot`` is asked for them, with no rate limit and no other
writes. At the end every row is checked in Redis against the database (0 stale, 0 missing).

Run::

    .venv/bin/python -m tests.benchmarks.snapshot_rows --rows 1000000 --chunk-rows 5000

Measured here (shared 2-core machine, load average 9 to 11 from other work meanwhile; MariaDB 10.11,
Tansu, one connector, one worker, chunks of 5,000, no rate limit): 1,000,000 rows in 241.1 s = 4,147
rows/s to Kafka by the connector's clock, every row in Redis after 286.4 s = 3,492 rows/s end to end,
1,000,000 checked, 0 stale, 0 missing (writing the rows took 214 s; the whole run 11 min 47 s).
100,000 rows: 4,851 rows/s to Kafka, 3,205 rows/s end to end.

Figures, not a test: nothing here asserts a time (the consistency check is asserted).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import orjson

from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis
from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService
from tests.support.snapshot import preload, run_snapshot, signal_grants, worker_ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A large table's snapshot, end to end (see the module).")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-rows", type=int, default=5000)
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args(argv)

    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="freshkey-snapshot-bench-"))
        servers: list[LocalMariaDB | LocalRedis | LocalKafka] = [LocalMariaDB(), LocalRedis(), LocalKafka()]
        for server in servers:
            server.start()
            stack.callback(server.stop)
        mariadb, local_redis, kafka = servers
        assert isinstance(mariadb, LocalMariaDB) and isinstance(local_redis, LocalRedis)
        assert isinstance(kafka, LocalKafka)
        mysql = MySQLService.of(mariadb)
        signal_grants(mysql)
        workdir = Path(tmp)
        p = Pipeline(mysql, kafka.bootstrap, local_redis.url, workdir, version_column=False)
        stack.callback(p.close)

        loaded = time.monotonic()
        preload(p, args.rows, batch=10_000)
        loaded = time.monotonic() - loaded
        print(f"{args.rows:,} rows written in {loaded:.1f} s", flush=True)
        p.start("connector")
        p.start("worker")
        started = time.monotonic()
        figures = run_snapshot(
            p,
            "--chunk-rows",
            str(args.chunk_rows),
            "--max-rows-per-s",
            "0",
            timeout=max(300, args.rows / 200),
        )
        command_s = time.monotonic() - started
        p.wait(lambda: worker_ops(p).get("r", 0) >= args.rows, max(300, args.rows / 200), "every row applied")
        applied_s = time.monotonic() - started
        p.wait_caught_up()
        report = p.verify()
        result = {
            "rows": args.rows,
            "chunk_rows": args.chunk_rows,
            "load_s": round(loaded, 1),
            "snapshot_rows": figures["rows"],
            "dropped": figures["dropped"],
            "connector_s": figures["seconds"],
            "connector_rows_per_s": round(figures["rows_per_s"] or 0),
            "command_s": round(command_s, 1),
            "applied_s": round(applied_s, 1),
            "end_to_end_rows_per_s": round(args.rows / applied_s),
            "checked": report.checked,
            "stale": report.stale,
            "missing": report.missing,
        }
        print(figures["output"])
        print(
            f"snapshot of {args.rows:,} rows, chunks of {args.chunk_rows:,}: "
            f"{result['connector_rows_per_s']:,} rows/s to Kafka by the connector's clock "
            f"({figures['seconds']:.1f} s); the command took {command_s:.1f} s; every row in Redis after "
            f"{applied_s:.1f} s = {result['end_to_end_rows_per_s']:,} rows/s end to end; "
            f"checked {report.checked:,}: {report.stale} stale, {report.missing} missing"
        )
        if args.json is not None:
            args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        assert figures["rows"] == args.rows and report.stale == 0 and report.missing == 0, report
    return 0


if __name__ == "__main__":
    sys.exit(main())
