"""Session-wide real services for the integration tests.

Each service is a private instance started here on a free local port (pipeline.embedded), or an
external one named by an environment variable, so that the same suite runs against the docker compose
stack (Apache Kafka, MySQL 8, Redis):

- ``FRESHKEY_TEST_MYSQL_DSN``  e.g. ``mysql://root:secret@127.0.0.1:3306`` (an account that may create
  databases and read the binlog; the connector uses it too);
- ``FRESHKEY_TEST_KAFKA``      e.g. ``127.0.0.1:9092``;
- ``FRESHKEY_TEST_REDIS``      e.g. ``redis://127.0.0.1:6379/0``;
- ``FRESHKEY_TEST_REDIS_CLUSTER`` e.g. ``127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002`` (seeds of a Redis
  Cluster; the tests move a slot between its masters).

A missing binary fails the tests that need it with the install command; it never turns into a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import pymysql
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode

from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis, MissingBinaryError, ServiceStartError
from tests.support.redis_cluster import LocalRedisCluster


@dataclass(frozen=True)
class MySQLService:
    host: str
    port: int
    admin_user: str
    admin_password: str
    user: str
    password: str

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.admin_user,
            password=self.admin_password,
            database=database,
            autocommit=True,
        )


def _start(service: LocalMariaDB | LocalRedis | LocalKafka) -> None:
    try:
        service.start()
    except (MissingBinaryError, ServiceStartError) as exc:
        pytest.fail(f"cannot start {type(service).__name__}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def mysql_service() -> Iterator[MySQLService]:
    dsn = os.environ.get("FRESHKEY_TEST_MYSQL_DSN")
    if dsn:
        url = urlparse(dsn)
        user, password = unquote(url.username or "root"), unquote(url.password or "")
        yield MySQLService(url.hostname or "127.0.0.1", url.port or 3306, user, password, user, password)
        return
    server = LocalMariaDB()
    _start(server)
    try:
        yield MySQLService(
            server.host, server.port, server.admin_user, server.admin_password, server.user, server.password
        )
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("FRESHKEY_TEST_REDIS")
    if external:
        yield external
        return
    server = LocalRedis()
    _start(server)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("FRESHKEY_TEST_KAFKA")
    if external:
        yield external
        return
    server = LocalKafka()
    _start(server)
    try:
        yield server.bootstrap
    finally:
        server.stop()


# --- Redis Cluster ---------------------------------------------------------------------------------------


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


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterService]:
    external = os.environ.get("FRESHKEY_TEST_REDIS_CLUSTER")
    if external:
        yield RedisClusterService(tuple(s.strip() for s in external.split(",") if s.strip()))
        return
    server = LocalRedisCluster(masters=3)
    try:
        server.start()
    except (MissingBinaryError, ServiceStartError) as exc:
        pytest.fail(f"cannot start LocalRedisCluster: {exc}", pytrace=False)
    try:
        yield RedisClusterService(tuple(server.nodes), server)
    finally:
        server.stop()
