"""The tesla suite's MPI hello, for real: the artifact's own ``setup/hello_mpi.c`` on a five-host lab replica.

Five local hosts stand in for ecetesla0-4: a lab-provider testbed whose hosts carry the real names, a
non-root lab account whose login shell is tcsh (the lab machines' default, which the artifact's
``change_cn_shell.sh`` replaces with zsh; the profile keeps it). The tesla profile's ssh_mesh, shell and mpi roles
set them up (real Ansible through that tcsh), then ``testbed run tesla -p task=hello`` runs the repository's code, given
with ``--source vit=<the unpacked artifact>``, across all five, and the results are collected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artifacts import artifact

pytestmark = [pytest.mark.local, pytest.mark.slow]

USER = "h3trinh"  # the artifact's scripts' WATID
NAMES = [f"ecetesla{i}" for i in range(5)]


def _cli(bed: Any, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=bed.cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TESTBED_HOME": str(bed.home)}, check=False)


def _lab_spec(bed: Any) -> None:
    key = Path(bed.home) / "testbeds" / bed.name / "id_ed25519"
    hosts = "\n".join(f"    - {{name: {n}, address: {h.address}}}" for n, h in zip(NAMES, bed.hosts, strict=True))
    (Path(bed.cwd) / "inventories" / "tesla.yml").write_text(
        "description: a replica of ecetesla0-4 on local hosts\n"
        f"provider:\n  kind: lab\n  key: {key}\n  connect_timeout: 5\n  hosts:\n{hosts}\n"
        f"user: {USER}\nprofile: tesla\ngroups:\n  homo: [ecetesla1, ecetesla2, ecetesla4]\n")


def test_tesla_hello_on_a_five_host_lab_replica(local_testbed: Any) -> None:
    vit = artifact("Scalable_ViT_DT")
    bed = local_testbed(hosts=5, user=USER, name="replica")
    for node, name in zip(bed.hosts, NAMES, strict=True):  # as the lab machines are: their names, tcsh
        r = bed.ssh(node.name, f"sudo hostname {name} && sudo chsh -s /usr/bin/tcsh {USER}")
        assert r.returncode == 0, r.stderr
    assert bed.ssh("node0", "echo $shell").stdout.strip().endswith("tcsh")
    _lab_spec(bed)

    r = _cli(bed, "provision", "tesla", "--json")
    assert r.returncode == 0, r.stderr
    assert [h["name"] for h in json.loads(r.stdout)["hosts"]] == NAMES

    r = _cli(bed, "setup", "tesla", "--role", "ssh_mesh", "--role", "shell", "--role", "mpi", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    shells = _cli(bed, "exec", "tesla", "--json", "--", "getent passwd " + USER)
    assert all(x["stdout"].strip().endswith(":/usr/bin/tcsh") or x["stdout"].strip().endswith(":/bin/tcsh")
               for x in json.loads(shells.stdout)), shells.stdout  # the lab's own, kept: no root needed

    r = _cli(bed, "run", "tesla", "--on", "tesla", "-p", "task=hello", "--source", f"vit={vit}", "--no-setup",
             "--collect", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads(r.stdout)
    assert run["status"] == "succeeded", run
    folder = Path(bed.cwd) / "results" / "tesla" / run["id"]
    hello = (folder / "ecetesla0" / "rank0.out").read_text()
    lines = sorted(ln for ln in hello.splitlines() if ln.startswith("Hello world"))
    assert lines == sorted(f"Hello world from processor {n}, rank {i} out of 5 processors"
                           for i, n in enumerate(NAMES)), hello
    # the artifact's committed log/ (its own 1-5 GPU runs) matches the output glob but is not this run's
    man = json.loads((folder / "manifest.json").read_text())
    assert not [f for f in man["files"] if "/log/" in f["path"]], man["files"]
    r = _cli(bed, "collect", run["id"], "--json")  # unchanged: nothing sent, and the note says what was left out
    col = json.loads(r.stdout)[0]
    assert col["files_sent"] == 0, col
    notes = [n for h in col["hosts"] for n in h["notes"]]
    # the ranks write into the run folder (out/rank*/), never into the checkout's committed log/: a hello run
    # declares no training log among its outputs (tesla's outputs are per task), and the authors' logs are not
    # even matched
    assert not any("out/rank*/log/**" in n or "source checkout" in n for n in notes), notes
    assert man["software"]["sources"]["vit"]["override"] == str(vit)
    r = _cli(bed, "report", str(folder))
    assert r.returncode == 0, r.stdout + r.stderr
    print((folder / "report" / "report.md").read_text()[:3000])
