"""The Kafka side of the connector.

- :mod:`connectors.kafka.producer`: the idempotent producer and the message size limit;
- :mod:`connectors.kafka.topics`: explicit topic creation and end offsets;
- :mod:`connectors.kafka.librdkafka`: librdkafka's own log lines, routed to logging.
"""
