"""The SLA's state as the worker serves it (``/freshkey/sla``) and ``freshkey sla`` reads it."""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

TargetName = Literal["p99_lag", "consistency_window", "heartbeat", "backlog_age"]
Status = Literal["ok", "violated", "no_data"]


class TargetState(BaseModel):
    """One target as last evaluated. ``threshold`` and ``measured`` are in ``unit``."""

    model_config = ConfigDict(frozen=True)

    name: TargetName
    status: Status
    threshold: float
    measured: float | None
    unit: Literal["ms", "fraction"]
    since_ms: int = Field(description="When this target entered its status, ms since the epoch.")
    detail: str


class SlaViolation(BaseModel):
    """A transition of a worker's SLA state: into violation, or the recovery from one."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["violation", "recovery"]
    at_ms: int = Field(description="When the evaluator saw the transition, ms since the epoch.")
    worker: str
    violated: tuple[TargetName, ...] = Field(
        description="Targets violated at a violation; the targets that had been violated, at a recovery."
    )
    since_ms: int = Field(
        description="When the violation began (for a recovery: its duration is at - since)."
    )
    samples: int
    evaluation_window_s: float
    targets: tuple[TargetState, ...]
    message: str

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))


class SlaState(BaseModel):
    """A worker's SLA state: served at ``/freshkey/sla`` and read by ``freshkey sla``."""

    model_config = ConfigDict(frozen=True)

    status: Status = Field(description="violated if any target is; else ok if any is; else no_data.")
    since_ms: int
    evaluated_at_ms: int
    worker: str
    evaluation_window_s: float
    samples: int = Field(description="Precise lag samples in the window.")
    p50_ms: float | None = Field(
        description="Nearest-rank p50 over the window (see pipeline.observe.sketch)."
    )
    p99_ms: float | None = Field(
        description="Nearest-rank p99 over the window: <= the p99_lag threshold exactly when it is met."
    )
    max_ms: float | None
    within_window_fraction: float | None
    targets: tuple[TargetState, ...]
    violations: int = Field(description="Violation events since the worker started.")
    last_event: SlaViolation | None
    backlog_age_ms: float | None = Field(
        None,
        description="How long the oldest change waiting on this worker's partitions of the change topic "
        "has waited, at least (0: caught up; None: not known, or not reported by this worker).",
    )
    window_end_ms: int | None = Field(
        None,
        description="The window is [window_end_ms - evaluation_window_s, window_end_ms): whole seconds, the "
        "current one left out, like every windowed figure of the worker (None: from an older worker).",
    )
    unknown_partitions: int | None = Field(
        None,
        description="Partitions of the change topic this worker should know about but has no figure for "
        "(see /freshkey/consumer-lag); None: consumer progress not reported by this worker.",
    )

    @property
    def violated(self) -> bool:
        return self.status == "violated"


def format_ms(value: float, threshold: float | None = None) -> str:
    """``value`` in ms with one decimal, or as many more (up to 6) as it takes for the text to compare
    with ``threshold`` the way the value does: 200.04 against 200 reads ``200.04 ms``, never ``200.0 ms``."""
    for decimals in range(1, 7):
        text = f"{value:.{decimals}f}"
        if threshold is None or (float(text) <= threshold) == (value <= threshold):
            return f"{text} ms"
    return f"{value!r} ms"
