"""The binlog side of the connector.

- :mod:`connectors.binlog.translate`: pure functions, rows events -> change and dead-letter events (value
  mapping, versions, primary-key changes);
- :mod:`connectors.binlog.ddl`: pure functions, query events -> transaction boundaries and DDL events
  (which bound tables a statement names);
- :mod:`connectors.binlog.source`: the reader (the replication stream, column types, boundaries, ticks);
- :mod:`connectors.binlog.positions`: binlog positions on the server and the gap errors.
"""
