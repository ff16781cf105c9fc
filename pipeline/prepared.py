"""What preparing one batch of change messages yields (:class:`pipeline.processor.ChangeProcessor`): the
planned cache actions, the messages rejected with their stage and reason (dead letters), the DDL and the
namespaces to fence; and how an unexpected exception is worded in a dead letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cache_writer import CacheAction
from schemas import Binding, Change, DdlEvent


@dataclass(frozen=True, slots=True)
class Planned:
    index: int
    event: Change
    binding: Binding
    actions: list[CacheAction]


@dataclass(frozen=True, slots=True)
class Reject:
    """A message that cannot be processed: it goes to the dead-letter topic with ``stage`` and ``reason``."""

    index: int
    stage: str
    reason: str


class Fence(NamedTuple):
    """Why a namespace is fenced (logged and recorded), and the cause its counters and signature log
    name."""

    reason: str
    cause: str


@dataclass
class Prepared:
    planned: list[Planned]
    rejects: list[Reject]
    ddl: list[DdlEvent]
    fences: dict[str, Fence]
    """Namespaces to fence before the batch is applied: oversized rows whose entry keys cannot be computed
    without the row, tables of which the connector could not read a rows event (``FenceEvent``). The
    batch's writes carry the signatures read before the fence, so the fence covers them too."""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]
