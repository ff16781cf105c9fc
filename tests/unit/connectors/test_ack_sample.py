"""connectors.sending: the acknowledgement latency is recorded for one event in ACK_LATENCY_SAMPLE, while
every event still holds the checkpoint until Kafka acknowledges it."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from connectors.checkpoint import BinlogPosition, CheckpointTracker
from connectors.kafka.limit import MessageLimit
from connectors.kafka.settings import KafkaSettings
from connectors.metrics import ConnectorMetrics, ConnectorStats
from connectors.sending import ACK_LATENCY_SAMPLE, Sender
from schemas import ChangeEvent, Source

SOURCE = Source(server_id=1, file="binlog.000007", pos=900, ts_ms=1_700_000_000_000, db="shop", table="t")


class Callbacks:
    def __init__(self) -> None:
        self.delivered: list[Callable[[], None]] = []

    def produce(
        self, topic: str, key: bytes, value: bytes, on_delivered: Callable[[], None], **_: object
    ) -> None:
        self.delivered.append(on_delivered)


def change(row_id: int) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"1:binlog.000007:900:{row_id}",
        op="c",
        key={"id": row_id},
        after={"id": row_id},
        source=SOURCE,
        ts_ms=1_700_000_000_500,
        version=row_id,
        commit_ts_us=1_700_000_000_000_000,
        commit_ts_coarse=True,
    )


def test_one_event_in_the_sample_records_its_latency_and_every_one_is_acknowledged() -> None:
    reader = InMemoryMetricReader()
    producer = Callbacks()
    tracker = CheckpointTracker(BinlogPosition("binlog.000007", 4))
    sender = Sender(
        KafkaSettings(bootstrap="127.0.0.1:1"),
        MessageLimit(1_000_000),
        tracker,
        producer,
        stats=ConnectorStats(),
        metrics=ConnectorMetrics(MeterProvider(metric_readers=[reader]).get_meter("test")),
    )
    events = 5 * ACK_LATENCY_SAMPLE
    for row_id in range(events):
        sender.send(change(row_id))
    tracker.boundary(BinlogPosition("binlog.000007", 1000))
    for delivered in producer.delivered[:-1]:
        delivered()
    assert tracker.committed.pos == 4, "the last event is not acknowledged yet"
    producer.delivered[-1]()
    assert tracker.committed.pos == 1000 and tracker.outstanding == 0

    data = reader.get_metrics_data()
    assert data is not None
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "freshkey.connector.ack.latency"
        for p in m.data.data_points
    ]
    assert len(points) == 1 and isinstance(points[0], HistogramDataPoint)
    assert points[0].count == events // ACK_LATENCY_SAMPLE
