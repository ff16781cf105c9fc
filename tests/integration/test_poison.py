"""Bad input never wedges the worker (invariant 8, issue 8): poison messages, fuzzing, shutdown, dead letters.

Only the worker runs (``pipeline.start("worker")``): the tests produce raw bytes to the change topic
themselves, so they depend on neither the connector nor MySQL's binlog. Valid changes are
``schemas.ChangeEvent`` wire forms of the harness's ``<db>.assets`` binding, keyed with
``schemas.message_key``; the malformed ones come from the hypothesis strategies of
tests/unit/schemas/test_dead_letters.py, where each one's stage and reason are checked against the codec.

Every test checks the same promise from the outside: each malformed message becomes exactly one dead
letter (matched by partition and offset) that is bounded and describes the whole original, every valid
change produced after it is applied, and the worker process is the one that was started (never exited,
never restarted: its stats uptime runs on).
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pipeline.embedded import LocalKafka, LocalRedis, free_port
from schemas import DeadLetter
from schemas.codec import DEAD_LETTER_ORIGINAL_BYTES, DEAD_LETTER_OVERHEAD_BYTES, dead_letter_size_bound
from tests.support.kafka import RawProducer, committed_offsets, create_topics, read_to_end
from tests.support.pipeline import Pipeline
from tests.support.poison import (
    HUGE_SHAPES,
    Change,
    ChangeStream,
    Poison,
    change_envelope,
    generate,
    huge_poison_messages,
    poison_messages,
    valid_edges,
    wire,
    with_token,
)
from tests.support.services import running

pytestmark = pytest.mark.integration

PARTITIONS = 3  # the harness's FRESHKEY_KAFKA_PARTITIONS
MAX_MESSAGE_BYTES = 1024 * 1024
WORKER_ENV = {
    # A worker must be able to fetch the 5 MB poison messages to dead-letter them (the broker takes them:
    # Tansu 0.6 has no message size limit); what it produces stays under 1 MiB.
    "FRESHKEY_KAFKA_MAX_FETCH_BYTES": str(8 * 1024 * 1024),
    "FRESHKEY_KAFKA_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
}
LIMIT = DEAD_LETTER_ORIGINAL_BYTES  # FRESHKEY_KAFKA_DEAD_LETTER_MAX_ORIGINAL_BYTES, default 256 KiB


# --- helpers -----------------------------------------------------------------------------------------------


class Watch:
    """The worker of one test: started once, and checked to be the same process at every step."""

    def __init__(self, p: Pipeline, **env: str) -> None:
        create_topics(p.kafka, {p.change_topic: PARTITIONS, p.dead_letter_topic: PARTITIONS})
        p.start("worker", **WORKER_ENV, **env)
        self.p = p
        self.producer = RawProducer(p.kafka)
        stats = p.stats()
        assert stats is not None
        self.uptime0 = float(stats["uptime_s"])
        self.t0 = time.monotonic()

    def alive(self) -> dict[str, Any]:
        """The worker's stats, after checking it never exited or restarted."""
        proc = self.p.procs["worker"]
        assert proc.poll() is None, f"the worker exited with {proc.returncode}\n{self.p.logs()}"
        assert self.p.starts["worker"] == 1
        stats = self.p.stats()
        assert stats is not None, "the worker's web server does not answer"
        elapsed = time.monotonic() - self.t0
        assert stats["uptime_s"] >= self.uptime0 + elapsed - 2, "the worker's uptime restarted"
        return stats

    def events(self) -> dict[str, int]:
        return dict(self.alive()["events"])

    def send(self, messages: Sequence[Poison | Change]) -> list[tuple[int, int]]:
        return self.producer.send(self.p.change_topic, [(m.key, m.value) for m in messages])


def applied(p: Pipeline, change: Change) -> bool:
    """Redis holds this change (or a later one) of its row."""
    entry = p.entry(change.row_id)
    if entry is None or entry.version < change.version:
        return False
    assert entry.version > change.version or entry.value == change.expected, entry
    return True


def wait_applied(p: Pipeline, changes: Sequence[Change], timeout: float = 60) -> None:
    last = {c.row_id: c for c in changes}  # one row's changes apply in order: its last one is enough
    p.wait(lambda: all(applied(p, c) for c in last.values()), timeout, f"{len(last)} rows applied")


def assert_final_state(p: Pipeline, stream: ChangeStream) -> None:
    for row_id, change in stream.expected().items():
        entry = p.entry(row_id)
        assert entry is not None, f"row {row_id} never reached Redis"
        assert (entry.version, entry.value) == (change.version, change.expected), (row_id, change.op)


def dead_letters(watch: Watch, expect: int, timeout: float = 60) -> dict[tuple[int, int], DeadLetter]:
    """The dead letters by (partition, offset) of their original, once the worker counted ``expect``;
    each message has exactly one (a second letter for the same message fails), each within its bound."""
    p = watch.p
    p.wait(lambda: watch.events().get("dead_lettered", 0) >= expect, timeout, f"{expect} dead letters")
    letters: dict[tuple[int, int], DeadLetter] = {}
    for record in read_to_end(p.kafka, p.dead_letter_topic):
        letter = DeadLetter.model_validate_json(record.value)
        assert letter.partition is not None and letter.offset is not None
        where = (letter.partition, letter.offset)
        assert where not in letters, f"two dead letters for {where}: {letters[where]} and {letter}"
        # The producer's limit is the promise; the codec's own bound (dead_letter_size_bound) is exceeded
        # by reasons that quote control characters: tests/unit/schemas/test_dead_letters.py, strict xfail.
        assert len(record.value) <= MAX_MESSAGE_BYTES, f"a dead letter of {len(record.value)} B"
        letters[where] = letter
    assert len(letters) == expect, f"{len(letters)} dead letters, expected {expect}"
    return letters


def check_letter(p: Pipeline, letter: DeadLetter, poison: Poison) -> None:
    """A dead letter says where and why, and describes the whole original with its first bytes."""
    assert letter.topic == p.change_topic
    assert letter.stage == poison.stage, (letter.reason, poison)
    assert letter.reason and poison.names in letter.reason, (letter.reason, poison)
    assert letter.original_size == len(poison.value)
    assert letter.original_sha256 == hashlib.sha256(poison.value).hexdigest()
    assert letter.truncated == (len(poison.value) > LIMIT)
    assert base64.b64decode(letter.original_b64) == poison.value[:LIMIT]
    expected_key = None if poison.key is None else base64.b64encode(poison.key[:1024]).decode()
    assert letter.key_b64 == expected_key


def time_to_apply(watch: Watch, messages: Sequence[Poison | Change], timeout: float = 30) -> float:
    """Seconds from producing ``messages`` (acknowledged by the broker) to their last one, a valid
    change, being in Redis (polled every millisecond: the harness's wait polls every 50 ms)."""
    last = messages[-1]
    assert isinstance(last, Change)
    started = time.monotonic()
    watch.send(messages)
    while not applied(watch.p, last):
        if time.monotonic() - started > timeout:
            watch.alive()
            raise AssertionError(
                f"the change after {len(messages) - 1} message(s) not applied\n{watch.p.logs()}"
            )
        time.sleep(0.001)
    return time.monotonic() - started


def out_of_range(db: str, path: str, token: bytes, key: bytes = b"oor") -> Poison:
    return Poison(
        "out-of-range", key, with_token(change_envelope(db), path, token), "decode", f"change.{path}"
    )


# --- finding 1: a 5 MB undecodable message -----------------------------------------------------------------


def test_a_5mb_undecodable_message_becomes_a_bounded_dead_letter_and_later_changes_apply(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    watch = Watch(p)
    stream = ChangeStream(p.database)
    before = [stream.change(r) for r in (1, 2, 3)]
    watch.send(before)
    wait_applied(p, before)

    poison = Poison("huge-random", b"poison/5mb", b"\xff" + os.urandom(5 * 1024 * 1024 - 1), "decode", "")
    after = [stream.change(r) for r in (1, 2, 3, 4, 5, 1)]
    started = time.monotonic()
    (where, *_) = watch.send([poison, *after])
    wait_applied(p, after)
    seconds = time.monotonic() - started
    print(f"\n5 MB poison -> the {len(after)} changes behind it applied in {seconds * 1000:.0f} ms")

    letters = dead_letters(watch, expect=1)
    check_letter(p, letters[where], poison)
    assert letters[where].truncated and letters[where].original_size == 5 * 1024 * 1024
    assert_final_state(p, stream)
    assert watch.events().get("dead_lettered") == 1


# --- finding 2: out-of-range numbers ------------------------------------------------------------------------


def test_out_of_range_numbers_are_dead_lettered_naming_the_field_and_later_changes_apply(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    watch = Watch(p)
    stream = ChangeStream(p.database)
    big_value = change_envelope(p.database, op="c")
    big_value["after"]["content"] = 10**400
    poisons = [
        out_of_range(p.database, "ts_ms", b"1" + b"0" * 400),  # the ts_ms = 10**400
        out_of_range(p.database, "version", str(2**64).encode()),
        out_of_range(p.database, "commit_ts_us", b"1" + b"0" * 30),
        out_of_range(p.database, "source.pos", str(2**64 + 7).encode()),
        out_of_range(p.database, "source.ts_ms", b"-1"),
        out_of_range(p.database, "source.server_id", str(2**32).encode()),
        out_of_range(p.database, "source.row", b"1e400"),
        # a value column with an integer beyond 64 bits: a valid envelope that cannot be cached
        Poison("bind-unencodable-value", b"big-value", wire(big_value), "bind", "cannot be cached"),
    ]
    messages: list[Poison | Change] = []
    for poison in poisons:  # each one followed by a valid change of another row
        messages += [poison, stream.change(len(messages) % 4 + 1)]
    where = watch.send(messages)
    # and a record without a value (a Kafka tombstone: what compaction leaves of a key)
    (null_where,) = watch.producer.send(p.change_topic, [(b"null-value", None)])
    last = stream.change(1)
    watch.send([last])
    wait_applied(p, [*(m for m in messages if isinstance(m, Change)), last])

    letters = dead_letters(watch, expect=len(poisons) + 1)
    for index, message in enumerate(messages):
        if isinstance(message, Poison):
            check_letter(p, letters[where[index]], message)
    check_letter(p, letters[null_where], Poison("null-value", b"null-value", b"", "decode", "<root>"))
    assert_final_state(p, stream)
    assert watch.events().get("dead_lettered") == len(poisons) + 1


# --- a dead letter larger than the producer takes -----------------------------------------------------------


def test_a_dead_letter_the_producer_refuses_as_too_large_is_sent_without_its_copy_and_the_stream_goes_on(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    """At the largest FRESHKEY_KAFKA_DEAD_LETTER_MAX_ORIGINAL_BYTES the settings accept for a 1 MiB
    producer, a dead letter whose reason quotes control characters outgrows the producer's limit (the
    codec's bound counts a reason character as one byte; JSON writes a NUL as six). The worker must
    then send it with size and digest only, as it does for a broker's limit, and go on: a letter the
    producer refuses must never stop consumption for good."""
    p = make_pipeline()
    max_original = (MAX_MESSAGE_BYTES - DEAD_LETTER_OVERHEAD_BYTES) * 3 // 4  # the settings' largest
    assert dead_letter_size_bound(max_original) <= MAX_MESSAGE_BYTES
    watch = Watch(p, FRESHKEY_KAFKA_DEAD_LETTER_MAX_ORIGINAL_BYTES=str(max_original))
    stream = ChangeStream(p.database)
    # the reason repeats the bad "kind" (2000 NULs once cut): 12,000 bytes of JSON in the letter
    value = wire({"kind": "\x00" * 3000, "pad": "x" * 1_000_000})
    poison = Poison("quoted-control-characters", b"k" * 1024, value, "decode", "Input tag")
    (where,) = watch.send([poison])
    letter = dead_letters(watch, expect=1, timeout=20)[where]
    assert letter.stage == "decode" and letter.reason.startswith("<root>: Input tag")
    assert letter.original_size == len(value)
    assert letter.original_sha256 == hashlib.sha256(value).hexdigest()
    assert letter.truncated
    assert value.startswith(base64.b64decode(letter.original_b64))  # a prefix, or nothing at all
    after = [stream.change(r) for r in (1, 2)]
    watch.send(after)
    wait_applied(p, after, timeout=30)
    assert_final_state(p, stream)


# --- fuzz: 1,000 generated malformed messages, one worker ---------------------------------------------------


FUZZ_MESSAGES = int(os.environ.get("FRESHKEY_TEST_FUZZ_MESSAGES", "1000"))
"""Malformed messages of the fuzz run (plus one 5 MB message of each shape); about 20 s here."""


def test_fuzz_a_thousand_malformed_messages_among_valid_changes_one_worker(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    generated = time.monotonic()
    poisons: list[Poison] = generate(poison_messages(p.database), FUZZ_MESSAGES)
    poisons += [generate(huge_poison_messages(p.database, shape), 1)[0] for shape in HUGE_SHAPES]
    edges = generate(valid_edges(), FUZZ_MESSAGES // 4)
    generated = time.monotonic() - generated
    assert len(poisons) == FUZZ_MESSAGES + len(HUGE_SHAPES)

    watch = Watch(p)
    stream = ChangeStream(p.database)
    messages: list[Poison | Change] = []
    for index, poison in enumerate(poisons):
        messages.append(poison)
        if index % 4 == 3:  # a valid change after every fourth poison, on 20 rows, some deletes
            row = index // 4 % 20 + 1
            messages.append(stream.change(row, delete=index % 7 == 0, edges=edges[index // 4 % len(edges)]))
    changes = [m for m in messages if isinstance(m, Change)]
    produced = time.monotonic()
    where = watch.send(messages)
    wait_applied(p, changes, timeout=120)
    letters = dead_letters(watch, expect=len(poisons), timeout=120)
    produced = time.monotonic() - produced

    for index, message in enumerate(messages):
        if isinstance(message, Poison):
            check_letter(p, letters[where[index]], message)
    assert_final_state(p, stream)
    events = watch.events()
    assert events.get("dead_lettered") == len(poisons), events
    assert events.get("unexpected", 0) == 0, "a batch failed on something the worker did not expect"

    # The time from a poison message to the valid change right behind it, per kind of poison.
    probes = {
        "random-bytes": Poison("random-bytes", b"p", b"\x00\xff junk", "decode", ""),
        "ts_ms=10**400": out_of_range(p.database, "ts_ms", b"1" + b"0" * 400),
        "100k nested arrays": Poison("deep", b"p", b"[" * 100_000 + b"]" * 100_000, "decode", ""),
        "5 MB": generate(huge_poison_messages(p.database, "random"), 1)[0],
    }
    timings: dict[str, list[float]] = {}
    for _ in range(3):
        timings.setdefault("none (a valid change alone)", []).append(
            time_to_apply(watch, [stream.change(21)])
        )
        for name, poison in probes.items():
            timings.setdefault(name, []).append(time_to_apply(watch, [poison, stream.change(21)]))
    dead_letters(watch, expect=len(poisons) + 3 * len(probes))
    assert_final_state(p, stream)

    total_mb = sum(len(m.value) for m in messages) / 1e6
    print(
        f"\nfuzz: {len(poisons)} malformed ({total_mb:.1f} MB with the valid ones) and {len(changes)} valid "
        f"changes: generated in {generated:.1f} s, all dead-lettered and applied {produced:.1f} s after "
        "the first was produced"
    )
    for name, seconds in timings.items():
        ms = sorted(s * 1000 for s in seconds)
        print(
            f"  poison {name} -> next change applied: median {statistics.median(ms):.0f} ms, max {ms[-1]:.0f}"
        )
    watch.alive()


# --- SIGTERM while the worker retries -----------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    with running(LocalRedis(workdir=tmp_path / "redis")) as server:
        yield server


def _log_has(p: Pipeline, text: str) -> bool:
    return any(text in path.read_text(errors="replace") for path in p.workdir.glob("worker.*.log"))


@pytest.mark.parametrize("stuck", ["redis-never-reached", "redis-lost-mid-batch"])
def test_sigterm_stops_a_worker_stuck_retrying_within_the_grace_period(
    private_redis: LocalRedis, make_pipeline: Callable[..., Pipeline], stuck: str
) -> None:
    p = make_pipeline()
    grace = 5.0
    env = {"FRESHKEY_WORKER_SHUTDOWN_GRACE_S": str(grace)}
    stream = ChangeStream(p.database)
    if stuck == "redis-never-reached":
        watch = Watch(p, FRESHKEY_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", **env)
        (where,) = watch.send([stream.change(1)])
        p.wait(lambda: _log_has(p, "loading the scripts into redis failed"), 30, "the worker to retry Redis")
    else:
        watch = Watch(p, FRESHKEY_REDIS_URL=private_redis.url, **env)
        first = stream.change(1)
        watch.send([first])
        client = redis.Redis.from_url(private_redis.url)
        try:
            p.wait(lambda: bool(client.hget(p.key(1), "v")), 60, "the first change in the private Redis")
        finally:
            client.close()
        private_redis.stop()
        (where,) = watch.send([stream.change(1)])
        p.wait(lambda: _log_has(p, "nothing is acknowledged"), 30, "the worker to retry the tier")
    watch.alive()

    proc = p.procs["worker"]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=grace + 10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"the worker ignored SIGTERM for {grace + 10} s\n{p.logs()}") from None
    seconds = time.monotonic() - started
    print(f"\nSIGTERM while stuck ({stuck}): exited with {code} after {seconds:.2f} s (grace {grace} s)")
    assert seconds <= grace + 3, f"the worker took {seconds:.1f} s to stop\n{p.logs()}"
    assert code == 0, p.logs()
    partition, offset = where
    committed = committed_offsets(p.kafka, p.env["FRESHKEY_WORKER_APP_ID"], p.change_topic)
    assert committed.get(partition, -1) <= offset, "the change it could not apply was acknowledged"


# --- a dead-letter topic the broker refuses -----------------------------------------------------------------


REFUSE = {"type": "object", "properties": {"value": {"type": "object", "required": ["never-present"]}}}
ACCEPT = {"type": "object", "properties": {"value": {"type": "object"}}}


class ValidatingKafka(LocalKafka):
    """A private Tansu broker with its schema registry on: a topic whose ``<topic>.json`` JSON schema
    a message's value does not match refuses the message (INVALID_RECORD). Tansu reads the schema on
    every produce, so :meth:`refuse` and :meth:`accept` take effect at once."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.schemas = workdir / "schemas"
        self.schemas.mkdir(parents=True)

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        super()._spawn([*argv, "--schema-registry", "file://./schemas"], env)  # relative to its workdir

    def refuse(self, topic: str) -> None:
        (self.schemas / f"{topic}.json").write_bytes(orjson.dumps(REFUSE))

    def accept(self, topic: str) -> None:
        (self.schemas / f"{topic}.json").write_bytes(orjson.dumps(ACCEPT))


@pytest.fixture
def validating_kafka(tmp_path: Path) -> Iterator[ValidatingKafka]:
    server = ValidatingKafka(tmp_path / "kafka")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_an_unwritable_dead_letter_topic_pauses_the_worker_without_acknowledging_then_it_catches_up(
    validating_kafka: ValidatingKafka, make_pipeline: Callable[..., Pipeline]
) -> None:
    # (validating_kafka first: fixtures stop in reverse order, so the worker stops before its broker)
    p = make_pipeline()
    p.kafka = p.env["FRESHKEY_KAFKA_BOOTSTRAP"] = validating_kafka.bootstrap
    validating_kafka.refuse(p.dead_letter_topic)
    watch = Watch(p)
    stream = ChangeStream(p.database)
    first = stream.change(1)
    watch.send([first])
    wait_applied(p, [first])

    poison = out_of_range(p.database, "ts_ms", b"1" + b"0" * 400)
    (where,) = watch.send([poison])
    p.wait(lambda: _log_has(p, "cannot be written"), 30, "the worker to report the dead-letter topic")
    later = [stream.change(r) for r in (2, 1, 3)]
    watch.send(later)

    # Refused: nothing after the poison message is applied or acknowledged, for as long as it lasts.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert not any(applied(p, c) for c in later), "a change behind the blocked dead letter applied"
        watch.alive()
        time.sleep(0.2)
    partition, offset = where
    committed = committed_offsets(p.kafka, p.env["FRESHKEY_WORKER_APP_ID"], p.change_topic)
    assert committed.get(partition, -1) <= offset, "the poison message was acknowledged without its letter"
    assert watch.events().get("dead_lettered", 0) == 0
    assert read_to_end(p.kafka, p.dead_letter_topic) == []

    validating_kafka.accept(p.dead_letter_topic)
    started = time.monotonic()
    wait_applied(p, later)
    seconds = time.monotonic() - started
    print(f"\ndead-letter topic writable again -> the changes behind it applied in {seconds:.2f} s")
    letters = dead_letters(watch, expect=1)
    check_letter(p, letters[where], poison)
    assert_final_state(p, stream)
    assert watch.events().get("dead_lettered") == 1
    p.wait(
        lambda: (
            committed_offsets(p.kafka, p.env["FRESHKEY_WORKER_APP_ID"], p.change_topic).get(partition, -1)
            > offset
        ),
        30,
        "the poison message to be acknowledged once its letter is written",
    )
