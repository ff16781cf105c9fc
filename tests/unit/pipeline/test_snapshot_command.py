"""``freshkey snapshot``'s display and figures, from a status row as the connector publishes it."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, TaskID

from connectors.snapshot.model import SnapshotStatus, TableProgress
from pipeline.commands.snapshot import RateColumn, _figures, _show


def status(rows: int, *, started: float = 1000.0, finished: float | None = None) -> SnapshotStatus:
    return SnapshotStatus(
        request="r1",
        status="done" if finished is not None else "running",
        tables=[
            TableProgress(
                db="d",
                table="t",
                label="assets",
                rows=rows,
                dropped=3,
                chunks=4,
                done=finished is not None,
                estimate=10_000,
            )
        ],
        chunk_rows=500,
        started_at=started,
        finished_at=finished,
    )


def test_the_rate_column_shows_the_connectors_rows_per_s() -> None:
    progress = Progress(RateColumn(), console=Console(file=None, width=80, force_terminal=False))
    tasks: dict[int, TaskID] = {}
    _show(progress, tasks, status(2_000, started=1000.0, finished=1004.0))
    task = progress.tasks[tasks[0]]
    assert task.completed == 2_000 and task.total == 2_000
    assert RateColumn().render(task).plain == "500 rows/s"


def test_a_running_snapshot_is_measured_against_the_estimate() -> None:
    progress = Progress(RateColumn(), console=Console(file=None, width=80, force_terminal=False))
    tasks: dict[int, TaskID] = {}
    _show(progress, tasks, status(2_000))
    task = progress.tasks[tasks[0]]
    assert task.completed == 2_000 and task.total == 10_000


def test_no_rate_before_anything_moved() -> None:
    progress = Progress(RateColumn(), console=Console(file=None, width=80, force_terminal=False))
    task_id = progress.add_task("assets", total=10)
    assert RateColumn().render(progress.tasks[task_id]).plain == "- rows/s"


def test_figures_count_this_runs_rows() -> None:
    figures = _figures(status(6_000, started=1000.0, finished=1010.0))
    assert figures["status"] == "done" and figures["rows"] == 6_000 and figures["seconds"] == 10.0
    assert figures["rows_per_s"] == 600.0
    assert figures["namespaces"]["assets"] == {
        "table": "d.t",
        "rows": 6_000,
        "dropped": 3,
        "chunks": 4,
        "done": True,
        "skipped": None,
    }
