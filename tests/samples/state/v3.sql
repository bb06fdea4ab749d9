-- A state file as testbed wrote it at schema version 3 (the version 2 sample opened and migrated by it: the
-- images table added), dumped with sqlite3's iterdump; its collected rows have no host stat of their files.
CREATE TABLE campaigns (
  id TEXT PRIMARY KEY, suite TEXT NOT NULL, testbed TEXT NOT NULL, points TEXT NOT NULL,
  status TEXT NOT NULL, created REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}');
INSERT INTO "campaigns" VALUES('fault-drill-0123abcd','fault-drill','old','[{"params": {"ranks": 2}, "run_id": "fault-drill-20250101-120000-abcd", "status": "succeeded"}, {"params": {"ranks": 3}, "run_id": null, "status": "todo"}]','running',1735732800.0,'{"faults": ["kill-rank"], "sources": {}}');
CREATE TABLE collected (
  run_id TEXT NOT NULL, host TEXT NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
  collected REAL NOT NULL, PRIMARY KEY (run_id, host, path));
INSERT INTO "collected" VALUES('fault-drill-20250101-120000-abcd','node0','rank0.out','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',120,1735732830.0);
INSERT INTO "collected" VALUES('fault-drill-20250101-120000-abcd','node1','train_log.csv','bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb',-1,1735732830.0);
CREATE TABLE events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, ts REAL NOT NULL, kind TEXT NOT NULL,
  host TEXT, detail TEXT NOT NULL DEFAULT '{}');
INSERT INTO "events" VALUES(1,'fault-drill-20250101-120000-abcd',1735732802.0,'started',NULL,'{"ranks": 2, "hosts": ["node0", "node1"], "prepare_seconds": 1.5}');
INSERT INTO "events" VALUES(2,'fault-drill-20250101-120000-abcd',1735732805.0,'fault','node1','{"fault": "kill-rank", "action": "signal", "host": "node1", "rank": 1, "signal": "SIGKILL", "ok": true, "seconds": 0.2}');
INSERT INTO "events" VALUES(3,'fault-drill-20250101-120000-abcd',1735732821.0,'ended',NULL,'{"status": "succeeded", "reason": null}');
CREATE TABLE hosts (
  testbed TEXT NOT NULL REFERENCES testbeds(name) ON DELETE CASCADE, name TEXT NOT NULL,
  address TEXT NOT NULL, port INTEGER NOT NULL, user TEXT NOT NULL, key TEXT, groups TEXT NOT NULL,
  facts TEXT NOT NULL, proxy_jump TEXT, state TEXT NOT NULL, position INTEGER NOT NULL,
  PRIMARY KEY (testbed, name));
INSERT INTO "hosts" VALUES('old','node0','10.213.7.2',22,'root',NULL,'["master"]','{"cpus": 2}',NULL,'up',0);
INSERT INTO "hosts" VALUES('old','node1','10.213.7.3',22,'root',NULL,'["workers"]','{"cpus": 2}',NULL,'up',1);
CREATE TABLE images (provider TEXT NOT NULL, id TEXT NOT NULL, key TEXT NOT NULL, plan TEXT NOT NULL, testbed TEXT NOT NULL, host TEXT NOT NULL, location TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (provider, id));
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "meta" VALUES('schema_version','3');
CREATE TABLE resources (
  testbed TEXT NOT NULL, kind TEXT NOT NULL, id TEXT NOT NULL, info TEXT NOT NULL DEFAULT '{}',
  created REAL NOT NULL, PRIMARY KEY (testbed, kind, id));
INSERT INTO "resources" VALUES('old','netns','tb-old-node0','{"veth": "tbv0"}',1.79537760223189115519e+09);
CREATE TABLE run_hosts (
  run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, host TEXT NOT NULL, rank INTEGER NOT NULL,
  status TEXT NOT NULL, exit_code INTEGER, reason TEXT, started REAL, ended REAL,
  PRIMARY KEY (run_id, host, rank));
INSERT INTO "run_hosts" VALUES('fault-drill-20250101-120000-abcd','node0',0,'succeeded',0,'exit 0',1735732809.0,1735732820.0);
INSERT INTO "run_hosts" VALUES('fault-drill-20250101-120000-abcd','node1',1,'succeeded',0,'exit 0',1735732809.0,1735732820.0);
CREATE TABLE runs (
  id TEXT PRIMARY KEY, suite TEXT NOT NULL, testbed TEXT NOT NULL, params TEXT NOT NULL,
  status TEXT NOT NULL, campaign TEXT, created REAL NOT NULL, started REAL, ended REAL,
  reason TEXT, info TEXT NOT NULL DEFAULT '{}');
INSERT INTO "runs" VALUES('fault-drill-20250101-120000-abcd','fault-drill','old','{"ranks": 2, "epochs": 3, "steps_per_epoch": 8, "step_seconds": 0.1, "ckpt_every": 4, "kill_step": 10, "timeout": 8, "port": 29511, "python": "~/tb-venv/bin/python"}','succeeded','fault-drill-0123abcd',1735732800.0,1735732802.0,1735732821.0,NULL,'{"outputs": {"node0": ["train_log.csv", "ckpt.pt", "rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end"], "node1": ["train_log.csv", "ckpt.pt", "rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end"]}, "run_dir": "~/.testbed-runs/fault-drill-20250101-120000-abcd", "hosts": ["node0", "node1"], "faults": ["kill-rank"], "world_size": 2, "plan": "/home/alice/.testbed/runs/fault-drill-20250101-120000-abcd/plan.json", "attempt": 1, "fired": ["kill-rank"], "recovered": ["kill-rank"], "sources": {}, "supervisor": {"pid": 4242, "started": 1735732800.1}, "launched_at": 1735732809.0, "ranks": [{"rank": 0, "host": "node0", "address": "10.213.0.2", "attempt": 1, "command": "~/tb-venv/bin/python fault_drill.py --rank 0 --world-size 2 --master-addr 10.213.0.2 --port 29512 --epochs 3 --steps-per-epoch 8 --step-seconds 0.1 --ckpt-every 4 --timeout 8 --attempt 1 --from_checkpoint", "env": {}, "cwd": null, "environment": null}, {"rank": 1, "host": "node1", "address": "10.213.0.3", "attempt": 1, "command": "~/tb-venv/bin/python fault_drill.py --rank 1 --world-size 2 --master-addr 10.213.0.2 --port 29512 --epochs 3 --steps-per-epoch 8 --step-seconds 0.1 --ckpt-every 4 --timeout 8 --attempt 1 --from_checkpoint", "env": {}, "cwd": null, "environment": null}]}');
CREATE TABLE testbeds (
  name TEXT PRIMARY KEY, provider TEXT NOT NULL, spec_path TEXT, status TEXT NOT NULL,
  created REAL NOT NULL, updated REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}');
INSERT INTO "testbeds" VALUES('old','local','inventories/old.yml','up',1.79537760221301913258e+09,1.79537760221301913258e+09,'{"subnet": "10.213.7.0/24"}');
CREATE INDEX events_run ON events(run_id, seq);
CREATE INDEX runs_testbed ON runs(testbed, created);
CREATE INDEX runs_campaign ON runs(campaign, created);
CREATE INDEX images_key ON images(key);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('events',3);
PRAGMA user_version=3;
