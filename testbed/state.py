"""SQLite state under the testbed home: testbeds, hosts, cloud resources, runs, events, collected files.

Every write is one transaction (``BEGIN IMMEDIATE``) so concurrent ``testbed`` processes serialise
instead of corrupting the file; WAL mode lets readers go on while one process writes.

The schema version lives in ``PRAGMA user_version``. A new file gets ``SCHEMA`` (the latest); an older one is
brought up by ``MIGRATIONS`` in one transaction; a newer one (written by a later testbed) is refused, untouched.
Version 1 files predate ``user_version`` and say so in ``meta.schema_version``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.hosts import Host

SCHEMA_VERSION = 2

SCHEMA = """
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
CREATE INDEX IF NOT EXISTS runs_campaign ON runs(campaign, created);
"""

# MIGRATIONS[v] brings a version-v file to v + 1 (statements run in one transaction with the version bump).
MIGRATIONS: dict[int, list[str]] = {
    1: ["CREATE INDEX IF NOT EXISTS runs_campaign ON runs(campaign, created)"],  # campaign reports, resume
}


def _row_to_host(r: sqlite3.Row) -> Host:
    return Host(
        name=r["name"], address=r["address"], port=r["port"], user=r["user"], key=r["key"],
        groups=json.loads(r["groups"]), facts=json.loads(r["facts"]), proxy_jump=r["proxy_jump"],
        state=r["state"],
    )


class Store:
    """The state database. Cheap to open; open one per command."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            self._create()
        # never open the file with a plain descriptor here: closing one drops every POSIX lock this process's
        # other connections hold on it (SQLite's own caveat), which shows up as "disk I/O error" elsewhere
        if self.path.stat().st_size == 0:
            raise self._damaged("empty file")
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute("PRAGMA foreign_keys=ON")
            with contextlib.suppress(sqlite3.OperationalError):  # another process is switching it right now
                self._db.execute("PRAGMA journal_mode=WAL")
            self._check_size()
            if self.schema_version != SCHEMA_VERSION:  # the usual open writes nothing
                with self.tx() as db:
                    self._migrate(db)
        except sqlite3.DatabaseError as e:
            if not any(w in str(e) for w in ("malformed", "not a database", "truncated")):
                raise
            self._db.close()
            raise self._damaged(str(e)) from None
        self.path.chmod(0o600)

    def _create(self) -> None:
        """A new state file, complete before it appears (so an empty or partial file is always damage)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.new")
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("BEGIN")
            self._migrate(db)
            db.execute("COMMIT")
        finally:
            db.close()
        tmp.chmod(0o600)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            pass  # another process made it first
        finally:
            tmp.unlink()

    def _check_size(self) -> None:
        """A file shorter than its own page count says is truncated (checked only when no WAL holds pages)."""
        if Path(f"{self.path}-wal").exists():
            return
        pages = int(self._db.execute("PRAGMA page_count").fetchone()[0])
        size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        if self.path.stat().st_size < pages * size:
            raise sqlite3.DatabaseError(f"truncated: {self.path.stat().st_size} of {pages * size} bytes")

    def _damaged(self, why: str) -> Exception:
        from testbed.errors import TestbedError

        return TestbedError(f"the state database is damaged ({why}); testbed left it as it is", where=str(self.path),
                            fix="restore it from a backup; or move it aside (mv state.db state.db.damaged) to start "
                                "empty, after which the testbeds it recorded (possibly still running and billing) "
                                "are unknown to testbed and must be released in their providers' consoles")

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Create a new file at the latest schema, or migrate an older one; refuse a newer one."""
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == 0 and "meta" in tables:  # written before user_version was used
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 1
        if version > SCHEMA_VERSION:
            from testbed.errors import TestbedError

            raise TestbedError(f"the state was written by a newer testbed (schema {version}; this one knows up "
                               f"to {SCHEMA_VERSION}); nothing was changed", where=str(self.path),
                               fix="upgrade testbed (pip install -U testbed), or set TESTBED_HOME to another folder")
        if version == SCHEMA_VERSION and db.execute("PRAGMA user_version").fetchone()[0] == version:
            return  # another process migrated it first
        if version == 0:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
        else:
            for v in range(version, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v]:
                    db.execute(stmt)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @classmethod
    def open_default(cls) -> Store:
        from testbed import paths

        return cls(paths.home() / "state.db")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; taken at once (IMMEDIATE) so two writers never interleave."""
        db = self._db
        for attempt in range(200):
            try:
                db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 199:
                    raise
                time.sleep(0.05)
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            db.execute("COMMIT")

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return list(self._db.execute(sql, args))

    # testbeds -------------------------------------------------------------------------------------
    def upsert_testbed(self, name: str, provider: str, spec_path: str | None, status: str,
                       info: dict[str, Any] | None = None) -> None:
        now = time.time()
        with self.tx() as db:
            old = db.execute("SELECT info FROM testbeds WHERE name=?", (name,)).fetchone()
            merged = {**(json.loads(old["info"]) if old else {}), **(info or {})}
            db.execute(
                "INSERT INTO testbeds(name, provider, spec_path, status, created, updated, info) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET provider=excluded.provider, "
                "spec_path=excluded.spec_path, status=excluded.status, updated=excluded.updated, "
                "info=excluded.info",
                (name, provider, spec_path, status, now, now, json.dumps(merged)),
            )

    def set_testbed_status(self, name: str, status: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE testbeds SET status=?, updated=? WHERE name=?", (status, time.time(), name))

    def update_testbed_info(self, name: str, **info: Any) -> None:
        with self.tx() as db:
            row = db.execute("SELECT info FROM testbeds WHERE name=?", (name,)).fetchone()
            if row is None:
                return
            merged = {**json.loads(row["info"]), **info}
            db.execute("UPDATE testbeds SET info=?, updated=? WHERE name=?",
                       (json.dumps(merged), time.time(), name))

    def testbed(self, name: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM testbeds WHERE name=?", (name,))
        if not rows:
            return None
        d = dict(rows[0])
        d["info"] = json.loads(d["info"])
        return d

    def testbeds(self) -> list[dict[str, Any]]:
        out = []
        for r in self.query("SELECT * FROM testbeds ORDER BY name"):
            d = dict(r)
            d["info"] = json.loads(d["info"])
            out.append(d)
        return out

    def delete_testbed(self, name: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM hosts WHERE testbed=?", (name,))
            db.execute("DELETE FROM resources WHERE testbed=?", (name,))
            db.execute("DELETE FROM testbeds WHERE name=?", (name,))

    # hosts ----------------------------------------------------------------------------------------
    def set_hosts(self, testbed: str, hosts: list[Host]) -> None:
        """Replace the testbed's host list (order kept: it decides ranks and the default master)."""
        with self.tx() as db:
            db.execute("DELETE FROM hosts WHERE testbed=?", (testbed,))
            for i, h in enumerate(hosts):
                db.execute(
                    "INSERT INTO hosts VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (testbed, h.name, h.address, h.port, h.user, h.key, json.dumps(h.groups),
                     json.dumps(h.facts), h.proxy_jump, h.state, i),
                )

    def upsert_host(self, testbed: str, h: Host) -> None:
        with self.tx() as db:
            pos = db.execute("SELECT position FROM hosts WHERE testbed=? AND name=?", (testbed, h.name)).fetchone()
            if pos is None:
                n = db.execute("SELECT COUNT(*) FROM hosts WHERE testbed=?", (testbed,)).fetchone()[0]
                position = n
            else:
                position = pos[0]
            db.execute(
                "INSERT OR REPLACE INTO hosts VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (testbed, h.name, h.address, h.port, h.user, h.key, json.dumps(h.groups),
                 json.dumps(h.facts), h.proxy_jump, h.state, position),
            )

    def set_host_state(self, testbed: str, host: str, state: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE hosts SET state=? WHERE testbed=? AND name=?", (state, testbed, host))

    def update_host_facts(self, testbed: str, host: str, facts: dict[str, Any]) -> None:
        with self.tx() as db:
            row = db.execute("SELECT facts FROM hosts WHERE testbed=? AND name=?", (testbed, host)).fetchone()
            if row is None:
                return
            merged = {**json.loads(row["facts"]), **facts}
            db.execute("UPDATE hosts SET facts=? WHERE testbed=? AND name=?", (json.dumps(merged), testbed, host))

    def hosts(self, testbed: str) -> list[Host]:
        return [_row_to_host(r) for r in
                self.query("SELECT * FROM hosts WHERE testbed=? ORDER BY position", (testbed,))]

    # cloud resources ------------------------------------------------------------------------------
    def add_resource(self, testbed: str, kind: str, rid: str, **info: Any) -> None:
        """Record a cloud resource id the moment the API returns it (before waiting on it)."""
        with self.tx() as db:
            db.execute(
                "INSERT INTO resources VALUES (?,?,?,?,?) ON CONFLICT(testbed, kind, id) "
                "DO UPDATE SET info=excluded.info",
                (testbed, kind, rid, json.dumps(info), time.time()),
            )

    def resources(self, testbed: str, kind: str | None = None) -> list[dict[str, Any]]:
        sql: str = "SELECT * FROM resources WHERE testbed=?"
        args: tuple[str, ...] = (testbed,)
        if kind:
            sql, args = sql + " AND kind=?", (testbed, kind)
        out = []
        for r in self.query(sql + " ORDER BY created", args):
            d = dict(r)
            d["info"] = json.loads(d["info"])
            out.append(d)
        return out

    def remove_resource(self, testbed: str, kind: str, rid: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM resources WHERE testbed=? AND kind=? AND id=?", (testbed, kind, rid))
