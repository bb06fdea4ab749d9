"""The SQLite state store: records, transactions, and concurrent writers (threads and processes)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from testbed.hosts import Host
from testbed.state import Store

pytestmark = pytest.mark.timeout(120)


def _integrity(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def _hosts(n: int) -> list[Host]:
    return [Host(name=f"n{i}", address=f"10.0.0.{i + 2}", groups=["workers"] if i else ["master"],
                 facts={"cpus": i}) for i in range(n)]


# records -------------------------------------------------------------------------------------------
def test_open_creates_schema_private_and_wal(tmp_path: Path) -> None:
    st = Store(tmp_path / "s" / "state.db")
    assert stat.S_IMODE((tmp_path / "s" / "state.db").stat().st_mode) == 0o600
    assert st.query("PRAGMA journal_mode")[0][0] == "wal"
    assert st.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == "2" and st.schema_version == 2
    st.close()
    st2 = Store(tmp_path / "s" / "state.db")  # reopening is harmless
    assert st2.testbeds() == []
    st2.close()


def test_testbed_upsert_merges_info_and_keeps_created(tmp_path: Path) -> None:
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "local", "/x.yml", "provisioning", {"a": 1})
    created = st.testbed("tb")["created"]  # type: ignore[index]
    time.sleep(0.01)
    st.upsert_testbed("tb", "local", "/x.yml", "up", {"b": 2})
    tb = st.testbed("tb")
    assert tb is not None and tb["status"] == "up" and tb["info"] == {"a": 1, "b": 2}
    assert tb["created"] == created and tb["updated"] > created
    st.update_testbed_info("tb", c=3)
    st.update_testbed_info("missing", c=3)  # no row: no-op, no error
    st.set_testbed_status("tb", "degraded")
    assert st.testbed("tb")["info"] == {"a": 1, "b": 2, "c": 3}  # type: ignore[index]
    assert [t["name"] for t in st.testbeds()] == ["tb"]
    assert st.testbed("missing") is None


def test_hosts_order_state_and_facts(tmp_path: Path) -> None:
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "lab", None, "up")
    st.set_hosts("tb", _hosts(3))
    assert [h.name for h in st.hosts("tb")] == ["n0", "n1", "n2"]
    st.upsert_host("tb", Host(name="n1", address="10.9.9.9"))  # keeps its position
    st.upsert_host("tb", Host(name="extra", address="10.9.9.10"))  # appended
    hs = st.hosts("tb")
    assert [h.name for h in hs] == ["n0", "n1", "n2", "extra"] and hs[1].address == "10.9.9.9"
    st.set_host_state("tb", "n2", "down")
    st.update_host_facts("tb", "n0", {"gpus": 1})
    st.update_host_facts("tb", "nope", {"gpus": 1})
    hs = st.hosts("tb")
    assert hs[2].state == "down" and hs[0].facts == {"cpus": 0, "gpus": 1} and hs[0].groups == ["master"]
    st.set_hosts("tb", _hosts(1))  # replaces the list
    assert [h.name for h in st.hosts("tb")] == ["n0"]


def test_resources_recorded_updated_and_removed(tmp_path: Path) -> None:
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "chameleon", None, "provisioning")
    st.add_resource("tb", "lease", "L1", name="tb-lease")
    st.add_resource("tb", "server", "S1")
    st.add_resource("tb", "server", "S2")
    st.add_resource("tb", "lease", "L1", name="renamed")  # same id: info updated, not duplicated
    assert [r["id"] for r in st.resources("tb")] == ["L1", "S1", "S2"]
    assert st.resources("tb", "lease")[0]["info"] == {"name": "renamed"}
    st.remove_resource("tb", "server", "S1")
    st.remove_resource("tb", "server", "never-there")
    assert [r["id"] for r in st.resources("tb", "server")] == ["S2"]
    st.add_resource("other", "server", "S9")
    st.set_hosts("tb", _hosts(2))
    st.delete_testbed("tb")
    assert st.testbed("tb") is None and st.hosts("tb") == [] and st.resources("tb") == []
    assert [r["id"] for r in st.resources("other")] == ["S9"]  # another testbed's resources stay


# transactions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_failed_transaction_rolls_back_everything(tmp_path: Path, exc: type[BaseException]) -> None:
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "local", None, "up")
    with pytest.raises(exc), st.tx() as db:
        db.execute("UPDATE testbeds SET status='broken' WHERE name='tb'")
        db.execute("INSERT INTO resources VALUES ('tb','netns','ns1','{}',0)")
        raise exc()
    assert st.testbed("tb")["status"] == "up"  # type: ignore[index]
    assert st.resources("tb") == []
    st.add_resource("tb", "netns", "ns2")  # the store is usable after a rollback
    assert [r["id"] for r in st.resources("tb")] == ["ns2"]


def test_constraint_violation_rolls_back(tmp_path: Path) -> None:
    st = Store(tmp_path / "state.db")
    with pytest.raises(sqlite3.IntegrityError), st.tx() as db:
        db.execute("INSERT INTO testbeds(name, provider, status, created, updated) VALUES ('a','local','up',0,0)")
        db.execute("INSERT INTO testbeds(name, provider, status, created, updated) VALUES ('a','local','up',0,0)")
    assert st.testbeds() == []


def test_reader_sees_committed_state_only(tmp_path: Path) -> None:
    writer, reader = Store(tmp_path / "state.db"), Store(tmp_path / "state.db")
    with writer.tx() as db:
        db.execute("INSERT INTO resources VALUES ('tb','k','r1','{}',0)")
        assert reader.resources("tb") == []  # WAL: the reader is not blocked and sees no partial write
    assert [r["id"] for r in reader.resources("tb")] == ["r1"]


# concurrency ---------------------------------------------------------------------------------------
def test_threads_each_with_a_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).upsert_testbed("tb", "local", None, "up")
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            st = Store(db)
            for i in range(40):
                st.add_resource("tb", f"t{t}", str(i))
                st.update_testbed_info("tb", **{f"t{t}": i})
            st.close()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and not any(th.is_alive() for th in threads)
    st = Store(db)
    assert len(st.resources("tb")) == 8 * 40
    assert st.testbed("tb")["info"] == {f"t{t}": 39 for t in range(8)}  # type: ignore[index]
    assert _integrity(db) == "ok"


def _proc_writer(db: str, p: int, n: int) -> None:
    st = Store(Path(db))  # also races on schema creation and the WAL switch for a fresh file
    st.upsert_testbed(f"tb{p}", "local", None, "up")
    st.set_hosts(f"tb{p}", _hosts(3))
    for i in range(n):
        st.add_resource("shared", "proc", f"{p}-{i}")
        st.update_testbed_info(f"tb{p}", last=i)
        if i % 10 == 0:
            st.set_host_state(f"tb{p}", "n1", f"s{i}")
    st.close()


def test_processes_writing_concurrently(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "state.db"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_proc_writer, args=(str(db), p, 40)) for p in range(8)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(90)
    assert [pr.exitcode for pr in procs] == [0] * 8
    st = Store(db)
    assert {r["id"] for r in st.resources("shared")} == {f"{p}-{i}" for p in range(8) for i in range(40)}
    for p in range(8):
        assert st.testbed(f"tb{p}")["info"] == {"last": 39}  # type: ignore[index]
        assert [h.name for h in st.hosts(f"tb{p}")] == ["n0", "n1", "n2"]
    assert _integrity(db) == "ok"


def test_writer_killed_mid_transaction_leaves_no_trace(tmp_path: Path) -> None:
    """A process killed inside a transaction: its write never appears and the file stays sound."""
    db = tmp_path / "state.db"
    Store(db).upsert_testbed("tb", "local", None, "up")
    ctx = mp.get_context("fork")
    ready = ctx.Event()

    def hold() -> None:
        st = Store(db)
        with st.tx() as c:
            c.execute("INSERT INTO resources VALUES ('tb','k','half','{}',0)")
            ready.set()
            time.sleep(60)

    pr = ctx.Process(target=hold)
    pr.start()
    assert ready.wait(30)
    pr.kill()
    pr.join(10)
    st = Store(db)
    st.add_resource("tb", "k", "after")  # the lock died with the process
    assert [r["id"] for r in st.resources("tb")] == ["after"]
    assert _integrity(db) == "ok"


def test_a_version_1_state_is_migrated_in_place(tmp_path: Path) -> None:
    """A state written by the previous testbed (schema 1, no user_version) opens, migrates, keeps everything."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript((Path(__file__).parent / "samples" / "state" / "v1.sql").read_text())
    db.close()
    st = Store(path)
    assert st.schema_version == 2
    assert [h.name for h in st.hosts("old")] == ["node0"] and st.testbed("old")["status"] == "up"
    assert st.query("SELECT status FROM runs")[0]["status"] == "succeeded"
    assert {r["name"] for r in st.query("SELECT name FROM sqlite_master WHERE type='index'")} >= {"runs_campaign"}
    st.close()
    assert Store(path).schema_version == 2  # opening again changes nothing


def test_a_newer_state_is_refused_untouched(tmp_path: Path) -> None:
    from testbed.errors import TestbedError

    path = tmp_path / "state.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    before = path.read_bytes()
    with pytest.raises(TestbedError) as e:
        Store(path)
    assert "newer testbed (schema 99" in e.value.what and "upgrade" in (e.value.fix or "")
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_a_damaged_state_is_named_and_left_alone(tmp_path: Path, damage: str) -> None:
    """Never silently recreated (the hosts it recorded may be running): one message, the file untouched."""
    from testbed.errors import TestbedError

    path = tmp_path / "state.db"
    st = Store(path)
    st.upsert_testbed("tb", "local", None, "up")
    st.set_hosts("tb", [Host(name=f"n{i}", address=f"10.0.0.{i + 2}") for i in range(50)])
    st.close()
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2 + 100], "garbage": b"\x00junk" * 100}[damage])
    for f in tmp_path.glob("state.db-*"):  # what a crash leaves is only the main file
        f.unlink()
    before = path.read_bytes()
    with pytest.raises(TestbedError) as e:
        Store(path)
    assert "state database is damaged" in e.value.what and "mv state.db" in (e.value.fix or "")
    assert path.read_bytes() == before
