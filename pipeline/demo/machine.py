"""How busy the machine was while the demo drove its changes, and whether the driver kept its rate.

Lag figures measured on a shared machine with more runnable processes than CPUs include time spent
waiting for a CPU: the demo prints these beside them so that a slow figure comes with its reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

HELD_FRACTION = 0.95
"""The driver held its rate when it reached at least this share of the rate asked for."""


@dataclass(frozen=True)
class MachineLoad:
    """Load averages (runnable processes, over 1, 5 and 15 minutes) and the CPUs this process may use."""

    cpus: int
    load_1m: float
    load_5m: float
    load_15m: float

    @classmethod
    def now(cls) -> MachineLoad:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        load_1m, load_5m, load_15m = os.getloadavg()
        return cls(cpus, load_1m, load_5m, load_15m)

    @property
    def busy(self) -> bool:
        """More runnable processes than CPUs over the last minute: work waits for a CPU."""
        return self.load_1m > self.cpus

    def text(self) -> str:
        return (
            f"load {self.load_1m:.2f} / {self.load_5m:.2f} / {self.load_15m:.2f} (1/5/15 min) "
            f"on {self.cpus} CPU{'' if self.cpus == 1 else 's'}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "load_1m": round(self.load_1m, 2),
            "load_5m": round(self.load_5m, 2),
            "load_15m": round(self.load_15m, 2),
        }


@dataclass(frozen=True)
class Pace:
    """The rate the driver was asked for, the rate it reached, and how far it fell behind its schedule
    (each change is due at ``start + i / rate``; a late one is sent at once, never skipped)."""

    target_per_s: float
    achieved_per_s: float
    max_behind_s: float

    @property
    def held(self) -> bool:
        return self.achieved_per_s >= HELD_FRACTION * self.target_per_s

    def warning(self, machine: MachineLoad) -> str | None:
        """What to tell the user when the rate was not held (None when it was)."""
        if self.held:
            return None
        why = (
            f"the machine is busy ({machine.text()})"
            if machine.busy
            else f"the database or this process was too slow ({machine.text()})"
        )
        return (
            f"the driver could not hold {self.target_per_s:,.0f} changes/s: it reached "
            f"{self.achieved_per_s:,.0f}/s and fell up to {self.max_behind_s:,.2f} s behind its schedule; "
            f"{why}. The lag figures come from this slower run: lower --rate, or run on a quieter machine"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "target_per_s": round(self.target_per_s, 1),
            "achieved_per_s": round(self.achieved_per_s, 1),
            "max_behind_s": round(self.max_behind_s, 3),
            "held": self.held,
        }
