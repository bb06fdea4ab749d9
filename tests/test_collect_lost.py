"""Collect of runs whose hosts are gone, and folders without files, without any host: state and folders only.

A run's hosts are gone when its testbed was destroyed, or destroyed and provisioned again since it ran (the
testbed's record is newer than the run), unless its provider keeps hosts across a destroy (lab machines).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from testbed import remote, ssh
from testbed.collect import collect_runs, format_problems, hosts_gone
from testbed.collect import manifest as mf
from testbed.errors import UsageError
from testbed.hosts import Host
from testbed.report.build import ReportResult
from testbed.report.folders import build_index, report_path, scan
from testbed.state import Store

HOSTS = [Host(name="node0", address="127.0.0.1", port=1, user="root"),
         Host(name="node1", address="127.0.0.1", port=1, user="root")]


def _testbed(st: Store, provider: str = "local", name: str = "tb") -> None:
    st.upsert_testbed(name, provider, None, "up")
    st.set_hosts(name, HOSTS)


def _run(st: Store, rid: str, *, testbed: str = "tb", status: str = "succeeded", ago: float = 0.0) -> None:
    """A run recorded ``ago`` seconds before now (its testbed made at most then)."""
    now = time.time() - ago
    info = {"run_dir": f"/root/.testbed-runs/{rid}", "outputs": {"*": ["r.txt"]}, "hosts": ["node0", "node1"]}
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, started, ended, info) "
                   "VALUES (?,?,?,?,?,?,?,?,?)", (rid, "demo", testbed, "{}", status, now, now,
                                                  None if status == "running" else now + 1, json.dumps(info)))


def _reprovisioned(st: Store, provider: str = "local") -> None:
    """The testbed destroyed and provisioned again now: a new record, newer than every run so far."""
    st.delete_testbed("tb")
    _testbed(st, provider)


def _collected(folder: Path, rid: str, hosts: tuple[str, ...] = ("node0", "node1")) -> None:
    """What an earlier collect left: files and this run's manifest naming them."""
    files = []
    for h in hosts:
        (folder / h).mkdir(parents=True)
        (folder / h / "r.txt").write_text(h)
        files.append({"host": h, "path": "r.txt", "sha256": "0" * 64, "size": len(h)})
    mf.write(folder, {"run_id": rid, "suite": "demo", "files": files})


@pytest.fixture
def st(tb_home: Path) -> Store:
    return Store.open_default()


def test_runs_of_an_earlier_testbed_are_lost_and_nothing_is_contacted_or_made(st: Store, tb_home: Path) -> None:
    _testbed(st)
    _run(st, "r-old", ago=5)
    _run(st, "r-half", ago=5)
    _collected(tb_home / "results/demo/r-half", "r-half", hosts=("node0",))
    _run(st, "r-stuck", status="running", ago=5)  # its supervisor went with the hosts: never ends by itself
    _reprovisioned(st)
    t0 = time.monotonic()
    res = {r.run_id: r for r in collect_runs(None, tb_home / "results", all_runs=True, store=st)}
    assert time.monotonic() - t0 < 2  # no host contacted (port 1 on 127.0.0.1 would be an error anyway)
    for rid in ("r-old", "r-stuck"):
        assert res[rid].lost and "destroyed after this run and provisioned again" in res[rid].lost, res[rid]
        assert not res[rid].hosts and not res[rid].ok and not res[rid].problems()
        assert not (tb_home / "results/demo" / rid).exists()
    half = res["r-half"]
    assert half.ok and half.lost is None and not half.hosts
    assert "kept the 1 file collected before (none of node1 had been collected)" in half.notes[0], half.notes
    assert format_problems(list(res.values())) is None  # --all: exit 0, each lost run one line
    assert json.loads((tb_home / "results/demo/r-half/manifest.json").read_text())["files"][0]["host"] == "node0"


def test_a_lost_run_named_is_one_problem_whose_fix_is_not_to_retry(st: Store, tb_home: Path) -> None:
    _testbed(st)
    _run(st, "r-old", ago=5)
    _reprovisioned(st)
    res = collect_runs(["r-old"], tb_home / "results", store=st)
    err = format_problems(res)
    assert err is not None and err.what == f"collect incomplete: {res[0].run_id} cannot be collected any more: " \
                                           f"{res[0].lost}"
    assert "run the same collect again" not in (err.fix or "") and "run their suites again" in (err.fix or "")
    assert not (tb_home / "results").exists()


def test_destroyed_testbed_and_lab_machines(st: Store, tb_home: Path) -> None:
    _testbed(st)
    _run(st, "r1", ago=5)
    st.delete_testbed("tb")
    run = st.run("r1")
    assert run is not None
    gone = hosts_gone(st, run)
    assert gone and "was destroyed after this run" in gone and "provision 'tb' again" in gone
    res = collect_runs(None, tb_home / "results", all_runs=True, store=st)[0]
    assert res.lost == gone and format_problems([res]) is None
    _testbed(st, provider="lab")  # lab machines are the same ones after a destroy: their files are still there
    assert hosts_gone(st, run) is None
    _reprovisioned(st, provider="local")
    assert hosts_gone(st, run) is not None
    _run(st, "r2")  # a run of the testbed as it is now
    run2 = st.run("r2")
    assert run2 is not None and hosts_gone(st, run2) is None


def test_a_run_nothing_could_be_fetched_of_leaves_no_folder(st: Store, tb_home: Path) -> None:
    _testbed(st)
    ssh.write_ssh_config("tb", HOSTS, connect_timeout=2)
    _run(st, "r1")
    res = collect_runs(["r1"], tb_home / "results", store=st, timeout=10)[0]
    assert not res.ok and [h.host for h in res.hosts if h.error] == ["node0", "node1"], res
    assert not (tb_home / "results").exists()  # no manifest-only folder (it read as a passing run)
    remote.close_connections("tb", ["node0", "node1"], remove=True)


def test_report_never_lists_a_folder_without_files(tb_home: Path) -> None:
    results = tb_home / "results"
    _collected(results / "demo/r-ok", "r-ok")
    mf.write(results / "demo/r-empty", {"run_id": "r-empty", "suite": "demo", "files": []})  # an older collect's
    (results / "demo/r-bare/node0").mkdir(parents=True)  # a manifest without a "files" list, and no file at all
    mf.write(results / "demo/r-bare", {"run_id": "r-bare", "suite": "demo"})
    found = scan(results)
    assert [r.run_id for r in found.runs] == ["r-ok"]
    skipped = {p.name: why for p, why in found.skipped}
    assert "manifest lists no collected file" in skipped["r-empty"] and "no collected file" in skipped["r-bare"]
    index = build_index(results)
    assert [r["run_id"] for r in index.runs] == ["r-ok"]
    assert {f for f, _ in index.skipped} == {"demo/r-empty/", "demo/r-bare/"}
    with pytest.raises(UsageError, match="not a run to report"):
        report_path(results / "demo/r-empty")
    suite = report_path(results / "demo")  # the suite folder: its one run
    assert isinstance(suite, ReportResult) and suite.runs == ["r-ok"], suite
