"""Where a session resumes, and the gaps that must be fenced before it produces anything.

Changes can be lost to the workers without any process failing: the binlog under the checkpoint was
purged, or the change topic lost events Kafka had acknowledged (a broker that lost its data, a topic
deleted and recreated). :class:`ResumeGuard` finds both and calls the fence hook (``on_gap(reason)``:
the command line fences every bound namespace) before the session produces anything. A purged binlog
stops the run (:class:`BinlogGapError`) unless ``accept_gap`` is set, which fences and continues from
the server's current position. A fence that fails is retried by the next session
(:class:`FenceError`): the checkpoint file remembers the pending gap across restarts, so nothing is
produced until a fence succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from connectors.binlog.positions import check_position, current_position
from connectors.checkpoint import CheckpointError, CheckpointState, CheckpointStore
from connectors.exceptions import BinlogGapError, ConfigurationError, ConnectorError, FenceError
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import TopicsReport, end_offsets, record_exists
from connectors.metrics import ConnectorMetrics, ConnectorStats
from connectors.settings import ConnectorSettings, MySQLSettings

log = logging.getLogger(__name__)

OnGap = Callable[[str], object]
"""Called with the reason when changes may have been lost to the workers, before anything is produced;
it must make every bound namespace safe (fence it). Raising makes the session retry the fence."""


class ResumeGuard:
    """A run's resume rules: the checkpoint's position checked against the server, the change topic
    checked against the offsets Kafka acknowledged, and the fence before anything is produced."""

    def __init__(
        self,
        mysql: MySQLSettings,
        kafka: KafkaSettings,
        connector: ConnectorSettings,
        store: CheckpointStore,
        *,
        on_gap: OnGap | None,
        accept_gap: bool,
        stats: ConnectorStats,
        metrics: ConnectorMetrics,
    ) -> None:
        self.mysql = mysql
        self.kafka = kafka
        self.connector = connector
        self.store = store
        self.on_gap = on_gap
        self.accept_gap = accept_gap
        self.stats = stats
        self.metrics = metrics

    def resume_state(self) -> tuple[CheckpointState, bool]:
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
            return self.accept(str(exc)), False
        if state is None:
            start = current_position(self.mysql, earliest=self.connector.start_from == "earliest")
            log.info("no checkpoint at %s: starting at %s:%d", self.store.path, start.file, start.pos)
            return CheckpointState(start), True
        try:
            check_position(self.mysql, state.position, checkpoint=self.store.path)
        except BinlogGapError as exc:
            if not self.accept_gap:
                raise
            return self.accept(str(exc)), False
        log.info(
            "resuming at %s:%d (checkpoint %s)", state.position.file, state.position.pos, self.store.path
        )
        return state, False

    def accept(self, reason: str) -> CheckpointState:
        """--accept-gap: fence every bound namespace, then continue from the server's current position."""
        log.error("ACCEPTING A BINLOG GAP (--accept-gap): %s", reason)
        self.fence(f"binlog gap accepted: {reason}")
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

    def remember_gap(self, reason: str) -> None:
        """A loss found while producing (``reason``): recorded in the checkpoint, so that the next
        session fences every bound namespace before producing anything. Called after the session's last
        save, which would drop it."""
        state = self._saved_state()
        if state is None:
            return  # nothing was ever acknowledged: nothing can have been lost
        log.error("GAP: %s. The next session fences every bound namespace before producing anything", reason)
        self.store.save(
            state.position, change_topic=state.change_topic, topic_ends=state.topic_ends, pending_gap=reason
        )

    def _saved_state(self) -> CheckpointState | None:
        try:
            return self.store.load_state()
        except CheckpointError:
            return None

    def check_topic(self, state: CheckpointState, topics: TopicsReport, *, fresh: bool) -> CheckpointState:
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
            lost = {
                p: (end, highs.get(p, 0))
                for p, end in state.topic_ends.items()
                if highs.get(p, 0) < end
                and not record_exists(self.kafka, topic, p, end - 1, timeout_s=self.connector.kafka_timeout_s)
            }
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
        self.fence(reason)
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

    def fence(self, reason: str) -> None:
        """Call the fence hook before anything is produced; a failure ends the session (retried)."""
        self.stats.gaps += 1
        self.metrics.gaps.add(1)
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
        except Exception as exc:  # whatever the hook raised: re-raised as a fence failure, with its class
            raise FenceError(
                f"fencing the caches failed ({exc!r}); nothing is produced until it succeeds"
            ) from exc
