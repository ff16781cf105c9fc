"""connectors.sending: what each item becomes on Kafka, and no item stopping the connector by its size
(the size check, the stand-ins, a refusal by the broker handled the same way), without a broker."""

from __future__ import annotations

import gc
import hashlib
import logging
import types
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from connectors.checkpoint import BinlogPosition, CheckpointTracker
from connectors.exceptions import ConfigurationError
from connectors.kafka.limit import MessageLimit
from connectors.kafka.settings import KafkaSettings
from connectors.metrics import ConnectorMetrics, ConnectorStats
from connectors.sending import DDL_QUERY_CHARS, ModelUpdateMessage, Sender
from schemas import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, Source, decode, encode, message_key
from schemas.codec import dead_letter
from schemas.model_updates import ModelUpdate

LIMIT = 100_000
KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", max_message_bytes=LIMIT, dead_letter_max_original_bytes=50_000)
SOURCE = Source(
    server_id=1, file="binlog.000007", pos=900, ts_ms=1_700_000_000_000, db="shop", table="assets"
)


def change(content: str, *, row_id: int = 42, op: str = "u", table: str = "assets") -> ChangeEvent:
    row = {"id": row_id, "content": content}
    return ChangeEvent(
        event_id=f"1:binlog.000007:900:{row_id}",
        op=op,  # type: ignore[arg-type]
        key={"id": row_id},
        before=row if op in ("u", "d") else None,
        after=row if op in ("c", "u") else None,
        source=SOURCE.model_copy(update={"table": table}),
        ts_ms=1_700_000_000_500,
        version=7 << 48 | 900 << 16,
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
    )


class StubProducer:
    """Records what the sender produces; ``refuse`` makes it answer too-large like the broker would."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.partitions: list[int | None] = []
        self.callbacks: list[Callable[[], None]] = []
        self.refusals: list[Callable[[bytes, bytes], None] | None] = []
        self.refuse = 0

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivered: Callable[[], None],
        *,
        on_too_large: Callable[[bytes, bytes], None] | None = None,
        partition: int | None = None,
    ) -> None:
        if len(key) + len(value) > self.refuse > 0 and on_too_large is not None:
            on_too_large(key, value)
            return
        self.refusals.append(on_too_large)
        self.sent.append((topic, key, value))
        self.partitions.append(partition)
        self.callbacks.append(on_delivered)


def make_sender(meter_reader: InMemoryMetricReader | None = None) -> tuple[Sender, StubProducer]:
    provider = MeterProvider(metric_readers=[meter_reader] if meter_reader is not None else [])
    stub = StubProducer()
    sender = Sender(
        KAFKA,
        MessageLimit(LIMIT),
        CheckpointTracker(BinlogPosition("binlog.000007", 4)),
        stub,
        stats=ConnectorStats(),
        metrics=ConnectorMetrics(provider.get_meter("test")),
    )
    return sender, stub


# --- messages ------------------------------------------------------------------------------------------


def test_each_item_goes_to_its_topic_with_its_key() -> None:
    sender, _ = make_sender()
    event = change("x")
    assert sender.message(event) == (
        KAFKA.change_topic,
        message_key("shop", "assets", {"id": 42}),
        encode(event),
    )
    ddl = DdlEvent(
        event_id="1:b.7:1000:ddl", source=SOURCE.model_copy(update={"table": "*"}), query="ALTER", ts_ms=1
    )
    assert sender.message(ddl) == (KAFKA.change_topic, b"ddl/shop", encode(ddl))
    letter = dead_letter("bad", b"raw", stage="connector")
    assert sender.message(letter) == (KAFKA.dead_letter_topic, b"connector", encode(letter))


def test_a_fence_event_goes_to_every_partition_of_the_change_topic_and_holds_the_checkpoint() -> None:
    sender, stub = make_sender()
    fence = FenceEvent(event_id="1:binlog.000007:900:fence", source=SOURCE, reason="ValueError: x", ts_ms=1)
    sender.send(change("a", row_id=1))
    sender.send(fence)
    assert stub.partitions == [None, *range(KAFKA.partitions)]
    assert {m for m in stub.sent[1:]} == {(KAFKA.change_topic, b"fence/shop/assets", encode(fence))}
    assert decode(stub.sent[1][2]) == fence
    sender.tracker.boundary(BinlogPosition("binlog.000007", 1000))
    assert sender.tracker.outstanding == 1 + KAFKA.partitions
    for acknowledge in stub.callbacks[:-1]:
        acknowledge()
    assert sender.tracker.committed.pos == 4, "one copy is not acknowledged yet"
    stub.callbacks[-1]()
    assert sender.tracker.committed.pos == 1000


def test_every_message_holds_the_checkpoint_until_kafka_acknowledges_it() -> None:
    sender, stub = make_sender()
    sender.send(change("a", row_id=1))
    sender.send(change("b", row_id=2))
    sender.tracker.boundary(BinlogPosition("binlog.000007", 1000))
    assert sender.tracker.outstanding == 2 and sender.tracker.committed.pos == 4
    stub.callbacks[1]()
    assert sender.tracker.committed.pos == 4, "the first is not acknowledged yet"
    stub.callbacks[0]()
    assert sender.tracker.committed.pos == 1000


# --- oversize ------------------------------------------------------------------------------------------


def test_an_oversized_change_is_sent_as_an_invalidation_with_the_same_identity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender, stub = make_sender()
    secret = "row-value-" + "x" * (2 * LIMIT)
    event = change(secret)
    with caplog.at_level(logging.WARNING, logger="connectors.sending"):
        sender.send(event)
    assert len(stub.sent) == 1
    topic, key, value = stub.sent[0]
    assert topic == KAFKA.change_topic
    assert key == message_key("shop", "assets", {"id": 42}), "same key: same partition, same order"
    sent = decode(value)
    assert isinstance(sent, ChangeEvent)
    assert sent.oversize is True and sent.before is None and sent.after is None
    assert (sent.event_id, sent.op, sent.key, sent.version, sent.source) == (
        event.event_id,
        event.op,
        event.key,
        event.version,
        event.source,
    )
    assert len(value) < 2000
    assert sender.stats.oversize == 1
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "shop.assets" in logged and "{'id': 42}" in logged and "invalidation" in logged
    assert "row-value-" not in logged, "the row's values are never logged"
    # The stand-in acknowledges the original's event number: the checkpoint waits for it.
    assert sender.tracker.outstanding == 1
    stub.callbacks[0]()
    assert sender.tracker.outstanding == 0


def test_a_change_under_the_limit_is_sent_whole() -> None:
    sender, stub = make_sender()
    event = change("y" * (LIMIT // 4))  # before and after: twice that
    sender.send(event)
    assert stub.sent[0][2] == encode(event)
    assert sender.stats.oversize == 0


def test_without_the_size_check_the_event_goes_to_kafka_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Protection off: the oversized event reaches the producer as it is (librdkafka then refuses it)."""
    sender, stub = make_sender()
    monkeypatch.setattr(sender.limit, "fits", lambda key, value: True)
    sender.send(change("x" * (2 * LIMIT)))
    assert len(stub.sent[0][2]) > 2 * LIMIT


@pytest.mark.parametrize("row_key", [{"id": 42}, {"sku": "a/b c%é"}, {"shop": 7, "sku": "x/y"}])
def test_a_broker_refusal_gets_the_same_stand_in_acknowledging_the_original(row_key: dict[str, Any]) -> None:
    """The stand-in is made from the refused message's own bytes (the sender keeps no item while Kafka
    has it): same identity, same message key (so the same partition), the original's event number."""
    sender, stub = make_sender()
    stub.refuse = LIMIT // 8  # the broker's limit is below ours
    row = {**row_key, "content": "z" * (LIMIT // 6)}
    event = change("").model_copy(update={"key": row_key, "before": row, "after": row})
    assert decode(encode(event)) == event
    key = message_key("shop", "assets", row_key)
    assert sender.limit.fits(key, encode(event)), "under our own limit: only the broker refuses it"
    sender.send(event)
    assert len(stub.sent) == 1
    assert stub.sent[0][1] == key, "same key: same partition, same order"
    sent = decode(stub.sent[0][2])
    assert isinstance(sent, ChangeEvent) and sent.oversize and sent.before is None and sent.after is None
    assert (sent.event_id, sent.key, sent.version, sent.source) == (
        event.event_id,
        event.key,
        event.version,
        event.source,
    )
    assert sender.tracker.outstanding == 1
    stub.callbacks[0]()
    assert sender.tracker.outstanding == 0


def test_broker_refusals_of_ddl_dead_letters_and_model_updates_get_their_stand_ins() -> None:
    sender, stub = make_sender()
    stub.refuse = 20_000
    source = SOURCE.model_copy(update={"pos": 1000, "table": "*"})
    ddl = DdlEvent(event_id="1:b.7:1000:ddl", source=source, query="ALTER TABLE t " + "C" * 30_000, ts_ms=1)
    sender.send(ddl)
    letter = dead_letter("bad row", b"r" * 30_000, stage="connector")
    sender.send(letter)
    update = b'{"model": "clip", "padding": "' + b"p" * 30_000 + b'"}'
    sender.send(ModelUpdateMessage(b"clip", update))
    (ddl_topic, ddl_key, ddl_value), (letter_topic, _, letter_value), (update_topic, _, update_value) = (
        stub.sent
    )
    cut = decode(ddl_value)
    assert (ddl_topic, ddl_key) == (KAFKA.change_topic, b"ddl/shop")
    assert isinstance(cut, DdlEvent) and cut.event_id == ddl.event_id and "cut, 30014 chars" in cut.query
    stripped = DeadLetter.model_validate_json(letter_value)
    assert letter_topic == KAFKA.dead_letter_topic and stripped.reason == "bad row" and stripped.truncated
    assert stripped.original_b64 == "" and stripped.original_size == 30_000
    instead = DeadLetter.model_validate_json(update_value)
    assert update_topic == KAFKA.dead_letter_topic and instead.stage == "model-registry"
    assert instead.original_size == len(update)
    assert instead.original_sha256 == hashlib.sha256(update).hexdigest()
    assert sender.tracker.outstanding == 3, "each stand-in acknowledges its original"


def _reachable(start: object, depth: int) -> list[object]:
    """Objects reachable from ``start`` in at most ``depth`` references (modules and classes not
    followed)."""
    seen: dict[int, object] = {}
    level = [start]
    for _ in range(depth):
        following = []
        for obj in level:
            for ref in gc.get_referents(obj):
                if id(ref) not in seen and not isinstance(ref, types.ModuleType | type):
                    seen[id(ref)] = ref
                    following.append(ref)
        level = following
    return list(seen.values())


def test_what_waits_for_kafka_holds_no_item() -> None:
    """Kafka's report of a message comes milliseconds later, and thousands wait at a time: what the
    producer holds until then refers to the event number and the topic, not to the item (its images,
    which the garbage collector would walk again and again)."""
    sender, stub = make_sender()
    event = change("x" * 100)
    sender.send(event)
    held = [stub.callbacks[0], stub.refusals[0]]
    assert not any(obj is event for obj in _reachable(held, 6))
    assert not any(obj is event.after for obj in _reachable(held, 6))


def test_a_refused_item_without_a_stand_in_says_what_to_raise() -> None:
    sender, stub = make_sender()
    stub.refuse = 100  # even an invalidation is over the broker's limit
    with pytest.raises(ConfigurationError, match=r"max\.message\.bytes"):
        sender.send(change("z" * 1000))
    seq = sender.tracker.produced()
    with pytest.raises(ConfigurationError, match=r"reading it back .* failed .*max\.message\.bytes"):
        sender._refused(KAFKA.change_topic, seq, b"k", b"not what the sender wrote")


def test_a_huge_ddl_is_cut_and_a_huge_dead_letter_loses_its_original() -> None:
    sender, stub = make_sender()
    source = SOURCE.model_copy(update={"pos": 1000, "table": "*"})
    ddl = DdlEvent(
        event_id="1:binlog.000007:1000:ddl", source=source, query="ALTER TABLE assets " + "C" * LIMIT, ts_ms=1
    )
    sender.send(ddl)
    sent = decode(stub.sent[0][2])
    assert (
        isinstance(sent, DdlEvent) and sent.query.startswith("ALTER TABLE assets CCC") and "cut" in sent.query
    )
    assert len(sent.query) < DDL_QUERY_CHARS + 100
    letter = dead_letter("bad row", b"r" * 200_000, stage="connector", max_original_bytes=200_000)
    sender.send(letter)
    sent_letter = DeadLetter.model_validate_json(stub.sent[1][2])
    assert sent_letter.original_b64 == "" and sent_letter.truncated and sent_letter.original_size == 200_000


def test_the_oversize_metric_counts() -> None:
    reader = InMemoryMetricReader()
    sender, _ = make_sender(reader)
    sender.send(change("x" * 2 * LIMIT))
    sender.send(change("x" * 2 * LIMIT, row_id=43))
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        m.name: p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    }
    assert values["freshkey.connector.oversize"] == 2


# --- the model registry ---------------------------------------------------------------------------------

REGISTRY_ROW = {
    "id": 1,
    "model": "clip",
    "model_version": "1.2.0",
    "tokenizer_version": "tok-3",
    "input_schema": '{"type": "object"}',
    "weights_ref": "clip-1.2.0.pt",
    "weights_sha256": "A" * 64,
    "namespaces": '["assets"]',
    "key_bits": 64,
}


def registry_change(row: dict[str, object], op: str = "c") -> ChangeEvent:
    return ChangeEvent(
        event_id="1:binlog.000007:900:0",
        op=op,  # type: ignore[arg-type]
        key={"id": 1},
        before=row if op in ("u", "d") else None,
        after=row if op in ("c", "u") else None,
        source=SOURCE.model_copy(update={"db": "ml", "table": "model_registry"}),
        ts_ms=1,
        version=1,
        commit_ts_us=1,
        commit_ts_coarse=True,
    )


def test_a_registry_row_becomes_a_model_update_on_its_topic() -> None:
    sender, stub = make_sender()
    sender.registry_row(registry_change(REGISTRY_ROW))
    ((topic, key, value),) = stub.sent
    assert (topic, key) == (KAFKA.model_update_topic, b"clip")
    update = ModelUpdate.model_validate_json(value)
    assert (update.model_version, update.namespaces, update.weights_sha256) == (
        "1.2.0",
        ("assets",),
        "a" * 64,
    )


def test_an_invalid_registry_row_is_a_dead_letter_saying_why_and_a_delete_is_nothing() -> None:
    sender, stub = make_sender()
    sender.registry_row(registry_change({**REGISTRY_ROW, "namespaces": "not json"}))
    ((topic, _, value),) = stub.sent
    letter = DeadLetter.model_validate_json(value)
    assert topic == KAFKA.dead_letter_topic and letter.stage == "model-registry"
    assert "'namespaces' is not JSON" in letter.reason
    assert sender.stats.dead_letters == 1
    sender.registry_row(registry_change(REGISTRY_ROW, op="d"))
    assert len(stub.sent) == 1, "a model is retired by publishing a newer one, not by a delete"
