-- A state file as testbed wrote it at schema version 1 (before PRAGMA user_version was used).
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS testbeds (
  name TEXT PRIMARY KEY, provider TEXT NOT NULL, spec_path TEXT, status TEXT NOT NULL,
  created REAL NOT NULL, updated REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS hosts (
  testbed TEXT NOT NULL REFERENCES testbeds(name) ON DELETE CASCADE, name TEXT NOT NULL,
  address TEXT NOT NULL, port INTEGER NOT NULL, user TEXT NOT NULL, key TEXT, groups TEXT NOT NULL,
  facts TEXT NOT NULL, proxy_jump TEXT, state TEXT NOT NULL, position INTEGER NOT NULL,
  PRIMARY KEY (testbed, name));
CREATE TABLE IF NOT EXISTS resources (
  testbed TEXT NOT NULL, kind TEXT NOT NULL, id TEXT NOT NULL, info TEXT NOT NULL DEFAULT '{}',
  created REAL NOT NULL, PRIMARY KEY (testbed, kind, id));
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, suite TEXT NOT NULL, testbed TEXT NOT NULL, params TEXT NOT NULL,
  status TEXT NOT NULL, campaign TEXT, created REAL NOT NULL, started REAL, ended REAL,
  reason TEXT, info TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS run_hosts (
  run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, host TEXT NOT NULL, rank INTEGER NOT NULL,
  status TEXT NOT NULL, exit_code INTEGER, reason TEXT, started REAL, ended REAL,
  PRIMARY KEY (run_id, host, rank));
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, ts REAL NOT NULL, kind TEXT NOT NULL,
  host TEXT, detail TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS campaigns (
  id TEXT PRIMARY KEY, suite TEXT NOT NULL, testbed TEXT NOT NULL, points TEXT NOT NULL,
  status TEXT NOT NULL, created REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS collected (
  run_id TEXT NOT NULL, host TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
  collected REAL NOT NULL, PRIMARY KEY (run_id, host, path));
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, seq);
CREATE INDEX IF NOT EXISTS runs_testbed ON runs(testbed, created);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO testbeds VALUES ('old', 'local', 'inventories/old.yml', 'up', 1700000000.0, 1700000000.0, '{"subnet": "10.213.7.0/24"}');
INSERT INTO hosts VALUES ('old', 'node0', '10.213.7.2', 22, 'root', NULL, '["master"]', '{}', NULL, 'up', 0);
INSERT INTO runs VALUES ('mpi-hello-20231114-221320-ab12', 'mpi-hello', 'old', '{}', 'succeeded', NULL, 1700000000.0, 1700000001.0, 1700000009.0, NULL, '{}');
INSERT INTO events(run_id, ts, kind, host, detail) VALUES ('mpi-hello-20231114-221320-ab12', 1700000001.0, 'started', NULL, '{}');
