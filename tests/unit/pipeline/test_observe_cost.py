"""What reporting costs the worker, measured (figures printed, never a timed assertion).

``ChangeProcessor.apply`` on 50,000 synthetic applied changes (100 batches of 500, every key distinct)
against a tier that acknowledges at once, with every observer the worker wires (``pipeline.app``):
worker stats, consumer progress, the SLA evaluator, OpenTelemetry (SDK meter with a Prometheus reader)
and the dashboard's series. The same batches with a do-nothing observer set give the floor (the apply
path without reporting). Then the body of ``/freshkey/stats``, the SLA evaluation, the dashboard's series
and a Prometheus scrape, each at 50,000 samples.

Runs as a test (``pytest -s`` shows the figures) and as a script, also against an older tree
(``PYTHONPATH=<tree> python tests/unit/pipeline/test_observe_cost.py``): it uses only what the worker's
wiring used before and after the observer redesign.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

from pipeline.observe.otel import OtelObserver, configure_telemetry
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.series import SeriesRecorder
from pipeline.observe.sla import SlaEvaluator
from pipeline.processor import ChangeProcessor, Planned
from pipeline.settings import SlaSettings, TelemetrySettings
from schemas import Binding, Bindings
from tests.support.fakes import InstantTier, update_message

CHANGES = 50_000
BATCH = 500
SINGLES = 2_000
"""Changes applied one per batch (a quiet worker)."""
BINDING = Binding(table="shop.assets", namespace="assets")  # type: ignore[call-arg]


class Nothing:
    """An observer set that does nothing: the floor of the apply path (every method either interface
    calls, as a plain no-op)."""

    def on_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_outcome(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_applied(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_batch(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_offset(self, *args: Any, **kwargs: Any) -> None:
        pass


def _change(row_id: int, now_us: int) -> bytes:
    # Committed 20 ms to 57 ms before "now", read by the connector 5 ms before it.
    commit_us = now_us - 20_000 - (row_id % 997) * 37
    return update_message(row_id, table="assets", commit_us=commit_us, ts_ms=now_us // 1000 - 5)


def _batches(
    p: ChangeProcessor, loop: asyncio.AbstractEventLoop, changes: int = CHANGES, size: int = BATCH
) -> list[list[Planned]]:
    now_us = time.time_ns() // 1000
    batches = []
    for start in range(0, changes, size):
        messages = [(None, _change(i, now_us)) for i in range(start, start + size)]
        prepared = loop.run_until_complete(p.prepare(messages))
        assert not prepared.rejects and len(prepared.planned) == size
        batches.append(prepared.planned)
    return batches


def _wire(p: ChangeProcessor) -> dict[str, Any]:
    """The worker's observers (pipeline.app, pipeline.web.install_dashboard)."""
    telemetry = configure_telemetry(TelemetrySettings(prometheus_port=0), service="worker", set_global=False)
    settings = SlaSettings()
    progress = ConsumerProgress("changes", partitions=4, window_ms=settings.window_ms)
    sla = SlaEvaluator(settings, progress=progress, worker="bench")
    extra = {}
    if "registry" in inspect.signature(OtelObserver).parameters:
        extra["registry"] = telemetry.registry  # type: ignore[attr-defined]
    otel = OtelObserver(meter=telemetry.meter_provider.get_meter("freshkey"), **extra)
    otel.watch_sla(lambda: sla.state)
    otel.watch_progress(progress)
    series = SeriesRecorder()
    for observer in (progress, sla, otel, series):
        p.observers.add(observer)
    return {"telemetry": telemetry, "sla": sla, "series": series}


def _apply_all(p: ChangeProcessor, batches: list[list[Planned]], loop: asyncio.AbstractEventLoop) -> float:
    """Seconds spent in apply over every batch."""
    gc.collect()
    spent = 0.0
    for planned in batches:
        started = time.perf_counter()
        refused = loop.run_until_complete(
            p.apply(planned, received_ms=time.time() * 1000, planned_ms=time.time() * 1000)
        )
        spent += time.perf_counter() - started
        assert not refused
    return spent


def _timed(call: Callable[[], Any], repeat: int = 20) -> float:
    """Median ms of ``call``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _processor() -> ChangeProcessor:
    return ChangeProcessor(Bindings(bindings=(BINDING,)), [InstantTier()], key_prefix="fk")  # type: ignore[list-item]


def measure(runs: int = 3) -> dict[str, float]:
    """The best of ``runs`` (the machine is shared: the least disturbed run is the closest figure)."""
    loop = asyncio.new_event_loop()
    try:
        floors, fulls = [], []
        wired: dict[str, Any] = {}
        for _ in range(runs):
            floor_p = _processor()
            floor_p.observers = Nothing()  # type: ignore[assignment]
            floors.append(_apply_all(floor_p, _batches(floor_p, loop), loop))
            if wired:
                wired["telemetry"].shutdown()
            full_p = _processor()
            wired = _wire(full_p)
            fulls.append(_apply_all(full_p, _batches(full_p, loop), loop))
        floor, full = min(floors), min(fulls)
        # A quiet worker applies a change at a time: what a batch of one costs.
        single_floor_p, single_p = _processor(), _processor()
        single_floor_p.observers = Nothing()  # type: ignore[assignment]
        single_wired = _wire(single_p)
        single_floor = _apply_all(single_floor_p, _batches(single_floor_p, loop, SINGLES, 1), loop)
        single = _apply_all(single_p, _batches(single_p, loop, SINGLES, 1), loop)
        single_wired["telemetry"].shutdown()
        # The last wired processor holds 50,000 samples; its windowed figures once their seconds are over.
        time.sleep(max(0.0, 1.05 - (time.time() % 1)))
        figures = {
            "apply_us_per_change": full / CHANGES * 1e6,
            "floor_us_per_change": floor / CHANGES * 1e6,
            "reporting_us_per_change": (full - floor) / CHANGES * 1e6,
            "single_apply_us": single / SINGLES * 1e6,
            "single_reporting_us": (single - single_floor) / SINGLES * 1e6,
            "stats_ms": _timed(full_p.stats.snapshot),
            "sla_evaluate_ms": _timed(wired["sla"].evaluate),
            "series_ms": _timed(wired["series"].snapshot, repeat=5),
        }
        registry = getattr(wired["telemetry"], "registry", None)
        if registry is not None:
            from prometheus_client import generate_latest

            figures["scrape_ms"] = _timed(lambda: generate_latest(registry), repeat=5)
        stats = full_p.stats.snapshot()
        assert stats["events"].get("u") == CHANGES, stats["events"]
        wired["telemetry"].shutdown()
        return figures
    finally:
        loop.close()


def _print(figures: dict[str, float]) -> None:
    print(
        f"\nreporting on {CHANGES:,} applied changes in batches of {BATCH}: "
        f"apply {figures['apply_us_per_change']:.1f} µs/change with every observer, "
        f"{figures['floor_us_per_change']:.1f} µs/change without reporting "
        f"(reporting {figures['reporting_us_per_change']:.1f} µs/change); one change per batch: "
        f"{figures['single_apply_us']:.1f} µs/change (reporting {figures['single_reporting_us']:.1f} µs)"
    )
    print(
        f"at {CHANGES:,} samples: /freshkey/stats body {figures['stats_ms']:.2f} ms, "
        f"SLA evaluation {figures['sla_evaluate_ms']:.2f} ms, dashboard series {figures['series_ms']:.2f} ms"
        + (f", Prometheus scrape {figures['scrape_ms']:.2f} ms" if "scrape_ms" in figures else "")
    )


def test_reporting_cost_per_change_and_stats_call_time() -> None:
    figures = measure(runs=1)
    _print(figures)
    assert figures["apply_us_per_change"] > 0 and figures["stats_ms"] > 0


if __name__ == "__main__":
    _print(measure())
