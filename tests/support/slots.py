"""Moving a Redis Cluster slot by hand, as ``redis-cli --cluster reshard`` does, for the cluster tests.

:class:`Migration` sends the same commands: ``CLUSTER SETSLOT <slot> IMPORTING/MIGRATING``, ``MIGRATE ...
KEYS`` in batches, then ``CLUSTER SETSLOT <slot> NODE`` on every node. Between :meth:`Migration.begin`
and :meth:`Migration.finish` the slot is half moved: clients get ``ASK`` for keys already on the target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis


def node_admin(name: str) -> redis.Redis:
    """A plain (non-cluster) client of one node ``host:port``, for CLUSTER commands."""
    host, port = name.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=10)


@dataclass
class Migration:
    """Moves one slot from its node to another with the commands ``redis-cli --cluster reshard`` uses."""

    slot: int
    source: str
    target: str
    nodes: list[str]
    moved_keys: int = 0

    @classmethod
    def plan(cls, client: aioredis.RedisCluster, key: str, target: str | None = None) -> Migration:
        slot = client.keyslot(key)
        source = client.get_node_from_key(key)
        assert source is not None
        nodes = [node.name for node in client.get_primaries()]
        if target is None:
            target = next(name for name in nodes if name != source.name)
        return cls(slot, source.name, target, sorted({*nodes, target}))

    def source_client(self) -> aioredis.Redis:
        host, port = self.source.rsplit(":", 1)
        return aioredis.Redis(host=host, port=int(port))

    def _id(self, name: str) -> str:
        with node_admin(name) as admin:
            return str(admin.execute_command("CLUSTER", "MYID").decode())

    def begin(self) -> None:
        with node_admin(self.target) as target:
            target.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self._id(self.source))
        with node_admin(self.source) as source:
            source.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self._id(self.target))

    def move_keys(self, batch: int = 4, pause_s: float = 0.0, limit: int | None = None) -> None:
        host, port = self.target.rsplit(":", 1)
        with node_admin(self.source) as source:
            while limit is None or self.moved_keys < limit:
                size = batch if limit is None else min(batch, limit - self.moved_keys)
                keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, size)
                if not keys:
                    return
                source.execute_command("MIGRATE", host, int(port), "", 0, 5000, "KEYS", *keys)
                self.moved_keys += len(keys)
                time.sleep(pause_s)

    def finish(self) -> None:
        """Give the slot to the target: on the target first, then the source, then every other node."""
        self.move_keys()
        target_id = self._id(self.target)
        order = [self.target, self.source, *(n for n in self.nodes if n not in (self.target, self.source))]
        for name in order:
            with node_admin(name) as admin:
                admin.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)

    def owner_seen_by_every_node(self) -> set[str]:
        owners = set()
        for name in self.nodes:
            with node_admin(name) as admin:
                for first, last, master, *_ in admin.execute_command("CLUSTER", "SLOTS"):
                    if int(first) <= self.slot <= int(last):
                        owners.add(f"{master[0].decode()}:{int(master[1])}")
        return owners
