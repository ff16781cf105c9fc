"""The SLA evaluator: figures from the lag sketch within its bound, exact decisions that agree with the
figures printed, transitions, sliding window (whole seconds), the heartbeat and backlog targets."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.agents.sla import TICK_AFTER_S, until_next_tick
from pipeline.observe import BatchReport, Observers
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.sketch import GROWTH
from pipeline.observe.sla import SlaEvaluator, SlaState, SlaViolation, format_ms
from pipeline.settings import SlaSettings
from tests.support.fakes import T0, Clock, nearest_rank


def evaluator(clock: Clock, **overrides: object) -> SlaEvaluator:
    base: dict[str, object] = {"evaluation_window_s": 10.0, "p99_lag_ms": 200.0, "window_ms": 1500.0}
    return SlaEvaluator(SlaSettings(**{**base, **overrides}), worker="w1", clock=clock)  # type: ignore[arg-type]


def report(
    ev: SlaEvaluator, clock: Clock, lags: list[float], *, namespace: str = "ns", coarse: bool = False
) -> None:
    """One applied batch at the clock's time, through the worker's fan-out (it feeds the sketch)."""
    batch = {namespace: np.array(lags, dtype=np.float64)}
    Observers([ev], sketch=ev.sketch).on_batch(
        BatchReport(at=clock(), coarse_lags=batch) if coarse else BatchReport(at=clock(), lags=batch)
    )


def feed(ev: SlaEvaluator, clock: Clock, lags: list[float], *, spread_s: float = 0.0) -> None:
    """One change per batch, spread over ``spread_s``."""
    for lag in lags:
        report(ev, clock, [lag])
        clock.advance(spread_s / max(len(lags), 1))


def test_p99_of_a_realistic_distribution_against_the_exact_one() -> None:
    rng = random.Random(7)
    clock = Clock()
    ev = evaluator(clock, evaluation_window_s=60.0)
    values = [rng.lognormvariate(3, 0.8) for _ in range(20_000)]
    feed(ev, clock, values, spread_s=30)
    clock.settle()
    state, _ = ev.evaluate()
    exact = nearest_rank(values, 0.99)
    assert state.samples == len(values)
    assert state.p99_ms is not None and exact <= state.p99_ms < exact * GROWTH
    assert state.max_ms == max(values)


def test_the_p99_decision_is_exact_at_the_threshold_and_the_printed_p99_agrees() -> None:
    clock = Clock()
    ev = evaluator(clock)
    report(ev, clock, [10.0] * 98 + [200.0] * 2)  # the 99th of 100 is exactly the threshold: met
    clock.settle()
    state, events = ev.evaluate()
    p99 = {t.name: t for t in state.targets}["p99_lag"]
    assert state.status == "ok" and not events
    assert state.p99_ms == p99.measured == 200.0, "reported at the threshold, not at a bucket above it"
    assert p99.detail.startswith("p99 lag 200.0 ms <= 200 ms (100 samples")
    report(ev, clock, [10.0] * 98 + [250.0] * 2)  # 2 of 200 above: the 198th of 200 is still 200.0
    clock.settle()
    state, events = ev.evaluate()
    assert state.status == "ok" and not events and state.p99_ms == 200.0
    report(ev, clock, [200.0004])  # 3 of 201 above: the 199th of 201 is 200.0004
    clock.settle()
    state, events = ev.evaluate()
    p99 = {t.name: t for t in state.targets}["p99_lag"]
    assert p99.status == "violated" and state.p99_ms is not None and 200.0 < state.p99_ms <= 250.0
    assert [e.violated for e in events] == [("p99_lag",)]


@settings(max_examples=150, deadline=None)
@given(
    lags=st.lists(st.floats(min_value=0, max_value=400, allow_nan=False), min_size=1, max_size=200),
    threshold=st.sampled_from([200.0, 137.3, 50.0]),
)
def test_the_decision_and_the_printed_p99_never_disagree(lags: list[float], threshold: float) -> None:
    clock = Clock()
    ev = evaluator(clock, p99_lag_ms=threshold)
    report(ev, clock, lags)
    clock.settle()
    state, _ = ev.evaluate()
    p99 = {t.name: t for t in state.targets}["p99_lag"]
    assert p99.measured is not None and state.p99_ms == p99.measured
    assert (p99.status == "ok") == (p99.measured <= threshold) == (nearest_rank(lags, 0.99) <= threshold)
    printed = float(p99.detail.split()[2])
    assert (printed <= threshold) == (p99.status == "ok"), p99.detail


def test_format_ms_keeps_the_comparison() -> None:
    assert format_ms(200.0, 200.0) == "200.0 ms" and format_ms(12.34) == "12.3 ms"
    assert format_ms(200.04, 200.0) == "200.04 ms" and format_ms(200.0004, 200.0) == "200.0004 ms"
    assert format_ms(199.96, 200.0) == "200.0 ms", "rounded up to the line: still reads as met, as it is"
    assert format_ms(200.00000001, 200.0) == "200.00000001 ms"


def test_a_burst_of_slow_samples_emits_one_violation_then_one_recovery() -> None:
    clock = Clock()
    ev = evaluator(clock, evaluation_window_s=10.0)
    assert ev.evaluate()[0].status == "no_data"
    events: list[SlaViolation] = []
    for _ in range(20):  # 2 s of healthy traffic
        feed(ev, clock, [15.0] * 10, spread_s=0.1)
        events += ev.evaluate()[1]
    assert ev.state.status == "ok" and events == []

    clock.settle()  # (sums of 0.01 s drift below the whole second)
    feed(ev, clock, [1800.0] * 30, spread_s=0.3)  # a stall: 30 changes 1.8 s late
    for _ in range(30):  # 3 s in violation: evaluated again and again, still one event
        feed(ev, clock, [15.0] * 10, spread_s=0.1)
        events += ev.evaluate()[1]
    assert [e.kind for e in events] == ["violation"]
    violation = events[0]
    assert set(violation.violated) == {"p99_lag", "consistency_window"}
    assert ev.state.violations == 1
    assert violation.worker == "w1" and "p99 lag" in violation.message
    assert ev.state.violated and ev.state.violations == 1
    assert ev.state.last_event == violation

    for _ in range(120):  # the slow samples leave the 10 s window
        feed(ev, clock, [15.0] * 10, spread_s=0.1)
        events += ev.evaluate()[1]
    assert [e.kind for e in events] == ["violation", "recovery"]
    recovery = events[1]
    assert recovery.since_ms == violation.at_ms and recovery.at_ms > violation.at_ms
    assert set(recovery.violated) == {"p99_lag", "consistency_window"}
    assert ev.state.status == "ok" and ev.state.violations == 1


def test_the_window_slides_over_whole_seconds_and_forgets_old_samples() -> None:
    clock = Clock()
    ev = evaluator(clock, evaluation_window_s=6.0)
    report(ev, clock, [5000.0] * 5)
    assert ev.evaluate()[0].samples == 0, "the current second is not in the window yet"
    clock.settle()
    state, _ = ev.evaluate()
    assert state.samples == 5 and state.window_end_ms == (T0 + 1) * 1000
    clock.advance(4.5)
    report(ev, clock, [10.0] * 3)
    clock.settle()
    state, _ = ev.evaluate()
    assert state.samples == 8 and state.max_ms == 5000.0
    clock.advance(1.0)  # six whole seconds after the first five: gone
    state, _ = ev.evaluate()
    assert state.samples == 3 and state.max_ms == 10.0 and state.status == "ok"
    clock.advance(7.0)
    state, _ = ev.evaluate()
    assert state.samples == 0 and state.status == "no_data" and state.p99_ms is None


def test_memory_is_bounded_by_the_sketch() -> None:
    clock = Clock()
    ev = evaluator(clock, evaluation_window_s=1.0)
    for i in range(500):
        report(ev, clock, [float(j % 5000) for j in range(i * 100, i * 100 + 100)])
        clock.advance(0.1)
    assert len(ev.sketch.seconds()) <= ev.sketch.retention_s + 1
    cells = [c for slot in ev.sketch._slots for c in slot.cells.values()]
    assert all(len(c.counts) <= ev.sketch.scheme.size for c in cells)


def test_coarse_samples_and_other_namespaces_do_not_count() -> None:
    clock = Clock()
    ev = evaluator(clock, namespaces=("ns",))
    report(ev, clock, [5000.0], coarse=True)
    report(ev, clock, [5000.0], namespace="other")
    report(ev, clock, [20.0])
    clock.settle()
    state, _ = ev.evaluate()
    assert state.samples == 1 and state.status == "ok"


def test_consistency_window_fraction() -> None:
    clock = Clock()
    ev = evaluator(clock, window_fraction=0.9, p99_lag_ms=10_000.0)
    feed(ev, clock, [100.0] * 9 + [1500.0])
    clock.settle()
    state, events = ev.evaluate()
    window = {t.name: t for t in state.targets}["consistency_window"]
    assert window.status == "ok" and window.measured == 1.0 and not events, "1500 ms is within 1500 ms"
    feed(ev, clock, [1600.0])
    clock.settle()
    state, events = ev.evaluate()
    window = {t.name: t for t in state.targets}["consistency_window"]
    assert window.status == "ok" and window.measured == pytest.approx(10 / 11) and not events
    feed(ev, clock, [1600.0])
    clock.settle()
    state, events = ev.evaluate()
    window = {t.name: t for t in state.targets}["consistency_window"]
    assert window.status == "violated" and window.measured == pytest.approx(10 / 12)
    assert [e.violated for e in events] == [("consistency_window",)]
    assert state.violations == 1 and state.last_event == events[0], "the transition's state counts it"


def test_an_overdue_heartbeat_is_a_violation_while_the_pipeline_is_stalled() -> None:
    clock = Clock()
    settings = SlaSettings(evaluation_window_s=10.0, window_ms=1500.0)
    ev = SlaEvaluator(settings, heartbeat_namespace="hb", heartbeat_interval_ms=500.0, clock=clock)
    assert {t.name: t.status for t in ev.evaluate()[0].targets}["heartbeat"] == "no_data"
    for _ in range(4):
        report(ev, clock, [20.0], namespace="hb")
        clock.advance(0.5)
        assert ev.evaluate()[0].status == "ok"
    clock.advance(1.4)  # last beat committed 1.92 s ago: the next one is waiting 1.42 s
    assert ev.evaluate()[0].status == "ok"
    clock.advance(0.2)
    state, events = ev.evaluate()
    heartbeat = {t.name: t for t in state.targets}["heartbeat"]
    assert heartbeat.status == "violated" and heartbeat.measured == pytest.approx(1620.0, abs=1)
    assert [e.violated for e in events] == [("heartbeat",)]
    report(ev, clock, [1700.0], namespace="hb")  # the late beat arrives
    state, events = ev.evaluate()
    assert {t.name: t.status for t in state.targets}["heartbeat"] == "ok"
    clock.advance(0.3)
    report(ev, clock, [20.0], namespace="hb")  # and the next one on time
    clock.settle()
    state, events = ev.evaluate()
    targets = {t.name: t.status for t in state.targets}
    assert targets["heartbeat"] == "ok" and targets["consistency_window"] == "violated"
    assert state.status == "violated", "the late beat itself broke the consistency window"


def test_state_and_events_are_json() -> None:
    clock = Clock()
    ev = evaluator(clock)
    feed(ev, clock, [5000.0])
    clock.settle()
    state, events = ev.evaluate()
    assert SlaState.model_validate(orjson.loads(orjson.dumps(state.model_dump(mode="json")))) == state
    assert SlaViolation.model_validate(orjson.loads(events[0].to_json())) == events[0]
    data = orjson.loads(events[0].to_json())
    assert data["kind"] == "violation" and data["targets"][0]["name"] == "p99_lag"


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRESHKEY_SLA_P99_LAG_MS", "50")
    monkeypatch.setenv("FRESHKEY_SLA_NAMESPACES", '["a", "b"]')
    s = SlaSettings()
    assert s.p99_lag_ms == 50 and s.namespaces == ("a", "b")
    assert s.window_ms == 1500 and s.window_fraction == 0.9999 and s.evaluation_window_s == 60
    assert s.violations_topic == "freshkey.sla-violations"


class _SlaServer:
    """Serves one SLA state at /freshkey/sla, like the worker."""

    def __init__(self, state: SlaState) -> None:
        import http.server
        import threading

        body = orjson.dumps(state.model_dump(mode="json"))

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/freshkey/sla"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.parametrize(("lag", "exit_code", "status"), [(10.0, 0, "ok"), (5000.0, 1, "violated")])
def test_sla_command_prints_writes_json_and_exits_1_when_violated(
    tmp_path: Path, lag: float, exit_code: int, status: str
) -> None:
    import typer
    from typer.testing import CliRunner

    from pipeline.commands.sla import sla

    clock = Clock()
    ev = evaluator(clock)
    feed(ev, clock, [lag] * 5)
    clock.settle()
    state, _ = ev.evaluate()
    server = _SlaServer(state)
    app = typer.Typer()
    app.command()(sla)
    out = tmp_path / "sla.json"
    try:
        result = CliRunner().invoke(app, ["--url", server.url, "--json", str(out)])
    finally:
        server.close()
    assert result.exit_code == exit_code, result.output
    assert "p99_lag" in result.output and status in result.output
    assert SlaState.model_validate(orjson.loads(out.read_bytes())) == state


def test_sla_command_prints_the_p99_at_the_threshold_as_met_and_just_above_it_as_violated() -> None:
    import typer
    from typer.testing import CliRunner

    from pipeline.commands.sla import sla

    app = typer.Typer()
    app.command()(sla)
    outputs = []
    for tail, exit_code in (([200.0, 200.0], 0), ([200.0004, 200.0004], 1)):
        clock = Clock()
        ev = evaluator(clock)
        report(ev, clock, [10.0] * 98 + tail)
        clock.settle()
        state, _ = ev.evaluate()
        server = _SlaServer(state)
        try:
            result = CliRunner().invoke(app, ["--url", server.url])
        finally:
            server.close()
        assert result.exit_code == exit_code, result.output
        outputs.append(" ".join(result.output.split()))
    assert "p50 10.0 ms, p99 200.0 ms, max 200.0 ms" in outputs[0], outputs[0]
    assert "p50 10.0 ms, p99 200.0004 ms, max 200.0004 ms" in outputs[1], outputs[1]
    assert "lag over the last 10 s to 2027-01-15 08:00:01 UTC:" in outputs[0], "the window is stated"


def test_evaluations_tick_just_after_each_whole_interval() -> None:
    assert until_next_tick(T0 + 0.3, 1.0) == pytest.approx(0.7 + TICK_AFTER_S)
    assert until_next_tick(T0, 1.0) == pytest.approx(1.0 + TICK_AFTER_S)
    assert until_next_tick(T0 + 0.3, 0.25) == pytest.approx(0.2 + TICK_AFTER_S)
    assert until_next_tick(T0 + 1.2, 5.0) == pytest.approx(3.8 + TICK_AFTER_S)


def test_sla_command_without_a_worker_exits_2() -> None:
    import typer
    from typer.testing import CliRunner

    from pipeline.commands.sla import sla
    from pipeline.embedded import free_port

    app = typer.Typer()
    app.command()(sla)
    result = CliRunner().invoke(app, ["--url", f"http://127.0.0.1:{free_port()}/freshkey/sla"])
    assert result.exit_code == 2 and "no SLA state" in result.output


# --- backlog_age: the age of the oldest change waiting on the change topic (ConsumerProgress) ------------


def new_progress(clock: Clock, partitions: int) -> ConsumerProgress:
    return ConsumerProgress(
        "changes", partitions=partitions, window_ms=1500.0, refresh_interval_s=2.0, clock=clock
    )


def stalled_worker(clock: Clock, *, with_progress: bool) -> tuple[SlaEvaluator, ConsumerProgress]:
    """A caught-up worker with no heartbeat binding and no precise lag samples, then one change arrives
    and is never acknowledged (its agent is wedged, or the tier refuses writes)."""
    settings = SlaSettings(evaluation_window_s=10.0, window_ms=1500.0)
    progress = new_progress(clock, 2)
    ev = SlaEvaluator(settings, worker="w1", progress=progress if with_progress else None, clock=clock)
    progress.set_assignment({0, 1})
    progress.set_high_watermarks({0: 40, 1: 12})
    progress.set_committed({0: 40, 1: 12})
    return ev, progress


def test_a_stalled_worker_is_violated_within_the_window_without_heartbeats_or_samples() -> None:
    clock = Clock()
    ev, progress = stalled_worker(clock, with_progress=True)
    state, _ = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert state.status == "ok" and backlog.status == "ok" and backlog.measured == 0.0
    assert state.samples == 0 and state.unknown_partitions == 0 and state.backlog_age_ms == 0.0
    progress.on_received("changes", 1, 12, clock() * 1000)  # the agent got it; Redis never answers
    clock.advance(1.5)
    assert ev.evaluate()[0].status == "ok", "exactly the window: still within it"
    clock.advance(0.05)
    state, events = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert state.status == "violated" and backlog.status == "violated"
    assert backlog.measured == pytest.approx(1550.0) and state.backlog_age_ms == pytest.approx(1550.0)
    assert "changes/1: 1 change(s) waiting, the oldest 1.6 s" in backlog.detail
    assert "acknowledges nothing while changes wait" in backlog.detail
    assert [(e.kind, e.violated) for e in events] == [("violation", ("backlog_age",))]
    assert {t.name: t.status for t in state.targets}["p99_lag"] == "no_data", "no sample told it"
    clock.advance(30)
    assert ev.evaluate()[0].status == "violated", "a stall stays violated while it lasts"
    progress.on_offset("changes", 1, 12)
    state, events = ev.evaluate()
    assert state.status == "ok" and [e.kind for e in events] == ["recovery"]
    assert events[0].violated == ("backlog_age",)


def test_the_same_stall_without_consumer_progress_reads_no_data() -> None:
    """What the target protects against: the old evaluator (no progress) calls a stall "no data"."""
    clock = Clock()
    ev, progress = stalled_worker(clock, with_progress=False)
    progress.on_received("changes", 1, 12, clock() * 1000)
    clock.advance(30)
    state, events = ev.evaluate()
    assert state.status == "no_data" and events == []
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert backlog.status == "no_data"
    assert backlog.detail == "consumer progress is not reported by this worker"
    assert state.unknown_partitions is None and state.backlog_age_ms is None


def test_no_partition_assigned_past_the_grace_while_changes_wait_is_violated() -> None:
    clock = Clock()
    settings = SlaSettings(window_ms=1500.0)
    progress = new_progress(clock, 2)
    ev = SlaEvaluator(settings, progress=progress, clock=clock)
    progress.set_high_watermarks({0: 62_000, 1: 3})
    progress.set_committed({0: 0, 1: 3})
    clock.advance(2.0)
    progress.set_high_watermarks({0: 62_000, 1: 3})
    progress.set_committed({0: 0, 1: 3})
    state, _ = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert backlog.status == "no_data" and "waiting for a partition" in backlog.detail
    assert state.status == "no_data" and state.unknown_partitions == 2
    clock.advance(1.6)  # 3.6 s without a partition: past the window plus one refresh interval
    state, events = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert state.status == "violated" and backlog.status == "violated"
    assert "no partition of changes assigned to this worker for 3.6 s" in backlog.detail
    assert "changes/0" in backlog.detail and "changes/1" not in backlog.detail
    assert [e.kind for e in events] == ["violation"]
    progress.set_assignment({0, 1})
    progress.on_received("changes", 0, 0, clock() * 1000 - 3600)
    state, _ = ev.evaluate()
    assert state.status == "violated", "the backlog is now this worker's: 62,000 changes, 3.6 s old"
    for offset in range(0, 62_000, 500):
        progress.on_offset("changes", 0, offset + 499)
    state, events = ev.evaluate()
    assert state.status == "ok" and [e.kind for e in events] == ["recovery"]


@pytest.mark.parametrize(
    ("highs", "committed", "status"),
    [
        ({0: 9, 1: 0}, {0: 9, 1: None}, "ok"),  # caught up: nothing waits, nobody needs this worker
        ({0: 9}, {0: 9}, "violated"),  # partition 1's high watermark unknown: cannot tell
        ({0: 9, 1: 4}, {0: 9, 1: None}, "violated"),  # never committed on 1, messages there
    ],
)
def test_no_partition_assigned_on_a_topic_where_nothing_waits_is_ok(
    highs: dict[int, int], committed: dict[int, int | None], status: str
) -> None:
    clock = Clock()
    progress = new_progress(clock, 2)
    ev = SlaEvaluator(SlaSettings(window_ms=1500.0), progress=progress, clock=clock)
    progress.set_high_watermarks(highs)
    progress.set_committed(committed)
    clock.advance(3.6)
    state, _ = ev.evaluate()
    assert {t.name: t.status for t in state.targets}["backlog_age"] == status


def test_an_assigned_partition_without_figures_counts_after_the_grace() -> None:
    clock = Clock()
    progress = new_progress(clock, 1)
    ev = SlaEvaluator(SlaSettings(window_ms=1500.0), progress=progress, clock=clock)
    progress.set_assignment({0})
    clock.advance(3.4)
    state, _ = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert backlog.status == "no_data" and "no figure yet for changes/0" in backlog.detail
    clock.advance(0.2)
    state, _ = ev.evaluate()
    backlog = {t.name: t for t in state.targets}["backlog_age"]
    assert backlog.status == "violated" and backlog.measured == pytest.approx(3600.0)
    assert "changes/0 unknown for 3.6 s (assigned, no high watermark yet)" in backlog.detail
    progress.set_high_watermarks({0: 0})
    assert ev.evaluate()[0].status == "ok", "an empty partition: known, nothing waits"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("receive"), st.integers(0, 1), st.integers(0, 30)),
            st.tuples(st.just("ack"), st.integers(0, 1), st.integers(0, 30)),
            st.tuples(st.just("high"), st.integers(0, 1), st.integers(0, 30)),
            st.tuples(st.just("committed"), st.integers(0, 1), st.integers(-1, 30)),
            st.tuples(st.just("assign"), st.integers(0, 3), st.integers(0, 0)),
            st.tuples(st.just("wait"), st.integers(0, 0), st.integers(0, 3000)),
        ),
        max_size=40,
    )
)
def test_never_ok_or_no_data_while_a_partition_is_known_to_be_behind_past_the_window(
    steps: list[tuple[str, int, int]],
) -> None:
    clock = Clock()
    progress = new_progress(clock, 2)
    ev = SlaEvaluator(SlaSettings(window_ms=1500.0), progress=progress, clock=clock)
    for action, partition, value in steps:
        if action == "receive":
            progress.on_received("changes", partition, value, clock() * 1000)
        elif action == "ack":
            progress.on_offset("changes", partition, value)
        elif action == "high":
            progress.set_high_watermarks({partition: value})
        elif action == "committed":
            progress.set_committed({partition: value})
        elif action == "assign":
            progress.set_assignment({0: (), 1: {0}, 2: {1}, 3: {0, 1}}[partition])
        else:
            clock.advance(value / 1000)
        state, _ = ev.evaluate()
        behind = [r for r in progress.snapshot().partitions if r.assigned and (r.age_ms or 0) > 1500]
        if behind:
            assert state.status == "violated", (behind, state.targets)


def test_progress_and_sla_windows_must_agree() -> None:
    progress = ConsumerProgress("changes", window_ms=1000.0)
    with pytest.raises(ValueError, match="FRESHKEY_SLA_WINDOW_MS"):
        SlaEvaluator(SlaSettings(window_ms=1500.0), progress=progress)


def test_a_state_with_the_new_fields_and_one_without_them_both_parse() -> None:
    clock = Clock()
    ev, _ = stalled_worker(clock, with_progress=True)
    state, _ = ev.evaluate()
    data = orjson.loads(orjson.dumps(state.model_dump(mode="json")))
    assert data["targets"][-1]["name"] == "backlog_age" and data["unknown_partitions"] == 0
    assert SlaState.model_validate(data) == state
    old = {k: v for k, v in data.items() if k not in ("backlog_age_ms", "unknown_partitions")}
    old["targets"] = [t for t in old["targets"] if t["name"] != "backlog_age"]
    parsed = SlaState.model_validate(old)  # what a worker from before this target answers
    assert parsed.backlog_age_ms is None and parsed.unknown_partitions is None


def test_sla_command_prints_the_backlog_and_unknown_partitions(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from pipeline.commands.sla import sla

    clock = Clock()
    ev, progress = stalled_worker(clock, with_progress=True)
    progress.on_received("changes", 1, 12, clock() * 1000)
    progress.set_assignment({0, 1, 2})  # partition 2: no figure yet
    clock.advance(4.0)
    state, _ = ev.evaluate()
    server = _SlaServer(state)
    app = typer.Typer()
    app.command()(sla)
    try:
        result = CliRunner().invoke(app, ["--url", server.url])
    finally:
        server.close()
    assert result.exit_code == 1, result.output
    assert "backlog_age" in result.output and "violated" in result.output
    assert "oldest change waiting on the change topic: 4000 ms; 1 partition without a figure" in " ".join(
        result.output.split()
    )
