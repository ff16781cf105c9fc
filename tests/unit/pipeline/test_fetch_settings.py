"""The worker's fetch settings reach the aiokafka consumer Faust creates (nothing is connected)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from pipeline.faust_app import FreshkeyApp
from pipeline.settings import WorkerSettings


def _consumer_fetch(**app_options: int) -> tuple[int, int]:
    async def build() -> tuple[int, int]:
        app = FreshkeyApp("fetch-settings", broker="kafka://127.0.0.1:1", **app_options)
        thread = app.consumer._thread  # type: ignore[attr-defined]
        consumer = thread._create_worker_consumer(app.transport)
        try:
            return consumer._fetch_min_bytes, consumer._fetch_max_wait_ms
        finally:
            await consumer.stop()  # never started: only releases what the constructor made
            thread.thread_loop.close()  # the consumer thread's own loop, made with the thread

    return asyncio.run(build())


def test_the_defaults_answer_at_the_first_change_within_10_ms() -> None:
    assert _consumer_fetch() == (1, 10)


def test_fetch_min_bytes_and_max_wait_reach_the_consumer() -> None:
    assert _consumer_fetch(fetch_min_bytes=16_384, fetch_max_wait_ms=20) == (16_384, 20)


def test_fetch_min_bytes_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRESHKEY_WORKER_FETCH_MIN_BYTES", "16384")
    assert WorkerSettings().fetch_min_bytes == 16_384
    monkeypatch.setenv("FRESHKEY_WORKER_FETCH_MIN_BYTES", "0")
    with pytest.raises(ValidationError, match="fetch_min_bytes"):
        WorkerSettings()
