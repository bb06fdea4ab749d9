"""State of any age opens: a home written by an older testbed (schemas 1 to 3), one whose migration was cut short
or whose version lies, is read by the read-only commands as the latest schema reads it (the file untouched) and
migrated by the first command that writes; a version no testbed writes (negative, not a number) is named as damage;
a disk that refuses (full, failing) is one clear error naming the folder, with nothing recorded lost."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.hosts import Host
from testbed.state import SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parents[1]


def older(home: Path, version: int, then: Callable[[sqlite3.Connection], object] | None = None) -> Path:
    """A state home as testbed of ``version`` left it (made from today's and taken back), holding one testbed."""
    home.mkdir(parents=True)
    st = Store(home / "state.db")
    st.upsert_testbed("lab1", "lab", None, "up")
    st.set_hosts("lab1", [Host(name="n1", address="10.0.0.1", user="me")])
    st._db.close()
    db = sqlite3.connect(home / "state.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    if version <= 3:
        for col in ("host_mtime", "host_ctime_ns", "host_ino"):
            db.execute(f"ALTER TABLE collected DROP COLUMN {col}")
    if version <= 2:
        db.execute("DROP TABLE images")
    if version <= 1:
        db.execute("DROP INDEX runs_campaign")
        db.execute("PRAGMA user_version=0")
        db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    else:
        db.execute(f"PRAGMA user_version={version}")
    if then is not None:
        then(db)
    db.close()
    return home


def tb(args: list[str], home: Path, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=home.parent, capture_output=True, text=True,
                          timeout=120, check=False, preexec_fn=preexec,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "TESTBED_HOME": str(home)})


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


AGES = {
    "schema-1": (1, None),
    "schema-2": (2, None),
    "schema-3": (3, None),
    "cut-short": (3, lambda db: db.execute("ALTER TABLE collected ADD COLUMN host_mtime INTEGER")),
    "version-lies": (SCHEMA_VERSION, lambda db: db.execute("DROP TABLE images")),
}


@pytest.mark.parametrize("age", list(AGES))
def test_an_older_state_home_is_read_untouched_then_migrated_by_a_write(tmp_path: Path, age: str) -> None:
    version, then = AGES[age]
    home = older(tmp_path / "home", version, then)
    before = _sha(home / "state.db")
    for args in (["status"], ["status", "lab1"], ["list", "runs"], ["image", "list"]):
        r = tb(args, home)
        assert r.returncode == 0 and "internal error" not in r.stderr and "Traceback" not in r.stderr, (args, r)
    assert "lab1" in tb(["status"], home).stdout
    assert _sha(home / "state.db") == before, "a read-only command changed the state file"
    st = Store(home / "state.db")  # a command that writes: migrated in place, nothing lost
    assert st.schema_version == SCHEMA_VERSION and st.testbed("lab1") is not None
    assert st.query("SELECT count(*) FROM images")[0][0] == 0
    assert {r[1] for r in st.query("PRAGMA table_info(collected)")} >= {"host_mtime", "host_ctime_ns", "host_ino"}


@pytest.mark.parametrize(("then", "said"), [
    (lambda db: db.execute("PRAGMA user_version=-3"), "it records schema -3, which no testbed writes"),
    (lambda db: (db.execute("PRAGMA user_version=0"),
                 db.execute("UPDATE meta SET value='banana' WHERE key='schema_version'")),
     "it records schema 'banana', which no testbed writes"),
], ids=["negative", "garbage"])
def test_a_version_no_testbed_writes_is_named_as_damage(tmp_path: Path, then: Callable[[sqlite3.Connection], object],
                                                         said: str) -> None:
    home = older(tmp_path / "home", SCHEMA_VERSION, then)
    before = _sha(home / "state.db")
    for args in (["status"], ["run", "mpi-hello", "--dry-run"]):
        r = tb(args, home)
        err = " ".join(r.stderr.split())
        assert r.returncode != 0 and said in err and f"where: {home / 'state.db'}" in err, (args, err)
        assert "internal error" not in err and "Traceback" not in err
    assert _sha(home / "state.db") == before


def _no_growth() -> None:
    """This process may grow no file: every write past a file's end fails as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_disk_that_refuses_writes_is_one_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    st = Store(home / "state.db")  # as testbed leaves it: in WAL mode, whose readers write too
    st.upsert_testbed("lab1", "lab", None, "up")
    st._db.close()
    before = _sha(home / "state.db")
    for args in (["status"], ["list", "runs"], ["plan", "mpi-hello"]):
        r = tb(args, home, _no_growth)
        err = " ".join(r.stderr.split())
        assert r.returncode == 1 and "the state database cannot be used" in err and "full?" in err, (args, err)
        assert f"where: {home / 'state.db'}" in err and "df -h" in err and "internal error" not in err
    assert _sha(home / "state.db") == before
    assert Store(home / "state.db").testbed("lab1") is not None
