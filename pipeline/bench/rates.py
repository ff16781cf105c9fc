"""The fixed-rate scenario of ``freshkey bench pipeline``: for each rate a fresh connector and worker
on their own table and topic, single-row updates driven at that rate, lag per stage from the worker's
stats, then the broker alone at the same rate (its own delivery lag, beside the ``connector->worker``
stage); see :mod:`pipeline.bench.pipeline`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.bench.measure import Scenario, per_item, poll
from pipeline.bench.procs import Sampler, wait_idle, wait_until
from pipeline.bench.raw import raw_kafka_lag
from pipeline.bench.roles import Connector, Worker, acked_count, acked_offsets, stop_all
from pipeline.bench.stack import DATABASE, RATE_NAMESPACE, RATE_TABLE, RATE_WARMUP_TABLE, update_statement
from pipeline.settings import WorkerSettings

SUSTAINED_THROUGHPUT = 0.95
SUSTAINED_CATCH_UP_S = 2.0


class RateRuns(Scenario):
    """The fixed-rate runs of one bench run: :meth:`run` returns a record per run and rate."""

    def run(self) -> list[dict[str, Any]]:
        """For each run, one fresh connector and worker per rate, all started (and warmed) together, then
        frozen; each rate's pair is thawed for its own run only, then stopped."""
        config, stack = self.config, self.stack
        records: list[dict[str, Any]] = []
        for run in range(1, config.runs + 1):
            self.progress.step(f"run {run}/{config.runs}: starting a connector and a worker per rate")
            pairs = [
                (
                    Connector(stack, f"rate{run}-{i}", f"connector-rate{run}-{i}", stack.rate_bindings(i)),
                    Worker(stack, f"rate{run}-{i}", f"worker-rate{run}-{i}", bindings=stack.rate_bindings(i)),
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
                    record["broker_lag_ms"] = self._broker_alone(rate, run, index)
                    records.append(record)
                    self.progress.log(_rate_line(record))
            finally:
                stop_all([proc for pair in pairs for proc in (pair[0].proc, pair[1].proc)])
        return records

    def _start_rate_pairs(self, pairs: Sequence[tuple[Connector, Worker]]) -> None:
        """Start every pair, wait until each worker holds its partitions and one row went through each
        pair, then freeze them all."""
        timeout = self.config.timeout_s
        self.session.start(*(proc for connector, worker in pairs for proc in (connector.proc, worker.proc)))
        wait_until(
            lambda: all(c.checkpoint.exists() for c, _ in pairs),
            timeout,
            "the connectors",
            self.session.check,
        )
        wait_until(
            lambda: all(w.progress() is not None for _, w in pairs),
            timeout,
            "the workers",
            self.session.check,
        )
        for _, worker in pairs:
            self.session.wait_assigned([worker])
        for index in range(len(pairs)):
            self._touch_rate_row(index)
        wait_until(
            lambda: all(acked_count(acked_offsets([w])) >= 1 for _, w in pairs),
            timeout,
            "the warm-up rows",
            self.session.check,
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
        self, rate: float, run: int, index: int, connector: Connector, worker: Worker
    ) -> dict[str, Any]:
        config = self.config
        connector.proc.thaw()
        worker.proc.thaw()
        # A connector frozen while other rates ran skips their changes (tables it does not read) first:
        # wait for it to go idle, then for one row through the pair, before the clock starts.
        wait_idle(connector.proc.pid, config.timeout_s, self.session.check)
        before = acked_count(acked_offsets([worker]))
        self._touch_rate_row(index)
        wait_until(
            lambda: acked_count(acked_offsets([worker])) > before,
            config.timeout_s,
            "the warm-up row",
            self.session.check,
        )
        base = acked_count(acked_offsets([worker]))
        joins = worker.joins()
        sampler = self.session.sampler(connector=connector.proc, worker=worker.proc)
        sampler.start()
        began = time.monotonic()
        changes = self._drive(rate, index, sampler)
        drive_s = time.monotonic() - began
        caught_at = poll(
            lambda: (acked_count(acked_offsets([worker])) - base) / changes,
            sampler,
            self.session.check,
            config.timeout_s,
            "the worker to apply the driven changes",
        )
        processes = sampler.stop()
        stats = worker.stats() or {}
        stop_all([connector.proc, worker.proc])
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
            "processes": per_item(processes, changes),
            "background_cores": sampler.background_cores,
            "rejoins": worker.joins() - joins,
        }

    def _broker_alone(self, rate: float, run: int, index: int) -> dict[str, Any]:
        """The broker's own delivery lag at ``rate`` for as long, right after freshkey's run (its pair
        stopped), beside ``connector->worker`` (:func:`~pipeline.bench.raw.raw_kafka_lag`)."""
        config = self.config
        return raw_kafka_lag(
            self.stack.broker.bootstrap,
            f"bench.raw-kafka.rate{run}-{index}",
            rate=rate,
            seconds=config.rate_seconds,
            partitions=config.partitions,
            fetch_max_wait_ms=WorkerSettings().fetch_max_wait_ms,
            timeout_s=config.timeout_s,
        )

    def _drive(self, rate: float, index: int, sampler: Sampler) -> int:
        """Single-row UPDATE transactions at ``rate`` per second for ``rate_seconds``: every statement
        that is due is sent at once (one round trip, each its own transaction), so the driver keeps the
        rate on average even when one round trip takes longer than the interval."""
        config = self.config
        total = max(1, round(rate * config.rate_seconds))
        table = RATE_TABLE.format(index=index)
        statements = [
            update_statement(table, self.rng.randrange(config.rows), n, self.rng) for n in range(total)
        ]
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
                self.session.check()
        return total


def _rate_line(record: Mapping[str, Any]) -> str:
    lag = record.get("lag_ms") or {}

    def ms(value: Any) -> str:
        return "-" if value is None else f"{value:,.1f}"

    broker = record.get("broker_lag_ms") or {}
    return (
        f"run {record['run']} at {record['rate']:,.0f}/s: driven {record['driven_per_s']:,.0f}/s, "
        f"throughput {record['throughput_per_s']:,.0f}/s, catch-up {record['catch_up_s']:.2f} s, "
        f"lag p50/p99/max {ms(lag.get('p50'))}/{ms(lag.get('p99'))}/{ms(lag.get('max'))} ms, "
        f"{'sustained' if record['sustained'] else 'NOT sustained'}; the broker alone "
        f"{ms(broker.get('p50'))}/{ms(broker.get('p99'))}/{ms(broker.get('max'))} ms"
    )
