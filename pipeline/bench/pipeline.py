"""``freshkey bench pipeline``: how fast each part of freshkey is, against the ceilings it runs on.

Everything runs on the embedded stack of ``freshkey demo`` (a private MariaDB with a ROW binlog, a
private Redis and the Tansu Kafka broker, started with :mod:`pipeline.embedded`), with the real
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

The rooms: :mod:`~pipeline.bench.config` (what to measure), :mod:`~pipeline.bench.stack` (the services,
schema, SQL and backlog writing), :mod:`~pipeline.bench.roles` (the connector and worker processes),
:mod:`~pipeline.bench.measure` (the session of a run, polling, records),
:mod:`~pipeline.bench.backlogs` and :mod:`~pipeline.bench.rates` (the scenarios); this module runs them
in order and assembles the report.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pipeline.bench.backlogs import BacklogRuns
from pipeline.bench.config import BenchConfig, Progress
from pipeline.bench.measure import Session
from pipeline.bench.rates import RateRuns
from pipeline.bench.roles import stop_all
from pipeline.bench.runs import bench_folder, finish_report, new_report
from pipeline.bench.stack import Stack


class PipelineBench:
    """One ``freshkey bench pipeline`` run: :meth:`run` returns the report."""

    def __init__(
        self, config: BenchConfig, progress: Progress | None = None, workdir: Path | None = None
    ) -> None:
        config.check()
        self.config = config
        self.progress = progress or Progress()
        self.workdir = workdir

    def run(self) -> dict[str, Any]:
        config = self.config
        began = time.monotonic()
        report = new_report("pipeline", config.to_json())
        report.update({"backlogs": {}, "rates": {"runs": []}})
        worker_outcomes: dict[str, Any] = {}
        self.progress.start(self._steps())
        with bench_folder(self.workdir, "freshkey-bench-", self.progress) as root, ExitStack() as stack:
            self.progress.step("starting MariaDB (binlog on), Redis and the Kafka broker")
            services = Stack(root, config, stack)
            services.prepare()
            report["environment"].update(services.versions())
            session = Session(config, self.progress, services)
            stack.callback(lambda: stop_all(session.procs))
            if config.backlog_scenarios:
                backlogs = BacklogRuns(session)
                report["backlogs"] = backlogs.run()
                worker_outcomes = backlogs.worker_outcomes
            if "rates" in config.scenarios and config.rates:
                report["rates"]["runs"] = RateRuns(session).run()
        report["worker_outcomes"] = worker_outcomes
        return finish_report(report, began)

    def _steps(self) -> int:
        config = self.config
        per_kind = (1 + len(config.backlog_scenarios)) if config.backlog_scenarios else 0
        setup = 2 if {"connector", "e2e", "worker", "workers-2"} & set(config.scenarios) else 1
        rates = (len(config.rates) + 1) * config.runs if "rates" in config.scenarios else 0
        return setup + per_kind * len(config.kinds) * config.runs + rates
