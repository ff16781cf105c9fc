"""A running freshkey pipeline (connector + worker processes) on the session's services, per test.

Every test gets its own database, topics, consumer group, Redis key prefix and checkpoint file, so
tests never see each other's data, against private or external services alike.

An integration test that fails is run once more (pytest-rerunfailures), and the summary lists it as
RERUN: these tests drive real processes and servers on a shared 2-core machine, where a deadline can be
missed by load alone. A test that fails twice fails the run; a RERUN is a flake to fix, not a pass to
ignore. Unit tests are never rerun.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService

RERUNS = 1
RERUN_REPORT_LINES = 60
RERUN_CAPTURED_LINES = 20
"""How much of each failed first attempt the summary prints: the last lines of its failure and of what it
captured (output, logs), so that a CI log says why a test needed its rerun."""

_reruns: list[pytest.TestReport] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.flaky(reruns=RERUNS, reruns_delay=2))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":  # pytest-rerunfailures' outcome of a failed attempt it runs again
        _reruns.append(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _reruns:
        return
    terminalreporter.section("why integration tests were rerun", sep="-")
    for report in _reruns:
        text = report.longreprtext.rstrip().splitlines()
        captured = [line for _, content in report.sections for line in content.rstrip().splitlines()]
        terminalreporter.write_line(f"RERUN {report.nodeid} ({report.when}):")
        crash = getattr(report.longrepr, "reprcrash", None)  # the error's own message, before any logs
        if crash is not None:
            for line in crash.message.splitlines()[:RERUN_CAPTURED_LINES]:
                terminalreporter.write_line(f"  ! {line}")
        for line in [*text[-RERUN_REPORT_LINES:], *captured[-RERUN_CAPTURED_LINES:]]:
            terminalreporter.write_line(f"    {line}")


@pytest.fixture
def make_pipeline(
    mysql_service: MySQLService, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[Callable[..., Pipeline]]:
    made: list[Pipeline] = []

    def make(
        *, version_column: bool = False, value_columns: bool = True, binding_extra: str = ""
    ) -> Pipeline:
        workdir = tmp_path / f"pipeline{len(made)}"
        workdir.mkdir()
        pipeline = Pipeline(
            mysql_service,
            kafka_bootstrap,
            redis_url,
            workdir,
            version_column=version_column,
            value_columns=value_columns,
            binding_extra=binding_extra,
        )
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        pipeline.close()
