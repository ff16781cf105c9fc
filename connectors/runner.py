"""The connector service: binlog -> Kafka, with a checkpoint that never passes an unacknowledged event.

A run is a loop of *sessions*. A session checks the database (the doctor's checks), finds where to
resume (the checkpoint), makes sure the topics exist, fences the caches if it finds a gap
(:mod:`connectors.resume`), then reads the binlog and produces (:mod:`connectors.sending`) until it is
stopped or something fails:

- a **retriable** failure (the database or the broker away, refused or restarted, a delivery that
  failed, a fatal producer error) ends the session: outstanding deliveries get a short flush and the
  rest are dropped, the checkpoint stays at the newest boundary Kafka acknowledged in full (invariant
  4), one WARNING line says what failed and when the next attempt is, ``freshkey.connector.retries``
  counts it, and a new session starts from the checkpoint after an exponential backoff
  (:class:`RetryPolicy`, run by tenacity). Replays are harmless: versions only go forward.
  ``FRESHKEY_CONNECTOR_RETRY_MAX_ATTEMPTS`` consecutive failures (0: never) end the run with
  :class:`RetriesExhaustedError`;
- a **configuration** problem (credentials, privileges, binlog settings, partition count, a binlog
  the server purged) ends the run with :class:`ConfigurationError`, whose message says what to change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from tenacity import RetryCallState, Retrying, retry_if_exception

from connectors.backoff import STABLE_AFTER_S, RetryPolicy
from connectors.binlog.source import BinlogSource, Boundary, Tick
from connectors.checkpoint import (
    BinlogPosition,
    CheckpointError,
    CheckpointSaver,
    CheckpointStore,
    CheckpointTracker,
)
from connectors.doctor import require_ready
from connectors.exceptions import (
    CAUSE_TEXT,
    BinlogGapError,
    RetriableError,
    RetriesExhaustedError,
    describe,
    retry_cause,
)
from connectors.gc_tuning import connector_gc
from connectors.kafka.limit import MessageLimit
from connectors.kafka.producer import ChangeProducer
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import prepare_topics
from connectors.metrics import CONNECTOR_METRICS, ConnectorMetrics, ConnectorStats
from connectors.resume import OnGap, ResumeGuard
from connectors.sending import Sender
from connectors.settings import ConnectorSettings, MySQLSettings
from connectors.snapshot import SnapshotCoordinator, SnapshotTable
from schemas import ChangeEvent, DeadLetter

log = logging.getLogger(__name__)

SERVE_EVERY_S = 0.001
"""The loop serves delivery reports (ChangeProducer.serve) at most this often, not before every item: on
a multi-row event each poll of librdkafka found a report or two, at the cost of a report's handling
(under SERVE_HANDOVER_S, so the background thread still leaves them to this one)."""
FAILED_FLUSH_S = 2.0
"""How long a failed session waits for outstanding acknowledgements before it drops them."""


def run_connector(
    mysql: MySQLSettings,
    kafka: KafkaSettings,
    connector: ConnectorSettings,
    tables: Collection[tuple[str, str]],
    *,
    on_gap: OnGap | None = None,
    accept_gap: bool = False,
    on_ready: Callable[[BinlogPosition], None] | None = None,
    progress_every_s: float = 5.0,
    snapshot_after_gap: Collection[SnapshotTable] = (),
) -> ConnectorStats:
    """Run sessions until interrupted (KeyboardInterrupt/SystemExit), a configuration error, or
    ``retry_max_attempts`` consecutive failed sessions (:class:`RetriesExhaustedError`).

    ``on_gap``: the fence hook (see :data:`~connectors.resume.OnGap`); without it a gap is a
    ConfigurationError. ``accept_gap``: a checkpoint the server cannot serve any more (purged binlog) or
    cannot read is fenced (``on_gap``) and replaced by the server's current position instead of stopping
    the run. ``on_ready``: called with the start position each time a session starts reading.
    ``snapshot_after_gap``: the tables a snapshot refills after a gap was fenced (``--snapshot``).
    On a clean stop it waits for outstanding acknowledgements and saves the final checkpoint.
    """
    registry: tuple[str, str] | None = None
    if connector.model_registry_table:
        db, table = connector.model_registry_table.split(".", 1)
        registry = (db, table)
        tables = {*tables, registry}
    if not tables:
        raise ValueError("no tables to read: the bindings are empty")
    run = ConnectorRun(
        mysql,
        kafka,
        connector,
        tables,
        registry=registry,
        on_gap=on_gap,
        accept_gap=accept_gap,
        on_ready=on_ready,
        progress_every_s=progress_every_s,
        snapshot_after_gap=snapshot_after_gap,
    )
    return run.run()


class ConnectorRun:
    """One run of the connector: the loop of sessions (:meth:`run`), each one :meth:`session`."""

    def __init__(
        self,
        mysql: MySQLSettings,
        kafka: KafkaSettings,
        connector: ConnectorSettings,
        tables: Collection[tuple[str, str]],
        *,
        registry: tuple[str, str] | None = None,
        on_gap: OnGap | None = None,
        accept_gap: bool = False,
        on_ready: Callable[[BinlogPosition], None] | None = None,
        progress_every_s: float = 5.0,
        metrics: ConnectorMetrics = CONNECTOR_METRICS,
        snapshot_after_gap: Collection[SnapshotTable] = (),
    ) -> None:
        self.mysql = mysql
        self.kafka = kafka
        self.connector = connector
        # Snapshots (connectors.snapshot) read the signal table's binlog rows: requests and watermarks.
        self.snapshots = SnapshotCoordinator(mysql, connector, after_gap=tuple(snapshot_after_gap))
        self.tables = {*tables, self.snapshots.table}
        self.registry = registry
        self.on_ready = on_ready
        self.progress_every_s = progress_every_s
        self.metrics = metrics
        self.stats = ConnectorStats()
        self.store = CheckpointStore(connector.checkpoint_path)
        self.limit = MessageLimit(kafka.max_message_bytes)
        self.retry = RetryPolicy(connector)
        self.guard = ResumeGuard(
            mysql,
            kafka,
            connector,
            self.store,
            on_gap=self.snapshots.gap_hook(on_gap),
            accept_gap=accept_gap,
            stats=self.stats,
            metrics=metrics,
        )
        self.connected = False

    # -- the loop of sessions ----------------------------------------------------------------------------
    def run(self) -> ConnectorStats:
        retrying = Retrying(
            retry=retry_if_exception(lambda exc: retry_cause(exc) is not None),
            stop=lambda state: self.retry.exhausted(),
            wait=lambda state: self.retry.backoff(),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        self.metrics.start_at_zero()
        state = self._connection_state
        self.metrics.connection_states.append(state)
        try:
            with connector_gc():
                retrying(self.attempt)
        except Exception as exc:
            if retry_cause(exc) is None:
                raise
            raise RetriesExhaustedError(
                f"gave up after {self.retry.failures} consecutive failed sessions "
                f"(FRESHKEY_CONNECTOR_RETRY_MAX_ATTEMPTS={self.connector.retry_max_attempts}); the last: "
                f"{describe(exc)}. The checkpoint is kept: a restart resumes from it"
            ) from exc
        finally:
            self.metrics.connection_states.remove(state)
        return self.stats

    def _connection_state(self) -> int:
        return int(self.connected)

    def attempt(self) -> None:
        """One session; a retriable failure counts as a consecutive failure."""
        try:
            self.session()
        except BaseException as exc:
            if retry_cause(exc) is not None:
                self.retry.failed()
            raise
        finally:
            self.connected = False

    def _before_sleep(self, retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
        cause = retry_cause(exc) if exc is not None else None
        wait = retry_state.next_action.sleep if retry_state.next_action is not None else 0.0
        self.stats.retries += 1
        self.metrics.retried(cause or "unknown")
        position = self._saved_position()
        log.warning(
            "connector session ended (%s): %s; next attempt %s in %.1f s, from checkpoint %s",
            CAUSE_TEXT.get(cause or "", "unknown"),
            describe(exc),
            self.retry.next_attempt(),
            wait,
            f"{position.file}:{position.pos}" if position is not None else "(none yet)",
        )

    def _saved_position(self) -> BinlogPosition | None:
        try:
            return self.store.load()
        except CheckpointError:
            return None

    # -- one session -----------------------------------------------------------------------------------
    def session(self) -> None:
        """Check the server, resume, fence any gap, then read and produce until stopped or failed."""
        self.stats.sessions += 1
        info = require_ready(self.mysql)
        state, fresh = self.guard.resume_state()
        extra = [self.kafka.model_update_topic] if self.registry else []
        topics = prepare_topics(self.kafka, extra, timeout_s=self.connector.kafka_timeout_s)
        state = self.guard.check_topic(state, topics, fresh=fresh)
        start = state.position
        tracker = CheckpointTracker(start)
        producer = ChangeProducer(
            self.kafka,
            linger_ms=self.connector.linger_ms,
            delivery_timeout_s=self.connector.delivery_timeout_s,
            limit=self.limit,
            # Verified against the topic by check_topic: an acknowledgement below them is a loss.
            acknowledged={(self.kafka.change_topic, p): end for p, end in state.topic_ends.items()},
            watch=topics.ids,  # the change topic gone or created again: the session ends, the next fences
        )
        sender = Sender(self.kafka, self.limit, tracker, producer, stats=self.stats, metrics=self.metrics)
        saver = CheckpointSaver(
            self.store,
            tracker,
            change_topic=self.kafka.change_topic,
            topic_ends=state.topic_ends,
            acked_ends=lambda: producer.acked_ends(self.kafka.change_topic),
        )
        source = BinlogSource(  # connects once iterated
            self.mysql,
            self.tables,
            start=start,
            version_source=self.connector.version_source,
            read_timeout_s=self.connector.mysql_read_timeout_s,
            checkpoint=self.store.path,
            fast_rows=self.connector.fast_rows,
        )
        self.metrics.checkpoint_ages.append(saver.age)
        clean = False
        gap: BinlogGapError | None = None
        try:
            saver.start()
            log.info(
                "connector reading %s %s (server_id %d) for %d table(s) from %s:%d -> %s",
                info.flavor,
                info.version,
                info.server_id,
                len(self.tables),
                start.file,
                start.pos,
                self.kafka.change_topic,
            )
            self.snapshots.begin(lambda: tracker.committed)
            self._read(source, sender, producer, start)
            clean = True
        except (KeyboardInterrupt, SystemExit):
            clean = True
            raise
        except BinlogGapError as exc:
            if not self.guard.accept_gap:
                raise
            gap = exc
        finally:
            self.metrics.checkpoint_ages.remove(saver.age)
            source.close()
            flush_s = (
                self.connector.flush_timeout_s
                if clean
                else min(FAILED_FLUSH_S, self.connector.flush_timeout_s)
            )
            remaining = producer.close(flush_s, purge=not clean)
            saver.stop()
            if producer.rewound is not None:
                self.guard.remember_gap(producer.rewound)
            self.snapshots.end()  # counts the chunks Kafka acknowledged, after the last flush
            if remaining:
                log.log(
                    logging.ERROR if clean else logging.INFO,
                    "%d event(s) unacknowledged at the end of the session; re-read from the checkpoint",
                    remaining,
                )
            log.info("session ended at checkpoint %s:%d", tracker.committed.file, tracker.committed.pos)
        if gap is not None:
            # After the session's last save, which the accepted position must replace.
            self.guard.accept(str(gap))
            raise RetriableError(
                "the server could not send the binlog from the checkpoint; accepted the gap (--accept-gap)",
                cause="gap",
            ) from gap

    def _read(
        self, source: BinlogSource, sender: Sender, producer: ChangeProducer, start: BinlogPosition
    ) -> None:
        tracker = sender.tracker
        last_report = connected_at = served_at = time.monotonic()
        for item in source:
            now = time.monotonic()
            if not self.connected:
                self.connected, connected_at = True, now
                if self.on_ready is not None:
                    self.on_ready(start)
            if self.retry.failures and now - connected_at >= STABLE_AFTER_S:
                self.retry.stable()
            if now - served_at >= SERVE_EVERY_S:
                producer.serve()
                served_at = now
            producer.raise_if_failed()
            if isinstance(item, Tick):
                self.snapshots.read_to(None)
            elif isinstance(item, Boundary):
                tracker.boundary(item.position)
                self.stats.transactions += 1
                self.snapshots.read_to(item.position)
                if source.caught_up():  # nothing more to batch with: send now, not after the linger
                    producer.push()
            elif isinstance(item, ChangeEvent) and item.table == self.snapshots.table:
                # A snapshot chunk's rows go out at its high watermark, in binlog order.
                for row in self.snapshots.on_signal(item):
                    sender.send(row)
                    if isinstance(row, DeadLetter):
                        self.stats.dead_letters += 1
                while tracker.outstanding > self.connector.max_in_flight:
                    producer.raise_if_failed()
                    producer.serve(0.005)
            elif self.registry is not None and isinstance(item, ChangeEvent) and item.table == self.registry:
                sender.registry_row(item)
            else:
                self.snapshots.observe(item)
                sender.send(item)
                if isinstance(item, DeadLetter):
                    self.stats.dead_letters += 1
                    log.warning("dead letter: %s", item.reason)
                elif item.kind == "ddl":
                    self.stats.ddl += 1
                    log.info("DDL in %s: %s", item.source.db, item.query[:200])
                elif item.kind == "fence":  # said by the source; sent to every partition
                    self.stats.unreadable += 1
                    self.metrics.unreadable.add(1)
                else:
                    self.stats.changes += 1
                while tracker.outstanding > self.connector.max_in_flight:
                    producer.raise_if_failed()
                    producer.serve(0.005)
            if now - last_report >= self.progress_every_s:
                last_report = now
                position = tracker.committed
                log.info(
                    "changes=%d ddl=%d dead_letters=%d oversize=%d unreadable=%d retries=%d unacked=%d "
                    "checkpoint=%s:%d",
                    self.stats.changes,
                    self.stats.ddl,
                    self.stats.dead_letters,
                    self.stats.oversize,
                    self.stats.unreadable,
                    self.stats.retries,
                    tracker.outstanding,
                    position.file,
                    position.pos,
                )
