"""The change topic's messages on their way from the worker's fetch loop (:mod:`pipeline.consumer`) to the
change agent (:mod:`pipeline.agents.changes`), in batches of a fetch's worth."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection

from faust.types import Message


class Intake:
    """Messages of ``topics`` on their way from the fetch loop to the one task that consumes them.

    The fetch loop :meth:`put`s messages (:meth:`put_many`: a partition's worth of a fetch) and
    :meth:`flush`es after each fetch; :meth:`take` returns up to ``max_`` of them, oldest first, once a
    fetch's worth is in (or ``batch`` are waiting), so a batch is as full as the broker's answer without
    a timer. At ``capacity`` the fetch loop waits for room (:meth:`wait_room`) before it puts more.
    :meth:`clear` drops what is waiting: Faust calls it when partitions are revoked (its flow control),
    and the consumer seeks back to the committed offsets, so nothing is lost.
    """

    def __init__(self, topics: Collection[str], *, batch: int, capacity: int) -> None:
        if batch < 1 or capacity < batch:
            raise ValueError("an intake needs batch >= 1 and capacity >= batch")
        self.topics = frozenset(topics)
        self.batch = batch
        self.capacity = capacity
        self._items: list[Message] = []
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self.capacity

    def put(self, message: Message) -> None:
        self.put_many([message])

    def put_many(self, messages: list[Message]) -> None:
        """:meth:`put` of each of ``messages`` (a partition's worth of a fetch), in one step."""
        items = self._items
        items.extend(messages)
        if len(items) >= self.batch:
            self._ready.set()
            if len(items) >= self.capacity:
                self._room.clear()

    def flush(self) -> None:
        """The end of a fetch: whatever came in may be taken."""
        if self._items:
            self._ready.set()

    async def take(self, max_: int, within_s: float = 0.0) -> list[Message]:
        """Up to ``max_`` messages, in the order they were put; waits until there are some, then up to
        ``within_s`` more for the batch to fill (0: what has come in is the batch)."""
        while not self._items or not self._ready.is_set():
            self._ready.clear()
            await self._ready.wait()
        if within_s > 0 and len(self._items) < max_:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    while len(self._items) < max_:
                        self._ready.clear()
                        await self._ready.wait()
        batch = self._items[:max_]
        del self._items[:max_]
        if not self._items:
            self._ready.clear()
        if len(self._items) < self.capacity:
            self._room.set()
        return batch

    async def wait_room(self) -> None:
        await self._room.wait()

    def clear(self) -> None:
        self._items.clear()
        self._ready.clear()
        self._room.set()


__all__ = ["Intake"]
