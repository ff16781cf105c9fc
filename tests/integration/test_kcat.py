"""freshkey's own topics stay plain JSON that standard Kafka tools read: kcat (Debian package) reads the
change topic and the dead-letter topic, and every message is a JSON document that freshkey's own codec
decodes to the same event, keyed ``<db>/<table>/<row key>``.

Debian 12's kcat runs on librdkafka 2.0.2, which cannot parse the ApiVersions v3 response of the Tansu
broker the tests start ("Protocol read buffer underflow for ApiVersion v3": tagged fields it does not
know); against Apache Kafka it works as it is. When it fails that way, the test runs the same kcat on the
newer librdkafka that the confluent-kafka wheel bundles (same soname, through ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from schemas import ChangeEvent, DeadLetter, decode, message_key
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


def _newer_librdkafka(workdir: Path) -> dict[str, str]:
    """An environment that loads the librdkafka bundled with confluent-kafka instead of the system's."""
    spec = importlib.util.find_spec("confluent_kafka")
    assert spec is not None and spec.origin is not None
    bundled = sorted((Path(spec.origin).parent.parent / "confluent_kafka.libs").glob("librdkafka*.so.1"))
    assert bundled, "confluent-kafka bundles no librdkafka"
    libdir = workdir / "librdkafka"
    libdir.mkdir(exist_ok=True)
    link = libdir / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(bundled[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir)}


def _kcat(
    bootstrap: str, topic: str, workdir: Path, *, expect: int, timeout: float = 60
) -> list[dict[str, Any]]:
    """Every message of ``topic`` as kcat prints it with ``-J`` (one JSON object per message)."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is missing: apt-get install -y kcat (the Debian package)", pytrace=False)
    command = [kcat, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-J"]
    result = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
    if result.returncode != 0 and b"Broker transport failure" in result.stderr:  # see the module docstring
        env = _newer_librdkafka(workdir)
        result = subprocess.run(command, capture_output=True, timeout=timeout, check=False, env=env)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    records = [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]
    assert len(records) >= expect, (len(records), result.stderr.decode(errors="replace"))
    return records


def test_kcat_reads_the_change_and_dead_letter_topics_as_plain_json(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    p = make_pipeline()
    p.start("connector")
    p.start("worker")
    p.sql(
        f"INSERT INTO {p.database}.assets VALUES (1, 'text', 'caf\u00e9', x'00ff', UTC_TIMESTAMP(6)), "
        "(2, 'image', 'png', NULL, UTC_TIMESTAMP(6))"
    )
    p.sql(f"UPDATE {p.database}.assets SET content = 'changed' WHERE id = 1")
    p.sql(f"DELETE FROM {p.database}.assets WHERE id = 2")
    producer = Producer({"bootstrap.servers": p.kafka})
    producer.produce(p.change_topic, key=b"junk", value=b"\x00 not json")
    assert producer.flush(10) == 0
    p.wait_consistent()
    p.wait(lambda: (p.stats() or {}).get("events", {}).get("dead_lettered", 0) >= 1, 30, "the dead letter")

    changes = [r for r in _kcat(p.kafka, p.change_topic, p.workdir, expect=5) if r.get("key") != "junk"]
    ops = []
    for record in changes:
        payload = record["payload"]
        document = json.loads(payload)  # plain JSON text, readable by any tool
        event = decode(payload.encode())
        assert isinstance(event, ChangeEvent) and document["op"] == event.op
        assert record["key"] == message_key(p.database, "assets", event.key).decode()
        ops.append((event.op, event.key["id"]))
    assert sorted(ops) == [("c", 1), ("c", 2), ("d", 2), ("u", 1)]
    assert any("caf\u00e9" in r["payload"] for r in changes), "UTF-8 text as it is, not escaped bytes"

    (letter,) = _kcat(p.kafka, p.dead_letter_topic, p.workdir, expect=1)
    dead = DeadLetter.model_validate_json(letter["payload"])
    assert dead.stage == "decode" and dead.reason and dead.topic == p.change_topic
