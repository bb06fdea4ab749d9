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
INSERT INTO resources VALUES ('old', 'netns', 'tb-old-node0', '{"veth": "tbv0"}', 1700000000.0);
INSERT INTO runs VALUES ('fault-drill-20231114-221500-cd34', 'fault-drill', 'old', '{"ranks": 1}', 'failed', 'fault-drill-0123abcd', 1700000100.0, 1700000101.0, 1700000120.0, 'node0 rank 0: signal 9 (SIGKILL)', '{"outputs": {"node0": ["rank*.out"]}, "run_dir": "~/.testbed-runs/fault-drill-20231114-221500-cd34", "hosts": ["node0"], "faults": ["kill-rank"], "world_size": 1, "plan": "/root/.testbed/runs/fault-drill-20231114-221500-cd34/plan.json", "attempt": 0, "fired": ["kill-rank"], "recovered": [], "sources": {}, "supervisor": {"pid": 4242, "started": 1700000100.5}, "launched_at": 1700000101.0, "ranks": [{"rank": 0, "host": "node0", "address": "10.213.7.2", "attempt": 0, "command": "python3 fault_drill.py --rank 0", "env": {}, "cwd": null, "environment": null}]}');
INSERT INTO run_hosts VALUES ('fault-drill-20231114-221500-cd34', 'node0', 0, 'failed', 137, 'signal 9 (SIGKILL)', 1700000101.0, 1700000110.0);
INSERT INTO events(run_id, ts, kind, host, detail) VALUES ('fault-drill-20231114-221500-cd34', 1700000110.0, 'fault', 'node0', '{"fault": "kill-rank", "action": "signal", "host": "node0", "rank": 0, "signal": "SIGKILL", "ok": true}');
INSERT INTO campaigns VALUES ('fault-drill-0123abcd', 'fault-drill', 'old', '[{"params": {"ranks": 1}, "run_id": "fault-drill-20231114-221500-cd34", "status": "failed"}]', 'done', 1700000100.0, '{"faults": ["kill-rank"], "sources": {}}');
INSERT INTO collected VALUES ('fault-drill-20231114-221500-cd34', 'node0', 'rank0.out', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 120, 1700000130.0);
