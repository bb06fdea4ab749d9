"""One ledger per user: every state home registers in the per-user index (``testbed.homes``) when it first
records a testbed, ``testbed status`` anywhere lists the testbeds of every folder, homes that are gone are
pruned with a note, and the commands that only read never create state.

No root, no cloud: testbeds are recorded by their providers' own ``record_testbed`` (as provision records them)
in temporary folders, under a temporary HOME/XDG_STATE_HOME; the CLI runs as a user runs it (its entry point
in a subprocess, cwd an unrelated empty folder).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localbed import invoke

from testbed import homes, paths
from testbed.errors import TestbedError
from testbed.state import Store

ROOT = Path(__file__).resolve().parents[1]
CHAMELEON = "provider:\n  kind: chameleon\n  count: 3\n"
LAB = "provider:\n  kind: lab\n  hosts:\n    - {name: a, address: 127.0.0.1}\n"


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user with an empty HOME and XDG_STATE_HOME, no TESTBED_HOME; the index path it gets."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home" / "xdg-state"))
    monkeypatch.delenv("TESTBED_HOME", raising=False)
    (tmp_path / "home").mkdir()
    return paths.index_path()


def _record(folder: Path, name: str, spec: str, monkeypatch: pytest.MonkeyPatch,
            resources: tuple[tuple[str, str, dict[str, str]], ...] = (), **info: str) -> Path:
    """Record testbed ``name`` in ``folder``'s state as provision does (the provider's ``record_testbed``), with
    the cloud ``resources`` it holds; the state home."""
    from testbed.handle import Testbed

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inventories").mkdir(exist_ok=True)
    (folder / "inventories" / f"{name}.yml").write_text(spec)
    with monkeypatch.context() as m:
        m.chdir(folder)
        st = Store.open_default()
        Testbed.open(name, st).provider().record_testbed("up", dict(info))
        for kind, rid, extra in resources:
            st.add_resource(name, kind, rid, **extra)
        home = st.path.parent
        st.close()
    return home


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``testbed <args>`` through its entry point (the fast path for status), in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | None]]:
    """Every path under ``root`` with its kind and bytes."""
    out: dict[str, tuple[str, bytes | None]] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = ("dir", None)
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = ("file", Path(p).read_bytes())
    return out


def test_status_anywhere_lists_the_testbeds_of_every_folder(user: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A Chameleon lease recorded in folder a/ and a lab testbed in a TESTBED_HOME elsewhere: `testbed status` in
    an unrelated empty folder lists both with their folders, a/'s cost from a/'s recorded spec (not from a spec
    of the same name here), and creates nothing there."""
    a = tmp_path / "a"
    home_a = _record(a, "cham", CHAMELEON, monkeypatch, (("lease", "L1", {"end": "2099-01-01T00:00:00Z"}),),
                     lease_end="2099-01-01T00:00:00Z", lease_id="L1", lease_name="tb-cham-x")
    custom = tmp_path / "custom-home"
    monkeypatch.setenv("TESTBED_HOME", str(custom))
    assert _record(tmp_path / "c", "lab1", LAB, monkeypatch) == custom
    monkeypatch.delenv("TESTBED_HOME")
    assert json.loads(user.read_text())["homes"] == [str(home_a), str(custom)]

    b = tmp_path / "b"
    (b / "inventories").mkdir(parents=True)
    (b / "inventories" / "cham.yml").write_text(CHAMELEON.replace("count: 3", "count: 7"))  # another testbed
    before = _snapshot(b)
    r = _cli(b, "status", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["testbeds"] == [] and data["state"] is False
    rows = {x["name"]: x for x in data["elsewhere"]["testbeds"]}
    assert set(rows) == {"cham", "lab1"}
    assert rows["cham"]["folder"] == str(a) and rows["cham"]["home"] == str(home_a)
    assert rows["cham"]["cost"]["unit"] == "SU" and rows["cham"]["cost"]["per_hour"] == 3.0  # a/'s spec: 3 nodes
    assert rows["cham"]["lease_end"] == "2099-01-01T00:00:00Z"
    assert rows["lab1"]["folder"] == str(custom) and rows["lab1"]["cost"] is None
    assert data["elsewhere"]["totals"]["SU"]["per_hour"] == 3.0
    assert data["elsewhere"]["pruned"] == [] and data["elsewhere"]["notes"] == []

    r = _cli(b, "status")
    assert r.returncode == 0, r.stderr
    assert "no testbed provisioned in this folder" in r.stdout and "testbeds in other folders" in r.stdout
    assert str(a) in r.stdout and str(custom) in r.stdout and "3.00 SU/h" in r.stdout, r.stdout
    r = _cli(b, "status", "cham")  # the name is known elsewhere: the message says where
    assert r.returncode == 1 and "not provisioned here" in r.stderr and f"cd to {a}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert _snapshot(b) == before  # nothing created here: no .testbed

    r = _cli(a, "status", "--json")  # from a/: its own ledger, the other folder beside it, a/ not twice
    data = json.loads(r.stdout)
    assert [x["name"] for x in data["testbeds"]] == ["cham"]
    assert [x["name"] for x in data["elsewhere"]["testbeds"]] == ["lab1"]


def test_state_from_before_the_index_is_listed_once_status_ran_there(user: Path, tmp_path: Path) -> None:
    """A home that recorded its testbeds before the index existed joins it the first time `status` runs there."""
    old = tmp_path / "old"
    st = Store(old / ".testbed" / "state.db")
    st.upsert_testbed("lab1", "lab", None, "up", {})
    st.close()
    assert not user.exists()
    assert _cli(tmp_path, "status", "--json").returncode == 0
    assert not user.exists()  # an unrelated folder lists nothing and registers nothing
    assert _cli(old, "status").returncode == 0
    r = _cli(tmp_path, "status", "--json")
    assert [x["name"] for x in json.loads(r.stdout)["elsewhere"]["testbeds"]] == ["lab1"]


@pytest.mark.slow
def test_read_only_commands_create_no_state(user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """status, list, show, doctor, logs, report, a dry run and completion leave an empty folder byte-identical (no
    .testbed), and leave a folder's existing state byte-identical (opened read-only: no migration, no -wal). So
    do exec, ssh, setup, extend and forget-host of a testbed that is not provisioned here (refused)."""
    from testbed.cli import complete

    empty = tmp_path / "empty"
    (empty / "results").mkdir(parents=True)
    a = tmp_path / "a"
    _record(a, "lab1", LAB, monkeypatch)
    for folder in (empty, a):
        monkeypatch.chdir(folder)
        before = _snapshot(folder)
        for args in (["status"], ["status", "--json"], ["status", "lab1"], ["status", "nosuch-run-1"]):
            r = _cli(folder, *args)
            assert "Traceback" not in r.stderr, r.stderr
            if args == ["status", "--json"]:  # the state was read: a/'s testbed is a/'s here, elsewhere from empty/
                data = json.loads(r.stdout)
                rows = data["testbeds"] if folder == a else data["elsewhere"]["testbeds"]
                assert [x["name"] for x in rows] == ["lab1"]
        for args in (["list"], ["list", "testbeds", "--json"], ["list", "runs"], ["list", "suites"],
                     ["list", "profiles"], ["show", "mpi-hello"], ["doctor"], ["logs", "nosuch-run-1"],
                     ["report", "results"], ["run", "mpi-hello", "--on", "local", "--dry-run", "--json"],
                     ["status", "lab1", "--json"]):
            _, out, exc = invoke(*args)
            assert exc is None or isinstance(exc, (SystemExit, TestbedError)), (args, exc)
            if args[:2] == ["list", "testbeds"] and folder == a:
                assert {r["name"]: r["status"] for r in json.loads(out)}["lab1"] == "up"
        if folder == empty:  # a command on a testbed of another folder: refused, nothing created to say so
            for args in (["exec", "lab1", "--", "true"], ["ssh", "lab1"], ["setup", "lab1"],
                         ["extend", "lab1", "--off"], ["forget-host", "lab1", "a"]):
                r = _cli(folder, *args)
                assert r.returncode == 1 and "not provisioned here" in r.stderr and f"cd to {a}" in r.stderr, r.stderr
        assert complete.testbeds("l") and complete.runs("") == [] and complete.hosts(
            type("Ctx", (), {"params": {"name": "lab1"}})(), "") == []
        del exc
        gc.collect()  # what the commands opened in this process is closed, as a CLI process closes it at exit
        assert _snapshot(folder) == before, folder
    assert not (empty / ".testbed").exists()


def test_refused_destroy_and_stop_create_no_state(user: Path, tmp_path: Path) -> None:
    """destroy of a testbed with neither spec nor state here, and stop of a run this folder never had, are refused
    with the usual message and leave an empty folder empty (no .testbed to say nothing was there)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, says in ((["destroy", "nosuch", "--yes"], "no testbed named 'nosuch'"),
                       (["stop", "nosuch-run-1"], "no run 'nosuch-run-1'")):
        r = _cli(empty, *args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert list(empty.iterdir()) == [], (args, list(empty.iterdir()))
    assert not user.exists()


def test_any_refused_command_leaves_a_folder_without_state_as_it_was(user: Path, tmp_path: Path) -> None:
    """Every command refused before it recorded anything, in a folder with no state: the refusal, and no
    .testbed left behind (the commands that write state open it before they judge their arguments)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, says in ((["provision", "nosuch"], "no testbed named 'nosuch'"),
                       (["collect", "nosuch-run"], "no run with id nosuch-run"),
                       (["run", "mpi-hello", "--on", "nosuch"], "no testbed named 'nosuch'"),
                       (["provision", "local", "--repair", "zz"], "is not provisioned")):
        r = _cli(empty, *args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert list(empty.iterdir()) == [], (args, list(empty.iterdir()))


def test_discarding_keeps_a_home_with_anything_recorded_or_any_other_file(tmp_path: Path) -> None:
    from testbed.state import discard_if_unused

    home = tmp_path / "h"
    Store(home / "state.db").close()
    (home / "keys").mkdir()
    assert not discard_if_unused(home) and home.is_dir()  # a file of its own: kept
    (home / "keys").rmdir()
    st = Store(home / "state.db")
    with st.tx() as db:
        db.execute("INSERT INTO campaigns VALUES ('c', 's', 't', '[]', 'running', 0, '{}')")
    st.close()
    assert not discard_if_unused(home) and home.is_dir()  # a row: kept
    with Store(home / "state.db").tx() as db:
        db.execute("DELETE FROM campaigns")
    assert discard_if_unused(home) and not home.exists()


def test_a_read_only_store_refuses_writes_and_an_empty_one_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "h" / "state.db"
    st = Store.open_existing(tmp_path / "h")
    assert not st.exists and st.testbeds() == [] and st.run_rows() == []
    with pytest.raises(RuntimeError, match="read-only"):
        st.upsert_testbed("x", "lab", None, "up")
    assert not (tmp_path / "h").exists()
    Store(db).upsert_testbed("x", "lab", None, "up")
    ro = Store.open_existing(tmp_path / "h")
    assert ro.exists and [t["name"] for t in ro.testbeds()] == ["x"]
    import sqlite3

    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # SQLite itself refuses, not only tx()
        ro.query("DELETE FROM testbeds")


def test_a_removed_home_is_pruned_with_a_note(user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    a, gone = tmp_path / "a", tmp_path / "gone"
    home_a = _record(a, "lab1", LAB, monkeypatch)
    home_gone = _record(gone, "lab2", LAB, monkeypatch)
    shutil.rmtree(gone)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = _cli(elsewhere, "status")
    assert r.returncode == 0, r.stderr
    assert f"note: forgot 1 folder whose state was deleted ({gone})" in r.stdout, r.stdout
    assert json.loads(user.read_text())["homes"] == [str(home_a)]
    r = _cli(elsewhere, "status", "--json")  # said once: it is gone from the index now
    data = json.loads(r.stdout)["elsewhere"]
    assert data["pruned"] == [] and [x["name"] for x in data["testbeds"]] == ["lab1"]
    assert str(home_gone) not in r.stdout


def test_status_says_other_folders_deleted_states_in_one_line_at_the_end_and_never_wraps_a_path(
        user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three deleted folders and a testbed in a deep folder under HOME, `status` at 80 columns from an empty
    folder: the table comes first, every table line fits in 80 columns, the folder is one line (``~``-relative,
    cut in its middle), and the deleted states are one short line after it (not a paragraph each)."""
    import shutil

    deep = tmp_path / "home" / "projects" / "a-rather-long-project-folder-name" / "and" / "deeper" / "experiment-x"
    _record(deep, "lab1", LAB, monkeypatch)
    for i in range(3):
        gone = tmp_path / "home" / "scratch" / f"gone{i}"
        _record(gone, "lab2", LAB, monkeypatch)
        shutil.rmtree(gone)
    here = tmp_path / "home" / "empty"
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "testbed", "status"], cwd=here, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    table = [ln for ln in lines if ln[:1] in "┏┃┡│├└+|"]
    assert table and all(len(ln) <= 80 for ln in table), r.stdout
    folder = [ln.split("│")[2].strip() for ln in table if ln.startswith("│") and "lab1" in ln]
    assert folder and folder[0].startswith("~/p") and folder[0].endswith("…/experiment-x"), r.stdout
    assert sum("experiment-x" in ln or "deeper" in ln for ln in table) <= 1, r.stdout  # the path is never wrapped
    notes = [i for i, ln in enumerate(lines) if "gone" in ln]
    assert len(notes) == 1 and notes[0] > lines.index(table[-1]), r.stdout
    assert lines[notes[0]].startswith("note: forgot 3 folders whose state was deleted (~/scratch/gone0"), r.stdout
    assert len(lines[notes[0]]) <= 100 and "no longer exists" not in r.stdout, r.stdout


def test_an_unreadable_index_is_said_and_rewritten(user: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    user.parent.mkdir(parents=True)
    user.write_text("{not json")
    r = _cli(tmp_path, "status")
    assert r.returncode == 0 and "index of state homes" in r.stdout and "unreadable" in r.stdout, r.stdout
    home = _record(tmp_path / "a", "lab1", LAB, monkeypatch)
    assert homes.read() == ([str(home)], None)


WRITER = """
import sys, time, pathlib
from testbed import homes
go, base, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
for _ in range(4000):
    if go.exists():
        break
    time.sleep(0.002)
for i in range(n):
    note = homes.register(base / f"h{i}" / ".testbed")
    assert note is None, note
"""

READER = """
import json, sys, time, pathlib
index, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
reads = bad = 0
for _ in range(200000):
    if stop.exists():
        break
    try:
        text = index.read_text()
    except FileNotFoundError:
        continue
    reads += 1
    try:
        json.loads(text)["homes"]
    except ValueError:
        bad += 1
print(reads, bad)
"""


def test_index_writers_at_once_all_end_up_listed_and_readers_never_see_a_part(user: Path, tmp_path: Path) -> None:
    """Two processes registering 40 homes each at the same moment: all 80 listed; a reader polling the index all
    the while always reads a whole JSON document; no temporary file is left; the index is the user's only."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, "-c", READER, str(user), str(stop)], env=env, stdout=subprocess.PIPE,
                              text=True)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(go), str(tmp_path / f"w{k}"), "40"], env=env)
               for k in range(2)]
    time.sleep(0.5)  # both started and waiting
    go.touch()
    try:
        assert [w.wait(timeout=120) for w in writers] == [0, 0]
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    listed, note = homes.read()
    want = {os.path.realpath(tmp_path / f"w{k}" / f"h{i}" / ".testbed") for k in range(2) for i in range(40)}
    assert note is None and set(listed) == want and len(listed) == 80
    reads, bad = map(int, out.split())
    assert reads > 0 and bad == 0
    assert sorted(p.name for p in user.parent.iterdir()) == ["homes.json", "homes.json.lock"]
    assert user.stat().st_mode & 0o777 == 0o600


def test_status_tables_keep_moments_whole_and_shorten_paths_to_the_width(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """At 60 columns: the runs table keeps each start time on one line, and a path column is cut in its middle
    (the home written ~) instead of wrapping over several lines."""
    from testbed.cli.hot import _print_runs
    from testbed.cli.output import Plain

    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("HOME", "/home/ana")
    _print_runs([{"id": "fault-drill-20260101-120000-ab12", "suite": "fault-drill", "testbed": "local",
                  "status": "failed", "started": 1_767_268_800.0, "reason": "rank 1 exited 3 after the collective"}])
    out = capsys.readouterr().out
    assert "2026-01-01T12:00:00Z" in out, out
    Plain().table("t", ("name", "folder"), [["a", "/home/ana/projects/some-long-project/and/deeper/experiment-x"]],
                  paths=("folder",))
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith(("│", "|"))]
    assert len(rows) == 1 and "~/" in rows[0] and "…" in rows[0] and rows[0].rstrip("│| ").endswith("experiment-x"), \
        out
    assert all(len(ln) <= 60 for ln in out.splitlines()), out
