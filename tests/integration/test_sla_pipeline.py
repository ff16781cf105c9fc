"""Heartbeat lag and SLA evaluation on real services: MariaDB binlog -> connector -> Kafka -> worker -> Redis.

The heartbeat prober runs in-process (a thread); connector and worker are child processes (see
``conftest.Pipeline``), the worker with a short SLA evaluation window so a violation and its recovery
both happen within seconds.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from connectors.heartbeat import HeartbeatProber, HeartbeatSettings, start_in_thread
from connectors.settings import MySQLSettings
from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import free_port
from pipeline.observe.sla import SlaState, SlaViolation
from tests.support.kafka import read_topic
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

INTERVAL_MS = 100
PAUSE_MS = 2000
SLA_ENV = {
    # Judged on the heartbeats only, over 4 s, every 0.25 s; loose enough for a busy 2-core machine, far
    # below what a 2 s Redis pause does.
    "FRESHKEY_SLA_EVALUATION_WINDOW_S": "4",
    "FRESHKEY_SLA_EVALUATION_INTERVAL_S": "0.25",
    "FRESHKEY_SLA_P99_LAG_MS": "500",
    "FRESHKEY_SLA_WINDOW_MS": "1000",
    "FRESHKEY_SLA_WINDOW_FRACTION": "0.9",
}


class HeartbeatPipeline:
    """A :class:`Pipeline` whose bindings also hold a heartbeat table, and the prober writing it."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        tag = p.change_topic.rsplit(".", 1)[1]
        self.namespace = f"heartbeat_{tag}"
        self.violations_topic = f"freshkey.sla-violations.{tag}"
        self.prometheus_port = free_port()
        self.settings = HeartbeatSettings(database=p.database, table="heartbeat", interval_ms=INTERVAL_MS)
        p.bindings_text += (
            f"  - table: {p.database}.heartbeat\n    namespace: {self.namespace}\n"
            "    version_column: beat_at\n    commit_time_column: beat_at\n"
        )
        (p.workdir / "bindings.yaml").write_text(p.bindings_text)
        p.env.update(
            {
                **SLA_ENV,
                "FRESHKEY_SLA_NAMESPACES": orjson.dumps([self.namespace]).decode(),
                "FRESHKEY_SLA_VIOLATIONS_TOPIC": self.violations_topic,
                "FRESHKEY_HEARTBEAT_DATABASE": p.database,
                "FRESHKEY_HEARTBEAT_TABLE": "heartbeat",
                "FRESHKEY_HEARTBEAT_INTERVAL_MS": str(INTERVAL_MS),
                "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(self.prometheus_port),
            }
        )
        admin = MySQLSettings(
            host=p.mysql.host,
            port=p.mysql.port,
            user=p.mysql.admin_user,
            password=p.mysql.admin_password,
        )
        self.prober = HeartbeatProber(admin, self.settings)
        self.prober.ensure_table()  # before the connector starts, like any bound table
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start connector and worker, wait until one beat went through (the worker joined its group:
        about 5 s here), then beat every INTERVAL_MS."""
        self.p.start("connector")
        self.p.start("worker")
        self.prober.beat()
        self.p.wait(lambda: self.heartbeat_lag().get("samples", 0) >= 1, 60, "the first heartbeat")
        self.thread = start_in_thread(self.prober)

    def stop(self) -> None:
        self.prober.stop()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def heartbeat_lag(self) -> dict[str, Any]:
        summary: dict[str, Any] = (self.p.stats() or {}).get("lag_ms", {}).get(self.namespace, {})
        return summary

    def sla(self) -> SlaState | None:
        data = fetch_stats(f"http://127.0.0.1:{self.p.web_port}/freshkey/sla")
        return None if data is None else SlaState.model_validate(data)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.prometheus_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text: str = response.read().decode()
        return text


@pytest.fixture
def heartbeat_pipeline(make_pipeline: Callable[..., Pipeline]) -> Iterator[HeartbeatPipeline]:
    hp = HeartbeatPipeline(make_pipeline())
    try:
        yield hp
    finally:
        hp.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_heartbeat_lag_is_measured_while_the_database_is_otherwise_idle(
    heartbeat_pipeline: HeartbeatPipeline,
) -> None:
    hp = heartbeat_pipeline
    hp.start()
    hp.p.wait(lambda: hp.heartbeat_lag().get("samples", 0) >= 51, 60, "50 more heartbeats")
    lag = hp.heartbeat_lag()
    state = hp.sla()
    assert state is not None
    print(f"\nheartbeat lag, idle database, {lag['samples']} beats every {INTERVAL_MS} ms: {lag}")
    window = f"SLA window {state.evaluation_window_s:g} s"
    print(f"{window}: p50 {state.p50_ms} ms, p99 {state.p99_ms} ms, max {state.max_ms} ms")
    assert lag["p50"] < 1000, lag
    assert hp.prober.stats.failures == 0
    assert hp.p.entry(1) is None, "nothing but heartbeats was written"

    targets = {t.name: t for t in state.targets}
    assert targets["heartbeat"].status != "no_data", "the worker found the heartbeat binding"
    metrics = hp.metrics()
    assert _metric(metrics, "freshkey_lag_milliseconds_count", namespace=hp.namespace, coarse="false") >= 51
    consumer_lag = fetch_stats(f"http://127.0.0.1:{hp.p.web_port}/freshkey/consumer-lag")
    assert consumer_lag, "the heartbeats' partition has a consumer lag"
    assert all(
        k.startswith(hp.p.change_topic + "/") and v["lag"] is not None and v["lag"] <= 20
        for k, v in consumer_lag.items()
    ), consumer_lag
    assert f'freshkey_consumer_lag{{messaging_destination_name="{hp.p.change_topic}"' in metrics


def test_a_redis_pause_is_a_violation_on_the_sla_page_topic_and_metrics_then_recovers(
    heartbeat_pipeline: HeartbeatPipeline,
) -> None:
    hp = heartbeat_pipeline
    p = hp.p
    hp.start()
    p.wait(lambda: (s := hp.sla()) is not None and s.status == "ok", 60, "the SLA to be met with heartbeats")
    before = hp.sla()
    assert before is not None
    # The first beat waited for the worker to join its group (seconds): a violation and a recovery
    # may already be behind us; they are the baseline.
    baseline = before.violations

    paused_at = time.monotonic()
    p.redis.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # type: ignore[no-untyped-call]
    seen_violated: SlaState | None = None
    while time.monotonic() - paused_at < PAUSE_MS / 1000 + 5:
        state = hp.sla()
        if state is not None and state.status == "violated":
            seen_violated = state
            break
        time.sleep(0.05)
    assert seen_violated is not None, f"no violation within 5 s after the pause\n{p.logs()}"
    print(f"\nviolated {time.monotonic() - paused_at:.2f} s after the pause began: {seen_violated.targets}")

    p.wait(lambda: (s := hp.sla()) is not None and s.status == "ok", 30, "the recovery")
    after = hp.sla()
    assert after is not None and after.violations >= baseline + 1
    assert after.last_event is not None and after.last_event.kind == "recovery"
    print(f"recovered {time.monotonic() - paused_at:.2f} s after the pause began: {after.last_event.message}")

    published = read_topic(p.kafka, hp.violations_topic, expect=2 * after.violations)
    events = [SlaViolation.model_validate(orjson.loads(value)) for _, value in published]
    assert [e.kind for e in events] == ["violation", "recovery"] * after.violations
    events = [e for e in events if e.at_ms > before.evaluated_at_ms]
    kinds = [e.kind for e in events]
    assert kinds[0] == "violation" and kinds[-1] == "recovery", kinds
    first = events[0]
    assert first.violated and first.worker == after.worker
    assert first.at_ms >= before.evaluated_at_ms

    metrics = hp.metrics()
    assert _metric(metrics, "freshkey_sla_violations_total") >= len(first.violated)
    assert _metric(metrics, "freshkey_sla_violated") == 0, "recovered: no target is violated any more"
    late = _metric(metrics, "freshkey_lag_milliseconds_count", namespace=hp.namespace) - _metric(
        metrics, "freshkey_lag_milliseconds_bucket", namespace=hp.namespace, le="1000"
    )
    assert late >= 1, "the heartbeats held up by the pause are in the lag histogram's >1 s buckets"
