"""What ``freshkey bench pipeline`` measures and how much: :class:`BenchConfig`, the ``--only`` names,
and the :class:`Progress` the command line renders."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

KINDS = ("single", "multi")
BACKLOG_SCENARIOS = ("raw-decode", "raw-redis", "connector", "e2e", "worker", "workers-2")
SCENARIOS = (*BACKLOG_SCENARIOS, "rates")


class BenchError(RuntimeError):
    """The bench could not measure something; the message says what and where the logs are."""


@dataclass(frozen=True)
class BenchConfig:
    """What to measure and how much. The defaults finish in a few minutes on a 2-core machine;
    :meth:`full` matches the sizes of issue 9 (50,000 single-row transactions, 50 x 1,000-row inserts)."""

    changes: int = 10_000
    insert_rows: int = 1_000
    rows: int = 1_000
    runs: int = 3
    rates: tuple[float, ...] = (500.0, 1_000.0, 2_000.0, 5_000.0)
    rate_seconds: float = 2.0
    partitions: int = 4
    kinds: tuple[str, ...] = KINDS
    scenarios: tuple[str, ...] = SCENARIOS
    seed: int = 7
    timeout_s: float = 300.0

    @classmethod
    def full(cls, **overrides: Any) -> BenchConfig:
        return replace(cls(changes=50_000, rate_seconds=10.0), **overrides)

    def check(self) -> None:
        """ValueError saying which option to change."""
        problems = []
        if self.changes < 1 or self.rows < 1 or self.insert_rows < 1:
            problems.append("--changes, --rows and --insert-rows must be at least 1")
        if self.runs < 1:
            problems.append("--runs must be at least 1")
        if any(rate <= 0 for rate in self.rates):
            problems.append("every --rates value must be positive")
        if self.rate_seconds <= 0:
            problems.append("--rate-seconds must be positive")
        if self.partitions < 1:
            problems.append("--partitions must be at least 1")
        if "workers-2" in self.scenarios and self.partitions < 2:
            problems.append("workers-2 needs at least 2 partitions (--partitions)")
        unknown = [k for k in self.kinds if k not in KINDS] + [
            s for s in self.scenarios if s not in SCENARIOS
        ]
        if unknown:
            problems.append(f"unknown {', '.join(unknown)}; choose from {', '.join((*KINDS, *SCENARIOS))}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def inserts(self) -> int:
        """Multi-row INSERTs in the ``multi`` backlog."""
        return -(-self.changes // self.insert_rows)

    def backlog_rows(self, kind: str) -> int:
        return self.changes if kind == "single" else self.inserts * self.insert_rows

    @property
    def backlog_scenarios(self) -> tuple[str, ...]:
        return tuple(s for s in BACKLOG_SCENARIOS if s in self.scenarios)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "inserts": self.inserts}


def parse_only(values: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--only`` values (repeatable, comma-separated) -> (kinds, scenarios). Naming no kind keeps both
    backlogs; naming no scenario keeps every scenario. ValueError for an unknown name."""
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS and n not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"--only: unknown {', '.join(unknown)}; choose from {', '.join((*KINDS, *SCENARIOS))}"
        )
    kinds = tuple(k for k in KINDS if k in names) or KINDS
    scenarios = tuple(s for s in SCENARIOS if s in names) or SCENARIOS
    return kinds, scenarios


class Progress:
    """What the bench reports while it runs (the command line renders it with rich)."""

    def start(self, total: int) -> None: ...

    def step(self, description: str) -> None:
        """A new step begins (the previous one is done)."""

    def log(self, text: str) -> None: ...

    def finish(self) -> None: ...
