"""librdkafka's own log lines, routed to Python logging at DEBUG.

While a broker is away librdkafka repeats "Connect to ... failed" every second; freshkey says so itself,
once per attempt, with what it does next. Every librdkafka client of the connectors (the producer, the
admin clients) gets :data:`LIBRDKAFKA_LOGGER` as its ``logger``.
"""

from __future__ import annotations

import logging


class QuietLibrdkafka(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter that writes every line at DEBUG, whatever level librdkafka gave it."""

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        super().log(logging.DEBUG, msg, *args, **kwargs)  # type: ignore[arg-type]


LIBRDKAFKA_LOGGER = QuietLibrdkafka(logging.getLogger("connectors.librdkafka"), {})
"""Passed as ``logger`` to every librdkafka client of the connectors (a duck-typed ``log`` method)."""
