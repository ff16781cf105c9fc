"""The dashboard's time series (pipeline/web/series.py) and its routes, without a broker."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer

from pipeline.observe import STAGE_PLAN, STAGE_SOURCE, STAGE_TRANSPORT, TIER_STAGE_PREFIX, Observers
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.series import RELATIVE_ACCURACY, SUMMARY_WINDOW_S, SeriesRecorder, Sketch
from pipeline.observe.stats import WorkerStats, percentile
from pipeline.web import STATIC_FILES, consumer_lag, install_dashboard


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _lower_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


# --- Sketch -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sketch_quantiles_are_within_the_relative_accuracy(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(math.log(20), 1.2) for _ in range(5000)] + [0.0, -0.7, -2.5]
    sketch = Sketch()
    for v in values:
        sketch.add(v)
    assert sketch.count == len(values)
    assert sketch.min == min(values) and sketch.max == max(values)
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0):
        exact = _lower_quantile(values, q)
        got = sketch.quantile(q)
        assert got is not None
        assert abs(got - exact) <= RELATIVE_ACCURACY * abs(exact) + 1e-9, (q, got, exact)


def test_sketch_merge_equals_one_sketch_of_everything() -> None:
    rng = random.Random(7)
    a, b, both = Sketch(), Sketch(), Sketch()
    for i in range(2000):
        v = rng.expovariate(1 / 50)
        (a if i % 3 else b).add(v)
        both.add(v)
    a.merge(b)
    for q in (0.5, 0.99):
        assert a.quantile(q) == both.quantile(q)
    assert (a.count, a.min, a.max) == (both.count, both.min, both.max)


def test_sketch_memory_depends_on_the_value_range_not_the_count() -> None:
    sketch = Sketch()
    rng = random.Random(3)
    for _ in range(100_000):
        sketch.add(rng.uniform(1, 1000))
    # log_gamma(1000) buckets at 1 % accuracy: about 346, however many samples.
    gamma = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
    assert len(sketch._pos) <= math.ceil(math.log(1000) / math.log(gamma)) + 1


def test_empty_sketch_and_nan() -> None:
    sketch = Sketch()
    sketch.add(math.nan)
    assert sketch.count == 0 and sketch.quantile(0.5) is None and sketch.summary({"p50": 0.5}) is None


# --- SeriesRecorder -----------------------------------------------------------------------------------


def _apply(rec: SeriesRecorder, lag: float, *, coarse: bool = False, tier: str = "redis") -> None:
    rec.on_event("u")
    rec.on_outcome(tier, "ns", "applied")
    rec.on_applied(
        "ns",
        "u",
        lag,
        coarse=coarse,
        stages={TIER_STAGE_PREFIX + tier: 1.0, STAGE_PLAN: 0.2, STAGE_TRANSPORT: lag / 2, STAGE_SOURCE: 0.5},
    )


def test_points_per_second_with_percentiles_counts_and_stages() -> None:
    clock = FakeClock()
    rec = SeriesRecorder(clock=clock)
    lags = [float(i) for i in range(1, 101)]
    for lag in lags:
        _apply(rec, lag)
    _apply(rec, 5000.0, coarse=True)
    rec.on_outcome("redis", "ns", "not_newer")
    clock.now += 1
    _apply(rec, 7.0)
    clock.now += 0.5
    snap = rec.snapshot()
    first, second = snap["points"]
    assert second["t"] == first["t"] + 1
    assert first["events"] == {"u": 101} and first["outcomes"] == {"applied": 101, "not_newer": 1}
    assert first["coarse_lag_samples"] == 1, "a coarse lag is counted, not charted"
    lag = first["lag_ms"]
    assert lag["count"] == 100 and lag["max"] == 100.0
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert lag[name] == pytest.approx(_lower_quantile(lags, q), rel=RELATIVE_ACCURACY)
    assert lag["p50"] == pytest.approx(percentile(lags, 50), rel=0.02), "close to the stats page's"
    assert snap["stages"] == [STAGE_SOURCE, STAGE_TRANSPORT, STAGE_PLAN, TIER_STAGE_PREFIX + "redis"]
    assert set(first["stages_ms"][STAGE_PLAN]) == {"count", "p50", "p99", "max"}
    assert second["lag_ms"]["p99"] == pytest.approx(7.0, rel=RELATIVE_ACCURACY)
    summary = snap["summary"]
    assert summary["lag_ms"]["count"] == 101 and summary["coarse_lag_samples"] == 1
    assert summary["changes_per_s"] == pytest.approx(102 / 1.5), "over the 1.5 s the recorder has existed"
    assert summary["outcomes"] == {"applied": 102, "not_newer": 1}


def test_since_returns_that_second_and_later() -> None:
    clock = FakeClock()
    rec = SeriesRecorder(clock=clock)
    for _ in range(5):
        _apply(rec, 3.0)
        clock.now += 1
    t0 = rec.snapshot()["points"][0]["t"]
    assert [p["t"] for p in rec.snapshot(since=t0 + 3.7)["points"]] == [t0 + 3, t0 + 4]
    assert rec.snapshot(since=clock.now + 10)["points"] == []


def test_retention_bounds_the_ring_and_the_summary_window() -> None:
    clock = FakeClock()
    rec = SeriesRecorder(retention_s=10, clock=clock)
    for _ in range(100):
        _apply(rec, 3.0)
        clock.now += 1
    points = rec.snapshot()["points"]
    assert len(points) == 9 and len(rec._seconds) <= 10, "only the last retention_s seconds are kept"
    clock.now += SUMMARY_WINDOW_S
    snap = rec.snapshot()
    assert snap["points"] == [] and snap["summary"]["lag_ms"] is None


def test_a_clock_step_back_adds_to_the_newest_second() -> None:
    clock = FakeClock()
    rec = SeriesRecorder(clock=clock)
    _apply(rec, 1.0)
    clock.now -= 5
    _apply(rec, 2.0)
    assert [p["events"] for p in rec.snapshot()["points"]] == [{"u": 2}]


def test_tier_stages_keep_their_first_seen_order() -> None:
    rec = SeriesRecorder(clock=FakeClock())
    _apply(rec, 1.0, tier="redis")
    _apply(rec, 1.0, tier="l3")
    assert rec.snapshot()["stages"][-2:] == [TIER_STAGE_PREFIX + "redis", TIER_STAGE_PREFIX + "l3"]


# --- consumer lag -------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class TP:
    topic: str
    partition: int


@dataclass
class FakeConsumer:
    highs: dict[TP, int | None] = field(default_factory=dict)
    broken: bool = False

    def assignment(self) -> set[TP]:
        if self.broken:
            raise RuntimeError("consumer not started")
        return set(self.highs)

    def highwater(self, tp: TP) -> int | None:
        return self.highs[tp]


@dataclass
class FakeApp:
    consumer: FakeConsumer
    started: bool = True


def test_consumer_lag_per_partition() -> None:
    app = FakeApp(FakeConsumer({TP("c", 0): 10, TP("c", 1): None, TP("c", 2): 0, TP("c", 3): 7}))
    rows = consumer_lag(app, {"c/0": 4, "c/1": 8, "c/3": 6, "old/5": 3})
    by_key = {(r["topic"], r["partition"]): r for r in rows}
    assert by_key[("c", 0)] == {
        "topic": "c",
        "partition": 0,
        "acked_offset": 4,
        "highwater": 10,
        "lag": 5,
        "assigned": True,
    }
    assert by_key[("c", 1)]["lag"] is None, "no high watermark yet"
    assert by_key[("c", 2)]["lag"] == 0, "an empty partition has no lag even before any ack"
    assert by_key[("c", 3)]["lag"] == 0
    assert by_key[("old", 5)]["assigned"] is False and by_key[("old", 5)]["lag"] is None
    assert [(r["topic"], r["partition"]) for r in rows] == sorted(by_key)


@pytest.mark.parametrize(
    "app", [FakeApp(FakeConsumer(broken=True)), FakeApp(FakeConsumer({TP("c", 0): 9}), started=False)]
)
def test_consumer_lag_when_the_consumer_is_not_running(app: FakeApp) -> None:
    rows = consumer_lag(app, {"c/0": 4})
    assert rows == [
        {"topic": "c", "partition": 0, "acked_offset": 4, "highwater": None, "lag": None, "assigned": False}
    ]


# --- the routes, on a Faust app's web server (no broker needed) -------------------------------------


class _Processor:
    def __init__(self) -> None:
        self.stats = WorkerStats()
        self.observers = Observers([self.stats])


def _serve(
    check: Callable[[TestClient, SeriesRecorder, _Processor], Any],
    *,
    with_sla: bool = False,
    progress: ConsumerProgress | None = None,
) -> None:
    async def main() -> None:
        app = faust.App("freshkey-dashboard-test", broker="kafka://127.0.0.1:9", web_enabled=True)
        processor = _Processor()
        if with_sla:

            @app.page("/freshkey/sla")
            async def sla(web: Any, request: Any) -> Any:
                return web.json({"status": "ok"})

        recorder = install_dashboard(app, processor, progress=progress)  # type: ignore[arg-type]
        async with TestClient(TestServer(app.web.web_app)) as client:  # type: ignore[attr-defined]
            await check(client, recorder, processor)

    asyncio.run(main())


def test_routes_serve_the_page_its_files_and_the_series() -> None:
    async def check(client: TestClient, recorder: SeriesRecorder, processor: _Processor) -> None:
        processor.observers.on_applied("ns", "c", 12.0, coarse=False, stages={STAGE_PLAN: 0.3})
        assert recorder in processor.observers.observers, "the recorder listens to the processor"
        page = await client.get("/dashboard")
        assert page.status == 200 and page.content_type == "text/html"
        html = await page.text()
        for name in ("dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css"):
            assert f"/dashboard/static/{name}" in html
        assert "https://" not in html.split("<footer")[0], "no CDN: everything is served by the worker"
        for name, content_type in STATIC_FILES.items():
            response = await client.get(f"/dashboard/static/{name}")
            assert response.status == 200 and response.content_type == content_type, name
            assert len(await response.read()) > 100
        assert (await client.get("/dashboard/static/series.py")).status == 404
        series = await client.get("/freshkey/api/series")
        body = await series.json()
        assert body["points"][0]["lag_ms"]["p50"] == 12.0
        assert body["routes"] == {"sla": False, "verify": False}
        assert body["consumer"] == []
        later = await client.get("/freshkey/api/series", params={"since": str(body["now"] + 60)})
        assert (await later.json())["points"] == []
        for bad in ("yesterday", "nan", "inf"):
            response = await client.get("/freshkey/api/series", params={"since": bad})
            assert response.status == 400, bad

    _serve(check)


def test_series_says_which_optional_routes_exist() -> None:
    async def check(client: TestClient, recorder: SeriesRecorder, processor: _Processor) -> None:
        body = await (await client.get("/freshkey/api/series")).json()
        assert body["routes"] == {"sla": True, "verify": False}

    _serve(check, with_sla=True)


def test_with_consumer_progress_the_card_shows_the_change_topic_and_unknown_partitions() -> None:
    clock = FakeClock()
    progress = ConsumerProgress("changes", partitions=2, clock=clock)

    async def check(client: TestClient, recorder: SeriesRecorder, processor: _Processor) -> None:
        processor.observers.on_offset("freshkey.hotness", 0, 4)  # internal topics stay out of the card
        body = await (await client.get("/freshkey/api/series")).json()
        assert [(r["topic"], r["partition"], r["state"], r["lag"]) for r in body["consumer"]] == [
            ("changes", 0, "unknown", None),
            ("changes", 1, "unknown", None),
        ], "before the group join: every partition unknown, not an empty card"
        progress.set_assignment({1})
        progress.set_high_watermarks({1: 9})
        progress.set_committed({1: 9})
        body = await (await client.get("/freshkey/api/series")).json()
        assert body["consumer"] == progress.rows()
        assert [(r["partition"], r["state"], r["lag"], r["acked_offset"]) for r in body["consumer"]] == [
            (1, "caught_up", 0, 8)
        ]

    _serve(check, progress=progress)
