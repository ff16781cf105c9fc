"""Oversized rows never stop the connector: the size check, the invalidation stand-in, and a refusal
by librdkafka or by the broker handled the same way (no servers: librdkafka refuses sizes by itself,
a broker's refusal is fed to the delivery-report handler)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from connectors import runner
from connectors.checkpoint import BinlogPosition, CheckpointTracker
from connectors.exceptions import DeliveryError
from connectors.producer import RECORD_OVERHEAD_BYTES, ChangeProducer, MessageLimit
from connectors.settings import ConnectorSettings, KafkaSettings, MySQLSettings
from schemas import ChangeEvent, DdlEvent, DeadLetter, Source, decode, encode, message_key
from schemas.codec import dead_letter

LIMIT = 100_000
KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", max_message_bytes=LIMIT, dead_letter_max_original_bytes=50_000)


def change(content: str, *, row_id: int = 42, op: str = "u") -> ChangeEvent:
    row = {"id": row_id, "content": content}
    return ChangeEvent(
        event_id=f"1:binlog.000007:900:{row_id}",
        op=op,  # type: ignore[arg-type]
        key={"id": row_id},
        before=row if op in ("u", "d") else None,
        after=row if op in ("c", "u") else None,
        source=Source(
            server_id=1, file="binlog.000007", pos=900, ts_ms=1_700_000_000_000, db="shop", table="assets"
        ),
        ts_ms=1_700_000_000_500,
        version=7 << 48 | 900 << 16,
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
    )


# --- MessageLimit --------------------------------------------------------------------------------------


def test_limit_keeps_room_for_headers_and_learns_a_lower_broker_limit() -> None:
    limit = MessageLimit(LIMIT)
    assert limit.max_bytes == LIMIT - RECORD_OVERHEAD_BYTES
    assert limit.fits(b"k", b"v" * (LIMIT - RECORD_OVERHEAD_BYTES - 1))
    assert not limit.fits(b"k", b"v" * (LIMIT - RECORD_OVERHEAD_BYTES))
    assert limit.refused(60_000) is True
    assert limit.max_bytes == 59_999
    assert limit.refused(80_000) is False, "a larger refusal teaches nothing"
    assert not limit.fits(b"", b"v" * 60_000)


# --- the producer, without a broker -----------------------------------------------------------------------


@pytest.fixture
def producer() -> Any:
    made = ChangeProducer(KAFKA, delivery_timeout_s=5)
    yield made
    made.close(0.1, purge=True)


def test_librdkafka_refusal_calls_on_too_large_instead_of_raising(producer: ChangeProducer) -> None:
    calls: list[str] = []
    producer.produce(
        "t",
        b"key",
        b"v" * LIMIT,
        lambda: calls.append("delivered"),
        on_too_large=lambda: calls.append("too large"),
    )
    assert calls == ["too large"]
    producer.raise_if_failed()  # no failure kept


def test_broker_refusal_queues_the_stand_in_and_lowers_the_limit(producer: ChangeProducer) -> None:
    calls: list[str] = []
    producer.on_delivery_error(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 70_000, lambda: calls.append("stand-in")
    )
    assert calls == [], "the stand-in is produced on the caller's thread, not the poll thread"
    assert producer.limit.max_bytes == 69_999
    producer.raise_if_failed()
    assert calls == ["stand-in"]


def test_other_delivery_errors_fail_the_session_and_purges_do_not(producer: ChangeProducer) -> None:
    producer.on_delivery_error(KafkaError(KafkaError._PURGE_QUEUE), "t", 10, None)
    producer.raise_if_failed()
    producer.on_delivery_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 10, None)
    with pytest.raises(DeliveryError, match=r"event for 't'"):
        producer.raise_if_failed()


def test_fatal_error_fails_the_session(producer: ChangeProducer) -> None:
    producer._on_error(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True))
    with pytest.raises(DeliveryError, match="for good"):
        producer.raise_if_failed()


# --- the runner's stand-ins --------------------------------------------------------------------------------


class StubProducer:
    """Records what the runner produces; ``refuse`` makes it answer too-large like the broker would."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.callbacks: list[Callable[[], None]] = []
        self.refuse = 0

    def produce(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivered: Callable[[], None],
        *,
        on_too_large: Callable[[], None] | None = None,
    ) -> None:
        if len(key) + len(value) > self.refuse > 0 and on_too_large is not None:
            on_too_large()
            return
        self.sent.append((topic, key, value))
        self.callbacks.append(on_delivered)


def make_session(tmp_path: Path) -> tuple[runner._Run, runner._Session, StubProducer]:
    run = runner._Run(
        MySQLSettings(),
        KAFKA,
        ConnectorSettings(checkpoint_path=tmp_path / "checkpoint.json"),
        [("shop", "assets")],
        registry=None,
        on_gap=None,
        accept_gap=False,
        on_ready=None,
        progress_every_s=5.0,
    )
    stub = StubProducer()
    session = runner._Session(CheckpointTracker(BinlogPosition("binlog.000007", 4)), stub)  # type: ignore[arg-type]
    return run, session, stub


def test_an_oversized_change_is_sent_as_an_invalidation_with_the_same_identity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, session, stub = make_session(tmp_path)
    secret = "row-value-" + "x" * (2 * LIMIT)
    event = change(secret)
    with caplog.at_level(logging.WARNING, logger="connectors.runner"):
        run._send(session, event)
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
    assert run.stats.oversize == 1
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "shop.assets" in logged and "{'id': 42}" in logged and "invalidation" in logged
    assert "row-value-" not in logged, "the row's values are never logged"
    # The stand-in acknowledges the original's event number: the checkpoint waits for it.
    assert session.tracker.outstanding == 1
    stub.callbacks[0]()
    assert session.tracker.outstanding == 0


def test_a_change_under_the_limit_is_sent_whole(tmp_path: Path) -> None:
    run, session, stub = make_session(tmp_path)
    event = change("y" * (LIMIT // 4))  # before and after: twice that
    run._send(session, event)
    assert stub.sent[0][2] == encode(event)
    assert run.stats.oversize == 0


def test_without_the_size_check_the_event_goes_to_kafka_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protection off: the oversized event reaches the producer as it is (librdkafka then refuses it)."""
    run, session, stub = make_session(tmp_path)
    monkeypatch.setattr(run.limit, "fits", lambda key, value: True)
    run._send(session, change("x" * (2 * LIMIT)))
    assert len(stub.sent[0][2]) > 2 * LIMIT


def test_a_broker_refusal_gets_the_same_stand_in_acknowledging_the_original(tmp_path: Path) -> None:
    run, session, stub = make_session(tmp_path)
    stub.refuse = LIMIT // 8  # the broker's limit is below ours
    event = change("z" * (LIMIT // 6))
    assert run.limit.fits(b"k" * 20, encode(event)), "under our own limit: only the broker refuses it"
    run._send(session, event)
    assert len(stub.sent) == 1
    sent = decode(stub.sent[0][2])
    assert isinstance(sent, ChangeEvent) and sent.oversize
    assert session.tracker.outstanding == 1
    stub.callbacks[0]()
    assert session.tracker.outstanding == 0


def test_a_huge_ddl_is_cut_and_a_huge_dead_letter_loses_its_original(tmp_path: Path) -> None:
    run, session, stub = make_session(tmp_path)
    source = Source(server_id=1, file="binlog.000007", pos=1000, ts_ms=1, db="shop", table="*")
    ddl = DdlEvent(
        event_id="1:binlog.000007:1000:ddl", source=source, query="ALTER TABLE assets " + "C" * LIMIT, ts_ms=1
    )
    run._send(session, ddl)
    sent = decode(stub.sent[0][2])
    assert (
        isinstance(sent, DdlEvent) and sent.query.startswith("ALTER TABLE assets CCC") and "cut" in sent.query
    )
    letter = dead_letter("bad row", b"r" * 200_000, stage="connector", max_original_bytes=200_000)
    run._send(session, letter)
    sent_letter = DeadLetter.model_validate_json(stub.sent[1][2])
    assert sent_letter.original_b64 == "" and sent_letter.truncated and sent_letter.original_size == 200_000


def test_the_oversize_metric_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    monkeypatch.setattr(
        runner,
        "_oversize",
        MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("freshkey.connector.oversize"),
    )
    run, session, _ = make_session(tmp_path)
    run._send(session, change("x" * 2 * LIMIT))
    run._send(session, change("x" * 2 * LIMIT, row_id=43))
    data = reader.get_metrics_data()
    assert data is not None
    values = [
        p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    assert values == [2]
