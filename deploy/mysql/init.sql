-- Runs once, on the first start of the mysql service (empty data volume), from
-- /docker-entrypoint-initdb.d. The image has already created the `freshkey` user from MYSQL_USER /
-- MYSQL_PASSWORD (the same FRESHKEY_MYSQL_PASSWORD the connector uses), so CREATE USER IF NOT EXISTS
-- is a no-op there; it only matters when this file is run by hand against another server (then
-- change the password and set FRESHKEY_MYSQL_PASSWORD to match).

CREATE USER IF NOT EXISTS 'freshkey'@'%' IDENTIFIED BY 'freshkey';

-- What `freshkey doctor` checks for: read the binlog as a replica, read rows for the verifier.
GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'freshkey'@'%';

-- The sample multimodal table (same schema as pipeline/demo/run.py SCHEMA).
CREATE DATABASE IF NOT EXISTS freshkey_demo;

CREATE TABLE IF NOT EXISTS freshkey_demo.assets (
  id INT PRIMARY KEY,
  modality VARCHAR(16) NOT NULL,
  content TEXT NOT NULL,
  embedding BLOB,
  updated_at DATETIME(6) NOT NULL
);

-- The heartbeat table (connectors/heartbeat.py: FRESHKEY_HEARTBEAT_DATABASE/_TABLE default to
-- freshkey.heartbeat; same schema as pipeline/demo/run.py SCHEMA). The heartbeat service writes it as
-- the freshkey user, which may create it and replace its rows (REPLACE needs INSERT and DELETE) in
-- this one database, nothing more.
CREATE DATABASE IF NOT EXISTS freshkey;

CREATE TABLE IF NOT EXISTS freshkey.heartbeat (
  id INT PRIMARY KEY,
  beat_at DATETIME(6) NOT NULL
);

GRANT CREATE, INSERT, DELETE ON freshkey.* TO 'freshkey'@'%';

-- The signal table of snapshots (FRESHKEY_CONNECTOR_SIGNAL_TABLE, default freshkey.signal): the connector
-- creates it and writes requests, watermarks and progress there, and `freshkey snapshot` updates it;
-- with the grants above that makes CREATE, SELECT, INSERT, UPDATE, DELETE on this database.
GRANT UPDATE ON freshkey.* TO 'freshkey'@'%';
