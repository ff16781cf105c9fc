"""The real services of the integration tests, as the tests see them: addresses, accounts, private copies.

The session's services are fixtures in tests/conftest.py; a test that needs its own copy (to restart it,
to break it) starts one with :func:`running`, which fails the test with the install command when a binary
is missing (never a skip) and stops the server afterwards. :class:`RestartableRedis` is a private Redis
that comes back on the same port, empty, as after a crash.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import pymysql
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from connectors.mysql import Connection
from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, MissingBinaryError, ServiceStartError
from tests.support.redis_cluster import LocalRedisCluster

Server = TypeVar("Server", LocalMariaDB, LocalRedis, LocalKafka, LocalRedisCluster)


@dataclass(frozen=True)
class MySQLService:
    """A MySQL/MariaDB server with binlog on: an admin account and the connector's account."""

    host: str
    port: int
    admin_user: str
    admin_password: str
    user: str
    password: str

    @classmethod
    def of(cls, server: LocalMariaDB) -> MySQLService:
        """The accounts of a private :class:`LocalMariaDB`."""
        return cls(
            server.host, server.port, server.admin_user, server.admin_password, server.user, server.password
        )

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        """An autocommit connection with the admin account."""
        return Connection(
            host=self.host,
            port=self.port,
            user=self.admin_user,
            password=self.admin_password,
            database=database,
            autocommit=True,
        )


@dataclass
class RedisClusterService:
    """A Redis Cluster for the tests: ``FRESHKEY_TEST_REDIS_CLUSTER`` (comma-separated ``host:port`` seeds,
    e.g. ``127.0.0.1:7000,127.0.0.1:7001``) or a private LocalRedisCluster of 3 masters.

    ``url`` and ``FRESHKEY_REDIS_CLUSTER=true`` are what freshkey's settings take; ``local`` is the
    private cluster (None for an external one), which can grow (``add_node``).
    """

    seeds: tuple[str, ...]
    local: LocalRedisCluster | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.seeds[0]}/0"

    def client(self) -> aioredis.RedisCluster:
        """A new asyncio cluster client (the caller closes it)."""
        nodes = [ClusterNode(host, int(port)) for host, port in (s.rsplit(":", 1) for s in self.seeds)]
        return aioredis.RedisCluster(startup_nodes=nodes, decode_responses=False)


def start_private(server: Server) -> Server:
    """Start ``server``; a missing binary or a server that does not come up fails the test with the
    reason (the install command, the server's log)."""
    try:
        server.start()
    except (MissingBinaryError, ServiceStartError) as exc:
        pytest.fail(f"cannot start {type(server).__name__}: {exc}", pytrace=False)
    return server


@contextmanager
def running(server: Server) -> Iterator[Server]:
    """``server`` started (:func:`start_private`) for the ``with`` block, stopped after it."""
    start_private(server)
    try:
        yield server
    finally:
        server.stop()


class RestartableRedis:
    """A private Redis that can be stopped and started again on the same port (it comes back empty)."""

    def __init__(self) -> None:
        self.server = LocalRedis().start()
        self.url = self.server.url

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = LocalRedis(port=self.server.port).start()
        assert self.server.url == self.url
