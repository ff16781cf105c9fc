"""``freshkey demo`` end to end: its own private services, a driven workload, a verified cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_drives_changes_and_finds_no_stale_entry(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--changes", "600", "--rate", "400", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = orjson.loads(out.read_bytes())
    assert set(figures) >= {"changes", "applied", "stale", "throughput_per_s", "lag_ms"}
    assert figures["changes"] == 600
    assert figures["stale"] == 0 and figures["missing"] == 0
    assert figures["applied"] >= 600
    assert set(figures["lag_ms"]) == {"p50", "p99", "max"}
    assert 0 < figures["lag_ms"]["p50"] <= figures["lag_ms"]["p99"] <= figures["lag_ms"]["max"]
    assert figures["verify"]["versions_checked"] and figures["verify"]["checked"] > 0
