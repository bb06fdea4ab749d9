"""SQLite state under the testbed home: testbeds, hosts, cloud resources, runs, events, campaigns, collected files.

This module is the one place that speaks SQL: every other module calls ``Store``'s named methods, which take and
return records (``testbed.hosts.Host``, the run records of ``testbed.records``, plain dicts for testbeds and
resources). ``Store.query`` and ``Store.tx`` stay for raw inspection in tests and debugging.

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
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, TypeVar, Unpack, cast

from testbed.hosts import Host

if TYPE_CHECKING:  # pydantic and the run models load on first use: `testbed status` and `exec` stay fast
    from pydantic import BaseModel

    from testbed.records import CampaignInfo, CampaignPoint, CampaignRecord, RankRecord, RunEvent, RunInfo, RunRecord

ACTIVE = ("pending", "running")  # testbed.records.ACTIVE (checked equal in tests/test_state.py)

SCHEMA_VERSION = 4

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
  collected REAL NOT NULL, host_mtime INTEGER, host_ctime_ns INTEGER, host_ino INTEGER,
  PRIMARY KEY (run_id, host, path));
CREATE TABLE IF NOT EXISTS images (
  provider TEXT NOT NULL, id TEXT NOT NULL, key TEXT NOT NULL, plan TEXT NOT NULL, testbed TEXT NOT NULL,
  host TEXT NOT NULL, location TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL,
  info TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (provider, id));
CREATE INDEX IF NOT EXISTS images_key ON images(key);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, seq);
CREATE INDEX IF NOT EXISTS runs_testbed ON runs(testbed, created);
CREATE INDEX IF NOT EXISTS runs_campaign ON runs(campaign, created);
"""

# MIGRATIONS[v] brings a version-v file to v + 1 (statements run in one transaction with the version bump).
MIGRATIONS: dict[int, list[str]] = {
    1: ["CREATE INDEX IF NOT EXISTS runs_campaign ON runs(campaign, created)"],  # campaign reports, resume
    2: ["CREATE TABLE IF NOT EXISTS images (provider TEXT NOT NULL, id TEXT NOT NULL, key TEXT NOT NULL, "
        "plan TEXT NOT NULL, testbed TEXT NOT NULL, host TEXT NOT NULL, location TEXT NOT NULL, "
        "size INTEGER NOT NULL, created REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (provider, id))",
        "CREATE INDEX IF NOT EXISTS images_key ON images(key)"],  # images keyed by the set-up's address
    # the host's stat of a collected file when it was hashed (FileStamp); rows from before have none (NULL), so
    # the listing's quick check never trusts them: each such file is hashed once more on its host
    3: ["ALTER TABLE collected ADD COLUMN host_mtime INTEGER",
        "ALTER TABLE collected ADD COLUMN host_ctime_ns INTEGER",
        "ALTER TABLE collected ADD COLUMN host_ino INTEGER"],
}


_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")


def _connect(target: str, path: Path, *, uri: bool = False) -> sqlite3.Connection:
    """A connection (autocommit, rows as sqlite3.Row) whose refusals by the disk name ``path``."""
    db = sqlite3.connect(target, timeout=30, isolation_level=None, check_same_thread=False, uri=uri,
                         factory=_Connection)
    db.path = str(path)
    db.row_factory = sqlite3.Row
    return db


def _columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's columns."""
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in tables}  # names from the file's
    # own catalogue, read by a pragma that takes no expression


_WANTED: dict[str, set[str]] = {}


def _wanted() -> dict[str, set[str]]:
    """The tables and columns of SCHEMA (read once from an in-memory database made with it)."""
    if not _WANTED:
        mem = sqlite3.connect(":memory:")
        mem.executescript(SCHEMA)
        _WANTED.update(_columns(mem))
        mem.close()
    return _WANTED


def _current(db: sqlite3.Connection) -> bool:
    """Whether the file is at SCHEMA_VERSION with every table and column of SCHEMA."""
    if int(db.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
        return False
    have = _columns(db)
    return all(t in have and cols <= have[t] for t, cols in _wanted().items())


def _apply(db: sqlite3.Connection, stmt: str) -> None:
    """One migration statement, idempotent: a column a cut-short migration already added is not added again."""
    m = _ADD_COLUMN.match(stmt)
    if m and m[2] in _columns(db).get(m[1], set()):
        return
    db.execute(stmt)


def _reconcile(db: sqlite3.Connection) -> None:
    """Add what SCHEMA has and the file lacks: tables and indexes (``IF NOT EXISTS``), and the columns of a
    table that a later version added (each nullable or with a default)."""
    for stmt in SCHEMA.split(";"):
        if stmt.strip():
            db.execute(stmt)
    have = _columns(db)
    mem = sqlite3.connect(":memory:")
    mem.executescript(SCHEMA)
    try:
        for table, cols in _wanted().items():
            for col in sorted(cols - have.get(table, set())):
                info = next(r for r in mem.execute(f"PRAGMA table_info({table})") if r[1] == col)
                if info[3] and info[4] is None:  # NOT NULL without a default: not a column a version added
                    # lazy: start-up (testbed status and exec load this module)
                    from testbed.errors import TestbedError

                    raise TestbedError(f"the state database lacks column {table}.{col}, which every version of "
                                       "testbed wrote", where=str(getattr(db, "path", "state.db")),
                                       fix="restore it from a backup, or move it aside to start empty")
                db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {info[2]}")  # names from SCHEMA, not the file
    finally:
        mem.close()


class RunColumns(TypedDict, total=False):
    """Columns of ``runs`` that ``Store.update_run`` sets."""

    status: str
    reason: str | None
    started: float | None
    ended: float | None


class RankColumns(TypedDict, total=False):
    """Columns of ``run_hosts`` that ``Store.set_rank`` sets."""

    status: str
    exit_code: int | None
    reason: str | None
    started: float | None
    ended: float | None


class TestbedRow(TypedDict):
    """A row of ``testbeds``: ``info`` is what provision, set-up and the provider recorded (JSON)."""

    name: str
    provider: str
    spec_path: str | None
    status: str
    created: float
    updated: float
    info: dict[str, Any]


class ResourceRow(TypedDict):
    """A row of ``resources``: a cloud resource recorded the moment its API named it."""

    testbed: str
    kind: str
    id: str
    info: dict[str, Any]
    created: float


class ImageRow(TypedDict):
    """A row of ``images``: an image of a set-up (``key``: its content address), recorded when named."""

    provider: str
    id: str
    key: str
    plan: str
    testbed: str
    host: str
    location: str
    size: int
    created: float
    info: dict[str, Any]


class FileStamp(NamedTuple):
    """What a host's stat said of a file when its checksum was taken: the listing's quick check trusts that
    checksum again only while these three and the size are unchanged (the ctime moves on every write and every
    utime, and no user can set it; a file replaced by another has another inode)."""

    mtime: int  # s
    ctime_ns: int
    ino: int


@dataclass(frozen=True, slots=True)
class CollectedFile:
    """A row of ``collected``: a file of a run verified in results/ (``size`` -1: its transfer is pending);
    ``stamp``: the host's stat of it when it was hashed, None when none can be trusted (see FileStamp)."""

    host: str
    path: str
    sha256: str
    size: int
    collected: float
    stamp: FileStamp | None = None


_M = TypeVar("_M", bound="BaseModel")


def _with_info(r: sqlite3.Row) -> dict[str, Any]:
    """A row as a dict, its ``info`` column read from JSON."""
    d = dict(r)
    d["info"] = json.loads(d["info"])
    return d


def _row_to_host(r: sqlite3.Row) -> Host:
    return Host(
        name=r["name"], address=r["address"], port=r["port"], user=r["user"], key=r["key"],
        groups=json.loads(r["groups"]), facts=json.loads(r["facts"]), proxy_jump=r["proxy_jump"],
        state=r["state"],
    )


_DB_FILES = ("state.db", "state.db-wal", "state.db-shm", "state.db-journal")


def discard_if_unused(home: Path) -> bool:
    """Remove ``home`` when it holds nothing but a state database with nothing recorded in it: what a command
    refused before it recorded anything leaves behind when the folder had no state before (the folder is left
    as the user found it). Anything else there (keys, a testbed's files, a row in any table) keeps it."""
    if not home.is_dir() or any(p.name not in _DB_FILES for p in home.iterdir()):
        return False
    db = home / "state.db"
    if db.is_file():
        try:
            con = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
            try:
                present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                tables = [t for t in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA) if t != "meta"]
                # names from this module's own schema, never from the file
                if any(con.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()  # noqa: S608
                       for t in tables if t in present):
                    return False
            finally:
                con.close()
        except sqlite3.DatabaseError:
            return False
    for p in home.iterdir():
        p.unlink()
    home.rmdir()
    return True


_DISK = ("disk I/O error", "database or disk is full", "unable to open database file", "disk full")


class _Connection(sqlite3.Connection):
    """A connection whose every statement that the disk refuses (full, failing, gone) is one TestbedError naming
    the state file: SQLite rolls the statement's transaction back, so nothing recorded before is lost."""

    path = ""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.OperationalError as e:
            if not any(w in str(e) for w in _DISK):
                raise
            # lazy: start-up (testbed status and exec load this module)
            from testbed.errors import TestbedError

            folder = Path(self.path).parent
            raise TestbedError(f"the state database cannot be used: {e} (is the disk of {folder} full?); "
                               "nothing of this command was recorded, and nothing recorded before was lost",
                               where=self.path,
                               fix=f"free space on that disk (df -h {folder}), then run the command again") from None


class Store:
    """The state database. Cheap to open; open one per command.

    ``readonly``: for the commands that only read (status, list, report, completion): the file must exist, is
    neither migrated nor re-moded, and SQLite refuses every write (``PRAGMA query_only``). A read-only open of
    an older schema reads it as it is (the migrations so far add indexes only). ``Store.empty`` stands in for a
    home that has no state, so that those commands never create one.
    """

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self.exists = True  # False: Store.empty, no file behind it
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.path.exists():
                self._create()
        # never open the file with a plain descriptor here: closing one drops every POSIX lock this process's
        # other connections hold on it (SQLite's own caveat), which shows up as "disk I/O error" elsewhere
        if self.path.stat().st_size == 0:
            raise self._damaged("empty file")
        # mode=rw: a file that vanished since is an error, never created anew
        target = f"{self.path.absolute().as_uri()}?mode=rw" if readonly else str(self.path)
        self._db = _connect(target, self.path, uri=readonly)
        try:
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute("PRAGMA foreign_keys=ON")
            if readonly:
                self._db.execute("PRAGMA query_only=ON")
            else:
                with contextlib.suppress(sqlite3.OperationalError):  # another process is switching it right now
                    self._db.execute("PRAGMA journal_mode=WAL")
            self._check_size()
            if readonly:
                self._check_version(self._stored_version(self._db))
                if not _current(self._db):  # an older (or half-migrated) file: read a migrated copy in memory
                    self._db = self._migrated_copy()
            elif not _current(self._db):  # the usual open writes nothing
                with self.tx() as db:
                    self._migrate(db)
        except sqlite3.DatabaseError as e:
            if not any(w in str(e) for w in ("malformed", "not a database", "truncated")):
                raise
            self._db.close()
            raise self._damaged(str(e)) from None
        if not readonly:
            self.path.chmod(0o600)

    @classmethod
    def empty(cls, path: Path) -> Store:
        """A read-only store with no testbed, run or campaign, for a home with no state at ``path`` (nothing is
        created there)."""
        st = cls.__new__(cls)
        st.path, st.readonly, st.exists = Path(path), True, False
        st._db = _connect(":memory:", st.path)
        st._db.execute("BEGIN")
        st._migrate(st._db)
        st._db.execute("COMMIT")
        st._db.execute("PRAGMA query_only=ON")
        return st

    @property
    def home(self) -> Path:
        """The state home this database belongs to."""
        return self.path.parent

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
        # lazy: start-up (testbed status and exec load this module)
        from testbed.errors import TestbedError

        return TestbedError(f"the state database is damaged ({why}); testbed left it as it is", where=str(self.path),
                            fix="restore it from a backup; or move it aside (mv state.db state.db.damaged) to start "
                                "empty, after which the testbeds it recorded (possibly still running and billing) "
                                "are unknown to testbed and must be released in their providers' consoles")

    def _stored_version(self, db: sqlite3.Connection) -> int:
        """The schema version the file records (``user_version``, else ``meta.schema_version`` of a version-1
        file; 0: a new file); one no testbed writes (negative, not a number) is damage."""
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version == 0 and "meta" in tables:  # written before user_version was used
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            text = str(row[0]) if row else "1"
            version = int(text) if text.isdigit() else -1
            if version < 0:
                raise self._damaged(f"it records schema {text[:40]!r}, which no testbed writes")
        if version < 0:
            raise self._damaged(f"it records schema {version}, which no testbed writes")
        return version

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Create a new file at the latest schema, or migrate an older one (one a migration was cut short in
        too); refuse a newer one."""
        version = self._stored_version(db)
        self._check_version(version)
        if version == SCHEMA_VERSION and _current(db):
            return  # another process migrated it first
        for v in range(max(version, 1), SCHEMA_VERSION) if version else ():
            for stmt in MIGRATIONS[v]:
                _apply(db, stmt)
        _reconcile(db)  # every table, column and index of SCHEMA, whatever a cut-short migration left
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")

    def _migrated_copy(self) -> sqlite3.Connection:
        """This file's database copied into memory and migrated there, for a read-only open of an older file:
        read as the latest schema reads, and the file itself untouched."""
        mem = _connect(":memory:", self.path)
        self._db.backup(mem)
        self._db.close()
        mem.execute("BEGIN")
        self._migrate(mem)
        mem.execute("COMMIT")
        mem.execute("PRAGMA query_only=ON")
        return mem

    def _check_version(self, version: int) -> None:
        """Refuse a file written by a newer testbed."""
        if version > SCHEMA_VERSION:
            # lazy: start-up (testbed status and exec load this module)
            from testbed.distribution import install_command
            from testbed.errors import TestbedError

            raise TestbedError(f"the state was written by a newer testbed (schema {version}; this one knows up "
                               f"to {SCHEMA_VERSION}); nothing was changed", where=str(self.path),
                               fix=f"upgrade testbed ({install_command(upgrade=True)}), or set TESTBED_HOME to "
                                   "another folder")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @classmethod
    def open_default(cls) -> Store:
        """This folder's state, created when it has none (for the commands that record something)."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed import paths

        return cls(paths.home() / "state.db")

    @classmethod
    def open_existing(cls, home: Path | None = None, *, readonly: bool = True) -> Store:
        """The state of ``home`` (default: this folder's) when it has one, else ``Store.empty``: never creates
        anything. ``readonly=False``: writes allowed to an existing file (``status --probe`` records what it
        found)."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed import paths

        if home is None:
            paths.check_state_home()  # a file there is no empty home
        db = (home or paths.state_home()) / "state.db"
        return cls(db, readonly=readonly) if db.is_file() else cls.empty(db)

    @classmethod
    def open_lazy(cls) -> Store:
        """This folder's state for the Python API (``testbed.open``): the file when there is one; else a stand-in
        with nothing recorded that creates the file on the first write, so that looking at a testbed from an
        empty folder leaves the folder as it was."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed import paths

        paths.check_state_home()
        db = paths.state_home() / "state.db"
        if db.is_file():
            return cls(db)
        st = _LazyStore.empty(db)
        st._lazy = True
        return st

    _lazy = False  # Store.open_lazy's stand-in: the first write creates the file

    def _materialize(self) -> None:
        """Make the stand-in of ``open_lazy`` the real file (created now, or by another process since)."""
        real = Store(self.path)
        self._lazy = False
        self._db.close()
        self._db, self.readonly, self.exists = real._db, False, True

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; taken at once (IMMEDIATE) so two writers never interleave."""
        if self.readonly and self._lazy:
            self._materialize()
        if self.readonly:
            raise RuntimeError(f"a write to the state opened read-only ({self.path})")  # a bug in the caller
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

    def query(self, sql: str, args: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        """Raw rows (tests, debugging); the package itself calls the named methods below."""
        return list(self._db.execute(sql, args))

    def _record(self, model: type[_M], row: sqlite3.Row, what: str, **json_cols: object) -> _M:
        """``row`` as ``model`` (JSON columns decoded); a row no model accepts is one TestbedError naming it."""
        from pydantic import ValidationError

        d = dict(row)
        try:
            for col, default in json_cols.items():
                d[col] = json.loads(d[col]) if d.get(col) else default
            return model.model_validate(d)
        except (ValueError, ValidationError) as e:
            # lazy: start-up (testbed status and exec load this module)
            from testbed.errors import TestbedError

            why = str(e).splitlines()[0] if not isinstance(e, ValidationError) else \
                "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:3])
            raise TestbedError(f"{what} in the state database is unreadable ({why})", where=str(self.path),
                               fix="it was edited by hand or by another program; restore the state file from a "
                                   "backup") from None

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

    def update_testbed_info(self, name: str, **info: object) -> None:
        with self.tx() as db:
            row = db.execute("SELECT info FROM testbeds WHERE name=?", (name,)).fetchone()
            if row is None:
                return
            merged = {**json.loads(row["info"]), **info}
            db.execute("UPDATE testbeds SET info=?, updated=? WHERE name=?",
                       (json.dumps(merged), time.time(), name))

    def testbed(self, name: str) -> TestbedRow | None:
        rows = self.query("SELECT * FROM testbeds WHERE name=?", (name,))
        return cast(TestbedRow, _with_info(rows[0])) if rows else None

    def testbed_info(self, name: str) -> dict[str, Any]:
        """The testbed's recorded ``info`` ({} when there is no such testbed)."""
        row = self.testbed(name)
        return row["info"] if row is not None else {}

    def testbeds(self) -> list[TestbedRow]:
        return [cast(TestbedRow, _with_info(r)) for r in self.query("SELECT * FROM testbeds ORDER BY name")]

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
    def add_resource(self, testbed: str, kind: str, rid: str, **info: object) -> None:
        """Record a cloud resource id the moment the API returns it (before waiting on it)."""
        self.add_resources(testbed, kind, {rid: info})

    def add_resources(self, testbed: str, kind: str, items: Mapping[str, Mapping[str, Any]]) -> None:
        """Record resources of one kind (id -> info) in one transaction: each commit waits for the disk, so a
        thousand hosts recorded one by one took over a minute. They share one time; :meth:`resources` keeps their
        order."""
        now = time.time()
        with self.tx() as db:
            db.executemany(
                "INSERT INTO resources VALUES (?,?,?,?,?) ON CONFLICT(testbed, kind, id) "
                "DO UPDATE SET info=excluded.info",
                [(testbed, kind, rid, json.dumps(dict(info)), now) for rid, info in items.items()],
            )

    def resources(self, testbed: str, kind: str | None = None) -> list[ResourceRow]:
        sql: str = "SELECT * FROM resources WHERE testbed=?"
        args: tuple[str, ...] = (testbed,)
        if kind:
            sql, args = sql + " AND kind=?", (testbed, kind)
        return [cast(ResourceRow, _with_info(r)) for r in self.query(sql + " ORDER BY created, rowid", args)]

    def remove_resource(self, testbed: str, kind: str, rid: str) -> None:
        self.remove_resources(testbed, kind, [rid])

    def remove_resources(self, testbed: str, kind: str, ids: Iterable[str]) -> None:
        """Forget resources of one kind, in one transaction."""
        with self.tx() as db:
            db.executemany("DELETE FROM resources WHERE testbed=? AND kind=? AND id=?",
                           [(testbed, kind, rid) for rid in ids])

    # images ---------------------------------------------------------------------------------------
    def add_image(self, provider: str, iid: str, *, key: str, plan: str, testbed: str, host: str, location: str,
                  size: int, **info: object) -> None:
        """Record an image the moment its provider names it (before it is ready), so prune can always find it."""
        with self.tx() as db:
            db.execute("INSERT INTO images VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(provider, id) DO UPDATE SET "
                       "size=excluded.size, info=excluded.info",
                       (provider, iid, key, plan, testbed, host, location, size, time.time(), json.dumps(info)))

    def images(self, key: str | None = None) -> list[ImageRow]:
        """Every recorded image (those of ``key``), oldest first."""
        sql, args = "SELECT * FROM images", cast(tuple[str, ...], ())
        if key is not None:
            sql, args = sql + " WHERE key=?", (key,)
        return [cast(ImageRow, _with_info(r)) for r in self.query(sql + " ORDER BY created", args)]


    def image_users(self) -> dict[str, list[str]]:
        """Image key -> the testbeds recorded as booted from it (their hosts, or a host repaired from it)."""
        out: dict[str, list[str]] = {}
        for tb in self.testbeds():
            for field in ("image", "repair_image"):
                img = (tb["info"] or {}).get(field)
                if isinstance(img, dict) and img.get("key") and tb["name"] not in out.get(str(img["key"]), []):
                    out.setdefault(str(img["key"]), []).append(tb["name"])
        return out

    def expiring_images(self, testbed: str, provider: str) -> list[ImageRow]:
        """The images the dead-man's switch of ``testbed`` deletes when its spec opts in (``expire_images``): those
        it baked with ``provider`` that no other testbed boots from. Without the opt-in the switch deletes none."""
        used = self.image_users()
        return [r for r in self.images() if r["testbed"] == testbed and r["provider"] == provider
                and not [u for u in used.get(r["key"], []) if u != testbed]]
    def remove_image(self, provider: str, iid: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM images WHERE provider=? AND id=?", (provider, iid))

    # runs -----------------------------------------------------------------------------------------
    def add_run(self, run: RunRecord, ranks: list[tuple[str, int]]) -> None:
        """Record a new run and its ranks (host, rank), all pending."""
        with self.tx() as db:
            db.execute("INSERT INTO runs(id, suite, testbed, params, status, campaign, created, info) "
                       "VALUES (?,?,?,?,?,?,?,?)", (run.id, run.suite, run.testbed, json.dumps(run.params),
                                                    run.status, run.campaign, run.created,
                                                    json.dumps(run.info.to_json())))
            db.executemany("INSERT INTO run_hosts(run_id, host, rank, status) VALUES (?,?,?,'pending')",
                           [(run.id, host, rank) for host, rank in ranks])

    def run(self, run_id: str) -> RunRecord | None:
        rows = self.query("SELECT * FROM runs WHERE id=?", (run_id,))
        return self._run(rows[0]) if rows else None

    def _run(self, row: sqlite3.Row) -> RunRecord:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.records import RunRecord

        return self._record(RunRecord, row, f"run '{row['id']}'", params={}, info={})

    def runs(self, limit: int = 100) -> list[RunRecord]:
        """The newest ``limit`` runs, newest first."""
        return [self._run(r) for r in self.query("SELECT * FROM runs ORDER BY created DESC LIMIT ?", (limit,))]

    def runs_of(self, suite: str, status: str) -> list[RunRecord]:
        """The runs of ``suite`` that ended with ``status``, newest first."""
        return [self._run(r) for r in self.query("SELECT * FROM runs WHERE suite=? AND status=? "
                                                 "ORDER BY created DESC", (suite, status))]

    def campaign_runs(self, cid: str) -> list[RunRecord]:
        """The runs of campaign ``cid``, oldest first."""
        return [self._run(r) for r in self.query("SELECT * FROM runs WHERE campaign=? ORDER BY created", (cid,))]

    def run_rows(self, limit: int = 100, testbed: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` runs (of ``testbed``), newest first, as their plain columns (no params, no info):
        what the ledger and run listings show, without loading the run models."""
        cols = "id, suite, testbed, status, campaign, created, started, ended, reason"
        if testbed is None:
            rows = self.query(f"SELECT {cols} FROM runs ORDER BY created DESC LIMIT ?", (limit,))  # noqa: S608
        else:
            rows = self.query(f"SELECT {cols} FROM runs WHERE testbed=? ORDER BY created DESC LIMIT ?",  # noqa: S608
                              (testbed, limit))
        return [dict(r) for r in rows]

    def run_ids(self, *, newest_first: bool = False, limit: int = -1) -> list[str]:
        """Run ids in the order they were created (``newest_first``: the other way)."""
        order = "created DESC, id DESC" if newest_first else "created, id"
        return [r["id"] for r in self.query(f"SELECT id FROM runs ORDER BY {order} LIMIT ?", (limit,))]  # noqa: S608

    def update_run(self, run_id: str, *, only_active: bool = False, info: RunInfo | None = None,
                   **columns: Unpack[RunColumns]) -> bool:
        """Set ``columns`` of the run and merge the keys set in ``info`` into its info.

        ``only_active``: only while the run is pending or running. False when nothing was changed.
        """
        bad = set(columns) - set(RunColumns.__annotations__)
        if bad:
            raise ValueError(f"not a column of runs: {sorted(bad)}")
        with self.tx() as db:
            row = db.execute("SELECT status, info FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None or (only_active and row["status"] not in ACTIVE):
                return False
            values: dict[str, Any] = dict(columns)
            if info is not None:
                values["info"] = json.dumps({**json.loads(row["info"] or "{}"), **info.to_json()})
            if values:
                cols = ", ".join(f"{k}=?" for k in values)  # names from RunColumns only
                db.execute(f"UPDATE runs SET {cols} WHERE id=?", (*values.values(), run_id))  # noqa: S608
        return True

    def set_rank(self, run_id: str, host: str, rank: int, **columns: Unpack[RankColumns]) -> None:
        """Set ``columns`` of one rank of the run."""
        bad = set(columns) - set(RankColumns.__annotations__)
        if bad or not columns:
            raise ValueError(f"not columns of run_hosts: {sorted(bad) or 'none given'}")
        cols = ", ".join(f"{k}=?" for k in columns)  # names from RankColumns only
        with self.tx() as db:
            db.execute(f"UPDATE run_hosts SET {cols} WHERE run_id=? AND host=? AND rank=?",  # noqa: S608
                       (*columns.values(), run_id, host, rank))

    def end_active_ranks(self, run_id: str, status: str, ended: float, reason: str, *,
                         keep_reason: bool = False) -> None:
        """Every rank of the run still pending or running ends with ``status`` (``keep_reason``: a reason
        already recorded stays)."""
        new_reason = "COALESCE(reason, ?)" if keep_reason else "?"
        with self.tx() as db:
            db.execute(f"UPDATE run_hosts SET status=?, ended=?, reason={new_reason} "  # noqa: S608
                       "WHERE run_id=? AND status IN (?, ?)", (status, ended, reason, run_id, *ACTIVE))

    def run_ranks(self, run_id: str) -> list[RankRecord]:
        """The run's ranks in rank order."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed.records import RankRecord

        return [self._record(RankRecord, r, f"rank {r['rank']} of run '{run_id}'")
                for r in self.query("SELECT * FROM run_hosts WHERE run_id=? ORDER BY rank", (run_id,))]

    def add_event(self, run_id: str, kind: str, host: str | None, ts: float, detail: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO events(run_id, ts, kind, host, detail) VALUES (?,?,?,?,?)",
                       (run_id, ts, kind, host, json.dumps(detail, default=str)))

    def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """The run's events after sequence number ``after``, in order."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed.records import RunEvent

        return [self._record(RunEvent, r, f"event {r['seq']} of run '{run_id}'", detail={})
                for r in self.query("SELECT * FROM events WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after))]

    # campaigns ------------------------------------------------------------------------------------
    def add_campaign(self, c: CampaignRecord) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO campaigns(id, suite, testbed, points, status, created, info) VALUES "
                       "(?,?,?,?,?,?,?)", (c.id, c.suite, c.testbed, json.dumps([p.model_dump() for p in c.points]),
                                           c.status, c.created, json.dumps(c.info.model_dump())))

    def campaign(self, cid: str) -> CampaignRecord | None:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.records import CampaignRecord

        rows = self.query("SELECT * FROM campaigns WHERE id=?", (cid,))
        return self._record(CampaignRecord, rows[0], f"campaign '{cid}'", points=[], info={}) if rows else None

    def save_campaign(self, cid: str, points: list[CampaignPoint], status: str | None = None) -> None:
        """Write the campaign's points (and its status when given)."""
        with self.tx() as db:
            db.execute("UPDATE campaigns SET points=? WHERE id=?", (json.dumps([p.model_dump() for p in points]),
                                                                     cid))
            if status:
                db.execute("UPDATE campaigns SET status=? WHERE id=?", (status, cid))

    def set_campaign_info(self, cid: str, info: CampaignInfo) -> None:
        """Replace the campaign's ``info`` (its faults, sources and budget)."""
        with self.tx() as db:
            db.execute("UPDATE campaigns SET info=? WHERE id=?", (json.dumps(info.model_dump()), cid))

    def campaign_of_runs(self) -> dict[str, str]:
        """run id -> campaign id, from the campaigns' points and the runs' own column (tolerant of odd rows)."""
        out: dict[str, str] = {}
        for row in self.query("SELECT id, points FROM campaigns"):
            try:
                points = json.loads(row["points"] or "[]")
            except ValueError:
                continue
            for point in points if isinstance(points, list) else []:
                if isinstance(point, dict) and point.get("run_id"):
                    out[str(point["run_id"])] = str(row["id"])
        for row in self.query("SELECT id, campaign FROM runs WHERE campaign IS NOT NULL"):
            out[str(row["id"])] = str(row["campaign"])
        return out

    # collected files ------------------------------------------------------------------------------
    def collected(self, run_id: str, host: str | None = None, *, verified: bool = False) -> list[CollectedFile]:
        """The run's collected files (of ``host``; ``verified``: without pending transfers)."""
        sql = ("SELECT host, path, sha256, size, collected, host_mtime, host_ctime_ns, host_ino FROM collected "
               "WHERE run_id=?")
        args: tuple[object, ...] = (run_id,)
        if host is not None:
            sql, args = sql + " AND host=?", (*args, host)
        if verified:
            sql += " AND size>=0"
        stamped = ("host_mtime", "host_ctime_ns", "host_ino")
        return [CollectedFile(r["host"], r["path"], r["sha256"], r["size"], r["collected"],
                              FileStamp(*(int(r[c]) for c in stamped)) if all(r[c] is not None for c in stamped)
                              else None)
                for r in self.query(sql, args)]

    def record_collected(self, run_id: str, host: str, items: list[tuple[str, str, int, FileStamp | None]],
                         when: float) -> None:
        """Upsert (path, sha256, size, host stamp or None) rows of ``host`` collected at ``when``."""
        with self.tx() as db:
            db.executemany("INSERT OR REPLACE INTO collected(run_id, host, path, sha256, size, collected, host_mtime, "
                           "host_ctime_ns, host_ino) VALUES (?,?,?,?,?,?,?,?,?)",
                           [(run_id, host, p, sha, n, when, *(stamp or (None, None, None)))
                            for p, sha, n, stamp in items])


class _LazyStore(Store):
    """``Store.open_lazy``'s stand-in for a folder without state: reads see nothing recorded until the state file
    exists (the first write here creates it; another ``Store`` of this folder may create it first, and reads then
    see what that one wrote)."""

    @property
    def _db(self) -> sqlite3.Connection:
        if self._lazy and self.path.is_file():
            self._materialize()
        return self._conn

    @_db.setter
    def _db(self, db: sqlite3.Connection) -> None:
        self._conn = db
