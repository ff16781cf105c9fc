"""pymysql connections to the source database: pymysql's, except the SSL context of its default TLS mode.

In its default mode (``preferred``: TLS when the server offers it, no certificate verified) pymysql
builds a new SSL context for every connection with ``ssl.create_default_context()``, which loads the
system's CA certificates: 21-29 ms of CPU here, for a context that then verifies nothing. freshkey
opens a connection per read of a table's columns, per prewarm or cutover batch (``read_rows``), per
check of ``freshkey doctor`` and several per connector session. :class:`Connection` builds that context
once per process, the same way, and every connection in that mode shares it (an ``SSLContext`` is safe
to share between connections and threads, and pymysql never changes it after making it). Every other
mode (a context of :meth:`~connectors.settings.MySQLSettings.ssl_kwargs`, TLS disabled) is pymysql's own.
Open every connection as ``Connection(**kwargs)`` (what ``pymysql.connect`` does with its own class).
"""

from __future__ import annotations

import ssl
from typing import Any, ClassVar

import pymysql.connections


class Connection(pymysql.connections.Connection):
    """pymysql's connection, with one SSL context per process for the ``preferred`` TLS mode."""

    _preferred: ClassVar[ssl.SSLContext | None] = None

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if isinstance(sslp, dict) and not sslp:  # the preferred mode: pymysql asks with no options
            context = Connection._preferred
            if context is None:  # two threads may both make one: harmless, one stays
                context = Connection._preferred = super()._create_ssl_ctx(sslp)
            return context
        made: ssl.SSLContext = super()._create_ssl_ctx(sslp)
        return made
