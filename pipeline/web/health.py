"""``GET /freshkey/health``: whether this worker consumes and its tiers answer, for orchestrators.

200 with ``{"status": "ok", ...}`` when the change agent runs on a running consumer and every cache tier
answers a PING within :data:`PING_TIMEOUT_S`; 503 with ``"status": "unavailable"`` and the reasons
otherwise. A rebalance in progress is reported (``rebalancing``) but is no failure: every member of a
group goes through one when another joins or leaves, and a health check that failed then would have
every worker restarted at once. The answer names tiers and states only: no address, user or secret.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson

from pipeline.context import Worker

PING_TIMEOUT_S = 1.0


def _agent_running(w: Worker) -> tuple[bool, str]:
    """Whether the change agent has a live actor (a crashed one ends the process, but an agent that has
    not started yet, or has stopped, must not count as consuming)."""
    changes = w.topics["changes"]
    agents = [a for a in w.app.agents.values() if getattr(a, "channel", None) is changes]
    if not agents:
        return False, "the change agent is not installed"
    # faust keeps an agent's actors in ``_actors``; an actor's task ends only when the agent stops.
    actors = [aref for agent in agents for aref in getattr(agent, "_actors", ())]
    if not any(a.actor_task is not None and not a.actor_task.done() for a in actors):
        return False, "the change agent is not running"
    return True, ""


def _consumer_running(w: Worker) -> tuple[bool, str, bool, int | None]:
    """Whether the app and its consumer run; whether a rebalance is in progress; partitions held."""
    app: Any = w.app
    if not getattr(app, "started", False):
        return False, "the worker is starting", False, None
    consumer = getattr(app, "_consumer", None)  # app.consumer would create one
    if consumer is None:
        return False, "no Kafka consumer yet", False, None
    state = getattr(consumer, "state", "running")
    if state != "running":
        return False, f"the Kafka consumer is {state}", False, None
    try:
        assigned: int | None = len(consumer.assignment())
    except Exception:  # not subscribed yet
        assigned = None
    return True, "", bool(getattr(app, "rebalancing", False)), assigned


async def _ping(tier: Any) -> str:
    try:
        await asyncio.wait_for(tier.ping(), PING_TIMEOUT_S)
    except TimeoutError:
        return "no answer"
    except Exception as exc:
        # The class only: a message may name a host or a user.
        return f"failing ({type(exc).__name__})"
    return "ok"


async def health(w: Worker) -> tuple[int, dict[str, Any]]:
    """The status code and body of ``/freshkey/health``."""
    reasons: list[str] = []
    consuming, why, rebalancing, assigned = _consumer_running(w)
    if not consuming:
        reasons.append(why)
    agent_ok, agent_why = _agent_running(w)
    if not agent_ok:
        consuming = False
        reasons.append(agent_why)
    tiers: dict[str, str] = {}
    if not w.tiers.ready.is_set():
        reasons.append("the cache tiers are not connected yet")
    else:
        names = [tier.name for tier in w.processor.tiers]
        states = await asyncio.gather(*(_ping(tier) for tier in w.processor.tiers))
        tiers = dict(zip(names, states, strict=True))
        reasons.extend(f"tier {name}: {state}" for name, state in tiers.items() if state != "ok")
        for name, guard in w.processor.guards.items():
            guard_state = guard.snapshot().get("state")
            if guard_state not in (None, "ok") and name in tiers:
                tiers[name] = f"{tiers[name]}, {guard_state}"
    body = {
        "status": "unavailable" if reasons else "ok",
        "consuming": consuming,
        "rebalancing": rebalancing,
        "assigned_partitions": assigned,
        "tiers": tiers,
        "reasons": reasons,
    }
    return (503 if reasons else 200), body


_QUOTED = re.compile(r"""b?'(?:[^'\\]|\\.)*'|b?"(?:[^"\\]|\\.)*\"""")
HIDDEN = "<hidden>"


def hide_values(text: str) -> str:
    """``text`` with every quoted literal (a value's repr: ``b'...'``, ``'...'``) replaced by
    :data:`HIDDEN`. Keys (``<prefix>:{<namespace>}:<row key>``, percent-encoded) and versions (``v123``)
    hold no quotes and stay."""
    return _QUOTED.sub(HIDDEN, text)


def redact_verification(raw: bytes) -> bytes:
    """A stored ``freshkey verify`` result with the row values in its examples hidden
    (:func:`hide_values`); anything that is not the expected JSON is replaced by a note."""
    try:
        result = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return orjson.dumps({"error": "the stored verification is not JSON"})
    _redact(result)
    return orjson.dumps(result)


def _redact(node: Any) -> None:
    if isinstance(node, dict):
        for name, value in node.items():
            if name == "examples" and isinstance(value, list):
                node[name] = [hide_values(v) if isinstance(v, str) else HIDDEN for v in value]
            else:
                _redact(value)
    elif isinstance(node, list):
        for item in node:
            _redact(item)
