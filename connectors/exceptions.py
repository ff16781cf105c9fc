"""Errors of the edges, under one root."""

from __future__ import annotations


class ConnectorError(Exception):
    """Root of every error raised by ``connectors``."""


class ConfigurationError(ConnectorError):
    """The source server or the settings are not usable; the message says exactly what to change."""


class DeliveryError(ConnectorError):
    """Kafka refused or timed out an event for good; the checkpoint stays before it."""


class UnsupportedBinlogError(ConnectorError):
    """The binlog holds something freshkey cannot decode (e.g. compressed events)."""
