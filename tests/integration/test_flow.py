"""The whole flow on real services: MySQL/MariaDB binlog -> Kafka -> Faust worker -> Redis."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from schemas import binlog_version

from .conftest import Pipeline
from .kafka_tools import read_topic

pytestmark = pytest.mark.integration

POS_MASK = (1 << 32) - 1


def _pos_of(version: int) -> int:
    return (version >> 16) & POS_MASK


def test_inserts_updates_deletes_reach_redis_with_values_and_binlog_versions(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    p.start("connector")
    p.start("worker")
    file0, pos0 = p.master_position()
    p.sql(
        f"INSERT INTO {p.database}.assets VALUES "
        "(1, 'text', 'a cat', x'00ff', '2026-01-01 00:00:00.000001'),"
        "(2, 'image', 'png bytes', NULL, '2026-01-01 00:00:00.000002'),"
        "(3, 'audio', 'wav', x'01', '2026-01-01 00:00:00.000003')"
    )
    _, pos1 = p.master_position()
    p.sql(f"UPDATE {p.database}.assets SET content = 'a black cat' WHERE id = 1")
    _, pos2 = p.master_position()
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 2")
    file3, pos3 = p.master_position()
    assert file0 == file3, "binlog rotated during the test"

    report = p.wait_consistent()
    assert report.rows == 2 and report.stale == 0 and report.missing == 0

    one, two, three = p.entry(1), p.entry(2), p.entry(3)
    assert one is not None and two is not None and three is not None
    assert (
        one.value == b'{"content":"a black cat","embedding":"AP8=","modality":"text",'
        b'"updated_at":"2026-01-01T00:00:00.000001"}'
    )
    assert pos1 < _pos_of(one.version) < pos2, "the update's version comes from its binlog position"
    assert two.tombstone and pos2 < _pos_of(two.version) < pos3, (
        "the delete left a tombstone with its version"
    )
    assert pos0 < _pos_of(three.version) < pos1
    assert three.version == binlog_version(file0, _pos_of(three.version), 2), "third row of the insert event"
    assert p.redis.pttl(p.key(2)) > 0, "tombstones expire"
    assert p.redis.pttl(p.key(1)) == -1, "live entries have no TTL by default"


def _resend(p: Pipeline, messages: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": p.kafka})
    for key, value in messages:
        producer.produce(p.change_topic, key=key, value=value)
    assert producer.flush(10) == 0


def _refused(p: Pipeline) -> int:
    """Changes that did not move L2: refused as not newer, or superseded by a newer one in their batch."""
    events = (p.stats() or {}).get("events", {})
    return int(events.get("change_not_newer", 0)) + int(events.get("change_superseded", 0))


def test_replayed_and_reordered_older_events_are_rejected_and_tombstones_hold(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    p.start("connector")
    p.start("worker")
    p.sql(f"INSERT INTO {p.database}.assets VALUES (1, 'text', 'v1', NULL, UTC_TIMESTAMP(6))")
    p.sql(f"UPDATE {p.database}.assets SET content = 'v2' WHERE id = 1")
    p.sql(f"INSERT INTO {p.database}.assets VALUES (2, 'text', 'doomed', NULL, UTC_TIMESTAMP(6))")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 2")
    p.wait_consistent()
    newest = p.entry(1)
    tomb = p.entry(2)
    assert newest is not None and tomb is not None and tomb.tombstone

    history = read_topic(p.kafka, p.change_topic, expect=4)
    insert_1, update_1, insert_2, delete_2 = history
    refused_before = _refused(p)
    # Replays (the same events again) and reordering (older after newer), including the insert that the
    # tombstone of row 2 must keep out.
    _resend(p, [update_1, insert_1, insert_2, delete_2, insert_2])
    p.wait(lambda: _refused(p) >= refused_before + 5, 30, "the worker to reject the replays")

    assert p.entry(1) == newest, "an older or replayed write replaced a newer entry"
    assert p.entry(2) == tomb, "a late older write came back through a tombstone"
    assert p.verify().stale == 0


def test_malformed_messages_go_to_the_dead_letter_topic_and_the_worker_goes_on(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    p.start("connector")
    p.start("worker")
    bad = [
        (b"k1", b"\x00\x01 not json"),
        (b"k2", b'{"kind": "change", "op": "x"}'),
        (b"k3", b'{"kind": "unknown"}'),
    ]
    _resend(p, bad)
    p.sql(f"INSERT INTO {p.database}.assets VALUES (7, 'text', 'after the junk', NULL, UTC_TIMESTAMP(6))")
    p.wait_consistent()
    p.wait(lambda: (p.stats() or {}).get("events", {}).get("dead_lettered", 0) >= 3, 30, "dead letters")
    letters = read_topic(p.kafka, p.dead_letter_topic, expect=3)
    import base64

    import orjson

    decoded = [orjson.loads(value) for _, value in letters]
    originals = {base64.b64decode(d["original_b64"]) for d in decoded}
    assert originals == {value for _, value in bad}, "dead letters keep the original bytes"
    assert all(d["reason"] and d["stage"] == "decode" for d in decoded)
    assert any("op" in d["reason"] for d in decoded), "the reason names the offending field"
    assert p.procs["worker"].poll() is None, "the worker is still running"
    started = time.monotonic()
    p.sql(f"UPDATE {p.database}.assets SET content = 'still flowing' WHERE id = 7")
    p.wait_consistent()
    assert time.monotonic() - started < 30


def test_an_l3_tier_gets_every_change_and_rejects_replays_like_l2(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    import redis as redis_lib

    from cache_writer.entries import parse_entry

    p = make_pipeline(version_column=True)
    l3_url = p.redis_url.rsplit("/", 1)[0] + "/1"  # another logical database stands in for a second Redis
    l3 = redis_lib.Redis.from_url(l3_url)
    p.start("connector")
    p.start("worker", FRESHKEY_REDIS_L3_URL=l3_url, FRESHKEY_REDIS_L3_ENTRY_TTL_S="3600")
    p.sql(f"INSERT INTO {p.database}.assets VALUES (1, 'text', 'v1', NULL, UTC_TIMESTAMP(6))")
    p.sql(f"UPDATE {p.database}.assets SET content = 'v2', updated_at = UTC_TIMESTAMP(6) WHERE id = 1")
    p.sql(f"INSERT INTO {p.database}.assets VALUES (2, 'text', 'doomed', NULL, UTC_TIMESTAMP(6))")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 2")
    p.wait_consistent()
    p.wait(lambda: l3.exists(p.key(1)) and l3.hget(p.key(2), "tomb") == b"1", 30, "L3 to catch up")
    l2_one, l3_one = p.entry(1), parse_entry(p.key(1), l3.hgetall(p.key(1)))  # type: ignore[arg-type]
    assert l3_one is not None and l2_one is not None
    assert (l3_one.version, l3_one.value) == (l2_one.version, l2_one.value)
    assert 0 < l3.pttl(p.key(1)) <= 3_600_000, "L3 entries carry their own, longer TTL"

    history = read_topic(p.kafka, p.change_topic, expect=4)
    refused_before = _refused(p)
    _resend(p, list(reversed(history)))
    p.wait(lambda: _refused(p) >= refused_before + 4, 30, "the replays to be rejected in L2")
    stats = p.stats() or {}
    # One action per key reaches the tiers (the newest of the batch), and L3 refuses it like L2.
    assert stats["outcomes"].get("redis-l3:not_newer", 0) >= 2, stats["outcomes"]
    assert parse_entry(p.key(1), l3.hgetall(p.key(1))) == l3_one  # type: ignore[arg-type]
    assert l3.hget(p.key(2), "tomb") == b"1"
    for key in l3.scan_iter(f"{p.prefix}:*"):
        l3.delete(key)
    l3.close()
