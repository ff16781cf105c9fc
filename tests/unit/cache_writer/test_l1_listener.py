"""The L1 listener's pure parts: which cluster nodes publish, and one subscription generation."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from cache_writer.l1 import L1Cache
from cache_writer.l1 import listener as listener_module
from cache_writer.l1.listener import InvalidationListener, _Subscription, cluster_primaries

SIGNATURE = "a sig-2 fk:{items}:"


def node(flags: str, slots: list[list[str]] | None = None) -> dict[str, object]:
    return {"flags": flags, "slots": slots or [], "connected": True}


def test_the_primaries_are_the_masters_that_serve_slots() -> None:
    nodes = {
        "h:1": node("myself,master", [["0", "5460"]]),
        "h:2": node("master,fail?", [["5461", "10921"]]),  # only suspected: its subscription decides
        "h:3": node("master", [["10922", "16383"]]),
        "h:4": node("master"),  # joined, no slots yet: runs no script, publishes nothing
        "h:5": node("slave"),
        "h:6": node("master,fail", [["1", "2"]]),
        "h:7": node("master,handshake", [["3", "4"]]),
        "h:8": node("master,noaddr", [["5", "6"]]),
    }
    assert cluster_primaries(nodes) == {"h:1", "h:2", "h:3"}


def _l1() -> L1Cache:
    return L1Cache(max_entries=100, max_bytes=100_000)


def subscribed(index: int) -> dict[str, object]:
    return {"type": "subscribe", "channel": b"fk:invalidations", "data": 1}


def message(data: str) -> dict[str, object]:
    return {"type": "message", "channel": b"fk:invalidations", "data": data.encode()}


def test_the_caches_serve_only_once_every_primary_confirmed() -> None:
    l1 = _l1()
    generation = _Subscription([l1], expected=3)
    assert not generation.on_message(0, subscribed(0))
    assert not generation.on_message(0, subscribed(0))  # the same one again does not count twice
    assert not generation.on_message(2, subscribed(2))
    assert not l1.healthy
    assert generation.on_message(1, subscribed(1))
    assert l1.healthy


def test_an_announcement_heard_twice_is_harmless() -> None:
    l1 = _l1()
    generation = _Subscription([l1], expected=2)
    generation.on_message(0, subscribed(0))
    generation.on_message(1, subscribed(1))
    assert l1.put("fk:{items}:1", 5, b"{}")
    generation.on_message(0, message("w 7 fk:{items}:1"))
    generation.on_message(1, message("w 7 fk:{items}:1"))
    assert l1.get("fk:{items}:1") is None
    assert not l1.put("fk:{items}:1", 6, b"{}"), "the floor stays at 7"
    assert l1.put("fk:{items}:1", 7, b"{}")


def test_a_late_copy_of_an_older_switch_does_not_bring_its_signature_back() -> None:
    """Cutover 1 then 2, heard directly from the node that switched; then the bus copy of 1 arrives."""
    l1 = _l1()
    generation = _Subscription([l1], expected=2)
    generation.on_message(0, subscribed(0))
    generation.on_message(1, subscribed(1))
    generation.on_message(0, message("a sig-1 fk:{items}:"))
    generation.on_message(0, message(SIGNATURE))
    generation.on_message(1, message("a sig-1 fk:{items}:"))  # late, through another primary
    assert l1.put("fk:{items}:1", 1, b"{}", signature="sig-2"), "entries of the active signature come in"
    assert not l1.put("fk:{items}:2", 1, b"{}", signature="sig-1"), "the old signature stays refused"


def test_a_cluster_client_that_reaches_no_node_is_retried_not_fatal() -> None:
    """redis-py's RedisClusterException (no node answers while it learns the slots) is not a RedisError:
    the listener must back off and try again, not end with the L1 off for good."""
    from redis.exceptions import RedisClusterException

    from cache_writer.l1 import InvalidationListener

    async def scenario() -> tuple[int, bool]:
        l1 = _l1()
        listener = InvalidationListener(None, "fk:invalidations", [l1])  # type: ignore[arg-type]
        calls = 0
        third = asyncio.Event()

        async def listen() -> None:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise RedisClusterException("Redis Cluster cannot be connected")
            third.set()
            await asyncio.sleep(30)

        listener._listen = listen  # type: ignore[method-assign]
        listener.start()
        # Wait for the third attempt with a generous deadline rather than one fixed sleep: under a
        # loaded CI machine the listener's backoff can take longer than a tight sleep would allow.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(third.wait(), 15.0)
        await asyncio.sleep(0.05)  # the third call has started; the task must still be running
        alive = listener._task is not None and not listener._task.done()
        await listener.stop()
        return calls, alive

    calls, alive = asyncio.run(scenario())
    assert calls == 3 and alive


class _Stubborn:
    """A stand-in client whose subscribe never returns and ignores cancels until ``release`` is set (as a
    call on a connection to a node that went silent may)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancels = 0

    def pubsub(self) -> _Stubborn:
        return self

    async def subscribe(self, channel: str) -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                self.cancels += 1
                if self.release.is_set():
                    raise

    async def aclose(self) -> None:
        return None


def test_stop_is_bounded_when_the_listener_ignores_its_cancel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listener_module, "STOP_WAIT_S", 0.2, raising=False)
    l1 = _l1()

    async def scenario() -> float:
        client = _Stubborn()
        listener = InvalidationListener(client, "fk:invalidations", [l1])  # type: ignore[arg-type]
        listener.start()
        task = listener._task
        assert task is not None
        await asyncio.sleep(0.05)  # the listener is in subscribe()
        started = time.monotonic()
        await listener.stop()
        took = time.monotonic() - started
        assert client.cancels >= 1 and not task.done(), "the stand-in ignored the cancel"
        client.release.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return took

    took = asyncio.run(scenario())
    assert took < 2.0, f"stop() waited {took:.1f} s for a listener that ignores its cancel"
    assert "did not stop within" in caplog.text
    assert not l1.healthy, "the caches stop serving either way"
