"""``/freshkey/health`` decided from the worker's parts, and the verification answer without row values."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.web.health import HIDDEN, health, hide_values, redact_verification


@dataclass
class _Task:
    finished: bool = False

    def done(self) -> bool:
        return self.finished


@dataclass
class _Actor:
    actor_task: _Task | None


@dataclass
class _Agent:
    channel: object
    _actors: list[_Actor]


@dataclass
class _Consumer:
    state: str = "running"

    def assignment(self) -> set[tuple[str, int]]:
        return {("changes", 0), ("changes", 1)}


@dataclass
class _App:
    agents: dict[str, _Agent]
    started: bool = True
    _consumer: _Consumer | None = field(default_factory=_Consumer)
    rebalancing: bool = False


class _Tier:
    def __init__(self, name: str, error: Exception | None = None, hang: bool = False) -> None:
        self.name, self.error, self.hang = name, error, hang

    async def ping(self) -> None:
        if self.hang:
            await asyncio.sleep(10)
        if self.error is not None:
            raise self.error


@dataclass
class _Guard:
    state: str = "ok"

    def snapshot(self) -> dict[str, Any]:
        return {"state": self.state}


@dataclass
class _Processor:
    tiers: list[_Tier]
    guards: dict[str, _Guard] = field(default_factory=dict)


@dataclass
class _Tiers:
    ready: asyncio.Event


def _worker(*, tiers: list[_Tier], ready: bool = True, agent_done: bool = False, **app: Any) -> Any:
    changes = object()
    event = asyncio.Event()
    if ready:
        event.set()

    @dataclass
    class W:
        topics: dict[str, object]
        app: _App
        tiers: _Tiers
        processor: _Processor

    agent = _Agent(changes, [_Actor(_Task(finished=agent_done))])
    return W({"changes": changes}, _App({"apply_changes": agent}, **app), _Tiers(event), _Processor(tiers))


def _health(**kw: Any) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, dict[str, Any]]:
        return await health(_worker(**kw))

    return asyncio.run(run())


def test_ok_when_consuming_and_every_tier_answers() -> None:
    status, body = _health(tiers=[_Tier("redis"), _Tier("redis-l3")])
    assert status == 200
    assert body["status"] == "ok" and body["consuming"] is True
    assert body["tiers"] == {"redis": "ok", "redis-l3": "ok"}
    assert body["assigned_partitions"] == 2


def test_a_rebalance_is_reported_but_healthy() -> None:
    status, body = _health(tiers=[_Tier("redis")], rebalancing=True)
    assert status == 200 and body["rebalancing"] is True


def test_a_tier_that_fails_shows_its_class_only() -> None:
    secret_message = ConnectionError("connecting as admin:hunter2 to 10.1.2.3")
    status, body = _health(tiers=[_Tier("redis"), _Tier("redis-l3", error=secret_message)])
    assert status == 503
    assert body["tiers"]["redis-l3"] == "failing (ConnectionError)"
    assert "hunter2" not in orjson.dumps(body).decode()


def test_a_tier_that_hangs_is_not_waited_for() -> None:
    status, body = _health(tiers=[_Tier("redis", hang=True)])
    assert status == 503 and body["tiers"]["redis"] == "no answer"


def test_not_consuming() -> None:
    assert _health(tiers=[_Tier("redis")], started=False)[0] == 503
    assert _health(tiers=[_Tier("redis")], _consumer=None)[0] == 503
    assert _health(tiers=[_Tier("redis")], _consumer=_Consumer(state="crashed"))[1]["reasons"] == [
        "the Kafka consumer is crashed"
    ]
    status, body = _health(tiers=[_Tier("redis")], agent_done=True)
    assert status == 503 and "the change agent is not running" in body["reasons"]
    status, body = _health(tiers=[], ready=False)
    assert status == 503 and "the cache tiers are not connected yet" in body["reasons"]


def test_verification_examples_keep_keys_and_versions_not_values() -> None:
    stored = {
        "nines": 3,
        "reports": [
            {
                "namespace": "assets",
                "examples": [
                    'stale: fk:{assets}:42: value b\'{"content":"secret caption"}\' != database b\'{"x":1}\'',
                    "stale after 1500 ms: fk:{assets}:7: value b'it\\'s private' (v12) is neither the row "
                    "at the first read nor now",
                    "missing: fk:{assets}:9",
                    "stale: fk:{assets}:3: v5 is older than the row at the first read (v8)",
                ],
            }
        ],
    }
    shown = orjson.loads(redact_verification(orjson.dumps(stored)))
    examples = shown["reports"][0]["examples"]
    assert examples[0] == f"stale: fk:{{assets}}:42: value {HIDDEN} != database {HIDDEN}"
    assert examples[1].startswith(f"stale after 1500 ms: fk:{{assets}}:7: value {HIDDEN} (v12) is neither")
    assert examples[2:] == stored["reports"][0]["examples"][2:]  # type: ignore[index]
    assert "secret caption" not in orjson.dumps(shown).decode()
    assert shown["nines"] == 3


def test_hide_values_and_broken_json() -> None:
    assert (
        hide_values("unverifiable: fk:{n}:1: bad version 'abc'")
        == f"unverifiable: fk:{{n}}:1: bad version {HIDDEN}"
    )
    assert orjson.loads(redact_verification(b"not json")) == {"error": "the stored verification is not JSON"}
