"""Explicit topic creation: freshkey never relies on broker auto-creation (wrong partition counts).

Errors: a broker that does not answer raises :class:`KafkaUnavailableError` (retriable: a connector
waits for it); a refusal that waiting cannot cure (an existing change topic with another partition
count, a creation the broker forbids) raises :class:`ConfigurationError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from connectors.exceptions import ConfigurationError, ConnectorError, KafkaUnavailableError, retry_cause
from connectors.kafka.librdkafka import LIBRDKAFKA_LOGGER
from connectors.kafka.security import SecurityErrors, librdkafka_config
from connectors.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

_TRY_S = 1.0
"""How long one metadata request of :func:`prepare_topics` may take before the next try."""


@dataclass(frozen=True, slots=True)
class TopicsReport:
    """What :func:`prepare_topics` found: partition counts, and the topics it had to create."""

    partitions: dict[str, int]
    created: list[str]
    ids: dict[str, str] = field(default_factory=dict)
    """The change topic's id (:func:`describe_ids`), read after any creation; empty where the broker did
    not say (the id is what :class:`~connectors.kafka.topic_check.TopicWatch` compares)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How a topic freshkey creates is made: its partition count and topic configs
    (``cleanup.policy``...)."""

    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)


def admin_client(settings: KafkaSettings) -> AdminClient:
    """An admin client as configured (security included)."""
    return _admin(settings)[0]


def _admin(settings: KafkaSettings) -> tuple[AdminClient, SecurityErrors]:
    """An admin client as configured (security included), and what it reports of a certificate or login
    failure (:func:`_unavailable` raises that instead of "does not answer")."""
    errors = SecurityErrors(settings)
    config = {**librdkafka_config(settings), "logger": LIBRDKAFKA_LOGGER, "error_cb": errors}
    admin = errors.client = AdminClient(config)
    return admin, errors


def _unavailable(
    settings: KafkaSettings, exc: KafkaException, errors: SecurityErrors | None = None
) -> ConnectorError:
    if errors is not None and errors.failure is not None:
        return errors.failure  # a certificate or a login that waiting does not fix
    return KafkaUnavailableError(
        f"Kafka at {settings.bootstrap} does not answer ({exc.args[0] if exc.args else exc}); "
        "check FRESHKEY_KAFKA_BOOTSTRAP if this lasts"
    )


def _list_topics(
    settings: KafkaSettings, admin: AdminClient, errors: SecurityErrors, timeout_s: float
) -> dict[str, Any]:
    """The broker's topics, asked for in short tries until ``timeout_s``: a refused login or a certificate
    that does not verify ends the wait at once (it was reported by the first try), a broker away does not."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            return dict(admin.list_topics(timeout=max(0.1, min(_TRY_S, remaining))).topics)
        except KafkaException as exc:
            if errors.failure is not None or time.monotonic() >= deadline:
                raise _unavailable(settings, exc, errors) from None


def prepare_topics(
    settings: KafkaSettings, extra: Iterable[str] = (), *, timeout_s: float = 30.0
) -> TopicsReport:
    """Create the change and dead-letter topics (and ``extra``) when missing; report what was created.

    An existing change topic with a different partition count than configured is a ConfigurationError:
    the key -> partition mapping would silently change under a running pipeline.
    """
    admin, errors = _admin(settings)
    wanted = [settings.change_topic, settings.dead_letter_topic, *extra]
    existing = _list_topics(settings, admin, errors, timeout_s)
    missing = [t for t in wanted if t not in existing]
    created: list[str] = []
    if missing:
        specs = {t: TopicSpec(settings.partitions) for t in missing}
        created = _create(settings, admin, specs, timeout_s)
        try:
            existing = admin.list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise _unavailable(settings, exc) from None
    counts = {t: len(existing[t].partitions) for t in wanted if t in existing}
    have = counts.get(settings.change_topic)
    if have is not None and have != settings.partitions:
        raise ConfigurationError(
            f"topic {settings.change_topic!r} has {have} partitions but FRESHKEY_KAFKA_PARTITIONS is "
            f"{settings.partitions}; set it to {have} (changing the count reorders rows across partitions)"
        )
    try:
        ids = describe_ids(admin, [settings.change_topic], timeout_s)
    except (KafkaException, TimeoutError) as exc:  # a broker that cannot say: no watch, nothing else lost
        log.warning("Kafka did not describe %r (%r): its identity is not watched", settings.change_topic, exc)
        ids = {}
    return TopicsReport(
        partitions=counts, created=sorted(created), ids={t: i for t, i in ids.items() if i is not None}
    )


def _create(
    settings: KafkaSettings, admin: AdminClient, specs: Mapping[str, TopicSpec], timeout_s: float
) -> list[str]:
    """Create ``specs``; the names created, sorted. One that someone else created meanwhile (a worker and
    a connector starting together) is skipped, not an error."""
    futures = admin.create_topics(
        [
            NewTopic(t, spec.partitions, settings.replication_factor, config=dict(spec.config))
            for t, spec in specs.items()
        ],
        request_timeout=timeout_s,
    )
    created: list[str] = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(topic)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                continue
            if retry_cause(exc) is not None and "POLICY" not in str(exc):
                raise _unavailable(settings, exc) from None
            raise ConfigurationError(f"cannot create topic {topic!r}: {exc}") from None
        except TimeoutError:
            raise KafkaUnavailableError(
                f"Kafka at {settings.bootstrap} did not create topic {topic!r} within {timeout_s:.0f} s"
            ) from None
    return sorted(created)


class TopicRestorer:
    """Creates the topics a process owns when the broker does not have them (:meth:`restore`), with one
    admin client for its whole life: a process that looks every few seconds would otherwise open a new
    client (threads, a connection, a metadata request) at each look. librdkafka reconnects it by itself
    after a broker restart."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._admin, self._errors = _admin(settings)

    def restore(
        self, wanted: Mapping[str, TopicSpec], *, timeout_s: float = 10.0
    ) -> tuple[list[str], list[str]]:
        """Create those of ``wanted`` the broker does not have, as specified; returns (the topics created,
        every topic the broker has), both sorted. For a process that must not wait for a broker's
        auto-creation: with it off, a topic lost with a broker's data never comes back; with it on, it
        comes back with the broker's default partition count and configs."""
        existing = _list_topics(self.settings, self._admin, self._errors, timeout_s)
        missing = {t: spec for t, spec in wanted.items() if t not in existing}
        created = _create(self.settings, self._admin, missing, timeout_s) if missing else []
        return created, sorted(set(existing) | set(created))


def ensure_topics(
    settings: KafkaSettings, extra: Iterable[str] = (), *, timeout_s: float = 30.0
) -> dict[str, int]:
    """Create the change and dead-letter topics (and ``extra``) when missing; topic -> partition count."""
    return prepare_topics(settings, extra, timeout_s=timeout_s).partitions


def end_offsets(
    settings: KafkaSettings, topic: str, partitions: int, *, timeout_s: float = 10.0
) -> dict[int, int]:
    """Partition -> offset of the next message to be written (the high watermark), from the broker."""
    admin, _ = _admin(settings)
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(
        {TopicPartition(topic, p): latest for p in range(partitions)}, request_timeout=timeout_s
    )
    ends: dict[int, int] = {}
    for tp, future in futures.items():
        try:
            ends[tp.partition] = int(future.result(timeout=timeout_s).offset)
        except KafkaException as exc:
            raise _unavailable(settings, exc) from None
        except TimeoutError:
            raise KafkaUnavailableError(
                f"Kafka at {settings.bootstrap} did not report the end offsets of {topic!r} "
                f"within {timeout_s:.0f} s"
            ) from None
    return ends


def record_exists(
    settings: KafkaSettings, topic: str, partition: int, offset: int, *, timeout_s: float = 10.0
) -> bool:
    """Whether the broker still holds the message at ``offset``: read it directly (an assigned
    consumer that joins no group and commits nothing). Some brokers report end offsets below the log
    end (Tansu: the last batch's base offset + 1), so a short end offset alone does not prove a loss."""
    consumer = Consumer(
        {
            **librdkafka_config(settings),
            "group.id": "freshkey-connector-probe",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        },
        logger=LIBRDKAFKA_LOGGER,
    )
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        message = consumer.poll(timeout_s)
        if message is None:
            return False
        error = message.error()
        return error is None and message.offset() == offset
    except KafkaException as exc:
        raise _unavailable(settings, exc) from None
    finally:
        consumer.close()


NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""The zero topic id, as librdkafka prints it: what a broker without topic ids gives."""


def describe_ids(admin: AdminClient, topics: Iterable[str], timeout_s: float) -> dict[str, str | None]:
    """Topic -> its id (a new one each time a topic is created: a topic deleted or lost and created again
    has another), or None for one the broker does not have. A broker without topic ids gives
    :data:`NO_TOPIC_ID`. Raises KafkaException for a broker that does not answer (or another error)."""
    futures = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
    ids: dict[str, str | None] = {}
    for topic, future in futures.items():
        try:
            ids[topic] = str(future.result(timeout=timeout_s).topic_id)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                ids[topic] = None
            else:
                raise
    return ids


def topic_names(settings: KafkaSettings, *, timeout_s: float = 10.0) -> list[str]:
    """The names of every topic on the cluster, sorted."""
    admin, errors = _admin(settings)
    try:
        return sorted(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise _unavailable(settings, exc, errors) from None
