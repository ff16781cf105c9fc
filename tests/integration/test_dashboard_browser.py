"""The worker's dashboard in a real headless browser, against a running connector and worker.

Debian's chromium, driven by Playwright (Playwright's own browser download does not work on these
machines; ``executable_path`` points it at the system browser). The test drives changes through the
pipeline, loads ``/dashboard``, waits until the charts have drawn data (the page publishes what it drew
in ``window.__freshkey`` and in ``data-points`` attributes), checks the lag figures it shows (tiles and
SLA card, each with its window) against ``/freshkey/stats`` and ``/freshkey/sla`` read at the same moment,
shows a verification that could not judge everything as such, checks that the page logged no errors,
and saves a screenshot to ``artifacts/dashboard.png``.

A missing browser or Playwright is a failure that says what to install, never a skip: a skipped
browser test would look like a passing one.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cache_writer.layout import latest_verification_key
from pipeline.verify.judge import Verification, VerifyReport
from tests.support.browser import (
    CHROMIUM_ARGS,
    EXPECTED_404_PATHS,
    chromium,
    playwright_or_fail,
    watch_console,
)
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO_ROOT / "artifacts" / "dashboard.png"


def _get(url: str) -> tuple[int, Any]:
    """Status and JSON body (None when the body is not JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _drive_changes(p: Pipeline) -> None:
    """Inserts, updates and a delete spread over a few seconds, so several seconds have points.

    One row first, waited for: the worker is then consuming, and the lag charted is the pipeline's,
    not its start-up.
    """
    p.sql(f"INSERT INTO {p.database}.assets VALUES (0, 'text', 'warm-up', NULL, UTC_TIMESTAMP(6))")
    p.wait_consistent()
    row = 0
    for _ in range(6):
        for _ in range(5):
            row += 1
            p.sql(
                f"INSERT INTO {p.database}.assets VALUES (%s, 'text', %s, x'00ff', UTC_TIMESTAMP(6))",
                (row, f"caption {row}"),
            )
        p.sql(
            f"UPDATE {p.database}.assets SET content = CONCAT(content, ' (edited)'), "
            "updated_at = UTC_TIMESTAMP(6) WHERE id = %s",
            (row - 1,),
        )
        time.sleep(0.5)
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 1")


def _figures_at_one_moment(page: Any, base: str, p: Pipeline) -> dict[str, Any]:
    """The lag figures the page shows (tiles, SLA card) and those of ``/freshkey/stats`` and
    ``/freshkey/sla``, read when all of them end their window at the same second (retried until so)."""
    shown: dict[str, Any] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        page.wait_for_function(
            "() => __freshkey.tiles && __freshkey.tiles.p99 != null && __freshkey.slaFigures"
            " && __freshkey.slaFigures.p99 != null",
            timeout=10_000,
        )
        shown = {
            "tiles": page.evaluate("JSON.parse(JSON.stringify(__freshkey.tiles))"),
            "sla card": page.evaluate("JSON.parse(JSON.stringify(__freshkey.slaFigures))"),
            "captions": page.eval_on_selector_all(".lag-window", "els => els.map(e => e.textContent)"),
            "sla text": page.inner_text("#sla-figures"),
            "stats": (p.stats() or {})["windows"]["last_60s"]["lag_ms"],
            "stats end": (p.stats() or {})["windows"]["last_60s"]["end"],
            "sla": _get(f"{base}/freshkey/sla")[1],
        }
        ends = {
            shown["tiles"]["end"],
            shown["sla card"]["end_ms"] / 1000,
            shown["stats end"],
            shown["sla"]["window_end_ms"] / 1000,
        }
        if len(ends) == 1:
            return shown
        time.sleep(0.2)
    raise AssertionError(f"the page and the worker never read the same second: {shown}")


def test_dashboard_shows_live_data_in_a_real_browser(
    make_pipeline: Callable[..., Pipeline], record_property: Callable[[str, object], None]
) -> None:
    browser_binary = chromium()
    sync_playwright = playwright_or_fail()

    p = make_pipeline(version_column=True)  # a µs commit-time column: the lag is precise, so charted
    p.start("connector")
    p.start("worker")
    _drive_changes(p)
    p.wait_consistent()
    base = f"http://127.0.0.1:{p.web_port}"

    # The JSON behind the page.
    status, series = _get(f"{base}/freshkey/api/series")
    assert status == 200, series
    assert any(point["lag_ms"] for point in series["points"]), series
    assert series["summary"]["outcomes"].get("applied", 0) > 0, series["summary"]
    assert any(
        row["topic"] == p.change_topic
        and row["assigned"]
        and row["highwater"] is not None
        and row["lag"] == 0
        for row in series["consumer"]
    ), f"the running consumer's high watermarks: {series['consumer']}"
    status, later = _get(f"{base}/freshkey/api/series?since={series['now'] + 3600}")
    assert status == 200 and later["points"] == [], "since filters the points"
    status, error = _get(f"{base}/freshkey/api/series?since=yesterday")
    assert status == 400 and "since" in error["error"]
    status, _ = _get(f"{base}/dashboard/static/..%2Fseries.py")
    assert status == 404, "only the listed static files are served"

    console: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=browser_binary, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            unexpected_404: list[str] = []

            def on_response(response: Any) -> None:
                if response.status >= 400 and not response.url.endswith(EXPECTED_404_PATHS):
                    unexpected_404.append(f"{response.status} {response.url}")

            watch_console(page, console)
            page.on("response", on_response)
            page.goto(f"{base}/dashboard", wait_until="load")
            try:
                page.wait_for_function(
                    "() => window.__freshkey && __freshkey.lagPoints > 0 && __freshkey.stagePoints > 0"
                    " && __freshkey.outcomes.applied > 0 && __freshkey.consumerPartitions > 0",
                    timeout=30_000,
                )
                # A few more polls: the page keeps updating, and the screenshot shows settled charts.
                updates = page.evaluate("__freshkey.updates")
                page.wait_for_function(f"() => __freshkey.updates >= {updates + 2}", timeout=10_000)
                # The page and the worker's JSON, read at one moment (the same window end).
                shown = _figures_at_one_moment(page, base, p)
                verify_text = page.inner_text("#verify-body")

                # A verification that could not judge a binding and an entry, on too few entries for nines.
                unverifiable = Verification(
                    1500.0,
                    [
                        VerifyReport(p.namespace, rows=3, checked=3, unverifiable_keys=1),
                        VerifyReport("ghost", tier="all", unverifiable="table shop.ghost does not exist"),
                    ],
                )
                p.redis.set(latest_verification_key(p.prefix), json.dumps(unverifiable.to_json()))
                page.wait_for_function("() => __freshkey.verify === '2 unverifiable'", timeout=10_000)
                unverifiable_text = page.inner_text("#verify-body")
            finally:
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)
                record_property("screenshot", str(SCREENSHOT))
                print(f"\ndashboard screenshot: {SCREENSHOT}")
            drawn = page.evaluate("JSON.parse(JSON.stringify(window.__freshkey))")
            points = page.eval_on_selector_all(
                ".chart", "els => Object.fromEntries(els.map(e => [e.id, Number(e.dataset.points)]))"
            )
            canvases = page.eval_on_selector_all(".chart canvas", "els => els.length")
            empty_lag = page.is_visible("#chart-lag .empty")
            sla_badge = page.inner_text("#sla-badge")
            consumer_text = page.inner_text("#consumer-body")
            legend = page.inner_text("#chart-lag .u-legend")
        finally:
            browser.close()

    context = f"(screenshot: {SCREENSHOT}; window.__freshkey = {drawn})"
    assert drawn["lagPoints"] > 0 and points["chart-lag"] > 0, context
    assert points["chart-stages"] > 0 and points["chart-outcomes"] > 0, context
    assert drawn["outcomes"]["applied"] > 0, context
    assert drawn["outcomes"]["tombstoned"] > 0, f"the delete shows as a tombstone {context}"
    assert canvases >= 3, f"uPlot drew {canvases} canvases {context}"
    assert not empty_lag, f"the lag chart still says 'waiting for data' {context}"
    for series_name in ("p50", "p99", "max"):
        assert series_name in legend, f"lag legend lacks {series_name}: {legend!r}"
    assert sla_badge.startswith("SLA: ") and sla_badge != "SLA: …", sla_badge
    assert drawn["sla"] in ("ok", "violated", "no data", "not configured"), context
    assert "no verification yet" in verify_text, verify_text
    assert "ghost: table shop.ghost does not exist" in unverifiable_text, unverifiable_text
    assert "0 stale of 3 (too few to state nines" in unverifiable_text, unverifiable_text
    assert "0.00 nines" not in unverifiable_text, unverifiable_text

    # One figure per window, the same on the page, the stats page and the SLA state.
    tiles, sla_figures, window, sla_now = (shown[k] for k in ("tiles", "sla card", "stats", "sla"))
    assert tiles["window_s"] == 60 and sla_figures["window_s"] == 60, shown
    assert all(c.startswith("last 60 s to ") for c in shown["captions"]), shown["captions"]
    assert "last 60 s to " in shown["sla text"], shown["sla text"]
    for name in ("p50", "p99", "max"):
        assert tiles[name] == sla_figures[name] == window[name] == sla_now[f"{name}_ms"], (name, shown)
    assert window["samples"] == sla_now["samples"] > 0, shown
    assert str(p.change_topic) in consumer_text, consumer_text
    assert drawn["lastError"] is None, context
    assert not console, "the page logged errors:\n" + "\n".join(console)
    assert not unexpected_404, f"failed requests: {unexpected_404}"
