"""The connector service: binlog -> Kafka, with a checkpoint that never passes an unacknowledged event.

A run is a loop of *sessions*. A session checks the database (the doctor's checks), finds where to
resume (the checkpoint), makes sure the topics exist, fences the caches if it finds a gap, then reads
the binlog and produces until it is stopped or something fails:

- a **retriable** failure (the database or the broker away, refused or restarted, a delivery that
  failed, a fatal producer error) ends the session: outstanding deliveries get a short flush and the
  rest are dropped, the checkpoint stays at the newest boundary Kafka acknowledged in full (invariant
  4), one WARNING line says what failed and when the next attempt is, ``freshkey.connector.retries``
  counts it, and a new session starts from the checkpoint after an exponential backoff (tenacity).
  Replays are harmless: versions only go forward. ``FRESHKEY_CONNECTOR_RETRY_MAX_ATTEMPTS``
  consecutive failures (0: never) end the run with :class:`RetriesExhaustedError`;
- a **configuration** problem (credentials, privileges, binlog settings, partition count, a binlog
  the server purged) ends the run with :class:`ConfigurationError`, whose message says what to change.

Gaps. Changes can be lost to the workers without any process failing: the binlog under the checkpoint
was purged, or the change topic lost events Kafka had acknowledged (a broker that lost its data, a
topic deleted and recreated). The connector then calls ``on_gap(reason)`` (the command line fences
every bound namespace) before it produces anything. A purged binlog stops the run unless
``accept_gap`` is set, which fences and continues from the server's current position. A fence that
fails is retried: nothing is produced until it succeeded (the checkpoint file remembers the pending
gap across restarts).

Oversized rows. A change whose encoded event is over the message limit is sent as an invalidation
(``oversize=True``, no images): the worker drops the row's entries and the application reads it
through. So is one the broker refuses as too large. No row can stop the connector.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import get_args

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from tenacity import RetryCallState, Retrying, retry_if_exception

from connectors.binlog import BinlogSource, Boundary, Tick, check_position, current_position
from connectors.checkpoint import (
    BinlogPosition,
    CheckpointError,
    CheckpointState,
    CheckpointStore,
    CheckpointTracker,
)
from connectors.doctor import require_ready
from connectors.exceptions import (
    BinlogGapError,
    ConfigurationError,
    ConnectorError,
    FenceError,
    RetriableError,
    RetriesExhaustedError,
    RetryCause,
    retry_cause,
)
from connectors.producer import ChangeProducer, MessageLimit
from connectors.registry import RegistryRowError, update_from_row
from connectors.settings import ConnectorSettings, KafkaSettings, MySQLSettings
from connectors.topics import TopicsReport, end_offsets, prepare_topics
from schemas import ChangeEvent, DdlEvent, DeadLetter, encode, message_key
from schemas.codec import dead_letter

log = logging.getLogger(__name__)

OnGap = Callable[[str], object]
"""Called with the reason when changes may have been lost to the workers, before anything is produced;
it must make every bound namespace safe (fence it). Raising makes the session retry the fence."""

STABLE_AFTER_S = 10.0
"""A session reading this long without failing resets the backoff (the next failure waits the initial
backoff again, and counts as attempt 1)."""
FAILED_FLUSH_S = 2.0
"""How long a failed session waits for outstanding acknowledgements before it drops them."""
DDL_QUERY_CHARS = 16_000
"""A DDL statement too large for a message is sent cut to this many characters (the worker re-reads
the table's columns from the database; the statement is only a record)."""

# -- OpenTelemetry (the API only: the entry point installs the SDK; names listed in pipeline.observe.otel) --
_meter = metrics.get_meter("freshkey")
_ack_latency = _meter.create_histogram(
    "freshkey.connector.ack.latency",
    unit="ms",
    description="Produce to Kafka acknowledging an event (acks=all).",
    explicit_bucket_boundaries_advisory=(0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
)
_retries = _meter.create_counter(
    "freshkey.connector.retries",
    description="Sessions ended by a retriable failure, by cause (database, kafka, fence, gap); each is "
    "followed by a new session from the checkpoint after a backoff.",
)
_oversize = _meter.create_counter(
    "freshkey.connector.oversize",
    description="Row changes sent as invalidations because their event was over the message limit.",
)
_gaps = _meter.create_counter(
    "freshkey.connector.gaps",
    description="Gaps found (purged binlog, change topic that lost events), each followed by a fence.",
)
_checkpoint_age: list[Callable[[], float]] = []
"""The running connector's checkpoint age (seconds); empty when none runs in this process."""
_connected: list[Callable[[], int]] = []
"""The running connector's connection state (1 reading and producing, 0 waiting to reconnect)."""


def _observe_checkpoint_age(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(age()) for age in _checkpoint_age[-1:]]


def _observe_connected(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(state()) for state in _connected[-1:]]


_meter.create_observable_gauge(
    "freshkey.connector.checkpoint.age",
    callbacks=[_observe_checkpoint_age],
    unit="s",
    description="Time since the saved checkpoint last moved; 0 while no read event waits for it.",
)
_meter.create_observable_gauge(
    "freshkey.connector.connected",
    callbacks=[_observe_connected],
    description="1 while the connector reads the binlog and produces to Kafka, 0 while it waits to retry.",
)


class ConnectorStats:
    """What a run did, for its caller and the progress lines."""

    def __init__(self) -> None:
        self.changes = 0
        self.ddl = 0
        self.dead_letters = 0
        self.transactions = 0
        self.oversize = 0
        self.retries = 0
        self.gaps = 0
        self.sessions = 0


@dataclass(frozen=True, slots=True)
class _ModelUpdate:
    """A model update read from the registry table, ready to produce."""

    key: bytes
    value: bytes
    event: ChangeEvent


_Item = ChangeEvent | DdlEvent | DeadLetter | _ModelUpdate


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
) -> ConnectorStats:
    """Run sessions until interrupted (KeyboardInterrupt/SystemExit), a configuration error, or
    ``retry_max_attempts`` consecutive failed sessions (:class:`RetriesExhaustedError`).

    ``on_gap``: the fence hook (see :data:`OnGap`); without it a gap is a ConfigurationError.
    ``accept_gap``: a checkpoint the server cannot serve any more (purged binlog) or cannot read is
    fenced (``on_gap``) and replaced by the server's current position instead of stopping the run.
    ``on_ready``: called with the start position each time a session starts reading.
    On a clean stop it waits for outstanding acknowledgements and saves the final checkpoint.
    """
    registry: tuple[str, str] | None = None
    if connector.model_registry_table:
        db, table = connector.model_registry_table.split(".", 1)
        registry = (db, table)
        tables = {*tables, registry}
    if not tables:
        raise ValueError("no tables to read: the bindings are empty")
    run = _Run(
        mysql,
        kafka,
        connector,
        tables,
        registry=registry,
        on_gap=on_gap,
        accept_gap=accept_gap,
        on_ready=on_ready,
        progress_every_s=progress_every_s,
    )
    return run.run()


class _Session:
    """What one session holds: closed together when it ends."""

    def __init__(self, tracker: CheckpointTracker, producer: ChangeProducer) -> None:
        self.tracker = tracker
        self.producer = producer


class _Run:
    def __init__(
        self,
        mysql: MySQLSettings,
        kafka: KafkaSettings,
        connector: ConnectorSettings,
        tables: Collection[tuple[str, str]],
        *,
        registry: tuple[str, str] | None,
        on_gap: OnGap | None,
        accept_gap: bool,
        on_ready: Callable[[BinlogPosition], None] | None,
        progress_every_s: float,
    ) -> None:
        self.mysql = mysql
        self.kafka = kafka
        self.connector = connector
        self.tables = tables
        self.registry = registry
        self.on_gap = on_gap
        self.accept_gap = accept_gap
        self.on_ready = on_ready
        self.progress_every_s = progress_every_s
        self.stats = ConnectorStats()
        self.store = CheckpointStore(connector.checkpoint_path)
        self.limit = MessageLimit(kafka.max_message_bytes)
        self.failures = 0  # consecutive failed sessions (reset by a stable one)
        self.connected = False
        self.ends: dict[int, int] = {}  # change topic: partition -> offset after the newest acked event

    # -- the loop of sessions ----------------------------------------------------------------------------
    def run(self) -> ConnectorStats:
        retrying = Retrying(
            retry=retry_if_exception(lambda exc: retry_cause(exc) is not None),
            stop=self._give_up,
            wait=self._backoff,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        # Every series from the start at 0: a dashboard shows "no retries", never "no data".
        for cause in get_args(RetryCause):
            _retries.add(0, {"cause": cause})
        _oversize.add(0)
        _gaps.add(0)
        state = self._connection_state
        _connected.append(state)
        try:
            retrying(self._attempt)
        except Exception as exc:
            if retry_cause(exc) is None:
                raise
            raise RetriesExhaustedError(
                f"gave up after {self.failures} consecutive failed sessions "
                f"(FRESHKEY_CONNECTOR_RETRY_MAX_ATTEMPTS={self.connector.retry_max_attempts}); the last: "
                f"{_describe(exc)}. The checkpoint is kept: a restart resumes from it"
            ) from exc
        finally:
            _connected.remove(state)
        return self.stats

    def _connection_state(self) -> int:
        return int(self.connected)

    def _attempt(self) -> None:
        try:
            self._session()
        except BaseException as exc:
            if retry_cause(exc) is not None:
                self.failures += 1
            raise
        finally:
            self.connected = False

    def _give_up(self, retry_state: RetryCallState) -> bool:
        limit = self.connector.retry_max_attempts
        return limit > 0 and self.failures >= limit

    def _backoff(self, retry_state: RetryCallState) -> float:
        """Exponential in the consecutive failures, capped, with jitter in its upper half (so that
        connectors restarted together do not all come back at the same instant)."""
        initial, cap = self.connector.retry_initial_backoff_s, self.connector.retry_max_backoff_s
        base = min(cap, initial * 2 ** min(max(0, self.failures - 1), 60))
        return float(base / 2 + random.uniform(0, base / 2))

    def _before_sleep(self, retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome is not None else None
        cause = retry_cause(exc) if exc is not None else None
        wait = retry_state.next_action.sleep if retry_state.next_action is not None else 0.0
        self.stats.retries += 1
        _retries.add(1, {"cause": cause or "unknown"})
        limit = self.connector.retry_max_attempts
        attempt = f"{self.failures + 1}" + (f" of {limit}" if limit else "")
        position = self._saved_position()
        log.warning(
            "connector session ended (%s): %s; next attempt %s in %.1f s, from checkpoint %s",
            _CAUSE_TEXT.get(cause or "", "unknown"),
            _describe(exc),
            attempt,
            wait,
            f"{position.file}:{position.pos}" if position is not None else "(none yet)",
        )

    def _saved_position(self) -> BinlogPosition | None:
        try:
            return self.store.load()
        except CheckpointError:
            return None

    # -- one session -----------------------------------------------------------------------------------
    def _session(self) -> None:
        self.stats.sessions += 1
        info = require_ready(self.mysql)
        state, fresh = self._resume_state()
        extra = [self.kafka.model_update_topic] if self.registry else []
        topics = prepare_topics(self.kafka, extra, timeout_s=self.connector.kafka_timeout_s)
        state = self._check_topic(state, topics, fresh=fresh)
        start = state.position
        self.ends = dict(state.topic_ends)
        tracker = CheckpointTracker(start)
        producer = ChangeProducer(
            self.kafka, delivery_timeout_s=self.connector.delivery_timeout_s, limit=self.limit
        )
        session = _Session(tracker, producer)
        stop_saver = threading.Event()
        saved = (time.monotonic(), start)

        def save(position: BinlogPosition) -> None:
            nonlocal saved
            self.ends.update(
                {
                    p: end
                    for p, end in producer.acked_ends(self.kafka.change_topic).items()
                    if end > self.ends.get(p, 0)
                }
            )
            self.store.save(position, change_topic=self.kafka.change_topic, topic_ends=self.ends)
            saved = (time.monotonic(), position)

        def save_loop() -> None:
            while not stop_saver.wait(0.1):
                moved = tracker.take_if_moved()
                if moved is not None:
                    save(moved)

        def checkpoint_age() -> float:
            saved_at, position = saved
            if tracker.outstanding == 0 and position == tracker.committed:
                return 0.0
            return time.monotonic() - saved_at

        saver = threading.Thread(target=save_loop, name="checkpoint-saver", daemon=True)
        source = BinlogSource(  # connects once iterated
            self.mysql,
            self.tables,
            start=start,
            version_source=self.connector.version_source,
            read_timeout_s=self.connector.mysql_read_timeout_s,
            checkpoint=self.store.path,
        )
        _checkpoint_age.append(checkpoint_age)
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
            self._read(source, session, start)
            clean = True
        except (KeyboardInterrupt, SystemExit):
            clean = True
            raise
        except BinlogGapError as exc:
            if not self.accept_gap:
                raise
            gap = exc
        finally:
            _checkpoint_age.remove(checkpoint_age)
            source.close()
            flush_s = (
                self.connector.flush_timeout_s
                if clean
                else min(FAILED_FLUSH_S, self.connector.flush_timeout_s)
            )
            remaining = producer.close(flush_s, purge=not clean)
            stop_saver.set()
            if saver.ident is not None:
                saver.join(timeout=2)
            moved = tracker.take_if_moved()
            if moved is not None or producer.acked_ends(self.kafka.change_topic):
                save(moved if moved is not None else tracker.committed)
            if remaining:
                log.log(
                    logging.ERROR if clean else logging.INFO,
                    "%d event(s) unacknowledged at the end of the session; re-read from the checkpoint",
                    remaining,
                )
            log.info("session ended at checkpoint %s:%d", tracker.committed.file, tracker.committed.pos)
        if gap is not None:
            # After the session's last save, which the accepted position must replace.
            self._accept(str(gap))
            raise RetriableError(
                "the server could not send the binlog from the checkpoint; accepted the gap (--accept-gap)",
                cause="gap",
            ) from gap

    def _resume_state(self) -> tuple[CheckpointState, bool]:
        """Where this session reads from, and whether that is a fresh start (no checkpoint yet).

        The checkpoint, after checking the server still has its binlog. No checkpoint: the server's
        current position (or its oldest binlog, ``start_from=earliest``), saved once the topics exist. A
        purged or unreadable checkpoint: ConfigurationError, or with ``accept_gap`` a fence and the
        current position.
        """
        try:
            state = self.store.load_state()
        except CheckpointError as exc:
            if not self.accept_gap:
                raise
            return self._accept(str(exc)), False
        if state is None:
            start = current_position(self.mysql, earliest=self.connector.start_from == "earliest")
            log.info("no checkpoint at %s: starting at %s:%d", self.store.path, start.file, start.pos)
            return CheckpointState(start), True
        try:
            check_position(self.mysql, state.position, checkpoint=self.store.path)
        except BinlogGapError as exc:
            if not self.accept_gap:
                raise
            return self._accept(str(exc)), False
        log.info(
            "resuming at %s:%d (checkpoint %s)", state.position.file, state.position.pos, self.store.path
        )
        return state, False

    def _accept(self, reason: str) -> CheckpointState:
        """--accept-gap: fence every bound namespace, then continue from the server's current position."""
        log.error("ACCEPTING A BINLOG GAP (--accept-gap): %s", reason)
        self._fence(f"binlog gap accepted: {reason}")
        start = current_position(self.mysql)
        previous = self._saved_state()
        state = CheckpointState(
            start,
            change_topic=previous.change_topic if previous else None,
            topic_ends=previous.topic_ends if previous else {},
        )
        self.store.save(start, change_topic=state.change_topic, topic_ends=state.topic_ends)
        log.warning("continuing at the current binlog position %s:%d after the fence", start.file, start.pos)
        return state

    def _saved_state(self) -> CheckpointState | None:
        try:
            return self.store.load_state()
        except CheckpointError:
            return None

    def _check_topic(self, state: CheckpointState, topics: TopicsReport, *, fresh: bool) -> CheckpointState:
        """Fence when the change topic lost events this connector had produced; save a first checkpoint."""
        topic = self.kafka.change_topic
        if fresh:
            if topic not in topics.created:
                self._warn_if_not_empty(topics)
            self.store.save(state.position, change_topic=topic, topic_ends={})
            return CheckpointState(state.position, change_topic=topic)
        reasons = [state.pending_gap] if state.pending_gap else []
        if topic in topics.created:
            reasons.append(
                f"the change topic {topic!r} was missing and has been recreated (a broker that lost its "
                "data, or a deleted topic): events Kafka had acknowledged may never have reached a worker"
            )
        elif not reasons and state.change_topic == topic and state.topic_ends:
            highs = end_offsets(
                self.kafka, topic, topics.partitions.get(topic, 0), timeout_s=self.connector.kafka_timeout_s
            )
            lost = {p: (end, highs.get(p, 0)) for p, end in state.topic_ends.items() if highs.get(p, 0) < end}
            if lost:
                where = ", ".join(
                    f"partition {p} ends at {high}, not {end}" for p, (end, high) in sorted(lost.items())
                )
                reasons.append(
                    f"the change topic {topic!r} lost events Kafka had acknowledged ({where}): a broker "
                    "that lost its data, or the topic was recreated"
                )
        if not reasons:
            if state.change_topic != topic:
                return CheckpointState(state.position, change_topic=topic)
            return state
        reason = "; ".join(reasons)
        # Remembered before the fence: a crash or a failed fence makes every later session fence again.
        self.store.save(state.position, change_topic=topic, topic_ends=state.topic_ends, pending_gap=reason)
        self._fence(reason)
        self.store.save(state.position, change_topic=topic, topic_ends={})
        return CheckpointState(state.position, change_topic=topic)

    def _warn_if_not_empty(self, topics: TopicsReport) -> None:
        """No checkpoint, yet the change topic has events: a checkpoint was probably deleted."""
        topic = self.kafka.change_topic
        try:
            partitions = topics.partitions.get(topic, 0)
            highs = end_offsets(self.kafka, topic, partitions, timeout_s=self.connector.kafka_timeout_s)
        except ConnectorError as exc:
            log.debug("cannot read the end offsets of %s: %s", topic, exc)
            return
        if any(highs.values()):
            log.warning(
                "no checkpoint at %s but the change topic %r already holds %d event(s): if a checkpoint was "
                "deleted, the changes since it are not replayed and may stay stale in the caches; "
                "`freshkey connector --accept-gap` with the old checkpoint in place fences them instead",
                self.store.path,
                topic,
                sum(highs.values()),
            )

    def _fence(self, reason: str) -> None:
        """Call the fence hook before anything is produced; a failure ends the session (retried)."""
        self.stats.gaps += 1
        _gaps.add(1)
        log.error("GAP: %s. Fencing every bound namespace before producing anything", reason)
        if self.on_gap is None:
            raise ConfigurationError(
                f"{reason}; this connector has no fence hook to make the caches safe: run it with "
                "`freshkey connector`, which fences every bound namespace"
            )
        try:
            self.on_gap(reason)
        except ConnectorError:
            raise
        except Exception as exc:
            raise FenceError(
                f"fencing the caches failed ({exc!r}); nothing is produced until it succeeds"
            ) from exc

    # -- reading and producing -------------------------------------------------------------------------
    def _read(self, source: BinlogSource, session: _Session, start: BinlogPosition) -> None:
        producer, tracker = session.producer, session.tracker
        last_report = connected_at = time.monotonic()
        for item in source:
            now = time.monotonic()
            if not self.connected:
                self.connected, connected_at = True, now
                if self.on_ready is not None:
                    self.on_ready(start)
            if self.failures and now - connected_at >= STABLE_AFTER_S:
                self.failures = 0
            producer.raise_if_failed()
            if isinstance(item, Tick):
                pass
            elif isinstance(item, Boundary):
                tracker.boundary(item.position)
                self.stats.transactions += 1
            elif self.registry is not None and isinstance(item, ChangeEvent) and item.table == self.registry:
                self._registry_row(session, item)
            else:
                self._send(session, item)
                if isinstance(item, DeadLetter):
                    self.stats.dead_letters += 1
                    log.warning("dead letter: %s", item.reason)
                elif item.kind == "ddl":
                    self.stats.ddl += 1
                    log.info("DDL in %s: %s", item.source.db, item.query[:200])
                else:
                    self.stats.changes += 1
                while tracker.outstanding > self.connector.max_in_flight:
                    producer.raise_if_failed()
                    time.sleep(0.005)
            if now - last_report >= self.progress_every_s:
                last_report = now
                position = tracker.committed
                log.info(
                    "changes=%d ddl=%d dead_letters=%d oversize=%d retries=%d unacked=%d checkpoint=%s:%d",
                    self.stats.changes,
                    self.stats.ddl,
                    self.stats.dead_letters,
                    self.stats.oversize,
                    self.stats.retries,
                    tracker.outstanding,
                    position.file,
                    position.pos,
                )

    def _registry_row(self, session: _Session, event: ChangeEvent) -> None:
        """A change of the model registry table: a model update, or a dead letter saying why not."""
        try:
            update = update_from_row(event)
        except RegistryRowError as exc:
            self.stats.dead_letters += 1
            log.warning("model registry row %s: %s", event.key, exc)
            self._send(session, self._dead_letter(str(exc), encode(event), stage="model-registry"))
            return
        if update is None:
            return
        self._send(session, _ModelUpdate(update.model.encode(), update.model_dump_json().encode(), event))
        log.info(
            "model update from the registry: %s %s for %s",
            update.model,
            update.model_version,
            update.namespaces,
        )

    def _dead_letter(self, reason: str, original: bytes, *, stage: str) -> DeadLetter:
        return dead_letter(
            reason, original, stage=stage, max_original_bytes=self.kafka.dead_letter_max_original_bytes
        )

    def _message(self, item: _Item) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of an item."""
        if isinstance(item, _ModelUpdate):
            return self.kafka.model_update_topic, item.key, item.value
        if isinstance(item, DeadLetter):
            return self.kafka.dead_letter_topic, b"connector", encode(item)
        if isinstance(item, ChangeEvent):
            return (
                self.kafka.change_topic,
                message_key(item.source.db, item.source.table, item.key),
                encode(item),
            )
        return self.kafka.change_topic, f"ddl/{item.source.db}".encode(), encode(item)

    def _send(self, session: _Session, item: _Item, seq: int | None = None) -> None:
        """Produce ``item``, or its smaller stand-in when it is over the limit (now or at the broker).

        ``seq``: the event number a stand-in acknowledges (the original's); the checkpoint waits for it.
        """
        topic, key, value = self._message(item)
        if not self.limit.fits(key, value):
            smaller = self._shrink(item, len(key) + len(value))
            if smaller is not None:
                self._send(session, smaller, seq)
                return
        if seq is None:
            seq = session.tracker.produced()
        acked = seq
        sent = time.monotonic()

        def delivered() -> None:
            session.tracker.acknowledged(acked)
            _ack_latency.record((time.monotonic() - sent) * 1000)

        def too_large() -> None:
            smaller = self._shrink(item, len(key) + len(value))
            if smaller is None:
                raise ConfigurationError(
                    f"a {len(key) + len(value)}-byte message for {topic!r} is too large for Kafka and "
                    "cannot be made smaller; raise the broker's max.message.bytes"
                )
            self._send(session, smaller, acked)

        session.producer.produce(topic, key, value, delivered, on_too_large=too_large)

    def _shrink(self, item: _Item, size: int) -> _Item | None:
        """The stand-in for an item of ``size`` bytes over the limit, or None when it has none."""
        limit = self.limit.max_bytes
        if isinstance(item, ChangeEvent):
            if item.oversize:
                return None
            self.stats.oversize += 1
            _oversize.add(1)
            log.warning(
                "row %s.%s key %s: its change is %d bytes, over the %d-byte message limit "
                "(FRESHKEY_KAFKA_MAX_MESSAGE_BYTES): sent as an invalidation, the application reads it "
                "through",
                item.source.db,
                item.source.table,
                item.key,
                size,
                limit,
            )
            return ChangeEvent.model_validate(
                {**item.model_dump(), "before": None, "after": None, "oversize": True}
            )
        if isinstance(item, DdlEvent):
            if len(item.query) <= DDL_QUERY_CHARS:
                return None
            log.warning("DDL in %s is %d bytes, over the message limit: sent cut", item.source.db, size)
            cut = f"{item.query[:DDL_QUERY_CHARS]} /* freshkey: cut, {len(item.query)} chars in all */"
            return item.model_copy(update={"query": cut})
        if isinstance(item, _ModelUpdate):
            self.stats.dead_letters += 1
            log.warning(
                "model update from the registry is %d bytes, over the message limit: dead letter", size
            )
            return self._dead_letter(
                f"model update of {size} bytes is over the {limit}-byte message limit",
                item.value,
                stage="model-registry",
            )
        if item.original_b64:
            return item.model_copy(update={"original_b64": "", "truncated": True})
        return None


_CAUSE_TEXT: dict[str, str] = {
    "database": "database unavailable",
    "kafka": "kafka unavailable",
    "fence": "fence failed",
    "gap": "binlog gap accepted",
}


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "(no exception)"
    text = str(exc) or repr(exc)
    if isinstance(exc, ConnectorError):
        return text
    return f"{type(exc).__name__}: {text}"
