"""pipeline.tiers.Tiers.check_incarnation without Redis: the identity a data set is seen under is recorded
only once a restored one is fenced, so a fence that fails (MySQL away, L2 gone again) is tried again at the
next look instead of being forgotten."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.tiers import Tiers


class _Tier:
    name = "redis"

    def __init__(self, current: str, recorded: str | None) -> None:
        self.current, self.recorded = current, recorded

    async def incarnation(self, prefix: str) -> tuple[str, str | None]:
        return self.current, self.recorded

    async def record_incarnation(self, prefix: str, identity: str) -> None:
        self.recorded = identity


def _tiers(tier: _Tier, *, fence_on_restore: bool = True) -> tuple[Tiers, list[str]]:
    settings: Any = SimpleNamespace(redis=SimpleNamespace(key_prefix="fk", fence_on_restore=fence_on_restore))
    events: list[str] = []
    processor: Any = SimpleNamespace(observers=SimpleNamespace(on_event=events.append))
    tiers = Tiers(settings, [], processor, SimpleNamespace())  # type: ignore[arg-type]
    tiers._l2 = tier  # type: ignore[assignment]
    return tiers, events


def test_a_failed_fence_is_tried_again_at_the_next_look() -> None:
    tier = _Tier("B", "A")
    tiers, events = _tiers(tier)
    calls: list[str] = []

    async def fence(bindings: object, reason: str, *, cause: str) -> list[str]:
        calls.append(cause)
        if len(calls) == 1:
            raise ConnectionError("MySQL away")
        return []

    tiers.fence = fence  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        asyncio.run(tiers.check_incarnation())
    assert tier.recorded == "A", "not recorded: the next look must fence again"
    assert asyncio.run(tiers.check_incarnation()) is True
    assert calls == ["tier-restored", "tier-restored"] and tier.recorded == "B"
    assert asyncio.run(tiers.check_incarnation()) is False, "recorded: no fence at the following looks"
    assert events == ["tier_restored", "tier_restored"]


def test_a_new_data_set_is_recorded_without_a_fence() -> None:
    tier = _Tier("B", None)
    tiers, events = _tiers(tier)
    assert asyncio.run(tiers.check_incarnation()) is False
    assert tier.recorded == "B" and events == []


def test_with_the_fence_off_a_restored_data_set_is_only_recorded() -> None:
    tier = _Tier("B", "A")
    tiers, events = _tiers(tier, fence_on_restore=False)
    assert asyncio.run(tiers.check_incarnation()) is False
    assert tier.recorded == "B" and events == []
