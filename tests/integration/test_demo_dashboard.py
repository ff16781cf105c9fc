"""The dashboard of a running ``freshkey demo --serve``, in a real headless browser.

The demo runs as a user starts it (a subprocess, its own private services and free ports) and keeps its
stack up after the run; the test loads the dashboard URL the demo printed, with Debian's chromium driven
by Playwright (as tests/integration/test_dashboard_browser.py does), and checks what the page shows:

- the counters (applied, tombstoned, refused as not newer, dead-lettered) equal those of the
  ``/freshkey/stats`` answer the page rendered (every JSON answer the page gets is recorded on its way
  in; a render is matched to its answer by the page's update count);
- the SLA badge and every target's status equal those of the ``/freshkey/sla`` answer it rendered, and
  the heartbeat target has data (heartbeats are on in the demo);
- the lag tiles and the SLA card show, for one window end, the figures ``/freshkey/stats`` and
  ``/freshkey/sla`` give when read directly at that moment;
- the demo's own summary ("accounted for N of N") is no more than the worker's counts now;

and saves a screenshot to ``artifacts/dashboard-demo.png``. The page's figures are read from the DOM
(parsed back into numbers) and from ``window.__freshkey`` (what it drew); see pipeline/web/static/
dashboard.js for the JSON fields behind each. A missing browser or Playwright is a failure that says
what to install, never a skip.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import CHROMIUM_ARGS, chromium, playwright_or_fail, watch_console
from tests.support.demo import SERVING, start_demo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO_ROOT / "artifacts" / "dashboard-demo.png"
COUNTER_TILES = {"t-applied": "applied", "t-tombstoned": "tombstoned", "t-not-newer": "not_newer"}
"""Tile id -> the outcome whose total over every ``tier:outcome`` of ``/freshkey/stats`` it shows."""


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _number(text: str) -> float:
    """A figure as the page prints it, back to a number: ``1,234``, ``12.3k``, ``1.76 s`` (in ms)."""
    match = re.fullmatch(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*(k|M|ms|s)?\s*", text)
    assert match, f"not a figure: {text!r}"
    value = float(match[1].replace(",", ""))
    return value * {"k": 1e3, "M": 1e6, "s": 1e3}.get(match[2] or "", 1)


def _close(shown: float, exact: float) -> bool:
    """Equal up to the page's rounding (3 significant digits at least, or 0.001 ms)."""
    return abs(shown - exact) <= max(0.0051 * abs(exact), 0.001)


class _Recorder:
    """Every JSON answer the page gets from the worker, by path, in the order it got them (Playwright
    runs the route handlers on the test's thread, while it waits on the page)."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[Any]] = {}

    def handler(self, path: str) -> Callable[[Any], None]:
        def handle(route: Any) -> None:
            response = route.fetch()
            if response.status == 200:
                self.bodies.setdefault(path, []).append(json.loads(response.body()))
            route.fulfill(response=response)

        return handle

    def count(self, path: str) -> int:
        return len(self.bodies.get(path, []))

    def last(self, path: str) -> Any:
        return self.bodies[path][-1]


DRAWN = """() => window.__freshkey && __freshkey.lagPoints > 0 && __freshkey.outcomes.applied > 0
  && __freshkey.tiles && __freshkey.tiles.p99 != null && __freshkey.slaFigures
  && __freshkey.sla && __freshkey.sla !== 'not configured'"""
HEARTBEAT_JUDGED = "() => __freshkey.slaTargets.heartbeat && __freshkey.slaTargets.heartbeat !== 'no_data'"
READ_COUNTERS = """() => ({
  tiles: Object.fromEntries(["t-applied", "t-tombstoned", "t-not-newer", "t-dead"].map(
    (id) => [id, document.getElementById(id).innerText])),
  slaBadge: document.getElementById("sla-badge").innerText,
  targets: JSON.parse(JSON.stringify(__freshkey.slaTargets)),
  updates: __freshkey.updates,
  lastError: __freshkey.lastError,
})"""


def _rendered(page: Any, recorder: _Recorder) -> dict[str, Any]:
    """The counters and SLA states the page shows, with the /freshkey/stats and /freshkey/sla answers it
    rendered them from. Each poll fetches both (in parallel), then renders once and counts the update:
    when the page's update count equals the answers recorded, before and after the read, the page
    shows the last ones."""
    paths = ("/freshkey/stats", "/freshkey/sla")
    shown: dict[str, Any] = {}
    for _ in range(100):
        counts = tuple(recorder.count(p) for p in paths)
        shown = page.evaluate(READ_COUNTERS)
        updates = page.evaluate("__freshkey.updates")
        settled = tuple(recorder.count(p) for p in paths)
        if counts == settled and shown["updates"] == updates == counts[0] == counts[1]:
            return {**shown, "stats": recorder.last(paths[0]), "sla": recorder.last(paths[1])}
        page.wait_for_timeout(50)  # not time.sleep: the page's requests wait on this thread's routes
    raise AssertionError(f"the page never showed its last answers ({counts} answers): {shown}")


def _lag_at_one_moment(page: Any, base: str) -> dict[str, Any]:
    """The tiles' and the SLA card's lag figures and those of /freshkey/stats and /freshkey/sla read
    directly, when all end their window at the same second (retried until so)."""
    shown: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shown = page.evaluate(
            """() => ({
              tiles: JSON.parse(JSON.stringify(__freshkey.tiles)),
              "tile text": Object.fromEntries(["p50", "p99", "max"].map(
                (k) => [k, document.getElementById("t-" + k).innerText])),
              "sla card": JSON.parse(JSON.stringify(__freshkey.slaFigures)),
            })"""
        )
        window_s = shown["tiles"]["window_s"]
        stats = _get_json(f"{base}/freshkey/stats")["windows"][f"last_{window_s}s"]
        sla = _get_json(f"{base}/freshkey/sla")
        shown |= {"stats": stats, "sla": sla}
        ends = {
            shown["tiles"]["end"],
            shown["sla card"]["end_ms"] / 1000,
            stats["end"],
            sla["window_end_ms"] / 1000,
        }
        if len(ends) == 1:
            return shown
        page.wait_for_timeout(200)
    raise AssertionError(f"the page and the worker never read the same second: {shown}")


def test_the_demo_dashboard_shows_what_the_worker_says(tmp_path: Path) -> None:
    browser_binary = chromium()
    sync_playwright = playwright_or_fail()

    workdir = tmp_path / "demo"
    proc, printed = start_demo(
        ["--changes", "300", "--rate", "300", "--serve", "--workdir", str(workdir)], until=SERVING
    )
    console: list[str] = []
    try:
        assert "The stack stays up" in printed, printed
        dashboard = re.search(r"^  dashboard +(http://\S+/dashboard)", printed, re.M)
        assert dashboard, printed
        base = dashboard[1].removesuffix("/dashboard")
        accounted = re.search(r"accounted for +([\d,]+) of ([\d,]+)", printed)
        assert accounted and accounted[1] == accounted[2], printed

        recorder = _Recorder()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=browser_binary, headless=True, args=CHROMIUM_ARGS
            )
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                for path in ("/freshkey/stats", "/freshkey/sla", "/freshkey/api/series"):
                    page.route(f"**{path}*", recorder.handler(path))

                watch_console(page, console)
                page.goto(dashboard[1], wait_until="load")
                try:
                    page.wait_for_function(DRAWN, timeout=30_000)
                    # The heartbeat prober runs while the demo serves: the SLA's heartbeat target gets data.
                    page.wait_for_function(HEARTBEAT_JUDGED, timeout=30_000)
                    counters = _rendered(page, recorder)
                    page.unroute_all()  # from here on the page polls the worker directly
                    lag = _lag_at_one_moment(page, base)
                    now = _get_json(f"{base}/freshkey/stats")
                finally:
                    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SCREENSHOT), full_page=True)
                    print(f"\ndemo dashboard screenshot: {SCREENSHOT}")
                drawn = page.evaluate("JSON.parse(JSON.stringify(window.__freshkey))")
            finally:
                browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, printed + rest

    context = f"(screenshot: {SCREENSHOT}; window.__freshkey = {drawn})"
    # The counters: the /freshkey/stats answer the page rendered.
    stats = counters["stats"]
    totals = {"applied": 0, "tombstoned": 0, "not_newer": 0}
    for key, n in stats["outcomes"].items():
        outcome = key.rpartition(":")[2]
        if outcome in totals:
            totals[outcome] += n
    for tile, outcome in COUNTER_TILES.items():
        assert _close(_number(counters["tiles"][tile]), totals[outcome]), (tile, counters, context)
    assert totals["applied"] > 0 and totals["tombstoned"] > 0, (
        f"the demo deletes rows too {stats['outcomes']}"
    )
    assert _number(counters["tiles"]["t-dead"]) == stats["events"].get("dead_lettered", 0), counters

    # The SLA: the /freshkey/sla answer the page rendered.
    sla = counters["sla"]
    shown_status = {"ok": "ok", "violated": "violated", "no data": "no_data"}
    assert shown_status[counters["slaBadge"].removeprefix("SLA: ")] == sla["status"], (counters, sla)
    assert counters["targets"] == {t["name"]: t["status"] for t in sla["targets"]}, (counters, sla)
    assert counters["targets"]["heartbeat"] in ("ok", "violated"), "heartbeats are on in the demo"

    # The lag figures at one moment: tiles, SLA card, /freshkey/stats and /freshkey/sla read directly.
    tiles, card, window, sla_now = (lag[k] for k in ("tiles", "sla card", "stats", "sla"))
    assert tiles["window_s"] == card["window_s"] == sla_now["evaluation_window_s"], lag
    for name in ("p50", "p99", "max"):
        assert tiles[name] == card[name] == window["lag_ms"][name] == sla_now[f"{name}_ms"], (name, lag)
        assert _close(_number(lag["tile text"][name]), tiles[name]), (name, lag["tile text"], tiles)

    # The demo's summary, printed before it served, is behind the worker's counts now (heartbeats go on).
    events = now["events"]
    seen = sum(events.get(k, 0) for k in ("change_applied", "change_superseded", "change_not_newer"))
    seen += events.get("dead_lettered", 0) + events.get("unbound", 0)
    assert int(accounted[1].replace(",", "")) <= seen, (accounted[0], events)

    assert drawn["lastError"] is None, context
    assert not console, "the page logged errors:\n" + "\n".join(console)
    assert "stopped: everything the demo started has been stopped." in rest, rest
