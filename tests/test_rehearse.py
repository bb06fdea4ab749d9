"""``testbed rehearse``: the probe, the rehearsed plan, the replica's shape, refusals, and real rehearsals.

The probe runs for real in a virtualenv (armed as a rehearsal arms it), the plans are the suites' own, and the
rehearsals run each seed suite on a local replica of its real testbed with the artifact's real tree.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artifacts import artifact
from localbed import free_subnet

from testbed import rehearse as rh
from testbed.errors import UsageError
from testbed.run import runner
from testbed.scripts.probe import PROBLEM_EXIT
from testbed.spec import load_testbed
from testbed.suite import expand_matrix, load_suite, resolve_params

ROOT = Path(__file__).resolve().parents[1]

PROBE = Path(rh.__file__).with_name("scripts") / "probe.py"
SCRIPT = '''import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--model", choices=["vgg", "resnet"], default="vgg")
args = p.parse_args()
rank = int(os.environ["RANK"])
try:
    devices = os.environ["CUDA_VISIBLE_DEVICES"]  # guarded: has a default, never a problem
except KeyError:
    devices = "0"
with open("log/rank.txt", "w") as f:
    f.write(str(rank))
print("TRAINED")
'''


@pytest.fixture
def venv(tmp_path: Path) -> dict[str, Any]:
    """A virtualenv with the probe armed for programs under ``src/`` (HOME in tmp: nothing outside is touched)."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SCRIPT)
    (tmp_path / "run").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    cfg = json.dumps({"run_dir": str(tmp_path / "run"), "roots": [str(tmp_path / "src")], "programs": []})
    r = subprocess.run([str(env_dir / "bin" / "python"), str(PROBE), "arm", cfg, "--here"], env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return {"python": str(env_dir / "bin" / "python"), "env": env, "src": tmp_path / "src", "run": tmp_path / "run"}


def _py(v: dict[str, Any], *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([v["python"], *argv], cwd=v["src"], env={**v["env"], **(env or {})}, capture_output=True,
                          text=True, check=False, timeout=120)


def test_the_probe_stands_in_for_the_program_and_names_what_the_host_lacks(venv: dict[str, Any]) -> None:
    r = _py(venv, "train.py", "--epochs", "2", "--model", "vit")
    assert r.returncode == PROBLEM_EXIT and "TRAINED" not in r.stdout, r.stdout + r.stderr
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert found["parsed_by"] == "its own parser"
    problems = "\n".join(found["problems"])
    assert "invalid choice: 'vit'" in problems  # argv against the script's own parser
    assert "reads $RANK, which is not set" in problems  # an environment variable it reads with no default
    assert "CUDA_VISIBLE_DEVICES" not in problems and "CUDA_VISIBLE_DEVICES" in found["env_read"]  # under except
    assert "writes log/rank.txt, but log/ does not exist" in problems  # a folder nothing creates

    for f in venv["run"].glob("probe-*.json"):
        f.unlink()
    (venv["src"] / "log").mkdir()
    r = _py(venv, "train.py", "--epochs", "2", env={"RANK": "1"})
    assert r.returncode == 0 and "replaced by the probe" in r.stdout, r.stdout + r.stderr
    assert json.loads(next(venv["run"].glob("probe-*.json")).read_text())["problems"] == []
    assert not (venv["src"] / "log" / "rank.txt").exists()  # the program itself never ran

    other = venv["src"].parent / "other.py"  # not under a source checkout: runs as it is
    other.write_text("print('untouched')\n")
    assert _py(venv, str(other)).stdout.strip() == "untouched"
    r = subprocess.run([venv["python"], str(PROBE), "disarm", "--here"], env=venv["env"], check=False)
    assert r.returncode == 0
    assert "TRAINED" in _py(venv, "train.py", env={"RANK": "0"}).stdout  # disarmed: the program runs again


def test_the_probe_reads_the_parser_from_the_source_when_an_import_is_missing(venv: dict[str, Any]) -> None:
    (venv["src"] / "train.py").write_text("import not_on_this_host\n" + SCRIPT)
    r = _py(venv, "train.py", "--epochs", "x", env={"RANK": "0"})
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert r.returncode == PROBLEM_EXIT and found["parsed_by"] == "its parser, read from the source", found
    assert "not_on_this_host" in found["import_error"]
    assert any("invalid int value: 'x'" in p for p in found["problems"]), found

    for f in venv["run"].glob("probe-*.json"):  # anything else that stops it before parse_args: the same fallback
        f.unlink()
    (venv["src"] / "train.py").write_text("open('/nonexistent/app.log', 'w')\n" + SCRIPT)
    r = _py(venv, "train.py", "--epochs", "2", env={"RANK": "0"})
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert found["parsed_by"] == "its parser, read from the source" and "FileNotFoundError" in found["import_error"]
    assert "args" in found and found["args"]["epochs"] == 2, found


def test_the_probe_leaves_out_an_environment_read_its_argv_never_reaches(venv: dict[str, Any]) -> None:
    """main-measure-time-emulator.py:122 reads $WORLD_SIZE only when --dist-url is env:// (found by rehearsing
    datastall: the probe called the unset variable a problem although the suite's argv never reaches it)."""
    (venv["src"] / "train.py").write_text(
        "import argparse, os\np = argparse.ArgumentParser()\np.add_argument('--dist-url', default='tcp://x')\n"
        "p.add_argument('--world-size', type=int, default=-1)\nargs = p.parse_args()\n"
        "if args.dist_url == 'env://' and args.world_size == -1:\n    args.world_size = int(os.environ['WORLD_SIZE'])\n"
        "if not args.dist_url.startswith('tcp'):\n    pass\nelse:\n    rank = os.environ['RANK']\n")
    r = _py(venv, "train.py")
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert found["problems"] == ["train.py:11 reads $RANK, which is not set for this rank"], found
    assert any("$WORLD_SIZE (unset) only where args.dist_url == 'env://'" in n for n in found["notes"]), found
    for f in venv["run"].glob("probe-*.json"):
        f.unlink()
    r = _py(venv, "train.py", "--dist-url", "env://", env={"RANK": "0"})  # now reached: a problem
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert r.returncode == PROBLEM_EXIT and found["problems"] == [
        "train.py:7 reads $WORLD_SIZE, which is not set for this rank"], found


ARGV_SCRIPT = """import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--data_dir", default="./data")
p.add_argument("--output_dir", required=True)
p.add_argument("--log-file", default="logs/train.log")
p.add_argument("--master", default="tcp://10.0.0.1:29500")
p.add_argument("--model", default="vgg")
p.add_argument("sets", nargs="*")
args = p.parse_args()
os.makedirs(args.output_dir, exist_ok=True)
with open(os.path.join(os.getcwd(), "results", "r.csv"), "w") as f:
    f.write("x")
"""


def test_the_probe_checks_the_files_and_folders_its_argv_names(venv: dict[str, Any]) -> None:
    """An input the argv names must exist; an output folder the code makes is made by the probe where the program
    would (the working folder), one it does not make must exist; a path built from os.getcwd() is a literal one."""
    (venv["src"] / "train.py").write_text(ARGV_SCRIPT)
    r = _py(venv, "train.py", "--output_dir", "out/run1", "a/b")
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert r.returncode == PROBLEM_EXIT, r.stdout + r.stderr
    assert sorted(found["problems"]) == sorted([
        f"train.py: --data_dir names ./data, an input that does not exist in {venv['src']}",
        f"train.py: --log-file names logs/train.log, but logs/ does not exist in {venv['src']} and the code does not "
        "make it",
        f"train.py:11 writes results/r.csv, but results/ does not exist in {venv['src']} and the code does not make it",
    ]), found["problems"]  # --master (a URL), --model (a word) and the positional list name no path
    assert (venv["src"] / "out" / "run1").is_dir() and found["made"] == ["out/run1"]  # as main.py's makedirs would
    assert {(a["dest"], a["kind"]) for a in found["argv_paths"]} == {
        ("data_dir", "input"), ("output_dir", "output"), ("log_file", "output")}, found["argv_paths"]

    for f in venv["run"].glob("probe-*.json"):
        f.unlink()
    for d in ("data", "logs", "results"):
        (venv["src"] / d).mkdir()
    r = _py(venv, "train.py", "--output_dir", "out/run2")
    assert r.returncode == 0 and "testbed probe: ready" in r.stdout, r.stdout + r.stderr
    assert json.loads(next(venv["run"].glob("probe-*.json")).read_text())["problems"] == []

    # a missing input that a step the rehearsal skipped names (it would have fetched it) is not judged
    cfg_file = Path(venv["env"]["HOME"]) / ".cache" / "testbed" / "probe.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()),
                                    "skipped": {"fetch": "mkdir -p sets && curl -o sets/train.csv https://x/y"}}))
    for f in venv["run"].glob("probe-*.json"):
        f.unlink()
    r = _py(venv, "train.py", "--output_dir", "out/run2", "--data_dir", "sets/train.csv")
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert r.returncode == 0 and found["problems"] == [], found
    assert found["not_judged"] == [f"train.py: --data_dir names sets/train.csv, an input that does not exist in "
                                   f"{venv['src']}: not judged, the skipped step 'fetch' names train.csv (it would "
                                   "make it)"], found


def test_a_module_run_with_python_m_is_probed_with_its_own_parser(venv: dict[str, Any]) -> None:
    """``python -m pkg.train``: the hook finds the module's file under the source checkout (sys.argv has lost the
    module's name by then) and runs its parser as -m would (its package's relative imports resolve)."""
    pkg = venv["src"] / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "opts.py").write_text("EPOCHS = 3\n")
    (pkg / "train.py").write_text("from .opts import EPOCHS\n" + SCRIPT.replace("default=1", "default=EPOCHS"))
    r = _py(venv, "-u", "-m", "pkg.train", "--model", "vit", env={"RANK": "0"})
    assert r.returncode == PROBLEM_EXIT and "TRAINED" not in r.stdout, r.stdout + r.stderr
    assert "testbed probe: -m pkg.train --model vit (in " in r.stdout, r.stdout
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert found["module"] == "pkg.train" and found["script"].endswith("pkg/train.py"), found
    assert found["parsed_by"] == "its own parser" and "invalid choice: 'vit'" in found["problems"][0], found
    for f in venv["run"].glob("probe-*.json"):
        f.unlink()
    (venv["src"] / "log").mkdir()
    r = _py(venv, "-m", "pkg.train", env={"RANK": "0"})
    found = json.loads(next(venv["run"].glob("probe-*.json")).read_text())
    assert r.returncode == 0 and found["problems"] == [] and found["args"]["epochs"] == 3, found
    assert _py(venv, "-m", "json.tool", "--help").returncode == 0  # a module outside the checkout runs as it is


def test_a_rank_inside_docker_run_is_skipped_and_checks_on_its_output_are_not_rehearsed(tmp_path: Path) -> None:
    (tmp_path / "c.yml").write_text(
        "name: c\nrequires: {hosts: 2}\nsteps:\n  launch:\n    needs: [gpu]\n    command: >-\n"
        "      {% if rank == 0 %}docker run --rm --gpus all -v $PWD:/w img:1 python3 /w/train.py{% else %}"
        "python3 train.py{% endif %}\n"
        "checks: [{name: trained, on: master, file: out/log.txt, contains: done}]\n")
    suite = load_suite(str(tmp_path / "c.yml"))
    plan = rh.rehearsal_plan(runner.plan_run(suite, None, {}, dry_run=True), suite, "lab")
    assert plan.rehearsal is not None
    assert plan.ranks[0].command.startswith("echo ") and "inside `docker run`" in plan.ranks[0].command
    assert "docker" not in plan.ranks[1].command and plan.rehearsal["probed_ranks"] == [1]
    assert plan.checks == [] and plan.rehearsal["not_rehearsed"] == [
        "check trained: reads out/log.txt, which the probed or skipped ranks do not write"]
    assert "inside `docker run`" in plan.rehearsal["skipped_ranks"]["0"]
    assert rh.in_container("sudo docker -H x run img") and not rh.in_container("echo docker-run; python3 run.py")


def test_a_probed_rank_stays_alive_until_its_bound_or_a_signal(venv: dict[str, Any]) -> None:
    """The config's stay: the probe lives on after its checks (as the program would), and a signal ends it."""
    import signal
    import time

    cfg = json.loads((Path(venv["env"]["HOME"]) / ".cache" / "testbed" / "probe.json").read_text())
    (Path(venv["env"]["HOME"]) / ".cache" / "testbed" / "probe.json").write_text(json.dumps({**cfg, "stay": 3}))
    (venv["src"] / "log").mkdir()
    t0 = time.monotonic()
    r = _py(venv, "train.py", env={"RANK": "0"})
    assert r.returncode == 0 and 3 <= time.monotonic() - t0 < 60, r.stdout
    assert "testbed probe: ready: alive 3 s or until signalled" in r.stdout
    (Path(venv["env"]["HOME"]) / ".cache" / "testbed" / "probe.json").write_text(json.dumps({**cfg, "stay": 25}))
    p = subprocess.Popen([venv["python"], "train.py"], cwd=venv["src"], env={**venv["env"], "RANK": "0"},
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and "ready" in p.stdout.readline() + p.stdout.readline()
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == -signal.SIGTERM and time.monotonic() - t0 < 5


def test_the_probe_runs_in_the_oldest_python_of_the_artifacts_envs() -> None:
    """The probe runs inside the rank's own interpreter: datastall's conda env is Python 3.9, ISCA's TPU image 3.8.
    ``isinstance(v, str | int)`` raised TypeError there (a union of types at run time needs 3.10)."""
    import ast

    src = PROBE.read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    unions = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in (
        "isinstance", "issubclass") and len(n.args) == 2 and isinstance(n.args[1], ast.BinOp)]
    assert unions == [], f"probe.py lines {unions}: isinstance with X | Y fails before Python 3.10"


def test_a_rehearsed_plan_skips_what_the_replica_lacks_and_probes_the_ranks(tb_home: Path) -> None:
    suite = load_suite("jitc")
    plan = runner.plan_run(suite, None, {"fault": "kill-rank"}, dry_run=True)
    needy = [s.name for s in plan.prepare if s.needs]
    plan = rh.rehearsal_plan(plan, suite, "chameleon")
    assert plan.rehearsal is not None and set(plan.rehearsal["skipped"]) == set(needy)
    for s in plan.prepare:
        if s.name in needy:
            assert all(c.startswith("echo ") and "skipped: needs" in c for c in s.commands.values())
    assert plan.prepare[-1].name == "rehearse: arm the probe" and plan.post[0].name == "rehearse: disarm the probe"
    assert "testbed_probe.py" in plan.files
    assert plan.rehearsal["probed_ranks"] == [r.rank for r in plan.ranks]
    # the fault is kept: it fires on the victim's probe (ready, staying alive) through the real supervisor
    [f] = plan.faults
    assert (f.name, f.when, f.watch_rank, f.at) == ("kill-rank", "testbed probe: ready", 1, None), f
    assert plan.rehearsal["not_rehearsed"] == [
        "fault kill-rank: fired when rank 1's probe was ready, not at /\\| Batch 5 \\|/ in rank 0's log (a probe "
        "prints no progress)"]
    assert f.recovery_steps(1), "the relaunch runs"
    arm = next(c for c in plan.prepare[-1].commands.values())
    assert json.loads(shlex.split(arm)[-1])["stay"] == rh.probe_stay(plan) == 5.0
    assert all("probe-*.json" in globs for globs in plan.outputs.values())
    shred = rh.rehearsal_plan(runner.plan_run(suite, None, {"fault": "shred-libtorch"}, dry_run=True), suite, "c")
    assert shred.faults == [] and shred.rehearsal is not None and \
        shred.rehearsal["not_rehearsed"] == ["fault shred-libtorch: needs gpu, which the replica lacks"]


def test_a_fault_that_did_not_fire_or_relaunch_fails_the_point(tb_home: Path) -> None:
    """Read from the run's events: fired, detected and relaunched is one line; a fault missed, failed to fire, or
    fired without a relaunch is a failure naming why."""
    from testbed.records import RunEvent

    suite = load_suite("jitc")
    plan = rh.rehearsal_plan(runner.plan_run(suite, None, {"fault": "kill-rank"}, dry_run=True), suite, "c")

    def ev(seq: int, ts: float, kind: str, **detail: Any) -> RunEvent:
        return RunEvent(seq=seq, run_id=plan.run_id, ts=ts, kind=kind, detail=detail)

    fired = ev(1, 10.0, "fault", fault="kill-rank", action="signal")
    failed = ev(2, 11.5, "failed", reason="node1 rank 1: signal 9 (SIGKILL)")
    lines, failures = rh.fault_outcomes(plan, [fired, failed, ev(3, 14.0, "relaunched", attempt=1)])
    assert failures == [] and lines == [f"fault kill-rank: fired (signal on {plan.faults[0].host} rank 1), detected "
                                        "1.5 s later (node1 rank 1: signal 9 (SIGKILL)), ranks relaunched (attempt 1)"]
    lines, failures = rh.fault_outcomes(plan, [fired, failed])
    assert failures == ["fault kill-rank: fired, but its recovery did not relaunch the ranks"], failures
    missed = ev(1, 10.0, "fault-missed", fault="kill-rank", reason="rank 1 never logged a line matching /x/")
    assert rh.fault_outcomes(plan, [missed])[1] == [
        "fault kill-rank did not fire: rank 1 never logged a line matching /x/"]
    bad = ev(1, 10.0, "fault", fault="kill-rank", ok=False, error="no such rank")
    assert rh.fault_outcomes(plan, [bad])[1] == ["fault kill-rank failed to fire: no such rank"]


def test_a_replica_has_the_real_testbeds_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATID", "h3trinh")
    target = load_testbed("tesla")
    suite = load_suite("tesla")
    spec = rh.replica_spec(target, suite, [resolve_params(suite, {})], "10.219.0.0/24")
    assert spec["provider"]["names"] == target.host_names() and spec["user"] == "h3trinh"
    assert spec["hardware"] == target.hardware.model_dump(mode="json") and spec["groups"] == target.groups
    cham = rh.replica_spec(load_testbed("chameleon"), load_suite("jitc"), [{"nodes": 3}], "10.219.0.0/24")
    assert cham["provider"]["names"] == ["node0", "node1", "node2"]  # as many as the suite's points need


def test_a_rehearsal_refuses_a_source_the_replica_cannot_reach_before_any_host(tb_home: Path) -> None:
    with pytest.raises(UsageError) as e:
        rh.rehearse("jitc", {}, like="chameleon")
    assert "cannot reach" in e.value.what and "--source jitc=PATH" in e.value.fix
    assert "fetching https://" in e.value.what and "failed" in e.value.what  # tried here first (git refused it)
    with pytest.raises(UsageError, match="has no parameter"):
        rh.rehearse("jitc", {"nope": "1"}, like="chameleon")
    with pytest.raises(UsageError, match="names no testbed"):
        rh.rehearse("jitc", {})
    assert not (tb_home / ".testbed" / "testbeds" / "rehearse-chameleon" / "local").exists()


# --- real rehearsals on local replicas ------------------------------------------------------------------------------
def _rehearse(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 1200) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "testbed", "rehearse", *args, "--subnet", free_subnet(), "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=timeout, check=False,
                       env={**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), **(env or {})})
    assert r.stdout.strip(), r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    out["_rc"], out["_stderr"] = r.returncode, r.stderr
    return out


@pytest.mark.slow
def test_tesla_hello_rehearsed_on_a_replica_of_the_lab(tmp_path: Path, need_local: None) -> None:
    """The README's line exactly as written, from a folder whose inventories/tesla.yml is the shipped one with the
    artifact's checkout as its source mirror (the spec's ``sources:``: this machine has the checkout, not a clone),
    and no WATID (the replica stands in with the spec's example); the set-up is the roles a hello needs."""
    vit = artifact("Scalable_ViT_DT")
    line = next(ln.split("#", 1)[0].strip() for ln in (ROOT / "README.md").read_text().splitlines()
                if ln.startswith("testbed rehearse tesla"))
    assert line == "testbed rehearse tesla -p task=hello", line
    (tmp_path / "inventories").mkdir()
    shipped = (ROOT / "inventories" / "tesla.yml").read_text()
    (tmp_path / "inventories" / "tesla.yml").write_text(shipped + f"sources:\n  vit: {json.dumps(str(vit))}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WATID", "COLUMNS")}
    r = subprocess.run([str(Path(sys.executable).with_name("testbed")), *shlex.split(line)[1:]], cwd=tmp_path,
                       capture_output=True, text=True, timeout=1200, check=False,
                       env={**env, "TESTBED_HOME": str(tmp_path / ".testbed"), "COLUMNS": "400"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "WATID is not set: the replica uses 'jdoe'" in r.stderr, r.stderr
    assert "set-up: profile tesla, roles ssh_mesh, shell, packages, mpi" in r.stderr, r.stderr
    target = load_testbed_env("tesla", WATID="jdoe")
    (folder,) = [m.parent for m in (tmp_path / "results" / "tesla").glob("*/manifest.json")]
    man = json.loads((folder / "manifest.json").read_text())
    assert man["rehearsal"]["like"] == "tesla"  # marked: never counted as results
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("ecetesla")) == sorted(target.host_names())
    report = (folder / "report" / "report.md").read_text()
    assert "Rehearsal: not results" in report and report.index("Rehearsal") < report.index("## Run"), report[:600]
    hello = (folder / "ecetesla0" / "rank0.out").read_text()
    assert sorted(ln for ln in hello.splitlines() if ln.startswith("Hello world")) == sorted(
        f"Hello world from processor {n}, rank {i} out of 5 processors" for i, n in enumerate(target.host_names()))
    assert not (tmp_path / ".testbed" / "testbeds" / "rehearse-tesla" / "local").exists()  # the replica is gone


def load_testbed_env(name: str, **env: str) -> Any:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return load_testbed(name)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_source_checkout_follows_its_branch_restores_a_modified_tree_and_takes_over_a_filled_folder(
        tb_home: Path) -> None:
    """The sources step, run for real with git: a later run gets the branch as the remote has it now (not the
    local branch an earlier run left), a tree an earlier run modified is put back, and a folder that set-up
    filled (not a git checkout) is taken over in place instead of failing the clone."""
    origin = tb_home / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    (origin / "main.py").write_text("v1\n")
    _git(origin, "add", ".")
    _git(origin, "commit", "-qm", "v1")
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "src.yml").write_text(
        f"name: src\nsources:\n  - {{name: app, repo: {origin}, ref: main, path: ~/app}}\n"
        "steps:\n  launch: {command: 'true'}\n")
    plan = runner.plan_run("src", None, {}, dry_run=True)
    cmd = plan.sources[0].commands[plan.sources[0].hosts[0]]
    home = tb_home / "home"
    home.mkdir()

    def checkout() -> None:
        r = subprocess.run(["sh", "-c", cmd], env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr

    checkout()
    (home / "app" / "main.py").write_text("modified by a run\n")
    (origin / "main.py").write_text("v2\n")
    _git(origin, "commit", "-qam", "v2")
    checkout()
    assert (home / "app" / "main.py").read_text() == "v2\n"  # the branch as it is now, the run's edit undone
    filled = home / "app"
    subprocess.run(["rm", "-rf", str(filled / ".git")], check=True)  # set-up left a plain copy there
    (filled / "made-by-setup.txt").write_text("kept\n")
    checkout()
    assert (filled / "main.py").read_text() == "v2\n" and (filled / "made-by-setup.txt").exists()


@pytest.mark.slow
def test_jitc_rehearsed_ranks_probed_through_their_real_launch(tmp_path: Path, need_local: None,
                                                                torch_pair: str) -> None:
    """jitc on a replica of its Chameleon testbed: the tracer check (CUDA) is skipped with the reason, the real
    prepare steps run (main.py repaired in the real checkout), and each rank's main.py, started by the suite's
    own launch line, is replaced by the probe: argv through main.py's own parser, its folder and files."""
    jitc = artifact("open-jitc")
    out = _rehearse(tmp_path, "jitc", "--like", "chameleon", "-p", "fault=kill-rank", "--source", f"jitc={jitc}",
                    "--no-setup", "--site", torch_pair)
    point = out["points"][0]
    steps = {s["name"]: s for s in point["steps"]}
    tracer = next(s for n, s in steps.items() if n.startswith("check the CUDA trace preload"))
    assert tracer["status"] == "skipped" and "needs cuda" in tracer["reason"], steps
    assert all(s["status"] == "ran" for n, s in steps.items() if s is not tracer), json.dumps(point, indent=1)
    # both ranks probed, then both again after the relaunch (with --from_checkpoint, as the recovery starts them)
    assert point["ranks"] == "probed" and len(point["probes"]) == 4, json.dumps(point, indent=1)
    assert sorted("--from_checkpoint" in p["argv"] for p in point["probes"]) == [False, False, True, True]
    for p in point["probes"]:
        assert p["script"] == "main.py" and p["parsed_by"] == "its own parser", p
        assert p["cwd"].endswith("open-jitc/UserLevel"), p
    nr = point["not_rehearsed"]
    assert nr[0].startswith("fault kill-rank: fired when rank 1's probe was ready"), nr
    assert all(x.startswith("output ") and "probed or skipped" in x for x in nr[1:]), nr  # what the probe stood for
    # the fault fired on the probed victim through the real supervisor, was detected, and every rank relaunched
    [line] = point["faults"]
    assert line.startswith("fault kill-rank: fired (signal on ") and ", detected " in line and "SIGKILL" in line \
        and line.endswith(", ranks relaunched (attempt 1)"), line
    assert out["ok"] and out["_rc"] == 0, json.dumps(out, indent=1)


def test_a_step_named_like_a_path_keeps_its_output_in_one_plain_file() -> None:
    """isca's 'repair technique/replay/replay.py, …' step stopped the supervisor (found by rehearsing it)."""
    from testbed.run.supervisor import step_log_name

    suite = load_suite("isca-resnet18")
    for s in suite.steps.prepare:
        name = step_log_name("prepare", s.name or "", "node0")
        assert "/" not in name and name.endswith("-node0.log") and name.startswith("prepare-"), name


@pytest.mark.slow
def test_isca_rehearsed_on_a_replica_of_its_tpu_vm(tmp_path: Path, need_local: None) -> None:
    """isca on a one-host replica of the TPU VM: the TPU image check and the Drive download skipped with their
    reasons, replay.py repaired in the real checkout, reproduce_injections.py probed through the suite's launch."""
    isca = artifact("ISCA_AE")
    out = _rehearse(tmp_path, "isca-resnet18", "--source", f"isca={isca}", "--no-setup",
                    env={"GOOGLE_CLOUD_PROJECT": "rehearsal"})
    point = out["points"][0]
    steps = {s["name"]: s for s in point["steps"]}
    assert next(s for n, s in steps.items() if n.startswith("repair technique/replay"))["status"] == "ran", steps
    assert {s["reason"] for s in steps.values() if s["status"] == "skipped"} >= {
        "needs tpu, which the replica lacks", "needs network, which the replica lacks"}, steps
    assert point["ranks"] == "probed" and [p["script"] for p in point["probes"]] == ["reproduce_injections.py"]
    assert out["ok"] and out["_rc"] == 0, json.dumps(out, indent=1)


# --- what a fault needs ---------------------------------------------------------------------------------------------
NEEDY = """name: needy
requires: {hosts: 2}
parameters:
  fault: {type: str, default: none, choices: [none, slow-link, gpu-gone]}
steps:
  launch: {command: 'sleep 1'}
faults:
  slow-link:
    action: command
    rank: 1
    at: 1
    needs: [tc]
    command: sudo tc qdisc add dev eth0 root netem delay 100ms
  gpu-gone:
    action: command
    rank: 1
    at: 1
    needs: [gpu, nvidia-driver]
    command: nvidia-smi -L
"""


def _lab(tb_home: Path, name: str, hardware: str) -> None:
    (tb_home / "inventories").mkdir(exist_ok=True)
    (tb_home / "inventories" / f"{name}.yml").write_text(
        f"provider: {{kind: lab, hosts: [{{name: a, address: 10.0.0.2}}, {{name: b, address: 10.0.0.3}}]}}\n"
        f"user: u\nhardware: {hardware}\n")


def test_a_fault_that_needs_what_the_testbed_lacks_is_refused_before_any_host(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "needy.yml").write_text(NEEDY)
    _lab(tb_home, "bare", "{}")
    _lab(tb_home, "rig", "{tools: [tc], gpu: {model: NVIDIA A100, count: 1}}")
    with pytest.raises(UsageError) as e:
        runner.plan_run("needy", "bare", {"fault": "slow-link"}, dry_run=True)
    assert "fault 'slow-link' of suite 'needy' needs tc, which testbed 'bare' (lab) lacks" in e.value.what
    assert "hardware.tools" in e.value.fix and "needy.yml" in str(e.value.where)
    with pytest.raises(UsageError, match="needs gpu, nvidia-driver, which testbed 'bare'"):
        runner.plan_run("needy", "bare", {"fault": "gpu-gone"}, dry_run=True)
    for fault in ("slow-link", "gpu-gone"):  # declared: planned, with what it needs
        plan = runner.plan_run("needy", "rig", {"fault": fault}, dry_run=True)
        assert [f.name for f in plan.faults] == [fault] and plan.faults[0].needs
    assert runner.plan_run("needy", "bare", {"fault": "none"}, dry_run=True).faults == []
    assert runner.plan_run("needy", None, {"fault": "gpu-gone"}, dry_run=True).faults  # no spec: not judged


def test_a_rehearsal_skips_a_point_whose_fault_the_real_testbed_lacks_and_keeps_the_others(tb_home: Path) -> None:
    """jitc's setpci-gpu needs a GPU: on a replica of the CPU-only chameleon testbed the point is skipped with the
    reason before any host; a rehearsal of only such points is refused as rehearsing nothing."""
    suite = load_suite("jitc")
    assert suite.faults["setpci-gpu"].needs == ["gpu", "nvidia-driver"]
    plan = runner.plan_run(suite, None, {"fault": "shred-libtorch"}, dry_run=True)
    plan.ranks = []  # ranks that run for real (none probed): the fault stays unless the replica lacks its needs
    plan = rh.rehearsal_plan(plan, suite, "chameleon")
    assert plan.faults == [] and plan.rehearsal is not None
    assert plan.rehearsal["not_rehearsed"] == ["fault shred-libtorch: needs gpu, which the replica lacks"]
    res = rh.PointResult(params={}, run_id="", status="skipped", reason="x", steps=[], ranks="not reached",
                         probes=[], not_rehearsed=[])
    assert res.ok and not rh.RehearsalResult("jitc", "chameleon", "r", {}, {}, [res]).ok
    (tb_home / "jitc").mkdir()
    (tb_home / "jitc" / "main.py").write_text("print()\n")
    with pytest.raises(UsageError) as e:
        rh.rehearse("jitc", {"fault": "setpci-gpu"}, like="chameleon", sources={"jitc": str(tb_home / "jitc")})
    assert e.value.what == "nothing to rehearse: fault setpci-gpu needs gpu, nvidia-driver, which testbed " \
        "chameleon lacks", e.value.what
    assert not (tb_home / ".testbed" / "testbeds" / "rehearse-chameleon" / "local").exists()


# --- one point per step shape; the datastall emulator rehearsed ---------------------------------------------------
def test_shapes_pick_one_point_per_distinct_step_shape() -> None:
    """What --shapes rehearses of each matrix: datastall's figures 3/4 (cgexec, one emulator run, vmtouch), 3-100
    (cgexec, a fill-cache run first), 5/6 (no cgroup, a fill-cache run); neuronabox's five experiments."""
    assert rh.programs("set -e\nFOO=1 cgexec -g memory:g python ~/a/main.py -j 8 > o.txt 2>&1 && vmtouch d") == [
        "set", "cgexec", "main.py", "vmtouch"]
    groups: dict[str, dict[Any, list[dict[str, Any]]]] = {}
    for name in ("datastall-emulator", "neuronabox"):
        s = load_suite(name)
        for p in expand_matrix(s, {}):
            shape = rh.plan_shape(runner.plan_run(s, None, p, dry_run=True))
            groups.setdefault(name, {}).setdefault(shape, []).append(p)
    stall = [sorted({p["figure"] for p in g}) for g in groups["datastall-emulator"].values()]
    assert stall == [["3", "4"], ["3-100"], ["5", "6"]], stall
    nbox = [sorted({p["experiment"] for p in g}) for g in groups["neuronabox"].values()]
    assert nbox == [["coll"], ["cnn"], ["bert"], ["deeplight"], ["fsdp"]], nbox
    with pytest.raises(UsageError, match="--shapes picks points of the matrix"):
        rh.rehearse("datastall-emulator", {}, shapes=True)


def _world_readable_cache() -> Path:
    """Where a replica's user (cc, h3trinh) can read what a test made (as the torch pair's venv)."""
    root = Path(os.environ.get("TESTBED_TEST_CACHE", "/var/tmp/testbed-tests"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def imagenette_archive() -> Path:
    """A small imagenette2.tar.gz in the layout of the authors' Drive copy: imagenette2/{train,val}/<wnid>/*.JPEG
    (what main-measure-time-emulator.py reads with ImageFolder, and vmtouch maps)."""
    import io
    import random
    import tarfile

    from PIL import Image

    out = _world_readable_cache() / "imagenette2-mini.tar.gz"
    if out.is_file():
        return out
    rng = random.Random(7)
    part = out.with_suffix(f".part{os.getpid()}")
    with tarfile.open(part, "w:gz") as tf:
        for split in ("train", "val"):
            for wnid in ("n01440764", "n02102040"):
                for i in range(4):
                    buf = io.BytesIO()
                    Image.frombytes("RGB", (64, 64), rng.randbytes(64 * 64 * 3)).save(buf, "JPEG")
                    info = tarfile.TarInfo(f"imagenette2/{split}/{wnid}/{wnid}_{i}.JPEG")
                    info.size, info.mode = len(buf.getvalue()), 0o644
                    tf.addfile(info, io.BytesIO(buf.getvalue()))
    part.chmod(0o644)
    part.replace(out)
    return out


@pytest.mark.slow
def test_datastall_rehearsed_one_point_per_shape_on_a_replica_of_its_chameleon_node(
        tmp_path: Path, need_local: None, torch_pair: str) -> None:
    """The datastall emulator on a replica of its Chameleon node, with the profile's check stack (mlock and minio
    built from their real sources, gpufs from the real tree, vmtouch, the memory cgroup) and the real dataset step
    fed a small archive in the Drive copy's layout: figures 3, 3-100 and 5 (one per step shape) each run the real
    cgroup, cache-drop and vmtouch steps, the emulator (its forks' API) probed through the suite's launch line."""
    from localbed import can_raise_memlock

    gpufs, mlock, minio = (artifact(n) for n in ("gpufs", "mlock", "minio"))
    (tmp_path / "inventories").mkdir()
    spec = yaml_load(Path(rh.__file__).parents[1] / "inventories" / "chameleon.yml")
    spec["vars"] = {"datastall_stack": "check", "datastall_dataset_url": f"file://{imagenette_archive()}",
                    "python_env_shared_site_packages": [torch_pair], "python_env_pip_packages": [],
                    "memlock_limit": "unlimited" if can_raise_memlock() else "4096"}
    (tmp_path / "inventories" / "chameleon-check.yml").write_text(json.dumps(spec))
    out = _rehearse(tmp_path, "datastall-emulator", "--like", "chameleon-check", "--matrix", "--shapes",
                    "--source", f"gpufs={gpufs}", "--source", f"mlock={mlock}", "--source", f"minio={minio}")
    assert out["setup"]["ok"], json.dumps(out["setup"], indent=1)
    assert [p["params"]["figure"] for p in out["points"]] == ["3", "3-100", "5"], out["points"]
    for point in out["points"]:
        steps = {s["name"]: s for s in point["steps"]}
        assert all(s["status"] == "ran" for s in steps.values()), json.dumps(point, indent=1)
        assert point["ranks"] == "probed", json.dumps(point, indent=1)
        runs = 1 if point["params"]["figure"] == "3" else 2  # 3-100 and 5: a resnet18 fill-cache run first
        assert [p["script"].rsplit("/", 1)[-1] for p in point["probes"]] == ["main-measure-time-emulator.py"] * runs
        for p in point["probes"]:
            assert p["parsed_by"] == "its own parser", p  # torch, torchvision, minio and mlock all imported
            assert p["argv"][-1].endswith("/data/imagenette2") and "--emulator-version=1" in p["argv"], p
        folder = Path(point["folder"])
        if point["params"]["figure"] in ("3", "3-100"):  # vmtouch mapped the extracted train/ of the small copy
            cache = next(folder.glob("node0/outputsfig3/cache_result*.txt")).read_text()
            assert "Files: 8" in cache and "Directories: 3" in cache, cache
    assert out["ok"] and out["_rc"] == 0, json.dumps(out, indent=1)


def yaml_load(path: Path) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


# --- neuronabox rehearsed -------------------------------------------------------------------------------------------
GPU_PAIR = """description: two one-GPU hosts, as NeuronaBox's evaluation (an emulated node and its peer)
provider: {kind: lab, hosts: [{name: gpu1, address: 10.0.0.2}, {name: gpu2, address: 10.0.0.3}]}
user: nbox
hardware: {interface: eno1, gpu: {model: NVIDIA GeForce RTX 3090, count: 1}}
"""


def deeplight_folder() -> Path:
    """DeepLight's dataset/ files in main_all.py's format (:66-82): Criteo's 39 fields (13 numerical, 26
    categorical), {Xi,Xv,y}_{train,valid}_tiny.npy and the embedding sizes in feature_sizes.pickle."""
    import pickle

    import numpy as np

    out = _world_readable_cache() / "deeplight-mini"
    if (out / "feature_sizes.pickle").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    sizes = [1] * 13 + [int(x) for x in rng.integers(2, 50, 26)]
    for split, n in (("train", 64), ("valid", 16)):
        xi = np.stack([rng.integers(0, s, n) for s in sizes], axis=1).reshape(n, 39, 1)
        np.save(out / f"Xi_{split}_tiny.npy", xi)
        np.save(out / f"Xv_{split}_tiny.npy", rng.random((n, 39)).astype(np.float32))
        np.save(out / f"y_{split}_tiny.npy", rng.integers(0, 2, n))
    with open(out / "feature_sizes.pickle", "wb") as f:
        pickle.dump(sizes, f)
    for p in [out, *out.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def test_a_compiled_rank_under_mpirun_runs_a_stand_in_and_one_not_under_mpirun_is_skipped(
        tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """neuronabox's collectives: mpirun starts a CUDA binary (/tmp/ex, named in the launch's probe:) that the
    skipped compile step makes: an MPI stand-in built on every host takes its place in the real mpirun line (its
    -x, --prefix, -H and --mca options kept); the same binary started without mpirun is skipped, said so."""
    monkeypatch.setenv("WATID", "jdoe")  # the lab's spec needs it, and a dry run reads the spec as a run does
    suite = load_suite("neuronabox")
    plan = rh.rehearsal_plan(runner.plan_run(suite, None, {"experiment": "coll"}, dry_run=True), suite, "x")
    assert plan.rehearsal is not None and plan.rehearsal["skipped_ranks"] == {}
    stand_in = f"{plan.run_dir}/{rh.MPI_STAND_IN}"
    cmd = plan.ranks[1].command
    assert f"sh -c '{stand_in} " in cmd and "/tmp/ex" not in cmd and "mpirun -x NCCL_PROTO" in cmd, cmd
    assert "--prefix /tmp/neuronabox-env -np 2 -H" in cmd and "--mca btl tcp,self" in cmd, cmd
    assert plan.files[f"{rh.MPI_STAND_IN}.c"].endswith("mpi_stand_in.c")
    build = next(s for s in plan.prepare if s.name == "rehearse: build the MPI stand-in")
    assert set(build.hosts) == set(plan.host_names) and "mpicc" in next(iter(build.commands.values()))
    assert any(n.startswith("rank 1: /tmp/ex stood in by an MPI program") for n in plan.rehearsal["not_rehearsed"])
    bare = rh.rehearsal_plan(runner.plan_run(suite, None, {"experiment": "coll"}, dry_run=True), suite, "x",
                             set_up=False)  # --no-setup: the hosts do not know each other (no ssh mesh)
    assert bare.rehearsal is not None and "the replica was not set up (--no-setup)" in \
        bare.rehearsal["skipped_ranks"]["1"] and bare.ranks[1].command.startswith("echo ")
    alone = runner.plan_run(suite, None, {"experiment": "coll"}, dry_run=True)
    alone.ranks[1].command = "cd /tmp && /tmp/ex 256 10"
    alone = rh.rehearsal_plan(alone, suite, "x")
    assert alone.rehearsal is not None and alone.rehearsal["skipped_ranks"]["1"] == (
        "needs cuda, gpu, which the replica lacks, and runs /tmp/ex, a compiled program the probe cannot stand in "
        "for (not under mpirun)")
    assert alone.ranks[1].command.startswith("echo ")
    tesla = load_suite("tesla")  # tesla's hello_mpi names no compiled program: its ranks run (mpirun, the binary)
    hello = rh.rehearsal_plan(runner.plan_run(tesla, None, {"task": "hello"}, dry_run=True), tesla, "tesla")
    assert hello.rehearsal is not None and hello.rehearsal["skipped_ranks"] == {}
    cnn = rh.rehearsal_plan(runner.plan_run(suite, None, {"experiment": "cnn"}, dry_run=True), suite, "x")
    assert cnn.rehearsal is not None and cnn.rehearsal["probed_ranks"] == [0, 1]


@pytest.mark.slow
def test_neuronabox_rehearsed_one_point_per_shape_on_a_replica_of_two_gpu_hosts(
        tmp_path: Path, need_local: None, torch_pair: str) -> None:
    """NeuronaBox on two local hosts shaped like its two one-GPU nodes (eno1): per experiment, each host's env
    (emu on the master, ori on the peer) stood in for, the real prepare steps that need no CUDA and no network on
    the real checkout (the per-host mpirun prefix, config.sh once per home, CNN's synthetic JPEGs, DeepLight's
    files from a folder the test makes in their format, BERT's folders), the CUDA and download steps skipped with
    their reasons; CNN, BERT (through run.sh), DeepLight and FSDP ranks probed through the suite's launch line."""
    nb = artifact("NeuronaBox")
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "gpu-pair.yml").write_text(GPU_PAIR)
    out = _rehearse(tmp_path, "neuronabox", "--like", "gpu-pair", "--matrix", "--shapes", "--source",
                    f"neuronabox={nb}", "--no-setup", "--site", torch_pair,
                    "-p", f"deeplight_data={deeplight_folder()}")
    points = {p["params"]["experiment"]: p for p in out["points"]}
    assert list(points) == ["coll", "cnn", "bert", "deeplight", "fsdp"], list(points)
    for exp, point in points.items():
        steps = {s["name"]: s for s in point["steps"]}
        for name, s in steps.items():
            needy = name.startswith(("compile", "the experiment's Python", "the experiment's data (downloaded)"))
            assert s["status"] == ("skipped" if needy else "ran"), (exp, name, s)
        if exp == "coll":
            assert point["ranks"] == "ran" and any("/tmp/ex" in n for n in point["not_rehearsed"]), point
            continue
        scripts = {"cnn": "main.py", "bert": "run_squad.py", "deeplight": "main_all.py", "fsdp": "T5_training.py"}
        assert point["ranks"] == "probed", json.dumps(point, indent=1)
        assert sorted({p["script"].rsplit("/", 1)[-1] for p in point["probes"]}) == [scripts[exp]], point["probes"]
        assert len(point["probes"]) == 2, point["probes"]  # one per rank, each in its own env
    assert out["ok"] and out["_rc"] == 0, json.dumps(out, indent=1)


FREE_SUBNET = """
import subprocess, sys
from testbed.providers.local.provider import free_subnet
def ip(*a): subprocess.run(["ip", *a], check=True)
print(free_subnet())
for dev, addr in (("d0", "10.219.0.1/24"), ("d1", "10.219.2.77/23")):
    ip("link", "add", dev, "type", "veth", "peer", "name", dev + "p")
    ip("addr", "add", addr, "dev", dev); ip("link", "set", dev, "up"); ip("link", "set", dev + "p", "up")
print(free_subnet())
print(free_subnet(prefer="10.219.0.0/24"))
print(free_subnet(prefer="10.219.2.0/24"))
print(free_subnet(prefer="10.250.3.0/24"))
"""


@pytest.mark.local
def test_the_replica_picks_a_subnet_no_route_uses(tmp_path: Path) -> None:
    """In a network namespace of its own: the first /24 from 10.219.0.0 that no route overlaps; a kept replica's
    own subnet (routed exactly) is kept, one another route overlaps is not."""
    r = subprocess.run(["unshare", "--net", sys.executable, "-c", FREE_SUBNET], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10.219.0.0/24", "10.219.1.0/24", "10.219.0.0/24", "10.219.1.0/24",
                                "10.250.3.0/24"], r.stdout
