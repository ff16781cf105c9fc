"""The worker's table manager (``pipeline.faust_app.PromptTableManager``): it closes the list of tables
and starts recovery at once, without Faust's 1 s sleep (which every worker start waited for)."""

from __future__ import annotations

import asyncio
from typing import Any

from faust.tables import TableManager

from pipeline.faust_app import FreshkeyApp, PromptTableManager


class _Recovery:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def start(self) -> None:
        self.calls.append("recovery")


def _started(manager: TableManager) -> tuple[list[str], bool]:
    """What ``manager.on_start`` did (with the channels and recovery stubbed), and whether it slept."""
    calls: list[str] = []
    slept = False

    async def sleep(seconds: float) -> None:
        nonlocal slept
        slept = True

    async def update_channels() -> None:
        calls.append("channels")

    manager_: Any = manager
    manager_.sleep = sleep
    manager_._update_channels = update_channels
    manager_._recovery = _Recovery(calls)
    asyncio.run(manager.on_start())
    return calls, slept


def test_the_worker_app_uses_the_prompt_table_manager() -> None:
    app = FreshkeyApp("test-prompt-tables", broker="kafka://127.0.0.1:9")
    assert isinstance(app.tables, PromptTableManager)


def test_tables_are_closed_and_recovered_without_a_sleep() -> None:
    app = FreshkeyApp("test-prompt-tables-2", broker="kafka://127.0.0.1:9")
    assert _started(app.tables) == (["channels", "recovery"], False)


def test_fausts_own_manager_sleeps_first() -> None:
    """The negative control: Faust's manager, stubbed the same way, does sleep."""
    app = FreshkeyApp("test-prompt-tables-3", broker="kafka://127.0.0.1:9", TableManager=TableManager)
    assert type(app.tables) is TableManager
    assert _started(app.tables) == (["channels", "recovery"], True)
