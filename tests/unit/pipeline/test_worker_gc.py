"""The worker's collector settings (``pipeline.faust_app.freeze_gc``): what exists at start is frozen, and
the young generation is collected every ``GC_YOUNG_THRESHOLD`` allocations, the older ones as before."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pipeline.faust_app import GC_YOUNG_THRESHOLD, freeze_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    previous = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


@pytest.mark.usefixtures("restored_gc")
def test_freeze_gc_freezes_what_exists_and_raises_only_the_young_threshold() -> None:
    gc.set_threshold(700, 11, 12)
    kept = [[] for _ in range(100)]  # tracked containers that exist before the start
    freeze_gc()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 11, 12)
    assert gc.get_freeze_count() >= len(kept)


def test_the_young_threshold_spans_a_batch() -> None:
    # A batch of FRESHKEY_WORKER_BATCH_MAX (default 500) keeps about 10 containers per change alive.
    from pipeline.settings import WorkerSettings

    assert 10 * WorkerSettings().batch_max <= GC_YOUNG_THRESHOLD
