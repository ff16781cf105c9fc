"""``freshkey demo`` without services: its accounting, the driver's pace, the sentinel rows and the
private settings it gives its processes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pipeline.config import load_settings
from pipeline.demo import stack as demo
from pipeline.demo.accounting import Accounting, Written
from pipeline.demo.catchup import Sentinel, SentinelRows, partition_of
from pipeline.demo.machine import MachineLoad, Pace
from pipeline.settings import TelemetrySettings, WorkerSettings
from schemas import message_key


def test_accounting_adds_up_and_says_why_not() -> None:
    written = Written(inserts=300, updates=250, deletes=50, heartbeats=12, sentinels=4)
    events = {
        "change_applied": 590,
        "change_superseded": 20,
        "change_not_newer": 3,
        "dead_lettered": 2,
        "unbound": 1,
        "c": 310,
        "u": 253,
        "d": 50,
        "ddl": 3,  # not a row change: not counted
    }
    accounting = Accounting.from_events(written, events)
    assert (accounting.seen, written.total) == (616, 616)
    assert accounting.adds_up and accounting.to_json()["adds_up"], accounting.problems()

    short = Accounting.from_events(written, {**events, "change_applied": 587, "c": 307})
    assert not short.adds_up
    assert short.problems() == [
        "3 of the 616 changes written are not accounted for by the worker (not yet handled, or lost: "
        "see events in /freshkey/stats)"
    ]
    extra = Accounting.from_events(written, {**events, "unbound": 5})
    assert "4 more changes than the 616 written" in extra.problems()[0]
    by_op = Accounting.from_events(written, {**events, "u": 250})
    assert by_op.problems() == [
        "the worker's counts by op (610) differ from its applied + superseded + not newer (613)"
    ]


def test_pace_warns_when_the_driver_fell_behind() -> None:
    busy = MachineLoad(cpus=2, load_1m=6.1, load_5m=5.0, load_15m=4.0)
    quiet = MachineLoad(cpus=8, load_1m=0.5, load_5m=0.4, load_15m=0.3)
    assert Pace(500, 490, 0.01).warning(busy) is None, "98 % of the rate is holding it"
    warning = Pace(500, 310, 1.25).warning(busy)
    assert warning is not None
    assert "could not hold 500 changes/s: it reached 310/s and fell up to 1.25 s behind" in warning
    assert "the machine is busy (load 6.10 / 5.00 / 4.00 (1/5/15 min) on 2 CPUs)" in warning
    slow = Pace(500, 310, 1.25).warning(quiet)
    assert slow is not None and "the database or this process was too slow" in slow
    assert busy.busy and not quiet.busy
    now = MachineLoad.now()
    assert now.cpus >= 1 and now.load_1m >= 0


def test_sentinel_rows_cover_every_partition() -> None:
    for partitions in (1, 4, 12):
        rows = SentinelRows(
            database="freshkey", table="heartbeat", namespace="hb", prefix="fk", partitions=partitions
        )
        assert sorted(rows.ids) == list(range(partitions))
        for partition, row_id in rows.ids.items():
            assert row_id >= 1_000_000, "clear of the prober's row"
            assert partition_of(message_key("freshkey", "heartbeat", {"id": row_id}), partitions) == partition


def test_a_sentinel_counts_only_at_its_version_in_every_tier() -> None:
    sentinels = [Sentinel(0, 1_000_000, "a", 100), Sentinel(1, 1_000_001, "b", 200)]
    l2 = {"a": 100, "b": 250}
    l3: dict[str, int] = {"a": 100}
    assert SentinelRows.missing(sentinels, [l2.get]) == []
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == [sentinels[1]], "b not in L3 yet"
    l3["b"] = 199
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == [sentinels[1]], "an older b is not it"
    l3["b"] = 200
    assert SentinelRows.missing(sentinels, [l2.get, l3.get]) == []


def test_the_demo_ignores_the_callers_addresses(tmp_path: Path) -> None:
    inherited = {
        "PATH": "/usr/bin",
        "FRESHKEY_REDIS_L3_URL": "redis://production:6379/0",
        "FRESHKEY_REDIS_KEY_PREFIX": "prod",
        "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": "9464",
        "FRESHKEY_SLA_P99_LAG_MS": "500",
        "FRESHKEY_WORKER_BATCH_MAX": "64",
    }
    env = demo.private_env(inherited, {"FRESHKEY_REDIS_KEY_PREFIX": "fk"})
    assert env == {
        "PATH": "/usr/bin",
        "FRESHKEY_SLA_P99_LAG_MS": "500",
        "FRESHKEY_WORKER_BATCH_MAX": "64",
        "FRESHKEY_REDIS_KEY_PREFIX": "fk",
    }


def test_the_env_file_is_private_and_read_by_the_commands(tmp_path: Path) -> None:
    path = tmp_path / "freshkey.env"
    demo.write_env_file(
        path, {"FRESHKEY_WORKER_WEB_PORT": "41234", "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": "0"}
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "it holds the database password"
    assert load_settings(WorkerSettings, path).web_port == 41234
    assert load_settings(TelemetrySettings, path).prometheus_port == 0
    with pytest.raises(ValueError, match="newline"):
        demo.write_env_file(path, {"FRESHKEY_MYSQL_PASSWORD": "a\nb"})
