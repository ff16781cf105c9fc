"""What the connector counts: its OpenTelemetry instruments and a run's own tally.

The instruments use the OpenTelemetry API only (the entry point installs the SDK); their names are the
dashboard contract in :mod:`schemas.metrics`. :data:`CONNECTOR_METRICS` is the process's set, on the
global meter; tests build their own :class:`ConnectorMetrics` on an in-memory meter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import get_args

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from connectors.exceptions import RetryCause
from schemas import metrics as names

ACK_BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
"""Buckets of the acknowledgement latency (acks=all on a local broker takes about a millisecond)."""


class ConnectorMetrics:
    """The connector's instruments on ``meter``.

    The two gauges observe the newest callable registered in :attr:`checkpoint_ages` and
    :attr:`connection_states` (a running connector registers its own, and removes it when it ends), so
    that a process without a running connector exports nothing for them.
    """

    def __init__(self, meter: Meter) -> None:
        self.ack_latency = meter.create_histogram(
            names.CONNECTOR_ACK_LATENCY,
            unit="ms",
            description="Produce to Kafka acknowledging an event (acks=all); one event in 16, sampled.",
            explicit_bucket_boundaries_advisory=ACK_BUCKETS_MS,
        )
        self.retries = meter.create_counter(
            names.CONNECTOR_RETRIES,
            description="Sessions ended by a retriable failure, by cause (database, kafka, fence, gap); "
            "each is followed by a new session from the checkpoint after a backoff.",
        )
        self.oversize = meter.create_counter(
            names.CONNECTOR_OVERSIZE,
            description="Row changes sent as invalidations because their event was over the message limit.",
        )
        self.gaps = meter.create_counter(
            names.CONNECTOR_GAPS,
            description="Gaps found (purged binlog, change topic that lost events), each followed by a "
            "fence.",
        )
        self.unreadable = meter.create_counter(
            names.CONNECTOR_UNREADABLE,
            description="Bound tables whose changes the connector could not read from the binlog, once "
            "per event and table: a rows event it cannot decode (also in the dead-letter topic), rows that "
            "became dead letters, a partial JSON update, a row change logged as a statement, a compressed "
            "event (every table); each table's namespace was fenced.",
        )
        self.checkpoint_ages: list[Callable[[], float]] = []
        """The running connector's checkpoint age (seconds); empty when none runs in this process."""
        self.connection_states: list[Callable[[], int]] = []
        """The running connector's connection state (1 reading and producing, 0 waiting to reconnect)."""
        meter.create_observable_gauge(
            names.CONNECTOR_CHECKPOINT_AGE,
            callbacks=[self._observe_checkpoint_age],
            unit="s",
            description="Time since the saved checkpoint last moved; 0 while no read event waits for it.",
        )
        meter.create_observable_gauge(
            names.CONNECTOR_CONNECTED,
            callbacks=[self._observe_connected],
            description="1 while the connector reads the binlog and produces to Kafka, 0 while it waits "
            "to retry.",
        )

    def _observe_checkpoint_age(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(age()) for age in self.checkpoint_ages[-1:]]

    def _observe_connected(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(state()) for state in self.connection_states[-1:]]

    def start_at_zero(self) -> None:
        """Every counter series at 0 from the start: a dashboard shows "no retries", never "no data"."""
        for cause in get_args(RetryCause):
            self.retries.add(0, {names.ATTR_CAUSE: cause})
        self.oversize.add(0)
        self.gaps.add(0)
        self.unreadable.add(0)

    def retried(self, cause: str) -> None:
        self.retries.add(1, {names.ATTR_CAUSE: cause})


CONNECTOR_METRICS = ConnectorMetrics(metrics.get_meter(names.SCOPE))
"""The instruments of this process's connector (global meter: served once an entry point configures
the SDK, ``pipeline.observe.otel.configure_telemetry``)."""


@dataclass
class ConnectorStats:
    """What a run did, for its caller and the progress lines."""

    changes: int = 0
    ddl: int = 0
    dead_letters: int = 0
    transactions: int = 0
    oversize: int = 0
    unreadable: int = 0
    retries: int = 0
    gaps: int = 0
    sessions: int = 0
