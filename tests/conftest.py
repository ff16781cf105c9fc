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
from urllib.parse import unquote, urlparse

import pytest

from pipeline.embedded import LocalKafka, LocalMariaDB, LocalRedis
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.services import MySQLService, RedisClusterService, running

__all__ = ["MySQLService", "RedisClusterService"]  # where the tests used to import them from


@pytest.fixture(scope="session")
def mysql_service() -> Iterator[MySQLService]:
    dsn = os.environ.get("FRESHKEY_TEST_MYSQL_DSN")
    if dsn:
        url = urlparse(dsn)
        user, password = unquote(url.username or "root"), unquote(url.password or "")
        yield MySQLService(url.hostname or "127.0.0.1", url.port or 3306, user, password, user, password)
        return
    with running(LocalMariaDB()) as server:
        yield MySQLService.of(server)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("FRESHKEY_TEST_REDIS")
    if external:
        yield external
        return
    with running(LocalRedis()) as server:
        yield server.url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("FRESHKEY_TEST_KAFKA")
    if external:
        yield external
        return
    with running(LocalKafka()) as server:
        yield server.bootstrap


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterService]:
    external = os.environ.get("FRESHKEY_TEST_REDIS_CLUSTER")
    if external:
        yield RedisClusterService(tuple(s.strip() for s in external.split(",") if s.strip()))
        return
    with running(LocalRedisCluster(masters=3)) as server:
        yield RedisClusterService(tuple(server.nodes), server)
