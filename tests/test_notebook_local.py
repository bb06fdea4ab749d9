"""examples/local.ipynb, executed with nbclient in a real Jupyter kernel on local hosts: the whole loop through the
Python API, and its clean-up when a cell fails (the hosts go with the kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localbed import free_subnet

from testbed.state import Store

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "local.ipynb"
pytestmark = pytest.mark.local
nbformat = pytest.importorskip("nbformat", reason="the dev extra brings nbclient, nbformat and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the dev extra brings nbclient, nbformat and ipykernel")


@pytest.fixture
def folder(need_local: None, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty folder with its own state home; its local spec only moves the hosts to a free subnet (and three
    hosts are enough). The testbed is destroyed afterwards, whatever the notebook did."""
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "local.yml").write_text(
        f"provider: {{kind: local, hosts: 3, subnet: {free_subnet()}}}\nuser: root\n"
        "groups: {workers: [node1, node2]}\n")
    env = {**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), "PYTHONPATH": str(ROOT)}
    try:
        yield tmp_path, env
    finally:
        subprocess.run([sys.executable, "-m", "testbed", "destroy", "local", "--yes"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120, check=False)


def execute(nb: Any, cwd: Path, env: dict[str, str]) -> None:
    """Run every cell in a fresh python3 kernel (this interpreter's ipykernel) started in ``cwd``, then shut it
    down as Jupyter does."""
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)


def output(nb: Any, tag: str) -> str:
    """Everything the cell tagged ``tag`` printed or showed as text."""
    cell = next(c for c in nb.cells if tag in c.metadata.get("tags", []))
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def test_the_local_notebook_runs_the_whole_loop(folder: tuple[Path, dict[str, str]]) -> None:
    cwd, env = folder
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    execute(nb, cwd, env)
    assert output(nb, "exec") == "{'node0': 'node0', 'node1': 'node1', 'node2': 'node2'}"
    failure = output(nb, "failure")
    assert "failed on 1 of 3 hosts: node1: exit 1" in failure and "fix:" in failure and "['node1']" in failure
    assert "succeeded" in output(nb, "suite") and output(nb, "logs").count("Hello world") == 3
    (manifest,) = (cwd / "results" / "mpi-hello").glob("*/manifest.json")
    assert f"PosixPath('{manifest.parent.relative_to(cwd)}')" in output(nb, "collect")
    assert (manifest.parent / "report" / "report.md").is_file()
    assert "(True, [('run succeeded', True)" in output(nb, "report")
    assert Store(cwd / ".testbed" / "state.db").testbed("local") is None  # its last cell destroyed it


def test_the_local_notebook_cleans_up_when_a_cell_fails(folder: tuple[Path, dict[str, str]]) -> None:
    cwd, env = folder
    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "exec" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
        "import json, pathlib\n"
        "pathlib.Path('netns.json').write_text(json.dumps([h.facts['netns'] for h in tb.hosts]))\n"
        "raise RuntimeError('a cell that fails')"))
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="a cell that fails"):
        execute(nb, cwd, env)
    names = json.loads((cwd / "netns.json").read_text())
    assert len(names) == 3
    assert Store(cwd / ".testbed" / "state.db").testbed("local") is None
    assert not [n for n in names if Path(f"/run/netns/{n}").exists()]  # the hosts went with the kernel
