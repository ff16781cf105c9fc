"""The backlog scenarios of ``freshkey bench pipeline``: a backlog written while every freshkey process
is frozen, then drained by what is measured (raw decode, raw Redis CAS, the connector alone, end to end,
one worker, two workers); see :mod:`pipeline.bench.pipeline`."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from pipeline.bench.config import BACKLOG_SCENARIOS, BenchError
from pipeline.bench.kafka import Copy, produce_copies, read_messages
from pipeline.bench.measure import Scenario, Session, measurement, poll
from pipeline.bench.procs import Sampler, wait_until
from pipeline.bench.raw import raw_decode, raw_redis_cas
from pipeline.bench.roles import Connector, Worker, acked_count, acked_offsets, all_reached, stop_all
from pipeline.bench.stack import (
    DATABASE,
    MODALITIES,
    NAMESPACES,
    TABLES,
    WARMUP_TABLE,
    Backlog,
    key_prefix,
)

QUIET_S = 2.5
"""Longer than a worker's heartbeat interval (its session timeout / 5: 2 s by default), so that a member
evicted while frozen has heard of it, and started rejoining, within that time after it is thawed."""


class BacklogRuns(Scenario):
    """The backlog scenarios of one bench run: :meth:`run` measures them; ``worker_outcomes`` then holds
    what each worker did (to check that the writes landed)."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.worker_outcomes: dict[str, Any] = {}

    def run(self) -> dict[str, Any]:
        """Every backlog scenario of every run; the ``backlogs`` part of the report."""
        config, stack = self.config, self.stack
        wanted = set(config.backlog_scenarios)
        alone = (
            Connector(stack, "alone", "connector-alone")
            if wanted & {"connector", "worker", "workers-2"}
            else None
        )
        e2e_connector = Connector(stack, "e2e", "connector-e2e") if "e2e" in wanted else None
        e2e_worker = Worker(stack, "e2e", "worker-e2e") if "e2e" in wanted else None
        single = Worker(stack, "one", "worker-one") if "worker" in wanted else None
        pair = (
            [
                Worker(stack, "two", "worker-two-a", group="two"),
                Worker(stack, "two", "worker-two-b", group="two"),
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
            self.session.start(*(c.proc for c in connectors), *(w.proc for w in workers))
            self._warm_up(alone, e2e_connector, e2e_worker, single, pair)
        for proc in self.session.procs:
            proc.freeze()

        kafka_next: dict[int, int] = dict(self.alone_next) if alone is not None else {}
        results: dict[str, Any] = {}
        drains: list[tuple[dict[str, Any], Backlog, dict[int, int], dict[int, int]]] = []
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
                backlog = self.stack.write_backlog(kind, self.rng)
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
                    _, following = self._alone_messages(backlog, kafka_next)
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
                copies, _ = self._alone_messages(backlog, first, end)
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
        stop_all([*(c.proc for c in connectors), *(w.proc for w in workers)])
        return results

    def _alone_messages(
        self, backlog: Backlog, start: Mapping[int, int], end: Mapping[int, int] | None = None
    ) -> tuple[list[Copy], dict[int, int]]:
        """``backlog``'s messages on the connector-alone topic from the ``start`` offsets (to ``end``), and
        the offsets that follow them."""
        return read_messages(
            self.stack.broker.bootstrap,
            self.alone_topic,
            self.config.partitions,
            start,
            want=backlog.rows,
            key_prefix=key_prefix(backlog.kind),
            end=end,
        )

    def _settle(self, workers: Sequence[Worker]) -> None:
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
            wait_until(
                quiet, self.config.timeout_s, "the workers' consumer group to settle", self.session.check, 0
            )
        self._warm_group(workers, self.template)

    def _warm_up(
        self,
        alone: Connector | None,
        e2e_connector: Connector | None,
        e2e_worker: Worker | None,
        single: Worker | None,
        pair: Sequence[Worker],
    ) -> None:
        """Every process has handled at least one change and every worker holds its partitions."""
        timeout = self.config.timeout_s
        connectors = [c for c in (alone, e2e_connector) if c is not None]
        wait_until(
            lambda: all(c.checkpoint.exists() for c in connectors),
            timeout,
            "the connectors",
            self.session.check,
        )
        workers = [w for w in (e2e_worker, single, *pair) if w is not None]
        wait_until(
            lambda: all(w.progress() is not None for w in workers),
            timeout,
            "the workers' web pages",
            self.session.check,
        )
        if e2e_worker is not None:
            self.session.wait_assigned([e2e_worker])
        with self.stack.admin.cursor() as cur:
            cur.execute(f"REPLACE INTO {DATABASE}.{WARMUP_TABLE} VALUES (1, UTC_TIMESTAMP(6))")
        target = self.stack.position()
        wait_until(
            lambda: all(c.reached(target) for c in connectors),
            timeout,
            "the connectors' warm-up row",
            self.session.check,
        )
        if e2e_worker is not None:
            wait_until(
                lambda: acked_count(acked_offsets([e2e_worker])) >= 1,
                timeout,
                "the end-to-end worker's warm-up row",
                self.session.check,
            )
            self.e2e_base = acked_count(acked_offsets([e2e_worker]))
        self.alone_next: dict[int, int] = {}
        if alone is not None:
            found, self.alone_next = read_messages(
                self.stack.broker.bootstrap,
                alone.topic,
                self.config.partitions,
                {},
                want=1,
                key_prefix=key_prefix(WARMUP_TABLE),
            )
            self.template = found[0]
            self.alone_topic = alone.topic
            for group in ([single] if single is not None else [], list(pair)):
                if group:
                    self._warm_group(group, self.template)

    def _warm_group(self, workers: Sequence[Worker], template: Copy) -> None:
        """Workers of one group hold their partitions and have applied a copy of the warm-up change in
        each of them."""
        self.session.wait_assigned(workers)
        copies = [Copy(p, template.key, template.value) for p in range(self.config.partitions)]
        last = produce_copies(self.stack.broker.bootstrap, workers[0].topic, copies)
        wait_until(
            lambda: all_reached(acked_offsets(workers), last),
            self.config.timeout_s,
            f"{', '.join(w.proc.name for w in workers)} to apply the warm-up copies",
            self.session.check,
        )
        self.session.wait_assigned(workers)

    def _raw_decode(self, backlog: Backlog) -> dict[str, Any]:
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
        return measurement(result.items, result.seconds, processes, sampler)

    def _raw_redis(self, backlog: Backlog) -> dict[str, Any]:
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
        return measurement(result.items, result.seconds, sampler.stop(), sampler)

    def _connector_alone(self, connector: Connector, backlog: Backlog) -> dict[str, Any]:
        sampler = self.session.sampler(connector=connector.proc)
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

        poll(
            done,
            sampler,
            self.session.check,
            self.config.timeout_s,
            "the connector's checkpoint to reach the backlog's end",
        )
        processes = sampler.stop()
        connector.proc.freeze()
        return measurement(backlog.rows, reached[0] - began, processes, sampler)

    def _end_to_end(self, connector: Connector, worker: Worker, backlog: Backlog) -> dict[str, Any]:
        target = self.e2e_base + backlog.rows
        joins = worker.joins()
        sampler = self.session.sampler(connector=connector.proc, worker=worker.proc)
        sampler.start()
        worker.proc.thaw()
        connector.proc.thaw()
        began = time.monotonic()
        done_at = poll(
            lambda: (acked_count(acked_offsets([worker])) - self.e2e_base) / backlog.rows,
            sampler,
            self.session.check,
            self.config.timeout_s,
            "the end-to-end worker to apply the backlog",
        )
        processes = sampler.stop()
        self.e2e_base = acked_count(acked_offsets([worker]))
        if self.e2e_base != target:
            raise BenchError(f"the end-to-end worker acknowledged {self.e2e_base} changes, {target} expected")
        wait_until(
            lambda: connector.reached(backlog.end),
            30,
            "the end-to-end connector's checkpoint",
            self.session.check,
        )
        connector.proc.freeze()
        worker.proc.freeze()
        return {
            **measurement(backlog.rows, done_at - began, processes, sampler),
            "rejoins": worker.joins() - joins,
        }

    def _drain(self, workers: Sequence[Worker], copies: Sequence[Copy], backlog: Backlog) -> dict[str, Any]:
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
        sampler = self.session.sampler(**names)
        start = {p: offset - sum(1 for c in copies if c.partition == p) for p, offset in last.items()}
        total = len(copies)
        sampler.start()
        for worker in workers:
            worker.proc.thaw()
        began = time.monotonic()

        def done() -> float | None:
            acked = acked_offsets(workers)
            if acked is None:
                return None
            if all_reached(acked, last):
                return 1.0
            return sum(max(0, min(acked.get(p, -1), last[p]) - start[p]) for p in last) / total

        done_at = poll(
            done, sampler, self.session.check, self.config.timeout_s, "the worker(s) to drain the topic"
        )
        processes = sampler.stop()
        return {
            **measurement(total, done_at - began, processes, sampler),
            "rejoins": sum(w.joins() for w in workers) - joins,
        }


def _run_line(kind: str, record: Mapping[str, Any]) -> str:
    parts = [f"{name} {record[name]['per_s']:,.0f}/s" for name in BACKLOG_SCENARIOS if name in record]
    return f"run {record['run']} {kind}: " + ", ".join(parts)
