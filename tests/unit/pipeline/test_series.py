"""The dashboard's time series (pipeline/observe/series.py) and its routes, without a broker."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from pipeline.observe import (
    STAGE_PLAN,
    STAGE_SOURCE,
    STAGE_TRANSPORT,
    TIER_STAGE_PREFIX,
    BatchReport,
    Observers,
    Repeated,
)
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.series import SUMMARY_WINDOW_S, SeriesRecorder
from pipeline.observe.sketch import GROWTH, LagSketch
from pipeline.observe.stats import WorkerStats
from pipeline.web import STATIC_FILES, consumer_lag, install_dashboard
from tests.support.fakes import Clock, nearest_rank

T0 = 1_700_000_000.0


def recorder(clock: Clock, retention_s: int = 900) -> tuple[SeriesRecorder, Observers]:
    rec = SeriesRecorder(retention_s=retention_s, clock=clock)
    return rec, Observers([rec], sketch=LagSketch(clock=clock))


def _apply(
    observers: Observers, clock: Clock, lags: list[float], *, coarse: bool = False, tier: str = "redis"
) -> None:
    """One batch of updates applied now, each with its lag."""
    n = len(lags)
    values = np.array(lags)
    observers.on_batch(
        BatchReport(
            at=clock(),
            events={"u": n},
            outcomes={(tier, "ns", "applied"): n},
            lags={} if coarse else {"ns": values},
            coarse_lags={"ns": values} if coarse else {},
            stages={
                TIER_STAGE_PREFIX + tier: Repeated(1.0, n),
                STAGE_PLAN: Repeated(0.2, n),
                STAGE_TRANSPORT: values / 2,
                STAGE_SOURCE: Repeated(0.5, n),
            },
        )
    )


def test_points_per_second_with_percentiles_counts_and_stages() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock)
    lags = [float(i) for i in range(1, 101)]
    _apply(observers, clock, lags)
    _apply(observers, clock, [5000.0], coarse=True)
    observers.on_batch(BatchReport(at=clock(), outcomes={("redis", "ns", "not_newer"): 1}))
    clock.now += 1
    _apply(observers, clock, [7.0])
    clock.now += 0.5
    snap = rec.snapshot()
    first, second = snap["points"]
    assert second["t"] == first["t"] + 1
    assert first["events"] == {"u": 101} and first["outcomes"] == {"applied": 101, "not_newer": 1}
    assert first["coarse_lag_samples"] == 1, "a coarse lag is counted, not charted"
    lag = first["lag_ms"]
    assert lag["samples"] == 100 and lag["max"] == 100.0 and lag["window_s"] == 1
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        exact = nearest_rank(lags, q)
        assert exact <= lag[name] < exact * GROWTH, name
    assert snap["stages"] == [STAGE_SOURCE, STAGE_TRANSPORT, STAGE_PLAN, TIER_STAGE_PREFIX + "redis"]
    assert set(first["stages_ms"][STAGE_PLAN]) == {"window_s", "samples", "p50", "p99", "max"}
    assert second["lag_ms"]["p99"] == 7.0, "the second still filling is charted as it stands"
    summary = snap["summary"]
    assert summary["window_s"] == SUMMARY_WINDOW_S and summary["end"] == T0 + 1
    assert summary["lag_ms"]["samples"] == 100, "the summary's window is whole seconds: not the current one"
    assert summary["coarse_lag_samples"] == 1
    assert summary["changes_per_s"] == pytest.approx(101 / 1.0), "over the 1 s the recorder has covered"
    assert summary["outcomes"] == {"applied": 101, "not_newer": 1}
    assert snap["windows"]["last_60s"]["lag_ms"] == {
        k: v for k, v in summary["lag_ms"].items() if k != "p95"
    }, "the summary and the window of the same length give the same figures"


def test_a_finished_second_is_computed_once() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock)
    _apply(observers, clock, [3.0])
    clock.now += 1
    first = rec.snapshot()["points"][0]
    assert rec.snapshot()["points"][0] is first, "served from the finished seconds"


def test_since_returns_that_second_and_later() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock)
    for _ in range(5):
        _apply(observers, clock, [3.0])
        clock.now += 1
    t0 = rec.snapshot()["points"][0]["t"]
    assert [p["t"] for p in rec.snapshot(since=t0 + 3.7)["points"]] == [t0 + 3, t0 + 4]
    assert rec.snapshot(since=clock.now + 10)["points"] == []


def test_retention_bounds_the_ring_and_the_summary_window() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock, retention_s=10)
    for _ in range(100):
        _apply(observers, clock, [3.0])
        clock.now += 1
    points = rec.snapshot()["points"]
    assert len(points) == 9 and len(rec._counts) <= 10, "only the last retention_s seconds are kept"
    clock.now += SUMMARY_WINDOW_S
    snap = rec.snapshot()
    assert snap["points"] == [] and snap["summary"]["lag_ms"] is None


def test_a_clock_step_back_adds_to_the_newest_second() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock)
    _apply(observers, clock, [1.0])
    clock.now -= 5
    _apply(observers, clock, [2.0])
    assert [p["events"] for p in rec.snapshot()["points"]] == [{"u": 2}]


def test_tier_stages_keep_their_first_seen_order() -> None:
    clock = Clock(T0)
    rec, observers = recorder(clock)
    _apply(observers, clock, [1.0], tier="redis")
    _apply(observers, clock, [1.0], tier="l3")
    assert rec.snapshot()["stages"][-2:] == [TIER_STAGE_PREFIX + "redis", TIER_STAGE_PREFIX + "l3"]


@pytest.mark.parametrize("seed", [1, 2])
def test_points_agree_with_the_sketch_bound_on_a_realistic_distribution(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(math.log(20), 1.2) for _ in range(5000)]
    clock = Clock(T0)
    rec, observers = recorder(clock)
    _apply(observers, clock, values)
    clock.now += 1
    lag = rec.snapshot()["points"][0]["lag_ms"]
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        exact = nearest_rank(values, q)
        assert exact <= lag[name] < exact * GROWTH


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
        processor.observers.on_batch(
            BatchReport(
                at=recorder.sketch.clock(),
                lags={"ns": np.array([12.0])},
                stages={STAGE_PLAN: Repeated(0.3, 1)},
            )
        )
        assert recorder in processor.observers.observers, "the recorder listens to the processor"
        assert recorder.sketch is processor.observers.sketch is processor.stats.sketch, "one sketch"
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
    clock = Clock(T0)
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
