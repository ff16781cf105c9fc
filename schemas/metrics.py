"""Metric and label names: the dashboard contract shared by the connector, the worker and Grafana.

Names follow the OpenTelemetry conventions (dotted, unit in the ``unit`` field, not in the name; counters
without ``_total``); the Prometheus exporter turns ``freshkey.lag`` with unit ``ms`` into
``freshkey_lag_milliseconds_bucket``/``_sum``/``_count`` and a counter ``freshkey.events`` into
``freshkey_events_total``. :data:`PROMETHEUS_METRIC_NAMES` lists every series name the code can export,
so that dashboards can be checked against it (tests/unit/pipeline/test_grafana.py). Each series also
carries the labels ``otel_scope_name``, ``otel_scope_version`` and ``otel_scope_schema_url``.
"""

from __future__ import annotations

SCOPE = "freshkey"
"""Instrumentation scope (meter and tracer name) of the pipeline's own instruments."""

# -- instrument names (OpenTelemetry) ----------------------------------------------------------------
LAG = "freshkey.lag"
STAGE_DURATION = "freshkey.stage.duration"
EVENTS = "freshkey.events"
CACHE_OUTCOMES = "freshkey.cache.outcomes"
CONSUMER_LAG = "freshkey.consumer.lag"
CONSUMER_BACKLOG_AGE = "freshkey.consumer.backlog.age"
CONSUMER_UNKNOWN_PARTITIONS = "freshkey.consumer.partitions.unknown"
SLA_VIOLATIONS = "freshkey.sla.violations"
SLA_VIOLATED = "freshkey.sla.violated"
SLA_LAG_P99 = "freshkey.sla.lag.p99"
SLA_WINDOW_RATIO = "freshkey.sla.window.ratio"
# The connector's (connectors.metrics)
CONNECTOR_ACK_LATENCY = "freshkey.connector.ack.latency"
CONNECTOR_CHECKPOINT_AGE = "freshkey.connector.checkpoint.age"
CONNECTOR_CONNECTED = "freshkey.connector.connected"
CONNECTOR_RETRIES = "freshkey.connector.retries"
CONNECTOR_OVERSIZE = "freshkey.connector.oversize"
CONNECTOR_GAPS = "freshkey.connector.gaps"
CONNECTOR_UNREADABLE = "freshkey.connector.unreadable_events"

# -- attribute keys ----------------------------------------------------------------------------------
ATTR_NAMESPACE = "namespace"
ATTR_COARSE = "coarse"
ATTR_STAGE = "stage"
ATTR_KIND = "kind"
ATTR_TIER = "tier"
ATTR_OUTCOME = "outcome"
ATTR_TARGET = "target"
ATTR_TOPIC = "messaging.destination.name"
"""OpenTelemetry messaging semantic conventions (Prometheus label ``messaging_destination_name``)."""
ATTR_PARTITION = "messaging.destination.partition.id"
ATTR_CAUSE = "cause"
"""What a connector retry was about: ``database``, ``kafka``, ``fence``, ``gap``."""

LAG_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 5000, 10000)
"""Lag buckets: the SLA thresholds (200 ms, 1.5 s) are bucket bounds, so Prometheus can count exactly."""
STAGE_BUCKETS_MS: tuple[float, ...] = (0.1, 0.25, 0.5, *LAG_BUCKETS_MS)

_HISTOGRAMS = {
    "freshkey_lag_milliseconds",
    "freshkey_stage_duration_milliseconds",
    "freshkey_connector_ack_latency_milliseconds",
}
_COUNTERS = {
    "freshkey_events",
    "freshkey_cache_outcomes",
    "freshkey_sla_violations",
    "freshkey_connector_retries",
    "freshkey_connector_oversize",
    "freshkey_connector_gaps",
    "freshkey_connector_unreadable_events",
}
_GAUGES = {
    "freshkey_consumer_lag",
    "freshkey_sla_violated",
    "freshkey_sla_lag_p99_milliseconds",
    "freshkey_sla_window_ratio",
    "freshkey_connector_checkpoint_age_seconds",
    "freshkey_connector_connected",
    "freshkey_consumer_backlog_age_milliseconds",
    "freshkey_consumer_partitions_unknown",
}
PROMETHEUS_METRIC_NAMES: frozenset[str] = frozenset(
    {f"{h}{suffix}" for h in _HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | {f"{c}_total" for c in _COUNTERS}
    | _GAUGES
    | {"target_info"}
)
"""Every series name the worker and the connector can export on their Prometheus endpoints."""
