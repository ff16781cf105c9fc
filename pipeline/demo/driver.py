"""The demo's driver: row changes of the sample table at a fixed rate, each one statement changing one row."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from pipeline.demo.machine import Pace
from pipeline.demo.stack import DATABASE, DemoError, Progress

MODALITIES = ("text", "image", "audio")


def drive(
    conn: Any,
    *,
    changes: int,
    rate: float,
    rows: int,
    seed: int,
    progress: Progress,
    check: Callable[[], None],
) -> tuple[dict[str, int], Pace]:
    """Inserts, updates and deletes at ``rate`` per second, one autocommitted statement each, each
    changing exactly one row. Returns the counts by kind and how well the rate was held."""
    rng = random.Random(seed)
    live: set[int] = set()
    table = f"{DATABASE}.assets"
    counts = {"inserts": 0, "updates": 0, "deletes": 0}
    behind = 0.0
    start = time.monotonic()
    with conn.cursor() as cur:
        for i in range(changes):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                behind = max(behind, -delay)
            row_id = rng.randrange(rows)
            if row_id not in live:
                modality = rng.choice(MODALITIES)
                kind = "inserts"
                changed = cur.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6))",
                    (row_id, modality, f"{modality} #{row_id} v0", rng.randbytes(32)),
                )
                live.add(row_id)
            elif rng.random() < 0.2:
                kind = "deletes"
                changed = cur.execute(f"DELETE FROM {table} WHERE id = %s", (row_id,))
                live.discard(row_id)
            else:
                kind = "updates"
                changed = cur.execute(
                    f"UPDATE {table} SET content = %s, embedding = %s, updated_at = UTC_TIMESTAMP(6) "
                    "WHERE id = %s",
                    (f"content of {row_id} at change {i}", rng.randbytes(32), row_id),
                )
            if changed != 1:  # the accounting counts one row event per statement
                raise DemoError(f"change {i} ({kind[:-1]} of row {row_id}) changed {changed} rows, not 1")
            counts[kind] += 1
            if i % 50 == 0 or i == changes - 1:
                progress.advance(i + 1, changes)
                check()
    elapsed = time.monotonic() - start
    # The last change is due at (changes - 1) / rate: the rate reached is over the same span.
    achieved = changes / max(elapsed, (changes - 1) / rate, 1e-9)
    return counts, Pace(target_per_s=rate, achieved_per_s=achieved, max_behind_s=behind)
