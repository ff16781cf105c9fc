"""What to do about each reply of a pipeline: the redirect and lost-script rules, once, without I/O.

:func:`pipeline_steps` is a generator that says what to send and what to do next; the asyncio and the
blocking :func:`~cache_writer.redis.pipeline.run_pipeline` only carry its steps out, so both follow
MOVED/ASK/TRYAGAIN and answer NOSCRIPT by the same rules (see :mod:`cache_writer.redis.pipeline`).

Steps (each an :class:`Step` whose ``op`` names the method of the driver that carries it out):

- ``send(pending)``: send each pending ``(command index, target)`` once and reply with one answer per
  pending command, in order. A target None goes by the client's slot map; ``(node, asking)`` goes to
  that node (``host:port``), right behind an ``ASKING`` when ``asking``.
- ``load(node)``: load the scripts on that node (None: wherever the client's SCRIPT LOAD goes).
- ``refresh()``: refresh the client's slot map (after MOVED).
- ``pause(seconds)``: wait (TRYAGAIN).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

MAX_ROUNDS = 16
"""Redirect rounds per call before the last redirect error is returned as the reply (redis-py uses 16)."""

TRYAGAIN_PAUSE_S = 0.05

Target = tuple[str, bool] | None
"""Where a pending command goes next: None = by the client's slot map; else (node ``host:port``, asking)."""


@dataclass
class RedirectStats:
    """Counts of what :func:`run_pipeline` had to follow, summed over the calls it was passed to."""

    ask: int = 0
    moved: int = 0
    tryagain: int = 0
    noscript: int = 0


class Step(NamedTuple):
    """One thing for the driver to do: call its method ``op`` with ``args`` and send back the result."""

    op: str
    args: tuple[Any, ...] = ()


Steps = Generator[Step, Any, list[Any]]


def pipeline_steps(
    count: int, *, scripts: bool, follow_redirects: bool, stats: RedirectStats | None = None
) -> Steps:
    """The steps that run ``count`` commands to one reply each (module docstring); returns the replies.

    ``scripts``: answer NOSCRIPT by loading the scripts and resending the refused commands (once per
    node). ``follow_redirects``: a cluster client (a single server's MOVED is only a reply).
    """
    stats = stats if stats is not None else RedirectStats()
    replies: list[Any] = [None] * count
    pending: list[tuple[int, Target]] = [(index, None) for index in range(count)]
    loaded_by_map = False
    loaded_on: set[str] = set()
    for _ in range(MAX_ROUNDS):
        answered = yield Step("send", (pending,))
        retry: list[tuple[int, Target]] = []
        refresh = pause = load_by_map = False
        load_nodes: set[str] = set()
        for (index, target), reply in zip(pending, answered, strict=True):
            replies[index] = reply
            if follow_redirects and isinstance(reply, MovedError):  # an AskError: test it first
                retry.append((index, (_node_name(reply), False)))
                refresh = True
                stats.moved += 1
            elif follow_redirects and isinstance(reply, AskError):
                retry.append((index, (_node_name(reply), True)))
                stats.ask += 1
            elif follow_redirects and isinstance(reply, TryAgainError):
                retry.append((index, target))
                pause = True
                stats.tryagain += 1
            elif isinstance(reply, NoScriptError) and scripts:
                # Through the slot map the reply does not say which node refused: load everywhere once.
                if target is None and not loaded_by_map:
                    load_by_map = True
                elif target is not None and target[0] not in loaded_on:
                    load_nodes.add(target[0])
                else:
                    continue  # refused again after a load: the NoScriptError stays the reply
                retry.append((index, target))
                stats.noscript += 1
        if not retry:
            break
        if load_by_map:
            yield Step("load", (None,))
            loaded_by_map = True
        for name in sorted(load_nodes):
            yield Step("load", (name,))
            loaded_on.add(name)
        if refresh:
            yield Step("refresh")
        if pause:
            yield Step("pause", (TRYAGAIN_PAUSE_S,))
        pending = retry
    return replies


def routed(pending: list[tuple[int, Target]]) -> list[int]:
    """Positions in ``pending`` of the commands that go by the client's slot map."""
    return [position for position, (_, target) in enumerate(pending) if target is None]


def by_node(pending: list[tuple[int, Target]]) -> dict[str, list[int]]:
    """Positions in ``pending`` of the commands sent to a named node, by node."""
    nodes: dict[str, list[int]] = {}
    for position, (_, target) in enumerate(pending):
        if target is not None:
            nodes.setdefault(target[0], []).append(position)
    return nodes


def _node_name(redirect: AskError) -> str:
    return f"{redirect.host}:{redirect.port}"
