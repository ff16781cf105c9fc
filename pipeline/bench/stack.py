"""The private services of ``freshkey bench pipeline`` and its database: the schema, the bindings, the
rows, and the SQL of the changes it writes."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
from pymysql.constants import CLIENT

from pipeline.bench.config import BenchConfig, BenchError
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis

DATABASE = "freshkey_bench"
TABLES = {"single": "single_rows", "multi": "multi_rows"}
WARMUP_TABLE = "warmup"
NAMESPACES = {"single": "bench_single", "multi": "bench_multi"}
WARMUP_NAMESPACE = "bench_warmup"
RATE_TABLE = "rate_rows_{index}"
"""One table per fixed rate (index in ``rates``), bound alone for that rate's connector and worker."""
RATE_NAMESPACE = "bench_rate_{index}"
RATE_WARMUP_TABLE = "rate_warmup_{index}"
"""Its own warm-up table (and namespace), so that the rate's lag figures hold the driven changes only."""
MODALITIES = ("text", "image", "audio")


ROW_TABLE_DDL = """
CREATE TABLE {db}.{table} (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
)
"""


@dataclass
class Backlog:
    """A backlog written while every freshkey process was frozen: its binlog range, rows, transactions
    and the ids of the rows it changed."""

    kind: str
    start: tuple[str, int]
    end: tuple[str, int]
    rows: int
    transactions: int
    row_ids: list[int] = field(default_factory=list)


class Stack:
    """The private services, the schema, and two MariaDB sessions: ``admin`` for positions and
    one-off statements, ``writer`` (multi-statement) for backlogs (:meth:`write_backlog`) and driven
    changes."""

    def __init__(self, root: Path, config: BenchConfig, stack: ExitStack) -> None:
        self.root = root
        self.config = config
        self.db = stack.enter_context(LocalMariaDB(workdir=root / "mariadb"))
        self.cache = stack.enter_context(LocalRedis(workdir=root / "redis"))
        self.broker = stack.enter_context(LocalKafka(workdir=root / "kafka"))
        self.admin = self.db.connect(admin=True)
        stack.callback(self.admin.close)
        self.writer = pymysql.connect(
            host=self.db.host,
            port=self.db.port,
            user=self.db.admin_user,
            password=self.db.admin_password,
            autocommit=True,
            client_flag=CLIENT.MULTI_STATEMENTS,
        )
        stack.callback(self.writer.close)
        self.bindings = root / "bindings.yaml"
        self._server_ids = iter(range(4301, 4301 + 10_000))
        self.next_multi_id = 1_000_000
        self.next_single_change = 0

    def prepare(self) -> None:
        """Schema, bindings, the rows the updates cycle over; a long write timeout on the server, so
        that the binlog stream of a frozen connector waits for it instead of being dropped.

        ``bindings.yaml`` binds the backlog tables and the warm-up table; ``bindings-rate<i>.yaml`` binds
        the table of the i-th fixed rate alone, so that a rate's connector skips the others' changes."""
        rng = random.Random(self.config.seed)
        rate_tables = [RATE_TABLE.format(index=i) for i in range(len(self.config.rates))]
        with self.admin.cursor() as cur:
            cur.execute("SET GLOBAL net_write_timeout = 3600")
            cur.execute(f"CREATE DATABASE {DATABASE}")
            for table in [*TABLES.values(), *rate_tables]:
                cur.execute(ROW_TABLE_DDL.format(db=DATABASE, table=table))
            for table in [
                WARMUP_TABLE,
                *(RATE_WARMUP_TABLE.format(index=i) for i in range(len(rate_tables))),
            ]:
                cur.execute(f"CREATE TABLE {DATABASE}.{table} (id INT PRIMARY KEY, at DATETIME(6) NOT NULL)")
            for table in [TABLES["single"], *rate_tables]:
                rows = [_row_values(i, f"row {i}", rng) for i in range(self.config.rows)]
                for first in range(0, len(rows), 1000):
                    values = ",".join(rows[first : first + 1000])
                    cur.execute(f"INSERT INTO {DATABASE}.{table} VALUES {values}")
        lines = ["bindings:"]
        for kind, table in TABLES.items():
            lines += _row_binding(table, NAMESPACES[kind])
        lines += _warmup_binding(WARMUP_TABLE, WARMUP_NAMESPACE)
        self.bindings.write_text("\n".join(lines) + "\n")
        for index, table in enumerate(rate_tables):
            lines = [
                "bindings:",
                *_row_binding(table, RATE_NAMESPACE.format(index=index)),
                *_warmup_binding(RATE_WARMUP_TABLE.format(index=index), f"{WARMUP_NAMESPACE}_{index}"),
            ]
            self.rate_bindings(index).write_text("\n".join(lines) + "\n")

    def rate_bindings(self, index: int) -> Path:
        return self.root / f"bindings-rate{index}.yaml"

    def position(self) -> tuple[str, int]:
        with self.admin.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        if not row:
            raise BenchError("SHOW MASTER STATUS returned nothing: the private MariaDB has no binlog")
        return str(row[0]), int(row[1])

    def execute(self, statements: Sequence[str]) -> None:
        """Run ``statements`` in one round trip; each is its own transaction (autocommit)."""
        with self.writer.cursor() as cur:
            cur.execute(";".join(statements))
            while cur.nextset():
                pass

    def write_backlog(self, kind: str, rng: random.Random) -> Backlog:
        """Write the backlog while every freshkey process is frozen; its binlog range and size."""
        config = self.config
        start = self.position()
        statements: list[str] = []
        if kind == "single":
            table = TABLES["single"]
            for _ in range(config.changes):
                change = self.next_single_change
                statements.append(update_statement(table, change % config.rows, change, rng))
                self.next_single_change += 1
            for first in range(0, len(statements), 200):
                self.execute(statements[first : first + 200])
            rows, transactions = config.changes, config.changes
            ids = [
                (self.next_single_change - config.changes + i) % config.rows for i in range(config.changes)
            ]
        else:
            ids = []
            for _ in range(config.inserts):
                first_id = self.next_multi_id
                self.next_multi_id += config.insert_rows
                ids += range(first_id, first_id + config.insert_rows)
                values = ",".join(
                    _row_values(i, f"inserted row {i}", rng)
                    for i in range(first_id, first_id + config.insert_rows)
                )
                self.execute([f"INSERT INTO {DATABASE}.{TABLES['multi']} VALUES {values}"])
            rows, transactions = config.inserts * config.insert_rows, config.inserts
        return Backlog(kind, start, self.position(), rows, transactions, ids)

    def server_id(self) -> int:
        return next(self._server_ids)

    def base_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "FRESHKEY_MYSQL_HOST": self.db.host,
            "FRESHKEY_MYSQL_PORT": str(self.db.port),
            "FRESHKEY_MYSQL_USER": self.db.user,
            "FRESHKEY_MYSQL_PASSWORD": self.db.password,
            "FRESHKEY_KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "FRESHKEY_KAFKA_PARTITIONS": str(self.config.partitions),
            "FRESHKEY_REDIS_URL": self.cache.url,
            "FRESHKEY_BINDINGS": str(self.bindings),
            "FRESHKEY_WORKER_DEVICE": "cpu",
        }

    def service_pids(self) -> dict[str, int]:
        pids = {"mariadb": self.db.pid, "redis": self.cache.pid, "kafka": self.broker.pid}
        return {name: pid for name, pid in pids.items() if pid is not None}

    def versions(self) -> dict[str, str]:
        with self.admin.cursor() as cur:
            cur.execute("SELECT VERSION()")
            row = cur.fetchone()
        import redis

        client = redis.Redis.from_url(self.cache.url)
        try:
            info = client.info("server")
        finally:
            client.close()
        return {"mariadb": str(row[0]) if row else "?", "redis": str(info.get("redis_version", "?"))}


def _row_binding(table: str, namespace: str) -> list[str]:
    """A table of the row shape, written through with a µs version and commit-time column."""
    return [
        f"  - table: {DATABASE}.{table}",
        f"    namespace: {namespace}",
        "    value_columns: [modality, content, embedding, updated_at]",
        "    version_column: updated_at",
        "    commit_time_column: updated_at",
        "    on_change: write",
    ]


def _warmup_binding(table: str, namespace: str) -> list[str]:
    return [
        f"  - table: {DATABASE}.{table}",
        f"    namespace: {namespace}",
        "    version_column: at",
        "    commit_time_column: at",
    ]


def _row_values(row_id: int, content: str, rng: random.Random) -> str:
    """``(id, modality, content, embedding, UTC_TIMESTAMP(6))`` as SQL (content holds no quote)."""
    return f"({row_id},'{rng.choice(MODALITIES)}','{content}',X'{rng.randbytes(32).hex()}',UTC_TIMESTAMP(6))"


def update_statement(table: str, row_id: int, change: int, rng: random.Random) -> str:
    return (
        f"UPDATE {DATABASE}.{table} SET content='change {change} of row {row_id}', "
        f"embedding=X'{rng.randbytes(32).hex()}', updated_at=UTC_TIMESTAMP(6) WHERE id={row_id}"
    )


def key_prefix(kind_or_table: str) -> bytes:
    """The start of the Kafka keys of a backlog's (or a table's) messages: ``<db>/<table>/``."""
    return f"{DATABASE}/{TABLES.get(kind_or_table, kind_or_table)}/".encode()
