"""The dry run shows the folder each step and rank runs in, where it is not the run folder (issue 55 item 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dry_run_names_each_steps_working_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400", "WATID": "jdoe",
           "TESTBED_HOME": str(tmp_path / ".testbed")}
    r = subprocess.run([sys.executable, "-m", "testbed", "run", "tesla", "--dry-run"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False, env=env)
    assert r.returncode == 0, r.stderr
    assert "compile hello_mpi (in ~/Scalable_ViT_DT/tesla):" in r.stdout, r.stdout
    assert "launch rank 0 (in ~/Scalable_ViT_DT/tesla):" in r.stdout
    j = subprocess.run([sys.executable, "-m", "testbed", "run", "tesla", "--dry-run", "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False, env=env)
    lines = json.loads(j.stdout)["commands"]
    run_dir = json.loads(j.stdout)["run_id"]
    assert {ln["cwd"] for ln in lines if ln["phase"] == "launch"} == {"~/Scalable_ViT_DT/tesla"}
    assert all(ln["cwd"] is None for ln in lines if ln["phase"] in ("setup", "upload")), run_dir
