"""A running freshkey pipeline (connector + worker processes) on the session's services, per test.

Every test gets its own database, topics, consumer group, Redis key prefix and checkpoint file, so
tests never see each other's data, against private or external services alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.pipeline import Pipeline
from tests.support.services import MySQLService


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
