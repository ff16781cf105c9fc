"""The client protocol of ``cache_writer.client.core`` without a server: what a read, a fill and a
get-or-load ask of Redis (and the loader), in order, and what they make of the replies. The asyncio and
the blocking client only carry these steps out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cache_writer.client.core import ClientCore, FillResult, Hit, Miss, Op, Steps
from cache_writer.hotness import HitRecorder
from cache_writer.l1 import L1Cache
from cache_writer.redis import scripts

SIG = "s" * 64
KEY = "fk:{ns}:1"


def drive(steps: Steps[Any], answer: Callable[[Op], Any]) -> tuple[Any, list[Op]]:
    """Run ``steps`` to the end, answering each operation with ``answer``; the result and the operations."""
    ops: list[Op] = []
    reply: Any = None
    while True:
        try:
            op = steps.send(reply)
        except StopIteration as done:
            return done.value, ops
        ops.append(op)
        reply = answer(op)


def replies(*answers: Any) -> Callable[[Op], Any]:
    queue = list(answers)
    return lambda op: queue.pop(0)


def core(*, has_l3: bool = False, **kwargs: Any) -> ClientCore[Any, Any]:
    """A client core with no I/O behind it (``has_l3``: it has an outer tier to read)."""
    return ClientCore(None, l3=object() if has_l3 else None, **kwargs)


def test_an_l2_hit_is_kept_in_l1_and_the_next_read_needs_no_redis() -> None:
    l1 = L1Cache()
    l1.mark(True)
    client = core(l1=l1)
    hit, ops = drive(client.get_steps("ns", [1]), replies([1, b"5", b'"v"', SIG.encode(), b""]))
    assert hit == Hit(b'"v"', 5, "l2", SIG)
    (op,) = ops
    assert op.name == "script"
    command, text = op.args
    assert command[:5] == ("EVALSHA", scripts.GET_OR_LEASE.sha, 2, KEY, "fk:{ns}:$signature")
    assert text == scripts.GET_OR_LEASE.text and command[6] == 2000
    again, ops = drive(client.get_steps("ns", [1]), replies())
    assert again == Hit(b'"v"', 5, "l1", SIG) and ops == []
    assert client.counts["hits_l2"] == 1 and client.counts["hits_l1"] == 1 and client.counts["reads"] == 2


def test_a_miss_with_a_lease_is_filled_from_l3_under_the_active_signature() -> None:
    client = core(has_l3=True)
    outer = {b"v": b"3", b"d": b'"outer"', b"s": SIG.encode()}
    hit, ops = drive(
        client.get_steps("ns", [1]), replies([0, b"tok", b"", SIG.encode(), b""], outer, [1, b"3"])
    )
    assert hit == Hit(b'"outer"', 3, "l3", SIG)
    assert [op.name for op in ops] == ["script", "outer", "script"]
    fill = ops[2].args[0]
    assert fill[:5] == ("EVALSHA", scripts.FILL.sha, 2, KEY, "fk:{ns}:$signature")
    assert fill[5:] == ("tok", b'"outer"', "3", "0", SIG, ""), "token, value, version, TTL, signature, row"
    assert client.counts["fill_filled"] == 1


def test_l3_is_not_read_while_fenced_nor_used_under_another_signature() -> None:
    client = core(has_l3=True)
    miss, ops = drive(client.get_steps("ns", [1]), replies([0, b"tok", b"7", SIG.encode(), b"1700000000000"]))
    assert isinstance(miss, Miss) and miss.lease is not None and miss.lease.outer_fenced
    assert miss.lease.held_version == 7 and [op.name for op in ops] == ["script"]

    old = {b"v": b"3", b"d": b'"old model"', b"s": b"o" * 64}
    miss, ops = drive(client.get_steps("ns", [1]), replies([0, b"tok", b"", SIG.encode(), b""], old))
    assert isinstance(miss, Miss) and [op.name for op in ops] == ["script", "outer"], "no fill"


def test_a_fill_reports_why_it_did_not_land() -> None:
    client = core()
    miss, _ = drive(client.get_steps("ns", [1]), replies([0, b"tok", b"", b"", b""]))
    assert isinstance(miss, Miss) and miss.lease is not None
    for reply, outcome in (
        ([0, b"lease"], FillResult.LEASE_VOID),
        ([0, b"stale"], FillResult.STALE),
        ([0, b"signature"], FillResult.SIGNATURE),
        ([1, b"9"], FillResult.FILLED),
    ):
        result, ops = drive(client.fill_steps(miss.lease, b'"x"', 9, row=["a/b", 2]), replies(reply))
        assert result is outcome
        assert ops[0].args[0][-1] == "a%2Fb/2", "the row key goes with the fill"


def test_get_or_load_waits_for_another_lease_holder_then_reads_through() -> None:
    client = core()
    held_elsewhere = [2, b"", b"", b"", b""]

    def answer(op: Op) -> Any:
        return {"script": held_elsewhere, "wait": None, "load": (b'"db"', 4)}[op.name]

    value, ops = drive(client.get_or_load_steps("ns", [1], wait_s=0.01, attempts=3), answer)
    assert value == b'"db"'
    assert [op.name for op in ops] == ["script", "wait"] * 3 + ["load"]
    assert client.counts["read_through"] == 1 and client.counts["lease_waits"] == 3


def test_get_or_load_fills_under_its_lease_and_a_missing_row_fills_nothing() -> None:
    client = core()
    value, ops = drive(
        client.get_or_load_steps("ns", [1], wait_s=0.01, attempts=3),
        replies([0, b"tok", b"", b"", b""], (b'"db"', 4), [1, b"4"]),
    )
    assert value == b'"db"' and [op.name for op in ops] == ["script", "load", "script"]
    no_row = replies([0, b"tok", b"", b"", b""], None)
    value, ops = drive(client.get_or_load_steps("ns", [2], wait_s=0.01, attempts=3), no_row)
    assert value is None and [op.name for op in ops] == ["script", "load"]


def test_hits_are_counted_and_flushed_when_due() -> None:
    recorder = HitRecorder("fk", flush_every=2, flush_interval_s=3600)
    client = core(hits=recorder)
    hit = [1, b"1", b'"v"', b"", b""]
    _, ops = drive(client.get_steps("ns", [1]), replies(hit))
    assert [op.name for op in ops] == ["script"]
    _, ops = drive(client.get_steps("ns", [1]), replies(hit, None))
    assert [op.name for op in ops] == ["script", "flush_hits"]
