"""Debian's chromium driven by Playwright, for the dashboard's browser tests.

Playwright's own browser download does not work on these machines (SERVICES.md); the tests drive the
system chromium instead (``FRESHKEY_CHROMIUM`` names another binary). A missing chromium or Playwright
fails the test with what to install, never a skip. :func:`watch_console` collects what the page logs as
an error, except the 404s of the optional routes, which answer 404 by design until there is something to
show ("no verification yet").
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from pipeline.web import OPTIONAL_ROUTES

CHROMIUM = os.environ.get("FRESHKEY_CHROMIUM", "/usr/bin/chromium")
INSTALL_CHROMIUM = "make system-packages-test, or apt-get update && apt-get install -y chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""How Debian's chromium runs here (SERVICES.md). Playwright adds --headless and a fresh temporary
--user-data-dir itself (it refuses one in args)."""
EXPECTED_404_PATHS = tuple(OPTIONAL_ROUTES.values())
"""Paths that answer 404 by design; Chromium logs each such response as a console error."""


def chromium() -> str:
    """The chromium binary to drive; fails the test with the install command when there is none."""
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        pytest.fail(
            f"chromium is not installed ({CHROMIUM} not found); install it with: {INSTALL_CHROMIUM}\n"
            "(or point FRESHKEY_CHROMIUM at a chromium binary)"
        )
    return path


def playwright_or_fail() -> Any:
    """``playwright.sync_api.sync_playwright``; fails the test when Playwright is not installed."""
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        pytest.fail("Playwright is not installed: pip install playwright (no `playwright install` needed)")
    return start


def watch_console(page: Any, problems: list[str]) -> None:
    """Append to ``problems`` every console error and uncaught exception of ``page``, except the
    expected 404s of :data:`EXPECTED_404_PATHS`."""

    def on_console(message: Any) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        if "status of 404" in message.text and url.endswith(EXPECTED_404_PATHS):
            return
        problems.append(f"console.error: {message.text} ({url})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
