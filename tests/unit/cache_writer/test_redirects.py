"""The redirect and lost-script rules of ``cache_writer.redis.redirects``, without a server: each reply is
answered with the step the drivers (asyncio and blocking) then carry out."""

from __future__ import annotations

from typing import Any

from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError

from cache_writer.redis.redirects import MAX_ROUNDS, RedirectStats, Step, pipeline_steps

A, B = "127.0.0.1:7001", "127.0.0.1:7002"


def drive(
    count: int, rounds: list[list[Any]], *, scripts: bool = True, cluster: bool = True
) -> tuple[list[Step], list[Any], RedirectStats]:
    """Run the steps of ``count`` commands; the n-th ``send`` is answered with ``rounds[n]``."""
    stats = RedirectStats()
    steps = pipeline_steps(count, scripts=scripts, follow_redirects=cluster, stats=stats)
    seen: list[Step] = []
    answers = iter(rounds)
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            return seen, done.value, stats
        seen.append(step)
        reply = next(answers) if step.op == "send" else None


def test_replies_without_redirects_take_one_round() -> None:
    steps, replies, stats = drive(2, [[b"a", ResponseError("WRONGTYPE")]])
    assert [s.op for s in steps] == ["send"]
    assert replies[0] == b"a" and isinstance(replies[1], ResponseError), "an error reply stays the reply"
    assert stats == RedirectStats()


def test_moved_goes_to_the_named_node_and_refreshes_the_slot_map() -> None:
    steps, replies, stats = drive(2, [[b"ok", MovedError(f"12 {B}")], [b"moved ok"]])
    assert [s.op for s in steps] == ["send", "refresh", "send"]
    assert steps[2].args == ([(1, (B, False))],), "only the redirected command, without ASKING"
    assert replies == [b"ok", b"moved ok"] and stats.moved == 1


def test_ask_goes_to_the_named_node_behind_asking_without_a_refresh() -> None:
    steps, replies, stats = drive(1, [[AskError(f"12 {B}")], [b"asked ok"]])
    assert [s.op for s in steps] == ["send", "send"]
    assert steps[1].args == ([(0, (B, True))],)
    assert replies == [b"asked ok"] and stats.ask == 1


def test_tryagain_pauses_and_resends_to_the_same_place() -> None:
    steps, replies, stats = drive(1, [[AskError(f"1 {A}")], [TryAgainError()], [b"ok"]])
    assert [s.op for s in steps] == ["send", "send", "pause", "send"]
    assert steps[3].args == ([(0, (A, True))],)
    assert replies == [b"ok"] and stats.tryagain == 1


def test_noscript_loads_the_scripts_once_where_the_command_went_then_keeps_the_error() -> None:
    noscript = NoScriptError("NOSCRIPT")
    steps, replies, stats = drive(2, [[noscript, b"ok"], [noscript]])
    assert [s.op for s in steps] == ["send", "load", "send"]
    assert steps[1].args == (None,), "through the slot map: wherever SCRIPT LOAD goes"
    assert replies == [noscript, b"ok"] and stats.noscript == 1

    steps, replies, _ = drive(1, [[AskError(f"1 {B}")], [noscript], [b"ok"]])
    assert [s.op for s in steps] == ["send", "send", "load", "send"]
    assert steps[2].args == (B,), "a redirected command's scripts go to the node that refused"
    assert replies == [b"ok"]


def test_without_scripts_noscript_is_only_a_reply() -> None:
    steps, replies, _ = drive(1, [[NoScriptError("NOSCRIPT")]], scripts=False)
    assert [s.op for s in steps] == ["send"] and isinstance(replies[0], NoScriptError)


def test_a_single_server_does_not_follow_redirects() -> None:
    moved = MovedError(f"12 {B}")
    steps, replies, _ = drive(1, [[moved]], cluster=False)
    assert [s.op for s in steps] == ["send"] and replies == [moved]


def test_redirects_stop_after_max_rounds_with_the_last_one_as_the_reply() -> None:
    ask = AskError(f"12 {B}")
    steps, replies, stats = drive(1, [[ask]] * MAX_ROUNDS)
    assert [s.op for s in steps].count("send") == MAX_ROUNDS
    assert replies == [ask] and stats.ask == MAX_ROUNDS
