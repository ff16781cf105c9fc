"""The cyclic garbage collector set for the connector's allocation pattern, for the length of a run.

The connector allocates a few container objects per row (images, events, delivery callbacks) and frees
nearly all of them by reference counting; thousands of them wait for their acknowledgement at any time.
With CPython's default thresholds (a young collection every 700 allocations, an older one every 10 of
those) the collector walked those waiting objects and everything imported, over and over: on the
multi-row backlog it cost about a fifth of the connector's main thread (``tests.benchmarks
.connector_path --modes send``). :func:`connector_gc` moves what exists before the run (modules, settings,
schemas) out of the collector's reach (``gc.freeze``) and collects the young generation every
:data:`YOUNG_THRESHOLD` allocations instead; cycles are still collected, later. The previous settings
come back when the run ends (tests run connectors in-process).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000
"""Allocations (minus deallocations) between two collections of the young generation (CPython: 700)."""
OLDER_THRESHOLDS = (20, 20)
"""Collections of one generation between two of the next (CPython: 10, 10)."""


@contextmanager
def connector_gc() -> Iterator[None]:
    """Freeze what exists now and raise the collector's thresholds until the block ends."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()
