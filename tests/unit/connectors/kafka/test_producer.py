"""connectors.kafka.producer without a broker: the message limit, and every refusal or failure kept
for the caller's thread (librdkafka refuses sizes by itself; a broker's refusal and librdkafka's error
callback are fed to their handlers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection

import connectors.kafka.producer as producer_module
from connectors.exceptions import ConfigurationError, DeliveryError
from connectors.kafka import topic_check
from connectors.kafka.acks import MAX_SPANS, AckedOffsets
from connectors.kafka.limit import RECORD_OVERHEAD_BYTES, MessageLimit
from connectors.kafka.producer import ChangeProducer
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topic_check import TOPIC_GONE_AFTER_S, TopicCheck, TopicWatch
from connectors.kafka.topics import NO_TOPIC_ID

LIMIT = 100_000
KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", max_message_bytes=LIMIT, dead_letter_max_original_bytes=50_000)


def test_limit_keeps_room_for_headers_and_learns_a_lower_broker_limit() -> None:
    limit = MessageLimit(LIMIT)
    assert limit.max_bytes == LIMIT - RECORD_OVERHEAD_BYTES
    assert limit.fits(b"k", b"v" * (LIMIT - RECORD_OVERHEAD_BYTES - 1))
    assert not limit.fits(b"k", b"v" * (LIMIT - RECORD_OVERHEAD_BYTES))
    assert limit.refused(60_000) is True
    assert limit.max_bytes == 59_999
    assert limit.refused(80_000) is False, "a larger refusal teaches nothing"
    assert not limit.fits(b"", b"v" * 60_000)


@pytest.fixture
def producer() -> Iterator[ChangeProducer]:
    made = ChangeProducer(KAFKA, delivery_timeout_s=5)
    yield made
    made.close(0.1, purge=True)


def test_librdkafka_refusal_calls_on_too_large_instead_of_raising(producer: ChangeProducer) -> None:
    calls: list[str] = []
    producer.produce(
        "t",
        b"key",
        b"v" * LIMIT,
        lambda: calls.append("delivered"),
        on_too_large=lambda key, value: calls.append(f"too large: {key!r}, {len(value)} bytes"),
    )
    assert calls == [f"too large: b'key', {LIMIT} bytes"]
    producer.raise_if_failed()  # no failure kept


def test_broker_refusal_queues_the_stand_in_and_lowers_the_limit(producer: ChangeProducer) -> None:
    calls: list[str] = []
    producer.on_delivery_error(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
        "t",
        b"key",
        b"v" * 69_997,
        lambda key, value: calls.append(f"stand-in for {key!r}, {len(value)} bytes"),
    )
    assert calls == [], "the stand-in is produced on the caller's thread, not the poll thread"
    assert producer.limit.max_bytes == 69_999
    producer.raise_if_failed()
    assert calls == ["stand-in for b'key', 69997 bytes"]


def test_other_delivery_errors_fail_the_session_and_purges_do_not(producer: ChangeProducer) -> None:
    producer.on_delivery_error(KafkaError(KafkaError._PURGE_QUEUE), "t", b"k", b"v", None)
    producer.raise_if_failed()
    producer.on_delivery_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", b"k", b"v", None)
    with pytest.raises(DeliveryError, match=r"event for 't'"):
        producer.raise_if_failed()


@pytest.mark.parametrize("code", [KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_an_event_for_a_topic_the_broker_no_longer_has_says_so(producer: ChangeProducer, code: int) -> None:
    producer.on_delivery_error(KafkaError(code), "t", b"k", b"v", None)
    with pytest.raises(DeliveryError, match=r"no longer has topic 't' \(a broker that lost its data"):
        producer.raise_if_failed()


def test_a_delivery_refused_for_want_of_authorization_is_a_configuration_error(
    producer: ChangeProducer,
) -> None:
    producer.on_delivery_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "t", b"k", b"v", None)
    with pytest.raises(ConfigurationError, match="refused an event for 't'"):
        producer.raise_if_failed()


def test_fatal_error_fails_the_session(producer: ChangeProducer) -> None:
    producer.on_client_error(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True))
    with pytest.raises(DeliveryError, match="for good"):
        producer.raise_if_failed()


def test_authentication_errors_are_configuration_errors(producer: ChangeProducer) -> None:
    producer.on_client_error(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED))
    with pytest.raises(ConfigurationError, match="refused freshkey"):
        producer.raise_if_failed()


def test_an_unreachable_broker_with_nothing_waiting_is_no_failure(producer: ChangeProducer) -> None:
    """An idle producer whose connection was closed is not an outage: nothing waits for it."""
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN)
    producer.on_client_error(down)
    producer.raise_if_failed()
    assert producer.last_error == down.str(), "kept for the messages"


def test_the_first_failure_is_the_one_raised(producer: ChangeProducer) -> None:
    producer.on_client_error(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True))
    producer.on_delivery_error(KafkaError(KafkaError._MSG_TIMED_OUT), "t", b"k", b"v", None)
    with pytest.raises(DeliveryError, match="for good"):
        producer.raise_if_failed()


def _purged_report_thread(producer: ChangeProducer, serve: bool) -> str:
    """Which thread serves the delivery report of a message purged from the queue."""
    threads: list[str] = []

    def on_error(err: KafkaError, topic: str, key: bytes, value: bytes, on_too_large: object) -> None:
        threads.append(threading.current_thread().name)

    producer.on_delivery_error = on_error  # type: ignore[method-assign]
    producer.produce("t", b"key", b"value", lambda: threads.append("delivered?"))
    producer._producer.purge(in_queue=True)
    time.sleep(0.2)  # a background thread that serves reports has served this one by now
    deadline = time.monotonic() + 5
    while not threads and time.monotonic() < deadline:
        if serve:
            producer.serve(0.01)
        else:
            time.sleep(0.01)
    assert threads, "no delivery report served within 5 s"
    return threads[0]


def test_a_caller_that_serves_gets_the_delivery_reports(
    producer: ChangeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports go to the thread that calls serve(): the background thread leaves them to it (no GIL
    taken from the producing thread per message) while it served within the hand-over time."""
    monkeypatch.setattr(producer_module, "SERVE_HANDOVER_S", 2.0)  # no hand-over on a loaded machine
    producer.serve()
    time.sleep(0.1)  # the background thread's poll in progress (0.05 s) ends; it waits from now on
    assert _purged_report_thread(producer, serve=True) == threading.current_thread().name


def test_without_a_serving_caller_the_background_thread_serves_the_reports(
    producer: ChangeProducer,
) -> None:
    assert _purged_report_thread(producer, serve=False) == "kafka-delivery"


class _Delivered:
    """What librdkafka hands a delivery report: the message's partition and offset."""

    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def _deliver(producer: ChangeProducer, partition: int, offset: int) -> None:
    producer._report("t", lambda: None, None, None, _Delivered(partition, offset))  # type: ignore[arg-type]


def test_offsets_that_go_up_are_the_acknowledged_ends(producer: ChangeProducer) -> None:
    for partition, offset in [(0, 0), (1, 7), (0, 1), (0, 5), (1, 8)]:
        _deliver(producer, partition, offset)
    producer.raise_if_failed()
    assert producer.rewound is None
    assert producer.acked_ends("t") == {0: 6, 1: 9}


def test_reports_served_out_of_order_are_no_loss(producer: ChangeProducer) -> None:
    """Two threads serve delivery reports (the caller's and the background one), so a later batch's
    callbacks can run first: offsets that come back out of order, each once, lose nothing. (The first
    version of the check compared each offset with the highest so far, and failed a benchmark's session
    this way with no broker fault.)"""
    for offset in [*range(10, 20), *range(0, 10), 25, 21, 20, 24, 22, 23]:
        _deliver(producer, 0, offset)
    producer.raise_if_failed()
    assert producer.rewound is None
    assert producer.acked_ends("t") == {0: 26}
    assert producer._acked[("t", 0)].spans == [[0, 26]], "the runs merged back into one"


def test_an_offset_acknowledged_twice_fails_the_session(producer: ChangeProducer) -> None:
    """A partition whose log went back (broker data gone, unclean leader election, topic recreated)
    acknowledges offsets it had acknowledged before, for other events: the session ends, and the next one
    fences (the saved ends stay up)."""
    for offset in range(0, 312):
        _deliver(producer, 0, offset)
    _deliver(producer, 1, 4)
    producer.raise_if_failed()
    _deliver(producer, 0, 0)
    with pytest.raises(DeliveryError, match="offset 0 of 't' partition 0, which it had acknowledged before"):
        producer.raise_if_failed()
    assert producer.rewound is not None and "may be lost" in producer.rewound
    assert producer.acked_ends("t") == {0: 312, 1: 5}, "the ends never go down: the checkpoint keeps them"


@pytest.mark.parametrize(
    ("order", "twice"),
    [([5, 3, 4, 9, 7, 8, 6], 6), ([1, 3, 5, 7, 2], 3), ([0, 2, 1], 0), ([4, 2, 3], 4)],
)
def test_acked_offsets_finds_every_offset_seen_twice_in_any_order(order: list[int], twice: int) -> None:
    acked = AckedOffsets()
    assert all(acked.add(offset) for offset in order)
    assert not acked.add(twice)
    assert acked.add(max(order) + 1)


def test_acked_offsets_keeps_a_bounded_number_of_runs() -> None:
    acked = AckedOffsets()
    for offset in range(0, 4 * MAX_SPANS, 2):  # another producer takes every other offset
        assert acked.add(offset)
    assert len(acked.spans) == MAX_SPANS
    assert not acked.add(4 * MAX_SPANS - 2)


def test_an_offset_below_the_ends_of_earlier_sessions_fails_the_session() -> None:
    made = ChangeProducer(KAFKA, delivery_timeout_s=5, acknowledged={("t", 0): 312})
    try:
        _deliver(made, 0, 312)  # the next offset: fine
        _deliver(made, 1, 0)  # no earlier end there
        made.raise_if_failed()
        _deliver(made, 0, 2)
        with pytest.raises(DeliveryError, match="below offset 311 it had acknowledged before"):
            made.raise_if_failed()
    finally:
        made.close(0.1, purge=True)


def test_the_topic_check_is_due_once_events_waited_and_the_last_check_ended_long_enough_ago() -> None:
    check = TopicCheck()
    now = time.monotonic()
    assert not check.due(now, waiting_since=now - TOPIC_GONE_AFTER_S + 0.1), "events have not waited yet"
    assert check.due(now, waiting_since=now - TOPIC_GONE_AFTER_S)


class _Admin:
    """Stands in for librdkafka's admin client: describe_topics answers as set (an id, or unknown)."""

    def __init__(self) -> None:
        self.ids: dict[str, str | None] = {}

    def describe_topics(self, topics: TopicCollection, request_timeout: float) -> dict[str, Future[Any]]:
        answers: dict[str, Future[Any]] = {}
        for name in topics.topic_names:
            future: Future[Any] = Future()
            found = self.ids.get(name)
            if found is None:
                future.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            else:
                future.set_result(SimpleNamespace(topic_id=found))
            answers[name] = future
        return answers


def test_the_watch_finds_a_topic_gone_or_created_again_and_looks_every_interval() -> None:
    admin = _Admin()
    admin.ids = {"c": "id-1"}
    watch = TopicWatch(lambda: cast(Any, admin), {"c": "id-1"})
    began = time.monotonic()
    assert not watch.due(began), "the session had just read the ids"
    assert watch.due(began + topic_check.TOPIC_WATCH_EVERY_S)
    assert watch.changed() is None
    ended = time.monotonic()
    assert not watch.due(ended + topic_check.TOPIC_WATCH_EVERY_S - 0.1)
    assert watch.due(ended + topic_check.TOPIC_WATCH_EVERY_S)
    admin.ids = {}
    assert watch.changed() == ("c", "not on the broker any more", False)
    admin.ids = {"c": "id-2"}
    assert watch.changed() == (
        "c",
        "created again: its topic id is id-2, was id-1 when the session began",
        True,
    )
    admin.ids = {"c": NO_TOPIC_ID}  # a broker without topic ids says nothing of identity
    assert watch.changed() is None
    assert not TopicWatch(lambda: cast(Any, admin), {}).due(time.monotonic() + 3600), "nothing watched"


def test_a_topic_created_again_ends_the_session_as_a_loss(producer: ChangeProducer) -> None:
    producer._changed(("c", "created again: its topic id is id-2, was id-1 when the session began", True))
    assert producer.rewound is not None and "events Kafka acknowledged may be lost" in producer.rewound
    with pytest.raises(DeliveryError, match="created again"):
        producer.raise_if_failed()


def test_the_topic_check_against_a_broker_that_does_not_answer_finds_nothing_and_waits_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker at all (127.0.0.1:1): the metadata request gives up after TOPIC_CHECK_TIMEOUT_S, nothing
    is reported gone (an unreachable broker is the producer's UNREACHABLE_AFTER_S), and the next check is
    due TOPIC_CHECK_EVERY_S after the end of this one, so the delivery thread is not held by checks back
    to back (with the start as reference, a check as long as the interval is due again at once)."""
    monkeypatch.setattr(topic_check, "TOPIC_CHECK_TIMEOUT_S", 0.5)
    monkeypatch.setattr(topic_check, "TOPIC_CHECK_EVERY_S", 0.5)
    quiet = {"allow.auto.create.topics": False, "log_level": 0}
    client = Producer({"bootstrap.servers": KAFKA.bootstrap, **quiet})
    check = TopicCheck()
    check.sent("t")
    check.sent("t")
    started = time.monotonic()
    assert check.gone(client) is None
    ended = time.monotonic()
    assert ended - started < 2.0, f"one topic's check took {ended - started:.2f} s"
    assert ended - started >= 0.4, "the broker cannot have answered"
    assert not check.due(ended, waiting_since=0.0), "counted from the end of the check"
    assert check.due(ended + 0.5, waiting_since=0.0)
