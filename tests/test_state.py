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
    assert st.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == "4" and st.schema_version == 4
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
    assert st.schema_version == 4
    assert [h.name for h in st.hosts("old")] == ["node0"] and st.testbed("old")["status"] == "up"
    assert st.query("SELECT status FROM runs")[0]["status"] == "succeeded"
    assert {r["name"] for r in st.query("SELECT name FROM sqlite_master WHERE type='index'")} >= {"runs_campaign"}
    st.close()
    assert Store(path).schema_version == 4  # opening again changes nothing


def _state_from_sample(tmp_path: Path, sample: str) -> Path:
    """A state file built by the SQL an earlier testbed's state amounted to (tests/samples/state/)."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript((Path(__file__).parent / "samples" / "state" / sample).read_text())
    db.close()
    return path


def test_a_version_1_state_reads_as_records_after_migration(tmp_path: Path) -> None:
    """Schema 1 as the previous testbed wrote it: migrated, then every table is readable through the named
    methods (typed run records included), and writable."""
    from testbed.records import Rank, RunInfo

    path = _state_from_sample(tmp_path, "v1.sql")
    st = Store(path)
    assert st.schema_version == 4 and st.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == "4"
    assert st.testbed("old")["info"] == {"subnet": "10.213.7.0/24"}  # type: ignore[index]
    assert [(h.name, h.address, h.groups) for h in st.hosts("old")] == [("node0", "10.213.7.2", ["master"])]
    assert [r["id"] for r in st.resources("old", "netns")] == ["tb-old-node0"]
    old, drill = "mpi-hello-20231114-221320-ab12", "fault-drill-20231114-221500-cd34"
    assert st.run_ids() == [old, drill] and st.run_ids(newest_first=True, limit=1) == [drill]
    hello = st.run(old)
    assert hello is not None and hello.status == "succeeded" and hello.info == RunInfo() and hello.params == {}
    run = st.run(drill)
    assert run is not None and run.campaign == "fault-drill-0123abcd" and run.params == {"ranks": 1}
    assert run.info.fired == ["kill-rank"] and run.info.supervisor and run.info.supervisor.pid == 4242
    assert run.info.ranks == [Rank(rank=0, host="node0", address="10.213.7.2",
                                   command="python3 fault_drill.py --rank 0")]
    assert [(r.host, r.rank, r.status, r.exit_code) for r in st.run_ranks(drill)] == [("node0", 0, "failed", 137)]
    assert [(e.seq, e.kind, e.detail["signal"]) for e in st.events(drill)] == [(2, "fault", "SIGKILL")]
    camp = st.campaign("fault-drill-0123abcd")
    assert camp is not None and camp.info.faults == ["kill-rank"] and [p.run_id for p in camp.points] == [drill]
    assert st.campaign_of_runs() == {drill: "fault-drill-0123abcd"}
    assert [(f.host, f.path, f.size) for f in st.collected(drill)] == [("node0", "rank0.out", 120)]
    assert st.update_run(drill, info=RunInfo(attempt=1)) and st.run(drill).info.fired == ["kill-rank"]  # type: ignore[union-attr]
    st.close()


def test_a_version_2_state_opens_unchanged_and_reads_as_records(tmp_path: Path) -> None:
    """Schema 2 as testbed wrote it before typed records (a finished run with a fault, recovery and a relaunch,
    its campaign and collected files): no migration, every record readable, info given back as stored."""
    import json

    from testbed.records import RunInfo

    path = _state_from_sample(tmp_path, "v2.sql")
    st = Store(path)
    assert st.schema_version == 4
    rid = "fault-drill-20250101-120000-abcd"
    run = st.run(rid)
    assert run is not None and run.status == "succeeded" and run.campaign == "fault-drill-0123abcd"
    stored = json.loads(st.query("SELECT info FROM runs WHERE id=?", (rid,))[0]["info"])
    assert run.info.to_json() == stored and run.to_json()["info"] == stored
    assert run.info.hosts == ["node0", "node1"] and run.info.world_size == 2 and run.info.attempt == 1
    assert [r.attempt for r in run.info.ranks or []] == [1, 1] and run.info.launched_at
    assert [r.status for r in st.run_ranks(rid)] == ["succeeded", "succeeded"]
    assert [e.kind for e in st.events(rid)] == ["started", "fault", "ended"]
    assert [e.kind for e in st.events(rid, after=2)] == ["ended"]
    camp = st.campaign("fault-drill-0123abcd")
    assert camp is not None and [p.status for p in camp.points] == ["succeeded", "todo"]
    assert [f.path for f in st.collected(rid)] == ["rank0.out", "train_log.csv"]
    assert [f.path for f in st.collected(rid, "node1", verified=True)] == []  # its transfer is pending
    assert [h.facts for h in st.hosts("old")] == [{"cpus": 2}, {"cpus": 2}]
    st.update_run(rid, info=RunInfo(attempt=2))
    after = json.loads(st.query("SELECT info FROM runs WHERE id=?", (rid,))[0]["info"])
    assert after == {**stored, "attempt": 2}  # a merge: every other key kept as it was


def test_a_version_3_state_migrates_and_its_collected_rows_are_never_quick_checked(tmp_path: Path) -> None:
    """Schema 3 (collected rows without the host's stat of their files): migrated to 4, its rows read back
    without a stamp, so the collector's known lines leave them out (each file is hashed once more on its host,
    never trusted on size and mtime alone); a row recorded now keeps the host's mtime, ctime and inode."""
    from testbed.collect.transfer import Ctx, known_files

    st = Store(_state_from_sample(tmp_path, "v3.sql"))
    assert st.schema_version == 4 and st.query("SELECT value FROM meta WHERE key='schema_version'")[0][0] == "4"
    from testbed.state import FileStamp
    rid = "fault-drill-20250101-120000-abcd"
    assert [(f.path, f.size, f.stamp) for f in st.collected(rid)] == [("rank0.out", 120, None),
                                                                      ("train_log.csv", -1, None)]
    folder = tmp_path / "results"
    (folder / "node0").mkdir(parents=True)
    (folder / "node0" / "rank0.out").write_bytes(b"x" * 120)  # its local copy, of the recorded size
    ctx = Ctx(st, threading.Lock(), "old", rid, folder, {}, None, 5, 5, None, False)
    assert known_files(ctx, "node0") == []
    stamp = FileStamp(mtime=1735732820, ctime_ns=1735732820123456789, ino=4242)
    st.record_collected(rid, "node0", [("rank0.out", "c" * 64, 120, stamp)], 1735732900.0)
    assert [f.stamp for f in st.collected(rid, "node0")] == [stamp]
    assert known_files(ctx, "node0") == [(120, 1735732820, 1735732820123456789, 4242, "c" * 64, "rank0.out")]


def test_run_writes_go_through_named_columns(tmp_path: Path) -> None:
    from testbed.records import RunInfo, RunRecord

    st = Store(tmp_path / "state.db")
    st.add_run(RunRecord(id="r1", suite="s", testbed="tb", status="pending", created=1.0,
                         info=RunInfo(hosts=["a", "b"])), [("a", 0), ("b", 1)])
    assert st.query("SELECT info FROM runs")[0]["info"] == '{"hosts": ["a", "b"]}'  # only what was set
    with pytest.raises(ValueError, match="not a column"):
        st.update_run("r1", **{"status='x' --": "y"})  # type: ignore[arg-type]
    st.set_rank("r1", "a", 0, status="failed", exit_code=3, reason="exit 3")
    st.end_active_ranks("r1", "stopped", 5.0, "run ended", keep_reason=True)
    assert [(r.status, r.reason, r.ended) for r in st.run_ranks("r1")] == [("failed", "exit 3", None),
                                                                          ("stopped", "run ended", 5.0)]
    assert st.update_run("r1", status="succeeded", ended=6.0, only_active=True)
    assert not st.update_run("r1", status="failed", only_active=True)  # ended: left alone
    assert not st.update_run("nope", status="failed")
    assert st.run("r1").status == "succeeded"  # type: ignore[union-attr]


def test_an_unreadable_run_row_is_one_error_naming_it(tmp_path: Path) -> None:
    from testbed.errors import TestbedError

    st = Store(tmp_path / "state.db")
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, info) "
                   "VALUES ('r1', 's', 'tb', '{}', 'failed', 0, '{\"hosts\": 5}')")
    with pytest.raises(TestbedError) as e:
        st.run("r1")
    assert "run 'r1'" in e.value.what and "info.hosts" in e.value.what and e.value.where == str(st.path)


def test_no_sql_outside_the_state_module() -> None:
    """All SQL lives in testbed/state.py: other modules call Store's named methods."""
    import re

    import testbed

    root = Path(testbed.__file__).parent
    sql = re.compile(r"\b(SELECT\s.+\sFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
                     r"CREATE\s+(TABLE|INDEX))\b|\.(execute|executemany|executescript|query|tx)\(")
    found = [f"{p.relative_to(root)}:{i}: {ln.strip()}" for p in sorted(root.rglob("*.py"))
             if p != root / "state.py" for i, ln in enumerate(p.read_text().splitlines(), 1) if sql.search(ln)]
    assert found == []


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


def test_active_statuses_match_the_run_models() -> None:
    """state.py keeps its own copy of ACTIVE so that opening the store does not import pydantic."""
    from testbed import records, state

    assert state.ACTIVE == records.ACTIVE


def test_a_watcher_waits_for_the_ended_event_a_finishing_supervisor_records_last(tmp_path: Path) -> None:
    """The supervisor marks the run ended, then records its "ended" event: a watcher that sees the run ended in
    between still yields that event (``testbed run`` once printed no "ended" line then; tests/test_tutorial.py
    found it under load)."""
    from testbed.records import RunInfo, RunRecord
    from testbed.run import bookkeeping as rs
    from testbed.run import runner

    st = Store(tmp_path / "state.db")
    st.add_run(RunRecord(id="r1", suite="s", testbed="tb", status="running", created=1.0,
                         info=RunInfo(hosts=["a"])), [("a", 0)])
    rs.event(st, "r1", "started", "a")
    assert st.update_run("r1", status="succeeded", ended=2.0, only_active=True)
    late = threading.Timer(0.3, lambda: rs.event(Store(tmp_path / "state.db"), "r1", "ended", None,
                                                 status="succeeded"))
    late.start()
    kinds = [ev.kind for ev in runner.watch("r1", store=st)]
    late.join()
    assert kinds == ["started", "ended"], kinds
