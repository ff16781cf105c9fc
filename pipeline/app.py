"""The worker's Faust app: wiring only. What each part does is in its own module.

- ``pipeline.processor``: a batch of change messages -> planned cache actions -> every tier;
- ``pipeline.agents.changes``: the change agent (offsets acknowledged after every tier answered);
- ``pipeline.agents.models`` / ``.hotness``: model updates, hit counts and cutovers (``pipeline.cutover``);
- ``pipeline.agents.sla``: SLA evaluation and consumer progress;
- ``pipeline.tiers``: the cache tiers, their fencing and recovery; ``pipeline.dead_letters``;
- ``pipeline.web``: the dashboard and the JSON routes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping

import faust
import pymysql

from cache_writer.retry import RetryPolicy
from connectors.database import column_types, primary_key, table_columns
from connectors.kafka.security import aiokafka_options, librdkafka_config
from connectors.kafka.settings import KafkaSettings
from connectors.kafka.topics import topic_names
from connectors.settings import MySQLSettings
from pipeline.agents import broker_topics, changes, debezium_topics, hotness, models, sla
from pipeline.config import AllSettings, SettingsError, debezium_options
from pipeline.context import SignatureLog, Worker
from pipeline.cutover import Cutovers
from pipeline.dead_letters import DeadLetterWriter
from pipeline.faust_app import FreshkeyApp
from pipeline.loaders import Loaders
from pipeline.models import ModelRegistry
from pipeline.observe.broker import BrokerOffsets
from pipeline.observe.otel import OtelObserver, configure_telemetry
from pipeline.observe.progress import ConsumerProgress
from pipeline.observe.sla import SlaEvaluator
from pipeline.processor import ChangeProcessor, Decoder
from pipeline.tiers import Tiers
from pipeline.web import install_dashboard
from pipeline.web.api import install_api
from pipeline.web.auth import auth_middleware
from pipeline.web.settings import web_settings
from schemas import Binding, Bindings, Change, DdlEvent, FenceEvent
from schemas.debezium import DebeziumOptions, Skip, decode_any
from schemas.values import ColumnType

log = logging.getLogger(__name__)


def debezium_topic_names(options: DebeziumOptions, kafka: KafkaSettings) -> list[str]:
    """The Debezium topics the worker subscribes to: the names given, or the topics matching the pattern
    now (faust-streaming's Kafka driver cannot subscribe to a pattern: a topic created later, for a table
    added later, makes the worker restart to read it: ``pipeline.agents.debezium_topics``)."""
    if options.topics.pattern is None:
        return list(options.topics.names)
    names = [t for t in topic_names(kafka) if options.topics.matches(t)]
    if not names:
        raise SettingsError(
            f"no topic matches FRESHKEY_KAFKA_DEBEZIUM_TOPICS=regex:{options.topics.pattern} on "
            f"{kafka.bootstrap}; check the pattern, or start the worker once Debezium created its topics"
        )
    log.info("reading the Debezium topics %s", ", ".join(names))
    return names


def faust_credentials(kafka: KafkaSettings) -> faust.types.auth.CredentialsT | None:
    """FRESHKEY_KAFKA_SECURITY_PROTOCOL and its settings as Faust's ``broker_credentials``, which Faust
    hands its aiokafka consumer and producer (the mapping itself: connectors.kafka.security)."""
    options = aiokafka_options(kafka)
    context = options.get("ssl_context")
    if kafka.security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(
            username=options["sasl_plain_username"],
            password=options["sasl_plain_password"],
            mechanism=options["sasl_mechanism"],
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def input_decoder(options: DebeziumOptions, mysql: MySQLSettings) -> Decoder:
    """The processor's decoder for ``FRESHKEY_WORKER_INPUT``. Debezium messages without a schema are
    decoded with the table's column types, read from the database once per table (again after a DDL of
    its database); a table that cannot be read leaves those messages to be dead-lettered with the reason.
    """
    types: dict[tuple[str, str], Mapping[str, ColumnType] | None] = {}

    def column_types_of(database: str, table: str) -> Mapping[str, ColumnType] | None:
        if (database, table) not in types:
            try:
                types[(database, table)] = column_types(mysql, database, table) or None
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
                log.warning("column types of %s.%s not read (%r)", database, table, exc)
                return None
        return types[(database, table)]

    def decoder(topic: str, key: bytes | None, value: bytes | None) -> Change | DdlEvent | FenceEvent | Skip:
        event = decode_any(topic, key, value, options, column_types=column_types_of)
        if isinstance(event, DdlEvent):
            for known in [k for k in types if k[0] == event.source.db]:
                del types[known]
        return event

    return decoder


def create_app(settings: AllSettings, bindings: Bindings) -> Worker:
    """The worker: its Faust app with every agent, timer and page installed. Installs the OpenTelemetry
    SDK (this is the worker's entry point)."""
    worker, kafka, redis = settings.worker, settings.kafka, settings.redis
    web = web_settings(settings)
    web_token = web.web_token.get_secret_value() if web.web_token else None
    app = FreshkeyApp(
        worker.app_id,
        fetch_max_wait_ms=worker.fetch_max_wait_ms,
        fetch_min_bytes=worker.fetch_min_bytes,
        broker=f"kafka://{kafka.bootstrap}",
        broker_credentials=faust_credentials(kafka),
        value_serializer="raw",
        key_serializer="raw",
        datadir=str(worker.data_dir),
        web_bind=worker.web_bind,
        web_port=worker.web_port,
        web_host=worker.web_bind,
        # Every route but the health check needs FRESHKEY_WORKER_WEB_TOKEN when it is set; Faust's own
        # pages (table contents, topology, internals) only with FRESHKEY_WORKER_FAUST_PAGES=true.
        web_application_options={"middlewares": [auth_middleware(web_token)]},
        web_router_enabled=web.faust_pages,
        web_tables_enabled=web.faust_pages,
        web_stats_enabled=web.faust_pages,
        web_graph_enabled=web.faust_pages,
        web_metrics_enabled=web.faust_pages,
        consumer_auto_offset_reset="earliest",
        # A worker that joined while its change topic was missing (a broker that lost its data) subscribes
        # to it at its next metadata refresh once the connector recreated it: 5 s, not aiokafka's 5 min.
        consumer_metadata_max_age_ms=broker_topics.METADATA_MAX_AGE_MS,
        broker_commit_interval=worker.commit_interval_s,
        broker_session_timeout=worker.session_timeout_s,
        broker_heartbeat_interval=max(worker.session_timeout_s / 5, 0.5),
        broker_rebalance_timeout=max(worker.session_timeout_s, 10.0),
        topic_disable_leader=True,
        topic_partitions=kafka.partitions,
        producer_acks=-1,
        producer_max_request_size=kafka.max_message_bytes,
        consumer_max_fetch_size=kafka.max_fetch_bytes,
        # A stopping or rebalancing worker does not wait for its unacknowledged batch: it is replayed.
        stream_wait_empty=False,
    )
    options = debezium_options(settings)
    if options.input == "debezium":
        input_topic = app.topic(*debezium_topic_names(options, kafka), internal=False)
    else:
        input_topic = app.topic(kafka.change_topic, partitions=kafka.partitions, internal=False)
    topics = {
        "changes": input_topic,
        "dead_letters": app.topic(kafka.dead_letter_topic, internal=False),
        "model_updates": app.topic(kafka.model_update_topic, internal=False),
        "hotness": app.topic(kafka.hotness_topic, partitions=kafka.partitions, internal=False),
        "violations": app.topic(settings.sla.violations_topic, internal=False),
    }
    if any(b.semantic is not None for b in bindings.bindings):
        import cache_writer.semantic.keys  # noqa: F401  torch now, not in the first batch

    registry = ModelRegistry(
        bindings, prefix=redis.key_prefix, device=worker.device, weights_dir=settings.model.weights_dir
    )
    fence_after_s = (
        worker.fence_after_s if worker.fence_after_s is not None else settings.sla.window_ms / 1000
    )
    policy = RetryPolicy(fence_after_s=fence_after_s)
    processor = ChangeProcessor(
        bindings,
        [],
        key_prefix=redis.key_prefix,
        models=registry,
        policy=policy,
        decoder=input_decoder(options, settings.mysql),
    )

    async def columns_of(binding: Binding) -> tuple[str, ...]:
        return await asyncio.to_thread(table_columns, settings.mysql, binding.database, binding.table_name)

    async def key_columns_of(binding: Binding) -> tuple[str, ...]:
        if binding.key_columns is not None:
            return binding.key_columns
        return await asyncio.to_thread(primary_key, settings.mysql, binding.database, binding.table_name)

    cutovers = Cutovers(
        bindings,
        registry,
        prefix=redis.key_prefix,
        settings=settings.model,
        columns_of=columns_of,
        key_columns_of=key_columns_of,
        loaders=Loaders(settings.mysql),
    )

    configure_telemetry(settings.telemetry, service="worker")
    broker_topics.forbid_topic_auto_creation()
    progress = ConsumerProgress(
        kafka.change_topic,
        partitions=kafka.partitions,
        window_ms=settings.sla.window_ms,
        refresh_interval_s=settings.telemetry.consumer_lag_interval_s,
    )
    heartbeat = bindings.for_table(settings.heartbeat.database, settings.heartbeat.table)
    evaluator = SlaEvaluator(
        settings.sla,
        progress=progress,
        worker=f"{socket.gethostname()}:{worker.web_port}",
        heartbeat_namespace=heartbeat.namespace if heartbeat else None,
        heartbeat_interval_ms=settings.heartbeat.interval_ms,
    )
    otel = OtelObserver(trace_sample_every=settings.telemetry.trace_sample_every)
    otel.watch_sla(lambda: evaluator.state)
    otel.watch_progress(progress)
    for observer in (progress, evaluator, otel):
        processor.observers.add(observer)

    signature_log = SignatureLog()
    w = Worker(
        settings=settings,
        bindings=bindings,
        app=app,
        topics=topics,
        processor=processor,
        registry=registry,
        cutovers=cutovers,
        tiers=Tiers(
            settings,
            bindings.bindings,
            processor,
            cutovers,
            spawn=app.add_future,
            on_fence=lambda namespace, cause: signature_log.add(namespace, cause),
        ),
        dead_letters=DeadLetterWriter(topics["dead_letters"], kafka, policy, processor.observers),
        sla=evaluator,
        otel=otel,
        progress=progress,
        broker_offsets=BrokerOffsets(
            kafka.bootstrap, group_id=worker.app_id, topic=kafka.change_topic, config=librdkafka_config(kafka)
        ),
        signature_log=signature_log,
    )

    @app.task
    async def connect_tiers() -> None:
        await w.tiers.connect()

    @app.task
    async def watch_l2_incarnation() -> None:
        await w.tiers.watch_incarnation()

    changes.install(w)
    models.install(w)
    hotness.install(w)
    sla.install(w)
    debezium_topics.install(w)
    broker_topics.install(w)
    install_api(w)
    install_dashboard(app, processor, progress=progress)
    return w
