"""``testbed reproduce``: a recorded run replayed from its manifest. Refused, before any host is touched, when the
suite changed (or a source has no commit, or the testbed differs) unless --allow names it; on a real local testbed
a matmul-baseline run replayed agrees with the original within the suite's tolerances."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SUITE = """\
name: echoes
profile: base
placement: {hosts: 1}
steps:
  launch: {command: "echo hi"}
references:
  metrics:
    - {metric: lines, table: t, column: c, value: 1, source: s, tolerance: {exact: true, why: a count}}
"""


def cli(cwd: Path, *argv: str, home: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "testbed", *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                                            "TESTBED_HOME": str(home or cwd / ".testbed")})


def recorded(tmp_path: Path, **extra: object) -> Path:
    """experiments/echoes.yml and a collected run of it whose manifest records that file's hash."""
    (tmp_path / "experiments").mkdir()
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE)
    run = tmp_path / "results" / "echoes" / "echoes-1"
    (run / "node0").mkdir(parents=True)
    (run / "node0" / "rank0.out").write_text("hi\n")
    manifest = {"schema": 1, "run_id": "echoes-1", "suite": "echoes", "params": {}, "status": "succeeded",
                "testbed": {"name": "local", "provider": "local"}, "hosts": [{"name": "node0", "facts": {"cpus": 2}}],
                "software": {"sources": {}}, "profile": "base", "faults": [],
                "suite_file": {"path": str(suite), "sha256": hashlib.sha256(suite.read_bytes()).hexdigest()},
                **extra}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_a_changed_suite_is_refused_naming_the_difference(tmp_path: Path) -> None:
    run = recorded(tmp_path)
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE.replace('"echo hi"', '"echo hello"'))
    r = cli(tmp_path, "reproduce", str(run), "--on", "local")
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    assert "run echoes-1 cannot be replayed as recorded: suite: suite file" in err and "changed since the run" in err
    assert "--allow suite" in err and "Traceback" not in r.stderr
    assert not (tmp_path / ".testbed" / "state.db").exists() or "echoes-" not in r.stdout  # nothing was started


def test_the_unchanged_suite_passes_to_the_testbed_check(tmp_path: Path) -> None:
    # the files match: the next question is the testbed, which this folder has never provisioned
    run = recorded(tmp_path)
    r = cli(tmp_path, "reproduce", str(run))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "cannot be replayed" not in r.stderr and "testbed 'local' is not provisioned" in r.stderr


def test_allow_names_the_difference_it_accepts(tmp_path: Path) -> None:
    run = recorded(tmp_path)
    (tmp_path / "experiments" / "echoes.yml").write_text(SUITE.replace("profile: base", "profile: local-suites"))
    r = cli(tmp_path, "reproduce", str(run), "--allow", "suite")
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "profile: profile 'base' recorded, the suite now names 'local-suites'" in err
    assert "--allow profile" in err and "suite file" not in err  # the allowed difference is not named again
    r = cli(tmp_path, "reproduce", str(run), "--allow", "suite", "--allow", "profile")
    assert r.returncode == 1 and "cannot be replayed" not in r.stderr and "not provisioned" in r.stderr, r.stderr
    r = cli(tmp_path, "reproduce", str(run), "--allow", "suites")
    assert r.returncode == 2 and "--allow suites: not a kind of difference" in r.stderr


def test_older_manifests_and_missing_commits_are_differences(tmp_path: Path) -> None:
    from testbed.reproduce import prepare

    run = recorded(tmp_path, suite_file=None)
    m = json.loads((run / "manifest.json").read_text())
    del m["faults"]
    (run / "manifest.json").write_text(json.dumps(m))
    os.chdir(tmp_path)
    from testbed.errors import UsageError

    with pytest.raises(UsageError) as e:
        prepare(run)
    assert "no suite hash" in e.value.what and "records no faults" in e.value.what
    # a suite with a source whose commit the run did not record
    (tmp_path / "experiments" / "echoes.yml").write_text(
        SUITE + "sources:\n  - {name: app, repo: https://example.invalid/app.git, path: ~/app}\n")
    with pytest.raises(UsageError) as e:
        prepare(run, allow=["suite"])
    assert "commit: source app: no commit recorded for the run" in e.value.what


def test_replay_on_the_local_testbed_agrees_with_the_original(shared_local_testbed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from testbed import collect
    from testbed.run import runner

    bed = shared_local_testbed
    os.chdir(bed.cwd)
    os.environ["TESTBED_HOME"] = str(bed.home)
    plan = runner.plan_run("matmul-baseline", bed.name, {"python": PY, "size": 64})
    first = runner.start_run(plan)
    assert runner.wait(first, timeout=240).status == "succeeded"
    results = tmp_path / "results"
    assert all(r.ok for r in collect.collect_runs([first], to=results))
    original = results / "matmul-baseline" / first
    m = json.loads((original / "manifest.json").read_text())
    assert m["suite_file"]["sha256"] and m["profile"] == "local-suites" and m["faults"] == []
    r = cli(bed.cwd, "reproduce", str(original), "--no-setup", "--json", home=bed.home, timeout=400)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["original"] == first and out["status"] == "succeeded" and out["differences"] == []
    assert [v["status"] for v in out["verdicts"]] == ["within tolerance"] * 2, out["verdicts"]
    assert [v["ours"] for v in out["verdicts"]] == [5, 4]
    replay = json.loads((results / "matmul-baseline" / out["replay"] / "manifest.json").read_text())
    assert replay["reproduces"] == first and replay["params"] == m["params"]
    assert replay["suite_file"]["sha256"] == m["suite_file"]["sha256"]
