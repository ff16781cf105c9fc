"""Scale-out: three workers in one consumer group share the change topic while one is killed, one stops.

A real connector and three real worker processes (``tests/support/pipeline.py``: ``worker``,
``worker-2``, ``worker-3``, one app id, so one consumer group) run on the session's broker, database and
Redis; the change topic has ``PARTITIONS`` partitions. A writer thread changes rows at ``RATE`` a second
for the whole run (inserts, updates, deletes). Meanwhile, each once:

1. ``kill -9`` of a worker: its partitions wait until the group coordinator gives up on it (the session
   timeout), then the others take them over and replay from the committed offsets;
2. SIGTERM of another worker: it leaves the group cleanly (exit 0) and its partitions move at once;
3. both start again and join: the group rebalances twice more.

Every write and tombstone Redis applies is announced with its version on ``<prefix>:invalidations``
(the scripts publish in the same atomic step), and a subscriber keeps the log (``BroadcastLog``). From
it the test measures, per event, how long each partition waited (the longest pause between two
announcements of one partition around the event): the recovery time after the kill (from the kill to
the first change applied on each of the victim's partitions), the hand-over after SIGTERM, and the
stall of the other workers' partitions at each leave and join. The figures are printed (``-s``).

Then it checks, with the writer stopped and the pipeline caught up:

- order: no key's announced version ever went backwards (0 order violations, across every worker that
  wrote it, replays after the kill included);
- every change applied: every row's last change on the topic was announced (so applied: a key's last
  change is never superseded within a batch, and "not newer" only when it was applied before), and the
  group's committed offsets are at the end of every partition;
- 0 stale: ``freshkey verify``'s engine (``run_verification``, SLA window) finds every row in the cache
  as in the database, nothing stale, nothing missing.

Negative control: a zombie, as a rebalance makes one (a worker that lost its partitions applies its last
batch after the new owner moved on), replays older changes of five keys read back from the topic.
Through the real tier (the versioned scripts) every one is refused as not newer and nothing is
announced; through a writer without the version check (HSET, and the announcement the script would
make) the same replay gives 5 order violations and the verifier finds the 5 rows stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from cache_writer import CacheAction, Outcome, RedisTier
from cache_writer.layout import invalidation_channel, parse_entry_key
from pipeline.demo.catchup import partition_of
from pipeline.plan import plan
from schemas import ChangeEvent, decode, message_key, parse_bindings
from tests.support.kafka import Record, committed_offsets, read_records
from tests.support.pipeline import Pipeline
from tests.support.workload import INSERT, Announcement, BroadcastLog, SteadyWriter, order_violations

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
WORKERS = ("worker", "worker-2", "worker-3")
ROWS = range(1, 61)
RATE = 60.0
"""Changes a second (single-row statements): about 10 a second per partition."""
SESSION_TIMEOUT_S = 6.0
"""``FRESHKEY_WORKER_SESSION_TIMEOUT_S``: how long the coordinator waits for a killed member."""
WINDOW_MS = 1500.0
CONTROL_KEYS = 5
WORKER_ENV = {"FRESHKEY_WORKER_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S)}


@dataclass
class Event:
    """One membership change and what it cost, from the broadcast log."""

    what: str
    worker: str
    started: float
    """When the kill, the SIGTERM or the process start happened (monotonic)."""
    moved: frozenset[int]
    """The partitions of the leaving worker (empty for a join)."""
    stable_s: float = 0.0
    """From ``started`` until every partition was assigned again, each to one live worker."""
    recovery_s: float = 0.0
    """From ``started`` until a change was applied again on every moved partition (0 for a join)."""
    stall_moved_s: float = 0.0
    """The longest pause of a moved partition around the event."""
    stall_others_s: float = 0.0
    """The longest pause of any other partition around the event: what the rebalance cost the rest."""
    answered_s: float | None = None
    """A join: from the process start until its web server answered (imports, app set-up)."""
    assigned_s: float | None = None
    """A join: from the process start until it held partitions (its web server up, then the join)."""


class ScaleOut:
    """The pipeline with three workers, the writer, the broadcast log and the measurements."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.binding = parse_bindings(p.bindings_text).bindings[0]
        self.writer = SteadyWriter(
            lambda: p.mysql.connect(p.database), ROWS, rate=RATE, present=ROWS, delete_share=0.05
        )
        self.log = BroadcastLog(p.redis, invalidation_channel(p.prefix))
        self.events: list[Event] = []
        self._partition: dict[str, int] = {}

    # -- the group ---------------------------------------------------------------------------------------
    def assigned(self, name: str) -> frozenset[int] | None:
        """The change topic's partitions ``name`` consumes now (None: it does not answer)."""
        page = self.p.page(name, "/freshkey/consumer-lag")
        if page is None:
            return None
        return frozenset(
            int(row["partition"])
            for row in page.values()
            if row.get("assigned") and row.get("partition") is not None
        )

    def running(self) -> list[str]:
        return [n for n in self.p.workers if self.p.procs[n].poll() is None]

    def wait_stable(self, timeout: float = 60) -> dict[str, frozenset[int]]:
        """Until every partition is assigned to exactly one running worker and each holds some."""
        holdings: dict[str, frozenset[int] | None] = {}

        def stable() -> bool:
            holdings.clear()
            holdings.update({n: self.assigned(n) for n in self.running()})
            held = [h for h in holdings.values() if h]
            return (
                len(held) == len(holdings)
                and sum(len(h) for h in held) == PARTITIONS
                and frozenset().union(*held) == frozenset(range(PARTITIONS))
            )

        self.p.wait(stable, timeout, f"a stable assignment of {PARTITIONS} partitions ({holdings})")
        return {n: h for n, h in holdings.items() if h is not None}

    # -- the broadcast log, per partition ------------------------------------------------------------------
    def partition(self, key: str) -> int:
        if key not in self._partition:
            parsed = parse_entry_key(key)
            assert parsed is not None, key
            row_key = message_key(self.p.database, "assets", {"id": int(parsed.row)})
            self._partition[key] = partition_of(row_key, PARTITIONS)
        return self._partition[key]

    def times(self) -> dict[int, list[float]]:
        by_partition: dict[int, list[float]] = defaultdict(list)
        for a in self.log.snapshot():
            by_partition[self.partition(a.key)].append(a.at)
        return by_partition

    def first_after(self, partitions: frozenset[int], after: float, timeout: float = 60) -> float:
        """When the last of ``partitions`` had a change applied after ``after`` (waits for it)."""
        found: dict[int, float] = {}

        def every() -> bool:
            for p, times in self.times().items():
                if p in partitions and p not in found:
                    later = [t for t in times if t > after]
                    if later:
                        found[p] = later[0]
            return set(found) == set(partitions)

        self.p.wait(every, timeout, f"changes applied again on partitions {sorted(partitions)}")
        return max(found.values())

    def longest_pause(self, partitions: frozenset[int], start: float, end: float) -> float:
        """The longest time between two announcements (or the window's ends) of one of ``partitions``."""
        longest = 0.0
        times = self.times()
        for p in partitions:
            inside = [start, *(t for t in times.get(p, []) if start < t < end), end]
            longest = max(longest, *(b - a for a, b in itertools.pairwise(inside)))
        return longest

    def settle(self, event: Event, end_after: float) -> None:
        """Wait for the group to be stable and every partition to flow again; fill in the figures."""
        self.wait_stable()
        event.stable_s = time.monotonic() - event.started
        flowing = self.first_after(frozenset(range(PARTITIONS)), max(end_after, time.monotonic()))
        others = frozenset(range(PARTITIONS)) - event.moved
        event.stall_others_s = self.longest_pause(others, event.started, flowing)
        if event.moved:
            event.recovery_s = self.first_after(event.moved, end_after) - event.started
            event.stall_moved_s = self.longest_pause(event.moved, event.started, flowing)
        self.events.append(event)

    # -- the events --------------------------------------------------------------------------------------
    def kill9(self, name: str, holdings: dict[str, frozenset[int]]) -> None:
        event = Event("kill -9", name, time.monotonic(), holdings[name])
        self.p.kill9(name)
        self.settle(event, end_after=time.monotonic())

    def sigterm(self, name: str, holdings: dict[str, frozenset[int]]) -> None:
        event = Event("SIGTERM", name, time.monotonic(), holdings[name])
        code = self.p.stop(name)
        assert code == 0, f"{name} exited with {code} after SIGTERM\n{self.p.logs()}"
        self.settle(event, end_after=time.monotonic())

    def join(self, name: str) -> None:
        event = Event("join", name, time.monotonic(), frozenset())
        self.p.start(name, **WORKER_ENV)
        event.answered_s = time.monotonic() - event.started
        self.p.wait(lambda: bool(self.assigned(name)), 60, f"{name} to get partitions")
        event.assigned_s = time.monotonic() - event.started
        self.settle(event, end_after=event.started)

    def calm_pause(self, seconds: float) -> float:
        """The longest pause of any partition over ``seconds`` of normal running: the baseline."""
        start = time.monotonic()
        time.sleep(seconds)
        return self.longest_pause(frozenset(range(PARTITIONS)), start, time.monotonic())

    # -- the end -----------------------------------------------------------------------------------------
    def topic(self, expect: int) -> list[Record]:
        return read_records(self.p.kafka, self.p.change_topic, expect=expect, timeout=60)

    def table(self) -> str:
        lines = [
            "event     worker     moved  stable s  recovery s  stall moved s  stall others s"
            "  web up s  assigned s",
        ]
        for e in self.events:
            lines.append(
                f"{e.what:<9} {e.worker:<10} {','.join(map(str, sorted(e.moved))) or '-':<6}"
                f" {e.stable_s:>8.2f}  {e.recovery_s:>10.2f}  {e.stall_moved_s:>13.2f}"
                f"  {e.stall_others_s:>14.2f}  {_figure(e.answered_s):>8}  {_figure(e.assigned_s):>10}"
            )
        return "\n".join(lines)


def _figure(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


@pytest.fixture
def scale_out(make_pipeline: Callable[..., Pipeline]) -> Iterator[ScaleOut]:
    p = make_pipeline(version_column=False)
    p.env["FRESHKEY_KAFKA_PARTITIONS"] = str(PARTITIONS)
    run = ScaleOut(p)
    try:
        yield run
    finally:
        run.writer.stop()
        run.log.stop()


def last_changes(records: list[Record], prefix: str, namespace: str) -> dict[str, ChangeEvent]:
    """The last change event of each row on the topic, by cache key."""
    last: dict[str, ChangeEvent] = {}
    for record in records:
        event = decode(record.value)
        if isinstance(event, ChangeEvent):
            last[f"{prefix}:{{{namespace}}}:{event.key['id']}"] = event
    return last


@pytest.mark.timeout(400)
def test_three_workers_share_the_topic_through_a_kill_a_stop_and_two_joins(scale_out: ScaleOut) -> None:
    run, p = scale_out, scale_out.p
    started = time.monotonic()
    p.start("connector")
    for row in ROWS:
        p.sql(INSERT, (row, f"setup-{row}"))
    run.log.start()
    for name in WORKERS:
        p.launch(name, **WORKER_ENV)
    holdings = run.wait_stable(timeout=120)
    assert len(holdings) == 3 and all(len(h) == 2 for h in holdings.values()), holdings
    p.wait_consistent(timeout=60)
    group_ready_s = time.monotonic() - started

    run.writer.start()
    calm = run.calm_pause(3.0)
    victim, leaver = sorted(holdings)[1], sorted(holdings)[2]
    run.kill9(victim, holdings)
    holdings = run.wait_stable()
    run.sigterm(leaver, holdings)
    run.join(victim)
    run.join(leaver)
    time.sleep(2.0)
    run.writer.stop()
    assert not run.writer.errors, run.writer.errors

    p.wait_consistent(timeout=90)
    changes = len(ROWS) + run.writer.total
    records = run.topic(changes)
    for record in records:
        assert record.key is not None
        assert partition_of(record.key, PARTITIONS) == record.partition, "partition_of is not the producer's"
    ends = {part: max(r.offset for r in records if r.partition == part) + 1 for part in range(PARTITIONS)}
    group = p.env["FRESHKEY_WORKER_APP_ID"]
    committed: dict[int, int] = {}

    def at_the_ends() -> bool:
        committed.update(committed_offsets(p.kafka, group, p.change_topic))
        return committed == ends

    def stuck() -> str:
        acked = {n: (p.stats(n) or {}).get("offsets") for n in run.running()}
        return f"the group's committed offsets to reach {ends} (at {committed}; acked: {acked})"

    p.wait(at_the_ends, 45, stuck)
    verification = p.run_verification(WINDOW_MS)
    report = verification.reports[0]
    announced = run.log.snapshot()
    violations = order_violations(announced)
    highest: dict[str, int] = {}
    for a in announced:
        highest[a.key] = max(highest.get(a.key, 0), a.version)
    last = last_changes(records, p.prefix, p.namespace)
    unapplied = {key: e.version for key, e in last.items() if highest.get(key) != e.version}
    stats = {n: p.stats(n) or {} for n in run.running()}
    applied_now = sum(int((s.get("events") or {}).get("change_applied", 0)) for s in stats.values())

    print(
        f"\nscale-out: {PARTITIONS} partitions, workers {', '.join(WORKERS)} in one group, session timeout"
        f" {SESSION_TIMEOUT_S:.0f} s, writer at {RATE:.0f}/s; group ready in {group_ready_s:.1f} s"
        f" (3 starts and joins)\n{run.table()}\n"
        f"longest pause of a partition before any event: {calm:.2f} s\n"
        f"changes committed: {changes} (setup {len(ROWS)}; writer c {run.writer.committed['c']} /"
        f" u {run.writer.committed['u']} / d {run.writer.committed['d']}); messages on the topic:"
        f" {len(records)}; announced (applied writes and tombstones): {len(announced)}; rows whose last"
        f" change was never applied: {len(unapplied)}; order violations: {len(violations)};"
        f" broadcast disconnects: {run.log.disconnects}\n"
        f"verify: rows {report.rows}, checked {report.checked}, stale {report.stale}, in flight"
        f" {report.in_flight}, missing {report.missing}; change_applied counted by the running workers"
        f" since their start: {applied_now}; total {time.monotonic() - started:.0f} s"
    )
    assert run.log.disconnects == 0, "the broadcast log missed messages: the counts below would be wrong"
    assert not violations, violations[:10]
    assert len(records) >= changes
    assert not unapplied, f"last changes never applied: {list(unapplied.items())[:10]}"
    assert report.stale == 0 and report.missing == 0 and report.unverifiable is None, report.to_json()
    assert report.rows == len(run.writer.present) and report.checked >= report.rows

    zombie_replay(run, records, announced)


def _constant(signature: str | None) -> Callable[[Mapping[str, Any]], str | None]:
    return lambda image: signature


def zombie_replay(run: ScaleOut, records: list[Record], before: list[Announcement]) -> None:
    """The negative control (module docstring): older changes of five keys, replayed after the fact."""
    p = run.p
    history: dict[str, list[ChangeEvent]] = defaultdict(list)
    for record in records:
        event = decode(record.value)
        if isinstance(event, ChangeEvent):
            history[f"{p.prefix}:{{{p.namespace}}}:{event.key['id']}"].append(event)
    replay: list[CacheAction] = []
    for key, events in sorted(history.items()):
        older = [e for e in events[:-1] if e.after is not None]
        if events[-1].after is not None and older and len(replay) < CONTROL_KEYS:
            # Built as the worker builds it, under the signature the entry carries now (if any).
            raw = p.redis.hget(key, "s")
            signature = raw.decode() if isinstance(raw, bytes) else None
            replay += plan(run.binding, older[-1], prefix=p.prefix, signature_of=_constant(signature))
    assert len(replay) == CONTROL_KEYS, "not enough rows with two writes on the topic"
    channel = invalidation_channel(p.prefix)

    async def through_the_tier() -> list[Outcome]:
        tier = RedisTier(p.async_redis(), tombstone_ttl_ms=60_000, channel=channel)
        try:
            await tier.load_scripts()
            return [r.outcome for r in await tier.apply(replay)]
        finally:
            await tier.close()

    async def without_version_check() -> None:
        client = p.async_redis()
        try:
            for action in replay:
                await client.hset(action.key, mapping={"v": action.version, "d": action.value or b""})
                await client.hdel(action.key, "tomb")
                await client.publish(channel, f"w {action.version} {action.key}")
        finally:
            await client.aclose()

    outcomes = asyncio.run(through_the_tier())
    time.sleep(0.3)  # any announcement the replay made has arrived
    assert outcomes == [Outcome.NOT_NEWER] * CONTROL_KEYS, outcomes
    assert len(run.log.snapshot()) == len(before), "a refused replay was announced"
    assert p.run_verification(WINDOW_MS).reports[0].stale == 0

    asyncio.run(without_version_check())
    run.p.wait(lambda: len(run.log.snapshot()) >= len(before) + CONTROL_KEYS, 10, "the naive announcements")
    violations = order_violations(run.log.snapshot())
    stale = run.p.run_verification(WINDOW_MS).reports[0].stale
    print(
        f"negative control: {CONTROL_KEYS} older changes replayed; through the versioned scripts: all"
        f" not newer, 0 announced; without the version check: {len(violations)} order violations,"
        f" {stale} stale"
    )
    assert {v.key for v in violations} == {a.key for a in replay}
    assert stale == CONTROL_KEYS
    with contextlib.suppress(Exception):
        run.log.stop()
