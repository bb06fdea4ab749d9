"""``testbed report`` reads results folders as untrusted input: a folder copied (two folders claiming one run
id) and a manifest whose fields are out of type or range are named with what is wrong, where and what to do,
and never listed as runs (least of all as passing ones)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHA = "ab" * 32


def a_run(results: Path, run_id: str = "echoes-1", folder: str | None = None, **fields: Any) -> Path:
    run = results / "echoes" / (folder or run_id)
    (run / "node0").mkdir(parents=True)
    (run / "node0" / "rank0.out").write_text("hi\n")
    m = {"schema": 1, "run_id": run_id, "suite": "echoes", "params": {}, "status": "succeeded", "reason": None,
         "started": "2026-01-02T10:00:00.000Z", "ended": "2026-01-02T10:01:00.000Z",
         "hosts": [{"name": "node0", "exit_code": 0, "status": "succeeded",
                    "ranks": [{"rank": 0, "status": "succeeded", "exit_code": 0}]}],
         "files": [{"host": "node0", "path": "rank0.out", "sha256": SHA, "size": 3}],
         "events": [{"ts": "2026-01-02T10:00:00.000Z", "kind": "started", "host": None, "detail": {}}], **fields}
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def test_a_copied_run_folder_is_named_not_reported(tmp_path: Path) -> None:
    from testbed.errors import UsageError
    from testbed.report.folders import build_index, report_suite_folder

    results = tmp_path / "results"
    run = a_run(results)
    a_run(results, "echoes-2")
    shutil.copytree(run, results / "echoes" / "echoes-1-copy")
    index = build_index(results)
    assert [r["run_id"] for r in index.runs] == ["echoes-2"], index.runs
    why = dict(index.skipped)
    for name in ("echoes-1", "echoes-1-copy"):
        assert why[f"echoes/{name}/"].startswith("run id echoes-1 is claimed by 2 folders ("), why
        assert str(results / "echoes" / "echoes-1-copy") in why[f"echoes/{name}/"]
    with pytest.raises(UsageError) as e:
        report_suite_folder(results / "echoes")
    assert "run id echoes-1 is claimed by 2 folders" in e.value.what and "(and 1 more)" in e.value.what
    assert (e.value.where or "").endswith("manifest.json") and "move" in (e.value.fix or "")


FORGED = [
    ({"ended": "2026-01-02T09:00:00.000Z"}, "ended (2026-01-02T09:00:00.000Z) is before started"),
    ({"started": "2999-01-01T00:00:00Z", "ended": None}, "started (2999-01-01T00:00:00Z) is in the future"),
    ({"started": "1970-01-01T00:00:00Z"}, "started (1970-01-01T00:00:00Z) is before 2000"),
    ({"started": 12}, "started is 12, not an ISO 8601 time"),
    ({"status": ["succeeded"]}, "status is ['succeeded'], not text"),
    ({"run_id": 7}, "run_id is 7, not a name"),
    ({"run_id": "../../etc"}, "run_id is '../../etc', not a name"),
    ({"hosts": [{"name": "node0", "exit_code": 70000}]}, "hosts[0].exit_code is 70000, out of range"),
    ({"hosts": [{"name": "node0", "exit_code": True}]}, "hosts[0].exit_code is True, out of range"),
    ({"hosts": [{"name": "../..", "exit_code": 0}]}, "hosts[0] has no usable host name ('../..')"),
    ({"files": [{"host": "node0", "path": "rank0.out", "sha256": SHA, "size": -1}]}, "files[0]: size -1 is out"),
    ({"files": [{"host": "node0", "path": "rank0.out", "sha256": SHA, "size": 1 << 62}]}, "is out of range"),
    ({"files": [{"host": "node0", "path": "/etc/passwd", "sha256": SHA, "size": 1}]},
     "files[0]: path '/etc/passwd' is not a path inside"),
    ({"events": [{"ts": "soon", "kind": "started"}]}, "events[0].ts is 'soon', not an ISO 8601 time"),
    ({"params": "a=1"}, "params is 'a=1', not a mapping"),
]


@pytest.mark.parametrize(("fields", "words"), FORGED, ids=[w.split(" is")[0] for _, w in FORGED])
def test_a_manifest_out_of_range_is_named_not_reported(tmp_path: Path, fields: dict[str, Any], words: str) -> None:
    from testbed.report.folders import build_index

    results = tmp_path / "results"
    a_run(results, "echoes-2")
    a_run(results, folder="echoes-1", **fields)
    index = build_index(results)
    assert [r["run_id"] for r in index.runs] == ["echoes-2"]
    why = dict(index.skipped)["echoes/echoes-1/"]
    assert why.startswith("manifest.json is damaged or forged: ") and words in why, why
    assert why.endswith("collect the run again, or move the folder out of the results")


def test_the_cli_says_what_is_wrong_where(tmp_path: Path) -> None:
    results = tmp_path / "results"
    a_run(results, ended="2026-01-01T00:00:00Z")
    r = subprocess.run([sys.executable, "-m", "testbed", "report", str(results / "echoes")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300",
                            "TESTBED_HOME": str(tmp_path / ".testbed")})
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "a negative duration" in err, (r.stdout, r.stderr)
    assert f"where: {results}/echoes/echoes-1/manifest.json" in err and "Traceback" not in err
    assert "succeeded" not in r.stdout
