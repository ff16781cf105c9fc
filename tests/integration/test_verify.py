"""``freshkey verify`` against a running pipeline: clean, stale, and in flight told apart."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from .conftest import Pipeline

pytestmark = pytest.mark.integration


def _verify(p: Pipeline, out: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "verify", "--json", str(out), *args],
        env=p.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, orjson.loads(out.read_bytes()), result.stdout + result.stderr


def test_verify_finds_nothing_then_a_stale_entry_then_an_in_flight_one(
    make_pipeline: Callable[..., Pipeline], tmp_path: Path
) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    for i in range(30):
        p.sql(
            f"INSERT INTO {p.database}.assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))",
            (i, f"row {i}"),
        )
    p.sql(f"DELETE FROM {p.database}.assets WHERE id < 5")
    p.wait_consistent()

    code, clean, output = _verify(p, tmp_path / "clean.json", "--window-ms", "200")
    assert code == 0, output
    assert clean["stale"] == 0 and clean["in_flight"] == 0 and clean["checked"] == 30
    assert clean["nines"] == pytest.approx(1.48, abs=0.01)  # log10(30): what 30 checks can show

    good = p.redis.hgetall(p.key(7))
    p.redis.hset(p.key(7), mapping={"d": b'{"stale":true}'})
    code, stale, output = _verify(p, tmp_path / "stale.json", "--window-ms", "300")
    assert code == 1 and stale["stale"] == 1 and stale["in_flight"] == 0, output
    assert "fk" not in output or p.key(7) in output
    assert stale["nines"] == pytest.approx(1.48, abs=0.01)

    p.redis.hset(p.key(7), mapping={"d": b'{"stale":true}'})
    # The "change" arrives 4 s later: after the verifier's first look (it starts in ~2 s), inside its
    # 8 s window. Seen once, fixed on the re-check: in flight, not stale.
    fixer = threading.Timer(4.0, lambda: p.redis.hset(p.key(7), mapping=good))
    fixer.start()
    code, flight, output = _verify(p, tmp_path / "flight.json", "--window-ms", "8000")
    fixer.join()
    assert code == 0 and flight["stale"] == 0 and flight["in_flight"] == 1, output

    stats = p.stats() or {}
    assert stats, "the worker answers"
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/freshkey/verify", timeout=5) as response:
        latest = orjson.loads(response.read())
    assert latest["in_flight"] == 1, "the worker serves the latest verification"
