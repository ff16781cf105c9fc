"""The worker's live dashboard: a static page on the worker's web server and the JSON it polls.

Routes, on the Faust web server (bound to ``FRESHKEY_WORKER_WEB_BIND``, 127.0.0.1 unless configured):

- ``GET /dashboard``: the page (``static/dashboard.html``); it polls the routes below every second.
- ``GET /dashboard/static/{name}``: its script and style sheet and the vendored uPlot (MIT, see
  ``static/uPlot.LICENSE``); only the files in :data:`STATIC_FILES`, nothing is fetched from a CDN.
- ``GET /freshkey/api/series?since=<unix s>``: :meth:`SeriesRecorder.snapshot` (per-second points from
  ``since`` on, a summary of the last minute, the lag figures of every window the worker reports: the
  same as ``/freshkey/stats``'s and the SLA's, all read from the one lag sketch), plus ``consumer`` (per
  partition of the change topic:
  state, acknowledged offset, high watermark, lag, age of the oldest waiting change; see
  :class:`~pipeline.observe.progress.PartitionProgress`) and ``routes`` (which optional routes this
  worker has, so the page does not poll a route that is not there).

The page also reads ``/freshkey/stats`` and, when present, ``/freshkey/sla`` and ``/freshkey/verify``;
without them it says "SLA: not configured" and "no verification yet".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from pipeline.observe.series import SeriesRecorder

if TYPE_CHECKING:
    import faust

    from pipeline.observe.progress import ConsumerProgress
    from pipeline.processor import ChangeProcessor

__all__ = ["OPTIONAL_ROUTES", "STATIC_FILES", "SeriesRecorder", "consumer_lag", "install_dashboard"]

log = logging.getLogger(__name__)

STATIC_FILES: Mapping[str, str] = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}
"""The files under ``/dashboard/static/`` and their content types (a whitelist: no path is joined)."""

OPTIONAL_ROUTES: Mapping[str, str] = {"sla": "/freshkey/sla", "verify": "/freshkey/verify"}
"""Routes other parts of freshkey may register; the series JSON says which exist."""

_NO_CACHE = {"Cache-Control": "no-cache"}


def _static(name: str) -> bytes:
    return resources.files("pipeline.web").joinpath("static", name).read_bytes()


def install_dashboard(
    app: faust.App, processor: ChangeProcessor, *, progress: ConsumerProgress | None = None
) -> SeriesRecorder:
    """Register the dashboard routes on ``app`` and a :class:`SeriesRecorder` on the processor (it reads
    the processor's lag sketch).

    ``progress``: the worker's consumer progress of the change topic; the consumer-lag card then shows
    that topic only, unknown partitions as unknown. Without it (older wiring), :func:`consumer_lag` of
    every partition the consumer holds. Returns the recorder (the worker does not need it; tests do).
    """
    series = SeriesRecorder()
    processor.observers.add(series)
    page = _static("dashboard.html").decode()
    assets = {name: _static(name) for name in STATIC_FILES}

    @app.page("/dashboard")
    async def dashboard_page(web: Any, request: Any) -> Any:
        return web.html(page, headers=dict(_NO_CACHE))

    @app.page("/dashboard/static/{name}")
    async def dashboard_static(web: Any, request: Any, name: str) -> Any:
        if name not in assets:
            return web.error(404, f"no such file: {name}")
        return web.bytes(assets[name], content_type=STATIC_FILES[name], headers=dict(_NO_CACHE))

    @app.page("/freshkey/api/series")
    async def series_api(web: Any, request: Any) -> Any:
        raw = request.query.get("since")
        since: float | None = None
        if raw:
            try:
                since = float(raw)
            except ValueError:
                since = math.nan
            if not math.isfinite(since):
                return web.error(400, f"since={raw!r}: want unix seconds")
        body = series.snapshot(since)
        body["consumer"] = (
            progress.rows() if progress is not None else consumer_lag(app, processor.stats.offsets)
        )
        body["routes"] = _routes_present(app)
        return web.json(body)

    return series


def consumer_lag(app: Any, offsets: Mapping[str, int]) -> list[dict[str, Any]]:
    """Per partition: the worker's last acknowledged offset, the broker's high watermark, the lag.

    ``offsets`` are ``{"topic/partition": last acknowledged offset}``
    (:class:`~pipeline.observe.stats.WorkerStats`). The high watermark (next offset to be written) comes
    from the consumer's last fetch; ``None`` where unknown (not assigned to this worker, not fetched yet,
    consumer not started), and then so is the lag.
    """
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for key, offset in offsets.items():
        topic, _, partition = key.rpartition("/")
        if partition.isdigit():
            rows[(topic, int(partition))] = _row(topic, int(partition), offset)
    assignment = []
    # ``app.consumer`` creates a consumer (and its thread's event loop) when there is none: ask only a
    # started app.
    if getattr(app, "started", False):
        try:
            consumer = app.consumer
            assignment = list(consumer.assignment())
        except Exception:  # consumer not running yet, or rebalancing: report what the offsets say
            assignment = []
    for tp in assignment:
        row = rows.setdefault((tp.topic, tp.partition), _row(tp.topic, tp.partition, None))
        row["assigned"] = True
        try:
            highwater = consumer.highwater(tp)
        except Exception:
            highwater = None
        if isinstance(highwater, int) and highwater >= 0:
            row["highwater"] = highwater
            acked = row["acked_offset"]
            if acked is not None:
                row["lag"] = max(0, highwater - acked - 1)
            elif highwater == 0:
                row["lag"] = 0
    return [rows[key] for key in sorted(rows)]


def _row(topic: str, partition: int, acked: int | None) -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "acked_offset": acked,
        "highwater": None,
        "lag": None,
        "assigned": False,
    }


def _routes_present(app: Any) -> dict[str, bool]:
    try:
        paths = {resource.canonical for resource in app.web.web_app.router.resources()}
    except Exception:  # another web driver: let the page find out (it tolerates a 404)
        return dict.fromkeys(OPTIONAL_ROUTES, True)
    return {name: path in paths for name, path in OPTIONAL_ROUTES.items()}
