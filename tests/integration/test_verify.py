"""``freshkey verify`` against a running pipeline: clean, stale, and in flight told apart."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from cache_writer import entry_key
from connectors.database import read_rows, read_table
from connectors.settings import MySQLSettings
from pipeline.verify.judge import Verification
from pipeline.verify.run import run_verification
from schemas import Binding, encode_value, parse_bindings
from tests.support.pipeline import Pipeline

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
    assert p.key(7) in output, "the stale entry's key is named"
    assert stale["nines"] == pytest.approx(1.48, abs=0.01)

    p.redis.hset(p.key(7), mapping={"d": b'{"stale":true}'})
    # The "change" arrives right after the verifier's first look at the entry (seen with MONITOR), inside
    # its window: seen once, fixed on the re-check: in flight, not stale.
    watching = threading.Event()

    def fix_after_first_look() -> None:
        with p.redis.monitor() as monitor:
            watching.set()
            while not monitor.next_command()["command"].startswith(f"HGETALL {p.key(7)}"):
                pass
        p.redis.hset(p.key(7), mapping=good)

    fixer = threading.Thread(target=fix_after_first_look, daemon=True)
    fixer.start()
    assert watching.wait(10)
    code, flight, output = _verify(p, tmp_path / "flight.json", "--window-ms", "3000")
    fixer.join(timeout=10)
    assert code == 0 and flight["stale"] == 0 and flight["in_flight"] == 1, output

    stats = p.stats() or {}
    assert stats, "the worker answers"
    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/freshkey/verify", timeout=5) as response:
        latest = orjson.loads(response.read())
    assert latest["in_flight"] == 1, "the worker serves the latest verification"


# --- unverifiable bindings, odd keys, tiny samples, the in-flight rule under a live heartbeat ---------------


def _verify_with(p: Pipeline, out: Path, bindings: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """``freshkey verify`` with another bindings file than the pipeline's (the pipeline never sees it)."""
    path = p.workdir / f"verify-{out.stem}.yaml"
    path.write_text(bindings)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "verify", "--json", str(out), *args],
        env={**p.env, "FRESHKEY_BINDINGS": str(path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert out.exists(), f"verify wrote no figures (exit {result.returncode}):\n{output}"
    return result.returncode, orjson.loads(out.read_bytes()), output


def _settings(p: Pipeline) -> MySQLSettings:
    """The connector's account (SELECT and the binlog position), as ``freshkey verify`` uses it."""
    return MySQLSettings(
        host=p.mysql.host, port=p.mysql.port, user=p.mysql.user, password=SecretStr(p.mysql.password)
    )


def test_unverifiable_bindings_are_reported_and_the_others_verified(
    make_pipeline: Callable[..., Pipeline], tmp_path: Path
) -> None:
    p = make_pipeline(version_column=True)
    p.start("connector")
    p.start("worker")
    for i in range(12):
        p.sql(
            f"INSERT INTO {p.database}.assets VALUES (%s, 'text', %s, NULL, UTC_TIMESTAMP(6))",
            (i, f"row {i}"),
        )
    p.sql(f"CREATE TABLE {p.database}.events (name VARCHAR(16), n INT)")  # no primary key
    p.sql(f"INSERT INTO {p.database}.events VALUES ('a', 1)")
    p.sql(f"CREATE TABLE {p.database}.labels (id INT PRIMARY KEY, label VARCHAR(16))")
    p.wait_consistent()
    bindings = (
        p.bindings_text
        + f"  - table: {p.database}.events\n    namespace: nopk_{p.prefix}\n"
        + f"  - table: {p.database}.nowhere\n    namespace: gone_{p.prefix}\n"
        + f"  - table: {p.database}.labels\n    namespace: typo_{p.prefix}\n    value_columns: [lable]\n"
    )

    code, figures, output = _verify_with(p, tmp_path / "unverifiable.json", bindings, "--window-ms", "200")

    assert code == 3, output
    assert figures["status"] == "unverifiable" and figures["stale"] == 0
    reasons = {u["namespace"]: u["reason"] for u in figures["unverifiable"]}
    assert "has no primary key: name key_columns" in reasons[f"nopk_{p.prefix}"], reasons
    assert "does not exist" in reasons[f"gone_{p.prefix}"], reasons
    assert "has no column lable" in reasons[f"typo_{p.prefix}"], reasons
    verified = [r for r in figures["reports"] if r["namespace"] == p.namespace]
    assert [(r["checked"], r["stale"], r["unverifiable"]) for r in verified] == [(12, 0, None)]
    assert figures["nines_text"] == "1.08 nines"
    assert output.count("UNVERIFIABLE") >= 3 and "has no primary key" in output, output
    with urllib.request.urlopen(f"http://127.0.0.1:{p.web_port}/freshkey/verify", timeout=5) as response:
        latest = orjson.loads(response.read())
    assert {u["namespace"] for u in latest["unverifiable"]} == set(reasons), "the worker's page says so too"


def test_a_tiny_sample_states_no_nines(make_pipeline: Callable[..., Pipeline], tmp_path: Path) -> None:
    p = make_pipeline()
    p.sql(f"INSERT INTO {p.database}.assets VALUES (1, 'text', 'solo', NULL, '2024-01-01 00:00:00')")
    (row,) = read_table(_settings(p), p.database, "assets")
    binding = parse_bindings(p.bindings_text).bindings[0]
    value = encode_value({c: row[c] for c in binding.value_columns or row})
    p.redis.hset(p.key(1), mapping={"v": "1", "c": "0", "d": value})

    code, tiny, output = _verify_with(p, tmp_path / "tiny.json", p.bindings_text, "--window-ms", "200")

    assert code == 0 and tiny["checked"] == 1 and tiny["stale"] == 0 and tiny["nines"] is None, output
    assert "0 stale of 1 (too few to state nines" in output, output


def test_keys_a_latin1_column_cannot_hold_are_rows_that_do_not_exist(
    make_pipeline: Callable[..., Pipeline], tmp_path: Path
) -> None:
    p = make_pipeline()
    p.sql(
        f"CREATE TABLE {p.database}.names (name VARCHAR(32) PRIMARY KEY, note VARCHAR(64)) "
        "CHARACTER SET latin1"
    )
    names = ["café", "b", *(f"n{i}" for i in range(10))]
    for name in names:
        p.sql(f"INSERT INTO {p.database}.names VALUES (%s, %s)", (name, f"note of {name}"))
    namespace = f"names_{p.prefix}"
    binding = Binding(table=f"{p.database}.names", namespace=namespace, value_columns=("note",))

    def plant(name: str, fields: dict[str, str | bytes]) -> str:
        key = entry_key(p.prefix, namespace, [name])
        p.redis.hset(key, mapping={"c": "0", **fields})  # type: ignore[dict-item]
        return key

    for name in names[1:]:
        plant(name, {"v": "1", "d": encode_value({"note": f"note of {name}"})})
    emoji = plant("smile \U0001f600", {"v": "1", "d": encode_value({"note": "x"})})
    upper = plant("CAFÉ", {"v": "1", "d": encode_value({"note": "note of café"})})
    wrong = plant("café", {"v": "1", "d": encode_value({"note": "an older note"})})
    plant("tomb \U0001f600", {"v": "1", "tomb": "1"})  # a tombstone: nothing to serve, nothing stale

    read = read_rows(
        _settings(p), p.database, "names", ["name"], [["smile \U0001f600"], ["CAFÉ"], ["b"], ["zz"]]
    )
    assert sorted(r["name"] for r in read) == ["b", "café"], "one odd key costs no read; CAFÉ = café here"

    bindings = (
        f"bindings:\n  - table: {binding.table}\n    namespace: {namespace}\n    value_columns: [note]\n"
    )
    code, figures, output = _verify_with(p, tmp_path / "latin1.json", bindings, "--window-ms", "200")

    assert code == 1, output
    (report,) = figures["reports"]
    assert (report["checked"], report["stale"], report["in_flight"]) == (15, 3, 0), report
    stale_keys = {e.split(": ", 2)[1] for e in report["examples"] if e.startswith("stale")}
    assert stale_keys == {emoji, upper, wrong}, report["examples"]


@pytest.mark.parametrize("version_column", [False, True], ids=["binlog-versions", "version-column"])
def test_a_heartbeat_row_through_a_live_pipeline_is_never_stale_until_the_worker_stops(
    make_pipeline: Callable[..., Pipeline], version_column: bool
) -> None:
    # Binlog versions: the floor read before the first read tells in flight from stale. Version column:
    # the row's own version at the first read does, and entries are re-read before rows (an entry newer
    # than a row read after it would be wrong).
    p = make_pipeline(version_column=version_column)
    p.start("connector")
    p.start("worker")
    for i in range(12):
        p.sql(f"INSERT INTO {p.database}.assets VALUES (%s, 'text', 'beat 0', NULL, UTC_TIMESTAMP(6))", (i,))
    p.wait_consistent()
    binding = parse_bindings(p.bindings_text).bindings[0]
    settings = _settings(p)
    stop = threading.Event()
    beats = [0]

    def heartbeat() -> None:
        conn = p.mysql.connect(p.database)
        try:
            with conn.cursor() as cur:
                while not stop.wait(0.01):
                    beats[0] += 1
                    cur.execute(
                        "UPDATE assets SET content = %s, updated_at = UTC_TIMESTAMP(6) WHERE id = 0",
                        (f"beat {beats[0]}",),
                    )
        finally:
            conn.close()

    async def verify_once() -> Verification:
        client = aioredis.Redis.from_url(p.redis_url)
        try:
            return await run_verification(
                settings, [binding], [("redis", client)], prefix=p.prefix, window_ms=1500
            )
        finally:
            await client.aclose()

    async def verify_staggered(runs: int, every_s: float) -> list[Verification]:
        """``runs`` verifications, one starting every ``every_s``: each looks at the pipeline at its own
        moment and then waits its window for its suspects while the next ones look (about
        ``runs * every_s`` plus one window in all, where one after the other takes ``runs`` windows)."""

        async def one(n: int) -> Verification:
            await asyncio.sleep(n * every_s)
            return await verify_once()

        return list(await asyncio.gather(*(one(n) for n in range(runs))))

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    try:
        first = p.entry(0)
        p.wait(
            lambda: (e := p.entry(0)) is not None and first is not None and e.version > first.version,
            30,
            "the heartbeat through the pipeline",
        )
        # 20 looks, 0.15 s apart: with the commit-to-cache lag at a few ms, 10 looks at a 20 ms heartbeat
        # all missed the row in flight once (a clean-clone run; the rerun caught it).
        runs = asyncio.run(verify_staggered(20, 0.15))
        stale = [r.to_json()["reports"][0]["examples"] for r in runs if r.stale]
        assert not stale, f"{len(stale)} of 20 runs said stale on a healthy pipeline: {stale}"
        assert sum(r.in_flight for r in runs) > 0, "the heartbeat was caught in flight (the test can tell)"

        p.stop("worker")  # the row keeps changing; the cache does not
        behind = beats[0]
        p.wait(lambda: beats[0] > behind + 5, 10, "the heartbeat to move on without the worker")
        result = asyncio.run(verify_once())
        assert result.stale == 1 and result.exit_code == 1, result.to_json()
        assert p.key(0) in result.reports[0].examples[0]
    finally:
        stop.set()
        beating.join(timeout=10)


def test_read_rows_takes_keys_in_their_json_form(make_pipeline: Callable[..., Pipeline]) -> None:
    """Binary keys come base64 (as in events and cache keys), datetimes and decimals as strings."""
    p = make_pipeline()
    p.sql(
        f"CREATE TABLE {p.database}.odd (b VARBINARY(16), t DATETIME(6), d DECIMAL(10, 2), note TEXT, "
        "PRIMARY KEY (b, t, d))"
    )
    p.sql(
        f"INSERT INTO {p.database}.odd VALUES (%s, '2024-01-02 03:04:05.000006', 12.50, 'x')", (b"\x00\xff",)
    )
    (row,) = read_table(_settings(p), p.database, "odd")
    key = [row["b"], row["t"], row["d"]]
    assert key == ["AP8=", "2024-01-02T03:04:05.000006", "12.50"]

    found = read_rows(_settings(p), p.database, "odd", ["b", "t", "d"], [key, ["not base64!", row["t"], "1"]])

    assert found == [row]
