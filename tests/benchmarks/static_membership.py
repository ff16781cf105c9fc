"""What a restart of one group member costs the others, with and without static membership.

Two aiokafka consumers (A and B, one group, 4 partitions, session timeout 6 s, heartbeat 1 s) on a private
Tansu broker (:class:`pipeline.embedded.kafka.LocalKafka`). Once both hold their partitions, B stops and a
new B starts ``--down`` seconds later; the figure is how long A held none of its partitions (from the
revocation that the restart causes to the next assignment). With ``group.instance.id`` set (static
membership, KIP-345) a restart within the session timeout should cost A nothing on a broker that honours
it; aiokafka then sends no LeaveGroup when B stops::

    .venv/bin/python -m tests.benchmarks.static_membership --down 1

Measured here (Tansu 0.6, the README's "What a rebalance costs"): A paused 3.0 s without instance ids and
14.1 s with them, so freshkey does not offer static membership.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.embedded.kafka import LocalKafka

TOPIC = "static-membership"


class Holding(ConsumerRebalanceListener):
    """When the consumer last lost and last got its partitions (monotonic seconds)."""

    def __init__(self) -> None:
        self.revoked_at: float | None = None
        self.assigned_at: float | None = None

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if revoked:
            self.revoked_at = time.monotonic()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.assigned_at = time.monotonic()


async def _member(bootstrap: str, group: str, instance: str | None, holding: Holding) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        group_instance_id=instance,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        rebalance_timeout_ms=10000,
        enable_auto_commit=False,
    )
    consumer.subscribe([TOPIC], listener=holding)
    await consumer.start()
    return consumer


async def _poll(consumer: AIOKafkaConsumer, until: float) -> None:
    while time.monotonic() < until:
        await consumer.getmany(timeout_ms=200)


async def restart_pause(bootstrap: str, *, static: bool, down_s: float, settle_s: float = 15.0) -> float:
    """Seconds A held no partition because B restarted (B down for ``down_s``)."""
    group = f"g-{'static' if static else 'dynamic'}-{time.monotonic_ns()}"
    a_holding, b_holding = Holding(), Holding()
    a = await _member(bootstrap, group, "a" if static else None, a_holding)
    b = await _member(bootstrap, group, "b" if static else None, b_holding)
    polling_a = asyncio.create_task(_poll(a, time.monotonic() + 2 * settle_s + down_s))
    await _poll(b, time.monotonic() + settle_s)  # both joined and assigned
    before = a_holding.revoked_at
    await b.stop()
    await asyncio.sleep(down_s)
    b2 = await _member(bootstrap, group, "b" if static else None, Holding())
    await _poll(b2, time.monotonic() + settle_s)
    await polling_a
    await b2.stop()
    await a.stop()
    revoked, assigned = a_holding.revoked_at, a_holding.assigned_at
    if revoked is None or revoked == before:
        return 0.0  # A never lost its partitions
    if assigned is None or assigned < revoked:
        raise RuntimeError(f"A did not get its partitions back within {settle_s} s of B's return")
    return assigned - revoked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--down", type=float, default=1.0, help="seconds B stays away (default 1)")
    args = parser.parse_args()
    with LocalKafka() as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 4, 1)]).values():
            future.result()
        for static in (False, True):
            pause = asyncio.run(restart_pause(kafka.bootstrap, static=static, down_s=args.down))
            label = "with group.instance.id (static)" if static else "without (dynamic)"
            print(
                f"{label:32} A held no partition for {pause:.2f} s while B restarted ({args.down:g} s down)"
            )


if __name__ == "__main__":
    main()
