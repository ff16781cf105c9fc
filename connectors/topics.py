"""Explicit topic creation: freshkey never relies on broker auto-creation (wrong partition counts)."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from connectors.exceptions import ConfigurationError
from connectors.settings import KafkaSettings


def ensure_topics(
    settings: KafkaSettings, extra: Iterable[str] = (), *, timeout_s: float = 30.0
) -> dict[str, int]:
    """Create the change and dead-letter topics (and ``extra``) when missing.

    Returns topic -> partition count. An existing change topic with a different partition count than
    configured is an error: the key -> partition mapping would silently change under a running pipeline.
    """
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    wanted = [settings.change_topic, settings.dead_letter_topic, *extra]
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise ConfigurationError(
            f"cannot reach Kafka at {settings.bootstrap} ({exc}); set FRESHKEY_KAFKA_BOOTSTRAP"
        ) from None
    missing = [t for t in wanted if t not in existing]
    if missing:
        futures = admin.create_topics(
            [NewTopic(t, settings.partitions, settings.replication_factor) for t in missing],
            request_timeout=timeout_s,
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise ConfigurationError(f"cannot create topic {topic!r}: {exc}") from None
        existing = admin.list_topics(timeout=timeout_s).topics
    counts = {t: len(existing[t].partitions) for t in wanted if t in existing}
    have = counts.get(settings.change_topic)
    if have is not None and have != settings.partitions:
        raise ConfigurationError(
            f"topic {settings.change_topic!r} has {have} partitions but FRESHKEY_KAFKA_PARTITIONS is "
            f"{settings.partitions}; set it to {have} (changing the count reorders rows across partitions)"
        )
    return counts
