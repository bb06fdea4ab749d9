"""examples/chameleon.ipynb, executed with nbclient in a real Jupyter kernel as Chameleon's JupyterHub runs it: the
kernel's environment is the Hub's (``v3oidcaccesstoken``, an access token that has expired, the Hub's API to renew
it), python-chi talks to the fake Chameleon on 127.0.0.1, and the fake's nodes are real local hosts. The notebook's
parameters are injected after its "parameters" cell, as papermill does; nothing in it knows it is a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from localbed import chameleon_cloud

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "chameleon.ipynb"
pytestmark = pytest.mark.local
nbformat = pytest.importorskip("nbformat", reason="the dev extra brings nbclient, nbformat and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the dev extra brings nbclient, nbformat and ipykernel")

# the artifact's own suite, shipped beside the notebook (the fake's nodes are local hosts: no set-up to apply)
SUITE = """\
name: hello-nodes
placement: {hosts: 2}
steps:
  launch:
    command: "echo rank {{ rank }} of {{ world_size }} on $(hostname) as $(id -un) | tee hello.txt"
outputs: [hello.txt]
checks:
  - name: every rank said hello
    file: hello.txt
    contains: "rank [0-9] of 2 on node[0-9] as cc"
timeouts: {poll: 0.5}
"""
PARAMS = {"NAME": "trovi", "SUITE": "hello-nodes", "SETUP": False, "NODES": 2, "IMAGE": "CC-Ubuntu20.04"}
NOTHING = {"leases": 0, "servers": 0, "fips": 0}


def inject(nb: Any, **params: Any) -> None:
    """papermill's way: a cell tagged ``injected-parameters`` right after the one tagged ``parameters``, which must
    define every name given."""
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    defined = {line.split("=", 1)[0].split(":")[0].strip() for line in nb.cells[at].source.splitlines()
               if "=" in line and not line.startswith((" ", "#"))}
    assert set(params) <= defined, f"the parameters cell lacks {set(params) - defined}"
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)


def output(nb: Any, tag: str) -> str:
    """Everything the cell tagged ``tag`` printed or showed (plain text and Markdown)."""
    cell = next(c for c in nb.cells if tag in c.metadata.get("tags", []))
    return "".join(o.get("text", "") + o.get("data", {}).get("text/markdown", "")
                   + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def test_the_chameleon_notebook_runs_in_the_hubs_environment(local_testbed: Any, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    bed = local_testbed(hosts=2, name="machines")
    with chameleon_cloud(bed, monkeypatch) as fake:
        folder = tmp_path / "artifact"  # the notebook's folder, as Trovi unpacks an artifact
        (folder / "experiments").mkdir(parents=True)
        (folder / "experiments" / "hello-nodes.yml").write_text(SUITE)
        hub = fake.jupyter_env(token_ttl=-60)  # the server started long ago: its token has expired
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "JUPYTERHUB_"))}
        env.update(hub, TESTBED_HOME=str(folder / ".testbed"), PYTHONPATH=str(ROOT))
        nb = nbformat.read(NOTEBOOK, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
        inject(nb, **PARAMS)
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                         resources={"metadata": {"path": str(folder)}})
        left: dict[str, int] | None = None
        try:
            client.execute(env=env)
        finally:
            nbformat.write(nb, tmp_path / "executed.ipynb")  # what the user would have seen, kept for a failure
            left = fake.leaked()
            if left != NOTHING:  # the notebook failed half way: its own destroy, as a user would
                subprocess.run([sys.executable, "-m", "testbed", "destroy", "trovi", "--yes"], cwd=folder, env=env,
                               capture_output=True, timeout=120, check=False)
        assert fake.hub_requests >= 1  # python-chi renewed the access token from the Hub
        assert "v3oidcaccesstoken" in output(nb, "spec")
        check = output(nb, "check")
        refused = [line.split(":")[0].strip() for line in check.splitlines() if ": NO " in line]
        assert "accepted: ok" in check and "JupyterHub" in check and refused == ["images"], check  # bare metal
        assert "cc-snapshot" in check  # the way round a bare-metal site's missing snapshots
        provision = output(nb, "provision")
        assert "lease" in provision and "lease ends 20" in provision and "<Testbed trovi (chameleon, " in provision
        hello = json.loads(output(nb, "exec").replace("'", '"'))
        assert sorted(hello) == ["node0", "node1"] and sorted(hello.values()) == ["cc on node0", "cc on node1"]
        assert "succeeded" in output(nb, "suite")
        assert output(nb, "logs").count("of 2 on node") == 2
        (manifest,) = (folder / "results" / "hello-nodes").glob("*/manifest.json")
        assert f"PosixPath('{manifest.parent.relative_to(folder)}')" in output(nb, "collect")
        report = output(nb, "report")  # the report shown inline, and its checks
        assert "every rank said hello" in report and "(True, [('run succeeded', True)" in report, report
        assert "<Testbed trovi (chameleon, not provisioned, 0 hosts)>" in output(nb, "destroy")
        assert left == NOTHING and not fake.keypairs  # the notebook's last cell left nothing at the site
        text = json.dumps(nb)  # no secret in what the notebook showed, nor in what testbed wrote
        for secret in (hub["OS_ACCESS_TOKEN"], fake.hub_token, *fake.oidc_tokens):
            assert secret not in text
            assert not [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
