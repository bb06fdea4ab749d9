"""The Python API as a user meets it: the README's example, run as written against a real local testbed, and the
pieces a notebook relies on (errors as exceptions, pinned host keys in Fabric, the HTML views)."""

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


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
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


def test_readme_example_runs_as_written(need_local: None, tmp_path: Path) -> None:
    """The block in the README, unchanged, in a fresh interpreter; the local spec gets a free subnet."""
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "local.yml").write_text(
        f"provider: {{kind: local, hosts: 3, subnet: {free_subnet()}}}\nuser: root\n")
    (tmp_path / "notes.txt").write_text("hello from the controller\n")
    script = readme_example() + textwrap.dedent("""
        # what the example did, checked afterwards
        import json, pathlib
        print(json.dumps({"hosts": sorted(hello), "copies": {h: p.read_text() for h, p in copies.items()},
                          "kernel": kernel, "report": str(report.path), "run": run.id}))
    """)
    env = {**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600, check=False)
    finally:  # never leave the hosts running, whatever the example did
        subprocess.run([sys.executable, "-m", "testbed", "destroy", "local", "--yes"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hosts"] == ["node0", "node1", "node2"]
    assert out["copies"] == {f"node{i}": f"node{i}\n" for i in range(3)}
    assert out["kernel"].strip() == os.uname().release  # the hosts share this machine's kernel
    assert (tmp_path / out["report"]).is_file()
    assert (tmp_path / "results" / "mpi-hello" / out["run"] / "manifest.json").is_file()


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
