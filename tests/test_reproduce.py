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


def recorded(tmp_path: Path, *, copy: bool = False, **extra: object) -> Path:
    """experiments/echoes.yml and a collected run of it whose manifest records that file's hash; ``copy``: the
    run folder holds the copy of the suite that collect keeps (``.suite/echoes.yml``, ``suite_copy``)."""
    (tmp_path / "experiments").mkdir()
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE)
    run = tmp_path / "results" / "echoes" / "echoes-1"
    (run / "node0").mkdir(parents=True)
    (run / "node0" / "rank0.out").write_text("hi\n")
    sha = hashlib.sha256(suite.read_bytes()).hexdigest()
    manifest = {"schema": 1, "run_id": "echoes-1", "suite": "echoes", "params": {}, "status": "succeeded",
                "testbed": {"name": "local", "provider": "local"}, "hosts": [{"name": "node0", "facts": {"cpus": 2}}],
                "software": {"sources": {}}, "profile": "base", "faults": [],
                "suite_file": {"path": str(suite), "sha256": sha}, **extra}
    if copy:
        (run / ".suite").mkdir()
        (run / ".suite" / "echoes.yml").write_text(SUITE)
        manifest["suite_copy"] = {"path": ".suite/echoes.yml", "sha256": sha, "files": {}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def edit_manifest(run: Path, **fields: object) -> None:
    m = json.loads((run / "manifest.json").read_text())
    m.update(fields)
    (run / "manifest.json").write_text(json.dumps(m))


def test_a_changed_suite_is_refused_naming_the_difference(tmp_path: Path) -> None:
    run = recorded(tmp_path)
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE.replace('"echo hi"', '"echo hello"'))
    r = cli(tmp_path, "reproduce", str(run), "--on", "local", "--suite", str(suite))
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    assert "run echoes-1 cannot be replayed as recorded: suite: suite file" in err and "changed since the run" in err
    assert "--allow suite" in err and "Traceback" not in r.stderr
    assert not (tmp_path / ".testbed" / "state.db").exists() or "echoes-" not in r.stdout  # nothing was started


def test_the_unchanged_suite_passes_to_the_testbed_check(tmp_path: Path) -> None:
    # the files match: the next question is the testbed, which this folder has never provisioned
    run = recorded(tmp_path, copy=True)
    r = cli(tmp_path, "reproduce", str(run))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "cannot be replayed" not in r.stderr and "testbed 'local' is not provisioned" in r.stderr


def test_allow_names_the_difference_it_accepts(tmp_path: Path) -> None:
    run = recorded(tmp_path)
    (tmp_path / "experiments" / "echoes.yml").write_text(SUITE.replace("profile: base", "profile: local-suites"))
    named = ("--suite", "experiments/echoes.yml")
    r = cli(tmp_path, "reproduce", str(run), *named, "--allow", "suite")
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "profile: profile 'base' recorded, the suite now names 'local-suites'" in err
    assert "--allow profile" in err and "suite file" not in err  # the allowed difference is not named again
    r = cli(tmp_path, "reproduce", str(run), *named, "--allow", "suite", "--allow", "profile")
    assert r.returncode == 1 and "cannot be replayed" not in r.stderr and "not provisioned" in r.stderr, r.stderr
    r = cli(tmp_path, "reproduce", str(run), "--allow", "suites")
    assert r.returncode == 2 and "--allow suites: not a kind of difference" in r.stderr


def test_older_manifests_and_missing_commits_are_differences(tmp_path: Path) -> None:
    from testbed.reproduce import prepare

    run = recorded(tmp_path, suite_file=None, testbed_version="0.0.9")
    m = json.loads((run / "manifest.json").read_text())
    del m["faults"]
    (run / "manifest.json").write_text(json.dumps(m))
    os.chdir(tmp_path)
    from testbed.errors import UsageError

    suite = tmp_path / "experiments" / "echoes.yml"
    with pytest.raises(UsageError) as e:
        prepare(run, suite_path=suite)
    assert "run echoes-1 was recorded by testbed 0.0.9, before testbed recorded suite hashes: the suite " \
        f"{tmp_path}/experiments/echoes.yml cannot be shown to be the file that ran" in e.value.what
    assert "records no faults" in e.value.what and "--allow suite" in (e.value.fix or "")
    # a suite with a source whose commit the run did not record
    (tmp_path / "experiments" / "echoes.yml").write_text(
        SUITE + "sources:\n  - {name: app, repo: https://example.invalid/app.git, path: ~/app}\n")
    with pytest.raises(UsageError) as e:
        prepare(run, allow=["suite"], suite_path=suite)
    assert "commit: source app: no commit recorded for the run" in e.value.what


def test_a_changed_workload_file_is_a_suite_difference_naming_it(tmp_path: Path) -> None:
    from testbed.errors import TestbedError, UsageError
    from testbed.reproduce import prepare

    work = tmp_path / "experiments" / "workloads"
    run = recorded(tmp_path, testbed_version="0.1.0")
    work.mkdir()
    (work / "job.py").write_text("print(1)\n")
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE + "files: [workloads/job.py]\n")
    m = json.loads((run / "manifest.json").read_text())
    m["suite_file"]["sha256"] = hashlib.sha256(suite.read_bytes()).hexdigest()
    os.chdir(tmp_path)
    # a manifest of a testbed that hashed the suite but not its files
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UsageError) as e:
        prepare(run, suite_path=suite)
    assert e.value.what.endswith("suite: run echoes-1 was recorded by testbed 0.1.0, before testbed recorded the "
                                 "hashes of a suite's files: workloads/job.py cannot be shown unchanged")
    m["suite_file"]["files"] = {"workloads/job.py": hashlib.sha256(b"print(1)\n").hexdigest()}
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TestbedError) as e:  # the files match: on to the testbed, never provisioned here
        prepare(run, suite_path=suite)
    assert "cannot be replayed" not in e.value.what and "not provisioned" in e.value.what
    (work / "job.py").write_text("print(2)\n")  # the suite's YAML is unchanged; its workload is not
    r = cli(tmp_path, "reproduce", str(run), "--on", "local", "--suite", str(suite))
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and f"suite: the suite's file {work}/job.py changed since the run (sha256 " in err, err
    assert "suite file" not in err and "--allow suite" in err and "Traceback" not in r.stderr
    (work / "job.py").unlink()
    with pytest.raises(UsageError, match=f"suite: the suite's file {work}/job.py is gone"):
        prepare(run, suite_path=suite)


def test_the_suite_replayed_is_the_copy_inside_the_run_folder(tmp_path: Path) -> None:
    """A results folder received from someone else never chooses a suite file outside it: the manifest's suite
    is a name, the copy is followed only inside the folder (no absolute path, no '..', no link out) and must
    hash as recorded; a run without a copy is refused until the user names the suite."""
    from testbed.errors import UsageError
    from testbed.reproduce import _replayed_suite, prepare

    run = recorded(tmp_path, copy=True)
    os.chdir(tmp_path)
    evil = tmp_path / "evil.yml"
    evil.write_text(SUITE.replace('"echo hi"', '"touch /tmp/owned"'))
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()
    (tmp_path / "experiments" / "echoes.yml").write_text(SUITE.replace('"echo hi"', '"echo edited"'))
    r = cli(tmp_path, "reproduce", str(run))  # the copy is replayed: the edit in experiments/ is no difference
    assert r.returncode == 1 and "not provisioned" in r.stderr, r.stderr  # the next check: the testbed
    suite, origin, _ = _replayed_suite(run, json.loads((run / "manifest.json").read_text()), None)
    assert origin == f"the copy in the run folder, {run}/.suite/echoes.yml" and suite.source == origin.split(", ")[1]
    assert suite.steps.launch.command == "echo hi"
    for field, value, words in (
            ("suite_copy", {"path": str(evil), "sha256": sha, "files": {}}, "suite_copy.path is an absolute path"),
            ("suite_copy", {"path": "../../../evil.yml", "sha256": sha, "files": {}}, "leads out of the run folder"),
            ("suite_copy", {"path": ".suite/echoes.yml", "sha256": sha, "files": {}}, "does not have the sha256"),
            ("suite", str(evil), "the manifest's suite ('" + str(evil) + "') is not a suite name")):
        edit_manifest(run, **{field: value})
        with pytest.raises(UsageError) as e:
            prepare(run)
        assert words in e.value.what and field in (e.value.where or ""), (e.value.what, e.value.where)
        edit_manifest(run, suite="echoes", suite_copy={"path": ".suite/echoes.yml", "files": {},
                                                       "sha256": hashlib.sha256(SUITE.encode()).hexdigest()})
    (run / ".suite" / "echoes.yml").unlink()  # a link out of the folder, to a file with the recorded hash
    (run / ".suite" / "echoes.yml").symlink_to(evil)
    edit_manifest(run, suite_copy={"path": ".suite/echoes.yml", "sha256": sha, "files": {}})
    with pytest.raises(UsageError, match="a link leading out of the run folder"):
        prepare(run)
    edit_manifest(run, suite_copy=None)  # results collected before collect kept a copy
    r = cli(tmp_path, "reproduce", str(run))
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "run echoes-1 holds no copy of its suite" in err and "Traceback" not in err, err
    assert f"fix: name the suite to replay: testbed reproduce {run} --suite echoes (its name here" in err
    assert "owned" not in r.stdout + r.stderr and not Path("/tmp/owned").exists()


def test_a_suite_without_references_is_refused_before_the_replay(tmp_path: Path) -> None:
    run = recorded(tmp_path)
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE.split("references:")[0])
    edit_manifest(run, suite_file={"path": str(suite), "sha256": hashlib.sha256(suite.read_bytes()).hexdigest()})
    r = cli(tmp_path, "reproduce", str(run), "--suite", str(suite))
    assert r.returncode == 2 and "suite echoes declares no references" in r.stderr, r.stderr


def test_a_replay_that_could_not_compare_says_why_and_exits_1(tmp_path: Path) -> None:
    """After a replay ran, the exit code is its verdict: 0 within tolerance, 1 outside or not compared (the
    replay timed out or failed, its folder holds nothing to compare) with the reason; never 2 (bad input)."""
    from testbed.report.verdicts import Verdict
    from testbed.reproduce import Outcome, Replay, judge
    from testbed.suite import load_suite

    run = recorded(tmp_path, copy=True)
    os.chdir(tmp_path)

    replay = Replay(run, json.loads((run / "manifest.json").read_text()), load_suite(str(run / ".suite/echoes.yml")),
                    "local", {}, [])
    out = judge(replay, tmp_path / "results" / "echoes" / "echoes-2", "timed-out", "ran past 60 s")
    assert out.code == 1 and out.problem == "the replay timed-out (ran past 60 s): nothing to compare"
    (tmp_path / "results" / "echoes" / "echoes-2").mkdir()  # succeeded, but nothing was collected of it
    out = judge(replay, tmp_path / "results" / "echoes" / "echoes-2", "succeeded")
    assert out.code == 1 and (out.problem or "").startswith("the two runs could not be compared: "), out.problem
    seen = Verdict("lines", 1, 1, 0.0, 0.0, True, "exact", "s")
    assert Outcome("r", "succeeded", [seen]).code == 0
    assert Outcome("r", "succeeded", [seen, Verdict("x", 1, 2, 1.0, 100.0, False, "exact", "s")]).code == 1


def test_collect_copies_the_suite_that_ran_into_the_run_folder(tmp_path: Path) -> None:
    """The suite's YAML and its files are copied while they hash as the run's plan recorded; a suite edited
    since the run is not copied (the copy would not be what ran), and an earlier whole copy is kept."""
    from testbed.collect.suite_copy import copy_suite, verified

    (tmp_path / "experiments" / "workloads").mkdir(parents=True)
    suite = tmp_path / "experiments" / "echoes.yml"
    suite.write_text(SUITE + "files: [workloads/job.py]\n")
    (tmp_path / "experiments" / "workloads" / "job.py").write_text("print(1)\n")
    os.chdir(tmp_path)
    sha = hashlib.sha256(suite.read_bytes()).hexdigest()
    info = {"suite_file": str(suite), "suite_sha256": sha, "profile": "base",
            "suite_files": {"workloads/job.py": hashlib.sha256(b"print(1)\n").hexdigest()}}
    run = tmp_path / "results" / "echoes" / "echoes-1"
    run.mkdir(parents=True)
    rec, why = copy_suite(info, run, None)
    assert why is None and rec is not None and rec["path"] == ".suite/echoes.yml" and rec["sha256"] == sha
    assert rec["files"] == {".suite/workloads/job.py": info["suite_files"]["workloads/job.py"]}
    assert rec["profile"]["name"] == "base" and (run / rec["profile"]["path"]).is_file()
    assert (run / ".suite" / "workloads" / "job.py").read_text() == "print(1)\n"
    path, files = verified(run, rec)
    assert path == run / ".suite" / "echoes.yml" and list(files) == [".suite/workloads/job.py", ".profile/base.yml"]
    (tmp_path / "experiments" / "workloads" / "job.py").write_text("print(2)\n")  # edited since the run
    assert copy_suite(info, run, rec) == (rec, None)  # the copy made before is whole: kept
    other = tmp_path / "results" / "echoes" / "echoes-2"
    other.mkdir()
    rec2, why = copy_suite(info, other, None)
    assert rec2 is None and why and "workloads/job.py changed (or is gone) since the run" in why
    assert not (other / ".suite").exists()


GPU_LAB = """provider:
  kind: lab
  hosts:
    - {name: g1, address: 10.1.2.3}
hardware:
  gpu: {model: RTX 3070, count: COUNT}
"""


def test_gpu_models_and_counts_are_compared_with_the_testbed(tmp_path: Path) -> None:
    from testbed.errors import UsageError
    from testbed.handle import Testbed
    from testbed.hosts import Host
    from testbed.reproduce import prepare
    from testbed.state import Store

    smi = [{"name": "NVIDIA GeForce RTX 3070", "memory": "8192 MiB", "driver": "550.54"}] * 2
    run = recorded(tmp_path, copy=True, hosts=[{"name": "node0", "facts": {"cpus": 2, "gpus": smi}}],
                   testbed={"name": "lab1", "provider": "lab"})
    (tmp_path / "inventories").mkdir()
    os.chdir(tmp_path)
    os.environ["TESTBED_HOME"] = str(tmp_path / ".testbed")
    st = Store(tmp_path / ".testbed" / "state.db")
    for count, model in ((2, "RTX 3070"), (1, "RTX 3070"), (2, "A100-SXM4-40GB")):
        (tmp_path / "inventories" / "lab1.yml").write_text(
            GPU_LAB.replace("COUNT", str(count)).replace("RTX 3070", model))
        tb = Testbed.open("lab1", st)
        assert tb.spec is not None
        st.upsert_testbed("lab1", "lab", tb.spec.source, "up", {"spec": tb.spec.model_dump(mode="json")})
        st.set_hosts("lab1", [Host(name="g1", address="10.1.2.3", facts={"cpus": 2})])
        if count == 2 and model == "RTX 3070":  # the spec's 'RTX 3070' is nvidia-smi's 'NVIDIA GeForce RTX 3070'
            assert prepare(run, store=st).differences == []
            continue
        with pytest.raises(UsageError) as e:
            prepare(run, store=st)
        want = ("hardware: GPUs per host: 2 recorded (nvidia-smi on the run's hosts), 1 on lab1 (its spec's "
                "hardware.gpu)" if count == 1 else
                "hardware: GPU model: NVIDIA GeForce RTX 3070 recorded (nvidia-smi on the run's hosts), "
                "A100-SXM4-40GB on lab1 (its spec's hardware.gpu)")
        assert want in e.value.what and "--allow hardware" in (e.value.fix or ""), e.value.what
        assert [d.kind for d in prepare(run, allow=["hardware"], store=st).differences] == ["hardware"]


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
    assert m["suite_copy"]["path"] == ".suite/matmul-baseline/suite.yml" and m["suite_copy"]["sha256"] == \
        m["suite_file"]["sha256"] and (original / ".suite" / "matmul-baseline" / "suite.yml").is_file()
    r = cli(bed.cwd, "reproduce", str(original), "--no-setup", "--json", home=bed.home, timeout=400)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["original"] == first and out["status"] == "succeeded" and out["differences"] == []
    assert out["suite"] == f"the copy in the run folder, {original}/.suite/matmul-baseline/suite.yml"
    assert out["problem"] is None and "replaying suite matmul-baseline from the copy" in r.stderr
    assert [v["status"] for v in out["verdicts"]] == ["within tolerance"] * 2, out["verdicts"]
    assert [v["ours"] for v in out["verdicts"]] == [5, 4]
    replay = json.loads((results / "matmul-baseline" / out["replay"] / "manifest.json").read_text())
    assert replay["reproduces"] == first and replay["params"] == m["params"]
    assert replay["suite_file"]["sha256"] == m["suite_file"]["sha256"]


@pytest.mark.slow  # a drill
def test_fault_drill_replay_carries_its_fault_and_agrees(shared_local_testbed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A fault-drill run (its default fault, kill-rank) replayed: the replay fires the same fault, recovers from
    the checkpoint, and its metrics agree with the original's within the suite's tolerances."""
    from testbed import collect
    from testbed.run import runner

    bed = shared_local_testbed
    os.chdir(bed.cwd)
    os.environ["TESTBED_HOME"] = str(bed.home)
    plan = runner.plan_run("fault-drill", bed.name, {"python": PY, "ranks": 2, "port": 29641}, faults=["kill-rank"])
    first = runner.start_run(plan)
    assert runner.wait(first, timeout=400).status == "succeeded"
    results = tmp_path / "results"
    assert all(r.ok for r in collect.collect_runs([first], to=results))
    original = results / "fault-drill" / first
    m = json.loads((original / "manifest.json").read_text())
    work = ROOT / "experiments" / "fault-drill" / "workloads" / "fault_drill.py"
    assert m["faults"] == ["kill-rank"] and m["params"]["ranks"] == 2
    assert m["suite_file"]["files"] == {"workloads/fault_drill.py": hashlib.sha256(work.read_bytes()).hexdigest()}
    r = cli(bed.cwd, "reproduce", str(original), "--no-setup", "--json", home=bed.home, timeout=500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["original"] == first and out["status"] == "succeeded" and out["differences"] == []
    verdicts = {v["metric"]: v for v in out["verdicts"]}
    assert all(v["status"] == "within tolerance" for v in verdicts.values()), verdicts
    assert verdicts["last step trained"]["ours"] == verdicts["last step trained"]["reference"] == 24
    assert verdicts["restarts"]["ours"] == 1
    replay = json.loads((results / "fault-drill" / out["replay"] / "manifest.json").read_text())
    assert replay["reproduces"] == first and replay["faults"] == ["kill-rank"] and replay["params"] == m["params"]
    fired = [e for e in replay["events"] if e["kind"] == "fault"]
    assert len(fired) == 1 and fired[0]["detail"]["fault"] == "kill-rank", fired
