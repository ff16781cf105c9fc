"""Scaffolding of the snapshot tests and the large-table bench: grants for the signal table, rows written
before the connector starts, a churn that races a snapshot, and ``freshkey snapshot`` as a subprocess.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from connectors.snapshot.signals import SignalTable
from tests.support.pipeline import Pipeline
from tests.support.processes import interruptible
from tests.support.services import MySQLService

HOT_EVERY = 150
"""Every 150th row is hot (some in every chunk): it takes half of the churn's changes."""


def signal_grants(mysql_service: MySQLService) -> None:
    """What the signal table needs (the test account is the least-privileged connector account)."""
    if mysql_service.user == mysql_service.admin_user:
        return
    with mysql_service.connect() as conn, conn.cursor() as cur:
        for host in ("127.0.0.1", "localhost"):
            grants = "CREATE, SELECT, INSERT, UPDATE, DELETE"
            cur.execute(f"GRANT {grants} ON `freshkey`.* TO '{mysql_service.user}'@'{host}'")


def preload(p: Pipeline, rows: int, *, batch: int = 5000, content_bytes: int = 64) -> None:
    """``rows`` rows written before the connector starts: only a snapshot can bring them in."""
    pad = "x" * content_bytes
    with p.mysql.connect(p.database) as conn, conn.cursor() as cur:
        for start in range(0, rows, batch):
            ids = range(start, min(rows, start + batch))
            cur.executemany(
                "INSERT INTO assets VALUES (%s, 'text', %s, %s, UTC_TIMESTAMP(6))",
                [(i, f"row {i} v0 {pad}", i.to_bytes(8, "big")) for i in ids],
            )


class Churn(threading.Thread):
    """Updates, deletes and re-inserts at ``rate`` per second, half of them on the hot rows."""

    def __init__(self, p: Pipeline, rows: int, rate: float, *, seed: int = 7) -> None:
        super().__init__(daemon=True)
        self.conn = p.mysql.connect(p.database)
        self.rows, self.rate = rows, rate
        self.rng = random.Random(seed)
        self.hot = list(range(0, rows, HOT_EVERY))
        self.deleted: set[int] = set()
        self.count = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        start = time.monotonic()
        try:
            with self.conn.cursor() as cur:
                while not self.stopped.is_set():
                    delay = start + self.count / self.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    hot = self.rng.random() < 0.5
                    row = self.rng.choice(self.hot) if hot else self.rng.randrange(self.rows)
                    if row in self.deleted:
                        cur.execute(
                            "INSERT INTO assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))",
                            (row, f"row {row} back at {self.count}"),
                        )
                        self.deleted.discard(row)
                    elif self.rng.random() < 0.1:
                        cur.execute("DELETE FROM assets WHERE id = %s", (row,))
                        self.deleted.add(row)
                    else:
                        cur.execute(
                            "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = %s",
                            (f"row {row} at {self.count}", row),
                        )
                    self.count += 1
        except BaseException as exc:
            self.error = exc
        finally:
            self.conn.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the churn did not stop"
        assert self.error is None, self.error


def freshkey(p: Pipeline, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``freshkey <args>`` with the pipeline's settings, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        env={**p.env, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_snapshot(p: Pipeline, *args: str, timeout: float = 180) -> dict[str, Any]:
    """Run ``freshkey snapshot`` to its end (exit 0 asserted); its --json figures."""
    out = p.workdir / f"snapshot-{time.monotonic_ns()}.json"
    done = freshkey(p, "snapshot", "--json", str(out), *args, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr + p.logs()
    figures: dict[str, Any] = json.loads(out.read_text())
    figures["output"] = done.stdout
    return figures


def start_command(p: Pipeline, *args: str, name: str = "snapshot") -> tuple[subprocess.Popen[bytes], Path]:
    """``freshkey <args>`` in the background, its output in a log file of the pipeline's workdir."""
    log = p.workdir / f"{name}-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            env={**p.env, "COLUMNS": "160"},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=interruptible(),  # the tests send it Ctrl-C
        )
    return proc, log


def status(p: Pipeline) -> dict[str, Any] | None:
    """The connector's snapshot status row (None before the signal table or the row exists)."""
    signal_table = SignalTable("freshkey.signal", int(p.env["FRESHKEY_MYSQL_SERVER_ID"]))
    with p.mysql.connect() as conn:
        if not signal_table.exists(conn):
            return None
        return signal_table.read(conn, "status")


def status_rows(p: Pipeline) -> int:
    """Rows the connector's snapshot has had acknowledged by Kafka, as it publishes them."""
    body = status(p)
    return sum(int(t.get("rows", 0)) for t in body.get("tables", [])) if body else 0


def worker_ops(p: Pipeline) -> dict[str, int]:
    """The worker's events by op (``r``: snapshot rows) since it started."""
    return dict((p.stats() or {}).get("events", {}))
