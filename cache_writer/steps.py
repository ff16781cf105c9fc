"""Driving the sans-I/O protocols of this package (``redis.redirects``, ``client.core``).

A protocol is a generator that yields the I/O it needs and takes each result back; an asyncio and a
blocking driver carry the same steps out, so the rules are written once::

    runner = StepRunner(steps)
    step = runner.next(None)
    while step is not None:
        step = runner.next(do(step))  # or: await do(step)
    return runner.result
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar

S = TypeVar("S")
R = TypeVar("R")


class StepRunner(Generic[S, R]):
    """Feeds a generator of steps: :meth:`next` gives the next step, None once it has returned
    (:attr:`result` then holds what it returned)."""

    def __init__(self, steps: Generator[S, Any, R]) -> None:
        self._steps = steps
        self.result: R

    def next(self, reply: Any) -> S | None:
        """Send the reply to the last step (None for the first) and return the next step."""
        try:
            return self._steps.send(reply)
        except StopIteration as done:
            self.result = done.value
            return None
