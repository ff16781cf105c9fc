"""Private MariaDB (with a binlog), Redis and Kafka-protocol broker instances on free local ports.

What ``freshkey demo`` runs the whole flow on, and what the integration tests start when no external
service is named. Each instance lives in its own directory, is stopped with its owner (or its process),
and says what to install when a binary is missing.
"""

from pipeline.embedded.kafka import LocalKafka
from pipeline.embedded.mariadb import LocalMariaDB
from pipeline.embedded.process import (
    HOST,
    LocalService,
    MissingBinaryError,
    ServiceStartError,
    free_port,
    preexec_die_with_parent,
)
from pipeline.embedded.redis import LocalRedis

__all__ = [
    "HOST",
    "LocalKafka",
    "LocalMariaDB",
    "LocalRedis",
    "LocalService",
    "MissingBinaryError",
    "ServiceStartError",
    "free_port",
    "preexec_die_with_parent",
]
