"""``freshkey demo`` started as a user starts it: a subprocess whose output the test reads as it comes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from tests.support.processes import interruptible

DEMO = [sys.executable, "-m", "pipeline", "demo"]
SERVING = "change a row, then watch the dashboard"
"""The last line ``freshkey demo --serve`` prints before it serves (its URLs are above it)."""


def start_demo(args: Sequence[str], until: str, timeout_s: float = 150) -> tuple[subprocess.Popen[str], str]:
    """``freshkey demo <args>`` in a subprocess (200 columns, so rich does not wrap its tables), read up to
    the first line that contains ``until`` (or ``timeout_s``, or the end of its output); the process and
    what it printed so far. The caller stops it."""
    proc = subprocess.Popen(
        [*DEMO, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=interruptible(),  # the tests send it Ctrl-C
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        lines.append(line)
        if until in line or time.monotonic() > deadline:
            break
    return proc, "".join(lines)
