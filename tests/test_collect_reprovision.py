"""Collect after the testbed was destroyed and provisioned again: runs whose hosts are gone are named, never retried.

Real local hosts: a run collected before the destroy keeps its results, a run never collected is named as lost
(one line, exit 0 for ``--all``), a run of the new testbed is collected; no folder without files is a run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_collect import make_run

ROOT = Path(__file__).resolve().parents[1]


def _cli(bed: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TESTBED_HOME": str(bed.home), "PYTHONPATH": str(ROOT), "COLUMNS": "400", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, env=env,
                          cwd=bed.cwd, timeout=300, check=False)


def test_collect_all_after_destroy_and_provision_again(local_testbed):
    bed = local_testbed(hosts=2)
    kept, _ = make_run(bed, outputs={"*": ["r.txt"]}, files={h.name: {"r.txt": h.name.encode()} for h in bed.hosts})
    never, _ = make_run(bed, outputs={"*": ["r.txt"]}, files={h.name: {"r.txt": b"lost"} for h in bed.hosts})
    r = _cli(bed, "collect", kept, "--to", "results")
    assert r.returncode == 0, r.stdout + r.stderr
    folder = bed.cwd / "results/demo" / kept
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert (folder / "node0/r.txt").read_bytes() == b"node0"

    bed.provider.destroy()
    bed.up()  # the same testbed name and state home: new hosts, new disks
    fresh, _ = make_run(bed, outputs={"*": ["r.txt"]}, files={h.name: {"r.txt": b"new"} for h in bed.hosts})

    r = _cli(bed, "collect", "--all", "--to", "results")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "error" not in out and "run the same collect again" not in out, out
    lost = [ln for ln in out.splitlines() if "cannot be collected any more" in ln]
    assert len(lost) == 1 and never in lost[0] and "destroyed" in lost[0], out
    assert kept in out and "kept" in out, out
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before  # untouched
    assert not (bed.cwd / "results/demo" / never).exists()  # no manifest-only folder
    assert (bed.cwd / "results/demo" / fresh / "node1/r.txt").read_bytes() == b"new"

    # named alone, the lost run is an error whose fix is not "try again"
    r = _cli(bed, "collect", never, "--to", "results")
    assert r.returncode == 1 and "cannot be collected any more" in r.stderr, r.stdout + r.stderr
    assert "run the same collect again" not in r.stderr and r.stderr.count("error:") == 1, r.stderr
    assert not (bed.cwd / "results/demo" / never).exists()

    r = _cli(bed, "report", "results", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    index = json.loads(r.stdout)
    assert sorted(x["run_id"] for x in index["runs"]) == sorted([kept, fresh])
    for run in index["runs"]:  # every run listed has files
        run_dir = bed.cwd / "results/demo" / run["run_id"]
        assert [p for p in run_dir.rglob("*") if p.is_file() and p.name != "manifest.json"
                and "report" not in p.relative_to(run_dir).parts]
