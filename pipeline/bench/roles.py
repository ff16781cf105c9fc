"""The freshkey processes of ``freshkey bench pipeline``: a connector and a worker on topics of their own,
and what the bench reads of them (checkpoint, acknowledged offsets, stats, group joins)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline.bench.procs import FreshkeyProcess
from pipeline.bench.stack import Stack
from pipeline.demo.catchup import fetch_stats
from pipeline.embedded import free_port

JOINED = "Joined group"
"""The line a Faust worker logs each time it (re)joins its consumer group."""


def _role_env(tag: str) -> dict[str, str]:
    return {
        "FRESHKEY_KAFKA_CHANGE_TOPIC": f"bench.{tag}.changes",
        "FRESHKEY_KAFKA_DEAD_LETTER_TOPIC": f"bench.{tag}.dead-letters",
        "FRESHKEY_KAFKA_MODEL_UPDATE_TOPIC": f"bench.{tag}.model-updates",
        "FRESHKEY_KAFKA_HOTNESS_TOPIC": f"bench.{tag}.hotness",
    }


class Connector:
    """A ``freshkey connector`` writing to ``bench.<tag>.changes``, with its own checkpoint file."""

    def __init__(self, stack: Stack, tag: str, name: str, bindings: Path | None = None) -> None:
        self.topic = f"bench.{tag}.changes"
        self.checkpoint = stack.root / f"checkpoint-{tag}.json"
        env = {
            **stack.base_env(),
            **_role_env(tag),
            "FRESHKEY_BINDINGS": str(bindings or stack.bindings),
            "FRESHKEY_MYSQL_SERVER_ID": str(stack.server_id()),
            "FRESHKEY_CONNECTOR_CHECKPOINT_PATH": str(self.checkpoint),
            "FRESHKEY_TELEMETRY_CONNECTOR_PROMETHEUS_PORT": str(free_port()),
        }
        self.proc = FreshkeyProcess(name, "connector", env, stack.root / f"{name}.log")

    def position(self) -> tuple[tuple[str, int], float] | None:
        """The saved checkpoint position and when it was saved (the file's mtime, Unix seconds)."""
        try:
            with self.checkpoint.open("rb") as fh:
                mtime = os.fstat(fh.fileno()).st_mtime_ns / 1e9
                data = orjson.loads(fh.read())
            return (str(data["file"]), int(data["pos"])), mtime
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def reached(self, target: tuple[str, int]) -> bool:
        saved = self.position()
        return saved is not None and saved[0] >= target


class Worker:
    """A ``freshkey worker`` on ``bench.<tag>.changes`` (consumer group ``bench-<group>``), writing under
    its own Redis key prefix."""

    def __init__(
        self, stack: Stack, tag: str, name: str, group: str | None = None, bindings: Path | None = None
    ) -> None:
        self.topic = f"bench.{tag}.changes"
        self.port = free_port()
        self.prefix = f"b{(group or tag).replace('.', '').replace('-', '')}"
        env = {
            **stack.base_env(),
            **_role_env(tag),
            "FRESHKEY_BINDINGS": str(bindings or stack.bindings),
            "FRESHKEY_WORKER_APP_ID": f"bench-{group or tag}",
            "FRESHKEY_WORKER_DATA_DIR": str(stack.root / f"{name}-data"),
            "FRESHKEY_WORKER_WEB_PORT": str(self.port),
            "FRESHKEY_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            "FRESHKEY_REDIS_KEY_PREFIX": self.prefix,
        }
        self.proc = FreshkeyProcess(name, "worker", env, stack.root / f"{name}.log")

    def progress(self) -> dict[int, tuple[int, bool]] | None:
        """partition -> (acknowledged offset, -1 for none; assigned here), from /freshkey/consumer-lag."""
        page = fetch_stats(f"http://127.0.0.1:{self.port}/freshkey/consumer-lag")
        if page is None:
            return None
        result: dict[int, tuple[int, bool]] = {}
        for row in page.values():
            if row.get("topic") == self.topic and row.get("partition") is not None:
                acked = row.get("acked_offset")
                result[int(row["partition"])] = (
                    -1 if acked is None else int(acked),
                    bool(row.get("assigned")),
                )
        return result

    def stats(self) -> dict[str, Any] | None:
        return fetch_stats(f"http://127.0.0.1:{self.port}/freshkey/stats", timeout_s=30)

    def joins(self) -> int:
        return self.proc.log_count(JOINED)


def acked_offsets(workers: Sequence[Worker]) -> dict[int, int] | None:
    """partition -> highest offset acknowledged by any of ``workers`` (None while one does not answer)."""
    merged: dict[int, int] = {}
    for worker in workers:
        progress = worker.progress()
        if progress is None:
            return None
        for partition, (acked, _) in progress.items():
            merged[partition] = max(merged.get(partition, -1), acked)
    return merged


def acked_count(acked: Mapping[int, int] | None) -> int:
    """Messages acknowledged in all (offsets of a fresh topic start at 0 and have no holes)."""
    return sum(offset + 1 for offset in (acked or {}).values())


def stop_all(procs: Sequence[FreshkeyProcess]) -> None:
    """Stop every process, in parallel: SIGTERM to all, then wait for each (SIGKILL after 5 s: what they
    leave behind is thrown away with the services)."""
    for proc in procs:
        proc.stopping = True
        proc.thaw()
        if proc.proc is not None and proc.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.proc.terminate()
    for proc in procs:
        proc.stop(timeout_s=5.0)


def all_reached(acked: Mapping[int, int] | None, last: Mapping[int, int]) -> bool:
    return acked is not None and all(acked.get(p, -1) >= offset for p, offset in last.items())
