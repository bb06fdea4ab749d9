"""The Python API as a user meets it: docs/api.md's example (and the README's), run as written from an empty folder
against a real local testbed; failures that raise as in Fabric, with warn=True to get the results back; errors
that print what, where and fix when nobody catches them; the old names with their DeprecationWarning; and the
pieces a notebook relies on (pinned host keys in Fabric, the HTML views)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from localbed import free_subnet

from testbed.errors import TestbedError

ROOT = Path(__file__).resolve().parents[1]




def python_example(page: str) -> str:
    """The first ``python`` block of the Python section of ``page`` (docs/api.md, README.md), as written."""
    text = (ROOT / page).read_text()
    section = re.split(r"^#+ From Python.*$", text, maxsplit=1, flags=re.M)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_import_testbed_loads_nothing_else() -> None:
    code = "import sys, testbed; print(sorted(m for m in sys.modules if m.startswith(('testbed.', 'fabric', " \
           "'typer', 'pydantic'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_testbed_is_the_cli_error_as_an_exception(tb_home: Path) -> None:
    import testbed

    with pytest.raises(testbed.TestbedError) as ei:
        testbed.open("nosuch")
    assert ei.value.what == "no testbed named 'nosuch'" and ei.value.fix


def test_an_uncaught_error_shows_what_where_and_fix(tb_home: Path) -> None:
    """A script that does not catch it (or a notebook cell) shows the fix, as the CLI does; repr names all three."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", "import testbed; testbed.open('nosuch')"], cwd=tb_home, env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1
    tail = r.stderr[r.stderr.index("testbed.errors.UsageError: "):]
    assert "no testbed named 'nosuch'" in tail and "\n  where: " in tail and "\n  fix:   " in tail, r.stderr
    e = TestbedError("what", where="here", fix="do this")
    assert repr(e) == "TestbedError('what', where='here', fix='do this')" and str(e) == e.render()


def test_the_old_names_warn_before_touching_anything(tb_home: Path) -> None:
    import testbed
    from testbed.errors import UsageError

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text("provider: {kind: lab, hosts: [{name: a1, address: 10.1.2.3}]}\n")
    tb = testbed.open("lab1")
    with pytest.warns(DeprecationWarning, match=r"Testbed.run\(command\) is deprecated.*Testbed.exec"), \
            pytest.raises(UsageError, match="has no hosts"):
        tb.run("hostname")
    with pytest.warns(DeprecationWarning, match=r"Testbed.start\(suite\) is deprecated.*run_suite"), \
            pytest.raises(UsageError, match="no suite"):
        tb.start("nosuch-suite")


def test_open_in_an_empty_folder_creates_no_state_until_something_is_recorded(tb_home: Path) -> None:
    """Looking at a testbed (its repr, hosts, record, HTML view) from a folder without state leaves it without
    one; the first write creates the state file, and what it wrote reads back from a fresh open."""
    import testbed
    from testbed.state import Store

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text("provider: {kind: lab, hosts: [{name: a1, address: 10.1.2.3}]}\n")
    tb = testbed.open("lab1")
    assert "not provisioned" in repr(tb) and tb.hosts == [] and tb.store.testbed("lab1") is None
    assert "lab1" in tb._repr_html_()  # a notebook's view of it
    assert not (tb_home / ".testbed").exists()
    other = Store.open_lazy()  # a second stand-in (another handle) of the same folder
    tb.store.upsert_testbed("lab1", "lab", None, "up", {})  # what provision records first
    assert (tb_home / ".testbed" / "state.db").is_file()
    assert tb.store.testbed("lab1")["status"] == "up"
    assert other.testbed("lab1")["status"] == "up"  # read from the file now, not from its empty stand-in
    other.close()
    again = Store.open_existing()
    assert again.exists and again.testbed("lab1")["status"] == "up"
    again.close()
    assert repr(testbed.open("lab1")).startswith("<Testbed lab1 (lab, up,")


def test_dir_shows_the_public_names_and_not_typing_helpers() -> None:
    import testbed

    names = dir(testbed)
    assert {"open", "Testbed", "Run", "TestbedError", "UsageError", "HostsFailed", "RunFailed"} <= set(names)
    assert not {"Any", "TYPE_CHECKING", "annotations", "Store"} & set(names), names
    assert all(hasattr(testbed, n) for n in names)


@pytest.mark.parametrize("page", ["docs/api.md", "README.md"])
def test_python_example_runs_as_written(need_local: None, tmp_path: Path, page: str) -> None:
    """The block in the page, unchanged, in a fresh interpreter, from a folder that holds only the local spec (so
    that it gets a free subnet); it makes what it reads and cleans up after itself."""
    code = python_example(page)
    if page == "README.md" and code == python_example("docs/api.md"):
        return  # the same text, run as docs/api.md's
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "local.yml").write_text(
        f"provider: {{kind: local, hosts: 3, subnet: {free_subnet()}}}\nuser: root\n"
        "groups: {workers: [node1, node2]}\n")
    script = code + textwrap.dedent("""
        # what the example did, checked afterwards
        import json, pathlib
        print(json.dumps({"hello": {h: r.stdout for h, r in hello.items()},
                          "copies": {h: p.read_text() for h, p in copies.items()}, "missing": sorted(missing),
                          "kernel": kernel, "report": str(report.path), "run": run.id, "status": run.status}))
    """)
    env = {**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600, check=False)
        left = subprocess.run([sys.executable, "-m", "testbed", "status", "local"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    finally:  # never leave the hosts running, whatever the example did
        subprocess.run([sys.executable, "-m", "testbed", "destroy", "local", "--yes"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    hosts = ["node0", "node1", "node2"]
    assert out["hello"] == {h: f"{h}\n" for h in hosts}
    assert out["copies"] == dict.fromkeys(hosts, "hello from the controller\n")
    assert out["missing"] == hosts and out["status"] == "succeeded"
    shown = r.stdout  # the HostsFailed the example printed: what, where and fix
    assert "exec 'exit 3' failed on 1 of 1 host: node0: exit 3" in shown and "fix:" in shown, shown
    assert out["kernel"].strip() == os.uname().release  # the hosts share this machine's kernel
    assert (tmp_path / out["report"]).is_file()
    assert (tmp_path / "results" / "mpi-hello" / out["run"] / "manifest.json").is_file()
    assert left.returncode == 1 and "not provisioned" in left.stdout + left.stderr, left.stdout + left.stderr


FLUNK = """\
name: flunk
placement: {hosts: 1}
steps:
  launch:
    command: "echo trying; exit 3"
timeouts: {poll: 0.5}
"""


def test_failures_raise_as_in_fabric_and_warn_returns_them(local_testbed: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """exec, put, get and run_suite raise on a failed host or run, with every host's result, as Fabric's
    Group.run raises GroupException; warn=True gives the same results back, as Fabric's warn=True does."""
    from fabric.exceptions import GroupException
    from invoke.exceptions import UnexpectedExit

    import testbed
    from testbed.handle import Testbed

    bed = local_testbed(hosts=3)  # type: ignore[operator]
    monkeypatch.setenv("TESTBED_HOME", str(bed.home))
    monkeypatch.chdir(bed.cwd)
    tb = Testbed.open(bed.name, bed.store)
    cmd = "test $(hostname) != node1"
    with pytest.raises(GroupException) as fe:
        tb.group().run(cmd, hide=True, in_stream=False)
    # the hosts where the command ran and failed (a paramiko connection that gives up under load is another matter)
    fabric_failed = {c.original_host for c, r in fe.value.result.items() if isinstance(r, UnexpectedExit)}
    with pytest.raises(testbed.HostsFailed) as ei:
        tb.exec(cmd)
    assert set(ei.value.failed) == fabric_failed == {"node1"}
    assert {h: r.exit_code for h, r in ei.value.results.items()} == {"node0": 0, "node1": 1, "node2": 0}
    assert str(ei.value).startswith(f"exec {cmd!r} failed on 1 of 3 hosts: node1: exit 1\n  where: testbed {bed.name}")
    assert "warn=True" in (ei.value.fix or "")
    fabric_warned = tb.group().run(cmd, hide=True, in_stream=False, warn=True)
    warned = tb.exec(cmd, warn=True)
    assert set(warned.failed) == {c.original_host for c, r in fabric_warned.items() if not r.ok} == {"node1"}
    assert not warned.ok and set(warned.succeeded) == {"node0", "node2"}
    with pytest.warns(DeprecationWarning):  # the old name: failures returned, as before
        assert set(tb.run(cmd).failed) == {"node1"}

    (bed.cwd / "notes.txt").write_text("n\n")
    with pytest.raises(testbed.HostsFailed) as ei:
        tb.put("notes.txt", "/nonexistent-dir/notes.txt")
    assert set(ei.value.failed) == {"node0", "node1", "node2"} and "put notes.txt" in ei.value.what
    assert tb.put("notes.txt", "/nonexistent-dir/notes.txt", "node0", warn=True).failed.keys() == {"node0"}
    tb.exec("echo here > /tmp/only-here", "node0")
    with pytest.raises(testbed.HostsFailed) as ei:
        tb.get("/tmp/only-here", "fetched")
    assert set(ei.value.failed) == {"node1", "node2"} and ei.value.results["node0"].ok
    got = tb.get("/tmp/only-here", "fetched", warn=True)
    assert {h: p.read_text() for h, p in got.items()} == {"node0": "here\n"} and set(got.failed) == {"node1", "node2"}

    (bed.cwd / "experiments").mkdir(exist_ok=True)
    (bed.cwd / "experiments" / "flunk.yml").write_text(FLUNK)
    with pytest.raises(testbed.RunFailed) as ri:
        tb.run_suite("flunk")
    run = ri.value.run
    assert run.status == "failed" and ri.value.code != 0 and run.id in ri.value.what and "where:" in str(ri.value)
    again = tb.run_suite("flunk", warn=True)
    assert again.status == "failed" and again.id != run.id
    res = tb.collect([run, again.id])
    assert [r.run_id for r in res] == [run.id, again.id] and all(r.ok for r in res)
    assert "trying" in "".join(ln.text for ln in again.logs())

    bed.provider.kill_host("node2")  # set-up on a host that does not answer: raises, the set-up's result in it
    with pytest.raises(testbed.HostsFailed) as ei:
        tb.setup(roles=["shell"], limit=["node2"])
    assert set(ei.value.failed) == {"node2"} and not ei.value.results.ok and "node2: unreachable" in ei.value.what
    assert not tb.setup(roles=["shell"], limit=["node2"], warn=True).ok


def test_fabric_connection_refuses_a_key_that_is_not_the_pinned_one(local_testbed: object,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import paramiko

    from testbed.handle import Testbed

    bed = local_testbed(hosts=2)  # type: ignore[operator]
    monkeypatch.setenv("TESTBED_HOME", str(bed.home))
    monkeypatch.chdir(bed.cwd)
    tb = Testbed.open(bed.name, bed.store)
    with tb.connection("node0") as c:
        assert c.run("hostname", hide=True, in_stream=False).stdout.strip() == "node0"
    kh = bed.home / "testbeds" / bed.name / "known_hosts"
    pinned = kh.read_text()
    other = next(ln for ln in pinned.splitlines() if ln.startswith("node1 ")).split(" ", 1)[1]
    kh.write_text("".join(f"node0 {other}\n" if ln.startswith("node0 ") else ln + "\n"
                          for ln in pinned.splitlines()))  # node1's key pinned for node0
    with pytest.raises(paramiko.SSHException), tb.connection("node0") as c:
        c.run("true", hide=True, in_stream=False)
    html = tb._repr_html_()
    assert "<table>" in html and "node1" in html and bed.name in repr(tb)
    with pytest.raises(TestbedError) as ei:
        tb.connection("node9")
    assert "no host 'node9'" in ei.value.what


_FLAG = re.compile(r"(?<![\w-])--?[a-z][\w-]*")  # --dry-run, --on, -p: what only the command line takes


def test_api_errors_name_methods_not_command_line_flags(tb_home: Path) -> None:
    """From Python, a refusal's what, where and fix name what a script can call (provision(), extend(4), exec(...),
    setup(limit=...)), never a flag such as --dry-run; the same refusal from the testbed command keeps its flags."""
    from localbed import invoke

    import testbed

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text("provider: {kind: lab, hosts: [{name: a1, address: 10.1.2.3}]}\n")
    tb = testbed.open("lab1")
    seen = []
    for call, fix in ((lambda: tb.run_suite("mpi-hello"), "provision it first: testbed.open('lab1').provision()"),
                      (lambda: tb.extend(), "extend(4) or extend(expire='8h')"),
                      (lambda: tb.exec("  "), "exec('hostname')"),
                      (lambda: tb.setup("base"), "provision it first: testbed.open('lab1').provision()")):
        with pytest.raises(TestbedError) as ei:
            call()
        e = ei.value
        assert e.fix == fix, e.render()
        assert not _FLAG.search(f"{e.what}\n{e.where}\n{e.fix}"), e.render()
        seen.append(e.what)
    assert seen[0] == "testbed 'lab1' is not provisioned"
    code, _, exc = invoke("run", "mpi-hello", "--on", "lab1")  # the command line: its own words
    assert code == 1 and isinstance(exc, TestbedError) and "--dry-run" in str(exc.fix), exc
    with pytest.raises(TestbedError) as ei:  # and the API's again after it
        tb.run_suite("mpi-hello")
    assert "--dry-run" not in str(ei.value.fix)
