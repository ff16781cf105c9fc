"""The binlog side of the connector.

- :mod:`connectors.binlog.translate`: pure functions, rows and query events -> change, DDL and dead-letter
  events (value mapping, versions, primary-key changes, DDL matching of bound tables);
- :mod:`connectors.binlog.source`: the reader (the replication stream, column types, boundaries, ticks);
- :mod:`connectors.binlog.positions`: binlog positions on the server and the gap errors.
"""
