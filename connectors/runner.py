"""The connector service: binlog -> Kafka, with a checkpoint that never passes an unacknowledged event."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from connectors.binlog import BinlogSource, Boundary, current_position
from connectors.checkpoint import BinlogPosition, CheckpointStore, CheckpointTracker
from connectors.doctor import require_ready
from connectors.producer import ChangeProducer
from connectors.registry import RegistryRowError, update_from_row
from connectors.settings import ConnectorSettings, KafkaSettings, MySQLSettings
from connectors.topics import ensure_topics
from schemas import ChangeEvent, DdlEvent, DeadLetter, encode, message_key
from schemas.codec import dead_letter

log = logging.getLogger(__name__)

# -- OpenTelemetry (the API only: the entry point installs the SDK; names listed in pipeline.telemetry) --
_meter = metrics.get_meter("freshkey")
_ack_latency = _meter.create_histogram(
    "freshkey.connector.ack.latency",
    unit="ms",
    description="Produce to Kafka acknowledging an event (acks=all).",
    explicit_bucket_boundaries_advisory=(0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
)
_checkpoint_age: list[Callable[[], float]] = []
"""The running connector's checkpoint age (seconds); empty when none runs in this process."""


def _observe_checkpoint_age(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(age()) for age in _checkpoint_age[-1:]]


_meter.create_observable_gauge(
    "freshkey.connector.checkpoint.age",
    callbacks=[_observe_checkpoint_age],
    unit="s",
    description="Time since the saved checkpoint last moved; 0 while no read event waits for it.",
)


class ConnectorStats:
    def __init__(self) -> None:
        self.changes = 0
        self.ddl = 0
        self.dead_letters = 0
        self.transactions = 0


def run_connector(
    mysql: MySQLSettings,
    kafka: KafkaSettings,
    connector: ConnectorSettings,
    tables: Collection[tuple[str, str]],
    *,
    on_ready: Callable[[BinlogPosition], None] | None = None,
    progress_every_s: float = 5.0,
) -> ConnectorStats:
    """Run until interrupted (KeyboardInterrupt/SystemExit) or a delivery fails for good.

    On a clean stop it waits for outstanding acknowledgements and saves the final checkpoint.
    """
    registry: tuple[str, str] | None = None
    if connector.model_registry_table:
        db, table = connector.model_registry_table.split(".", 1)
        registry = (db, table)
        tables = {*tables, registry}
    if not tables:
        raise ValueError("no tables to read: the bindings are empty")
    info = require_ready(mysql)
    ensure_topics(kafka, extra=[kafka.model_update_topic] if registry else [])
    store = CheckpointStore(connector.checkpoint_path)
    start = store.load()
    if start is None:
        start = current_position(mysql, earliest=connector.start_from == "earliest")
        store.save(start)
        log.info("no checkpoint at %s: starting at %s:%d", store.path, start.file, start.pos)
    else:
        log.info("resuming at %s:%d (checkpoint %s)", start.file, start.pos, store.path)
    tracker = CheckpointTracker(start)
    producer = ChangeProducer(kafka)
    stats = ConnectorStats()
    stop_saver = threading.Event()
    saved = (time.monotonic(), start)

    def save_loop() -> None:
        nonlocal saved
        while not stop_saver.wait(0.1):
            moved = tracker.take_if_moved()
            if moved is not None:
                store.save(moved)
                saved = (time.monotonic(), moved)

    def checkpoint_age() -> float:
        saved_at, position = saved
        if tracker.outstanding == 0 and position == tracker.committed:
            return 0.0
        return time.monotonic() - saved_at

    saver = threading.Thread(target=save_loop, name="checkpoint-saver", daemon=True)
    saver.start()
    source = BinlogSource(mysql, tables, start=start, version_source=connector.version_source)
    log.info(
        "connector reading %s %s (server_id %d) for %d table(s) -> %s",
        info.flavor,
        info.version,
        info.server_id,
        len(tables),
        kafka.change_topic,
    )
    if on_ready is not None:
        on_ready(start)
    last_report = time.monotonic()
    _checkpoint_age.append(checkpoint_age)
    try:
        for item in source:
            producer.raise_if_failed()
            if isinstance(item, Boundary):
                tracker.boundary(item.position)
                stats.transactions += 1
            elif registry is not None and isinstance(item, ChangeEvent) and item.table == registry:
                _registry_row(producer, tracker, kafka, item, stats)
            else:
                _produce(producer, tracker, kafka, item)
                if isinstance(item, DeadLetter):
                    stats.dead_letters += 1
                    log.warning("dead letter: %s", item.reason)
                elif item.kind == "ddl":
                    stats.ddl += 1
                    log.info("DDL in %s: %s", item.source.db, item.query[:200])
                else:
                    stats.changes += 1
                while tracker.outstanding > connector.max_in_flight:
                    producer.raise_if_failed()
                    time.sleep(0.005)
            now = time.monotonic()
            if now - last_report >= progress_every_s:
                last_report = now
                position = tracker.committed
                log.info(
                    "changes=%d ddl=%d dead_letters=%d unacked=%d checkpoint=%s:%d",
                    stats.changes,
                    stats.ddl,
                    stats.dead_letters,
                    tracker.outstanding,
                    position.file,
                    position.pos,
                )
    finally:
        _checkpoint_age.remove(checkpoint_age)
        source.close()
        remaining = producer.close(connector.flush_timeout_s)
        stop_saver.set()
        saver.join(timeout=2)
        moved = tracker.take_if_moved()
        if moved is not None:
            store.save(moved)
        if remaining:
            log.error("%d event(s) unacknowledged at shutdown; they will be re-read on restart", remaining)
        log.info("connector stopped at checkpoint %s:%d", tracker.committed.file, tracker.committed.pos)
    return stats


def _registry_row(
    producer: ChangeProducer,
    tracker: CheckpointTracker,
    kafka: KafkaSettings,
    event: ChangeEvent,
    stats: ConnectorStats,
) -> None:
    """A change of the model registry table: a model update, or a dead letter saying why not."""
    try:
        update = update_from_row(event)
    except RegistryRowError as exc:
        stats.dead_letters += 1
        log.warning("model registry row %s: %s", event.key, exc)
        _produce(producer, tracker, kafka, dead_letter(str(exc), encode(event), stage="model-registry"))
        return
    if update is None:
        return
    seq = tracker.produced()
    producer.produce(
        kafka.model_update_topic,
        update.model.encode(),
        update.model_dump_json().encode(),
        lambda: tracker.acknowledged(seq),
    )
    log.info(
        "model update from the registry: %s %s for %s", update.model, update.model_version, update.namespaces
    )


def _produce(
    producer: ChangeProducer,
    tracker: CheckpointTracker,
    kafka: KafkaSettings,
    item: object,
) -> None:
    seq = tracker.produced()
    sent = time.monotonic()

    def delivered() -> None:
        tracker.acknowledged(seq)
        _ack_latency.record((time.monotonic() - sent) * 1000)

    if isinstance(item, DeadLetter):
        producer.produce(kafka.dead_letter_topic, b"connector", encode(item), delivered)
        return

    if isinstance(item, ChangeEvent):
        key = message_key(item.source.db, item.source.table, item.key)
    elif isinstance(item, DdlEvent):
        key = f"ddl/{item.source.db}".encode()
    else:  # pragma: no cover - exhaustive
        raise TypeError(type(item))
    producer.produce(kafka.change_topic, key, encode(item), delivered)
