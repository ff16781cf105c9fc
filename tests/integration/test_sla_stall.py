"""A stalled worker is an SLA violation *while* it is stalled; partitions without figures are unknown.

Real services: MariaDB binlog -> connector -> Kafka -> worker -> Redis (``conftest.Pipeline``). The
worker's writes are stalled with ``CLIENT PAUSE ... WRITE`` on its Redis: its agent has the change and
cannot acknowledge it, while its web server keeps answering. The bindings have no heartbeat table and no
commit-time column, so the only thing that can see the stall is the ``backlog_age`` target
(``pipeline.observe.progress.ConsumerProgress``).

The two pipeline tests need ``pipeline/worker.py`` to feed ``ConsumerProgress`` (the agent's received
messages, the acknowledged offsets, the assignment, high watermarks and committed offsets) and to serve
``progress.report()`` at ``/freshkey/consumer-lag``; until it does they fail with that message.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException

from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import free_port
from pipeline.observe.broker import BrokerOffsets
from pipeline.observe.sla import SlaState, TargetState
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

WINDOW_MS = 1500
MARGIN_S = 2.0
"""Allowed past the window: SLA evaluation every 0.25 s, connector and broker, a busy 2-core machine."""
PAUSE_MS = 6000
"""Longer than the window and the margin together: the violation must show while the stall lasts."""
SLA_ENV = {
    "FRESHKEY_SLA_WINDOW_MS": str(WINDOW_MS),
    "FRESHKEY_SLA_EVALUATION_INTERVAL_S": "0.25",
    "FRESHKEY_SLA_EVALUATION_WINDOW_S": "4",
    "FRESHKEY_TELEMETRY_CONSUMER_LAG_INTERVAL_S": "0.5",
}
NOT_WIRED = (
    "the worker does not report the backlog_age target: pipeline/worker.py must feed "
    "pipeline.observe.progress.ConsumerProgress and pass it to SlaEvaluator(progress=...)"
)


def _prepare(p: Pipeline) -> int:
    """SLA settings for a quick judgement, a private violations topic and a Prometheus port."""
    port = free_port()
    tag = p.change_topic.rsplit(".", 1)[1]
    p.env.update(
        {
            **SLA_ENV,
            "FRESHKEY_SLA_VIOLATIONS_TOPIC": f"freshkey.sla-violations.{tag}",
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(port),
        }
    )
    return port


def _get(p: Pipeline, path: str) -> Any:
    return fetch_stats(f"http://127.0.0.1:{p.web_port}{path}")


def _sla(p: Pipeline) -> SlaState | None:
    data = _get(p, "/freshkey/sla")
    return None if data is None else SlaState.model_validate(data)


def _targets(state: SlaState) -> dict[str, TargetState]:
    return {t.name: t for t in state.targets}


def _backlog(p: Pipeline) -> TargetState | None:
    state = _sla(p)
    if state is None:
        return None
    target = _targets(state).get("backlog_age")
    assert target is not None and target.detail != "consumer progress is not reported by this worker", (
        NOT_WIRED
    )
    return target


def _insert(p: Pipeline, ids: range) -> None:
    for row_id in ids:
        p.sql(
            "INSERT INTO assets (id, modality, content, embedding, updated_at) "
            "VALUES (%s, 'text', %s, NULL, NOW(6))",
            (row_id, f"row {row_id}"),
        )


def test_a_stalled_worker_turns_the_sla_violated_within_the_window_and_recovers(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()  # binlog versions, no commit-time column: not one precise lag sample
    _prepare(p)
    p.start("connector")
    p.start("worker")
    _insert(p, range(1, 6))
    p.wait_consistent()
    p.wait(lambda: (t := _backlog(p)) is not None and t.status == "ok", 60, "backlog_age ok")
    p.wait(lambda: (s := _sla(p)) is not None and s.status == "ok", 30, "the SLA ok")
    before = _sla(p)
    assert before is not None and before.samples == 0
    assert _targets(before)["heartbeat"].detail == "no heartbeat binding"
    baseline = before.violations

    p.redis.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
    changed_at = time.monotonic()
    p.sql("UPDATE assets SET content = 'changed while Redis refuses writes' WHERE id = 1")
    violated: SlaState | None = None
    stalled_rows: list[dict[str, Any]] = []
    while time.monotonic() - changed_at < WINDOW_MS / 1000 + MARGIN_S:
        state = _sla(p)
        if state is not None and _targets(state)["backlog_age"].status == "violated":
            violated = state
            lag = _get(p, "/freshkey/consumer-lag") or {}
            stalled_rows = [row for row in lag.values() if row["state"] == "stalled"]
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - changed_at
    assert violated is not None, (
        f"backlog_age not violated {elapsed:.2f} s after a change the worker cannot apply "
        f"(window {WINDOW_MS} ms + {MARGIN_S} s)\n{p.logs()}"
    )
    print(f"\nviolated {elapsed:.2f} s after the change: {_targets(violated)['backlog_age'].detail}")
    assert elapsed < PAUSE_MS / 1000, "seen while the worker was still stalled"
    assert violated.status == "violated" and violated.samples == 0
    assert {n: t.status for n, t in _targets(violated).items() if n != "backlog_age"} == {
        "p99_lag": "no_data",
        "consistency_window": "no_data",
        "heartbeat": "no_data",
    }, "nothing but the new target could see this stall"
    assert violated.backlog_age_ms is not None and violated.backlog_age_ms > WINDOW_MS
    assert stalled_rows and all(r["lag"] >= 1 and r["age_ms"] > WINDOW_MS for r in stalled_rows), stalled_rows

    p.wait(lambda: (s := _sla(p)) is not None and s.status == "ok", 30, "the recovery")
    after = _sla(p)
    assert after is not None and after.violations >= baseline + 1
    assert after.last_event is not None and after.last_event.kind == "recovery"
    assert "backlog_age" in after.last_event.violated
    print(f"recovered {time.monotonic() - changed_at:.2f} s after the change: {after.last_event.message}")
    p.wait_consistent()


def test_a_fresh_worker_shows_unknown_partitions_before_it_joins_never_an_empty_answer(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    prometheus_port = _prepare(p)
    p.start("connector")
    _insert(p, range(1, 31))  # changes wait on the topic before any worker reads them
    p.start("worker")  # returns once the web server answers: before the group join (seconds here)

    first = _get(p, "/freshkey/consumer-lag")
    assert first, f"/freshkey/consumer-lag answered {first!r}: an empty answer reads as caught up"
    assert sorted(first) == [f"{p.change_topic}/{n}" for n in range(3)], "the change topic, nothing else"
    assert all(row["state"] == "unknown" and row["lag"] is None for row in first.values()), first
    assert all(not row["assigned"] for row in first.values()), f"joined before the first answer: {first}"
    backlog = _backlog(p)
    assert backlog is not None and backlog.status != "ok", backlog
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    gauge = "freshkey_consumer_partitions_unknown{"
    unknown = [line for line in metrics.splitlines() if line.startswith(gauge)]
    assert unknown and unknown[0].endswith(" 3.0"), unknown
    assert f'freshkey_consumer_lag{{messaging_destination_name="{p.change_topic}"' not in metrics, (
        "an unknown partition has no lag observation, not a 0"
    )

    p.wait_consistent()

    def caught_up() -> bool:
        rows = (_get(p, "/freshkey/consumer-lag") or {}).values()
        return len(rows) == 3 and all(r["assigned"] and r["state"] == "caught_up" for r in rows)

    p.wait(caught_up, 30, "every partition assigned and caught up")
    p.wait(lambda: (t := _backlog(p)) is not None and t.status == "ok", 30, "backlog_age ok")
    series = _get(p, "/freshkey/api/series")
    assert series is not None and {row["topic"] for row in series["consumer"]} == {p.change_topic}, (
        "the dashboard's card shows the change topic only"
    )


def test_broker_offsets_reads_every_high_watermark_and_the_worker_groups_committed_offsets(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """What the wiring reads for ConsumerProgress, against the worker's real group (its app id)."""
    p = make_pipeline()
    p.start("connector")
    p.start("worker")
    _insert(p, range(1, 21))
    p.wait_caught_up()
    acked = {
        int(key.rsplit("/", 1)[1]): offset
        for key, offset in (p.stats() or {}).get("offsets", {}).items()
        if key.startswith(p.change_topic + "/")
    }
    assert acked, "the worker acknowledged changes"
    group = p.env["FRESHKEY_WORKER_APP_ID"]
    reader = BrokerOffsets(p.kafka, group_id=group, topic=p.change_topic)
    try:

        def committed_reached() -> bool:
            committed = reader.read().committed
            return all(committed.get(n) == offset + 1 for n, offset in acked.items())

        p.wait(committed_reached, 30, "the group's commits (every FRESHKEY_WORKER_COMMIT_INTERVAL_S)")
        figures = reader.read()
        assert sorted(figures.highs) == [0, 1, 2] and sorted(figures.committed) == [0, 1, 2]
        for n, offset in acked.items():
            # A lower bound: Tansu answers ListOffsets with the last batch's base offset + 1.
            assert 1 <= figures.highs[n] <= offset + 1, (n, figures.highs[n], offset)
    finally:
        reader.close()
    stranger = BrokerOffsets(p.kafka, group_id=f"{group}-never-committed", topic=p.change_topic)
    try:
        assert set(stranger.read().committed.values()) == {None}
    finally:
        stranger.close()
    missing = BrokerOffsets(p.kafka, group_id=group, topic=f"{p.change_topic}.missing", timeout_s=2)
    try:
        with pytest.raises(KafkaException):
            missing.read()
    finally:
        missing.close()
