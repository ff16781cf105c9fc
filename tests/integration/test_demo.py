"""``freshkey demo`` end to end: its own private services, a driven workload, a verified cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment mentions ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupting_the_demo_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "demo",
            "--changes",
            "100000",
            "--rate",
            "300",
            "--workdir",
            workdir,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    output = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        output.append(line)
        if "driving" in line or time.monotonic() > deadline:
            break
    assert any("driving" in line for line in output), "".join(output)
    assert _processes_mentioning(str(workdir)), "the services and the pipeline should be running now"
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(output) + rest
    assert "interrupted" in rest
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(workdir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(workdir)) == [], "something the demo started is still running"
