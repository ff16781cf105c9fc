"""What the worker's agents, timers and pages share: built once by :func:`pipeline.app.create_app`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import faust

    from pipeline.config import AllSettings
    from pipeline.cutover import Cutovers
    from pipeline.dead_letters import DeadLetterWriter
    from pipeline.models import ModelRegistry
    from pipeline.observe.broker import BrokerOffsets
    from pipeline.observe.otel import OtelObserver
    from pipeline.observe.progress import ConsumerProgress
    from pipeline.observe.sla import SlaEvaluator
    from pipeline.processor import ChangeProcessor
    from pipeline.tiers import Tiers
    from schemas import Bindings


@dataclass
class SignatureLog:
    """The last signature changes this worker made (cutovers, DDL, fences), oldest first; served at
    ``/freshkey/cutovers``."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    keep: int = 100

    def add(self, namespace: str, cause: str, **details: Any) -> None:
        entry = {"namespace": namespace, "cause": cause, **details, "ts_ms": int(time.time() * 1000)}
        self.entries.append(entry)
        del self.entries[: -self.keep]


@dataclass
class Worker:
    """One worker process: its settings, Faust app and topics, and the parts that do the work."""

    settings: AllSettings
    bindings: Bindings
    app: faust.App
    topics: dict[str, Any]
    """Faust topics by role: changes, dead_letters, model_updates, hotness, violations."""
    processor: ChangeProcessor
    registry: ModelRegistry
    cutovers: Cutovers
    tiers: Tiers
    dead_letters: DeadLetterWriter
    sla: SlaEvaluator
    otel: OtelObserver
    progress: ConsumerProgress
    broker_offsets: BrokerOffsets
    signature_log: SignatureLog = field(default_factory=SignatureLog)
