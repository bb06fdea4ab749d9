"""isca-resnet18 against the real ISCA_AE tree (../shared/artifacts; skipped when absent): what the steps do in order.

The launch and post commands of each injection are run as rendered, in a copy of the real repository under a
sandbox home, with ``python3`` replaced by a stub that writes what ``reproduce_injections.py`` writes
(``replay_<csv basename>.txt`` in its working folder, reproduce_injections.py:208). The result files then left
in the run folder are compared with the authors' committed expected results.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from artifacts import artifact, plan_for, points

from testbed.run.plan import HostInfo, TestbedInfo, build_plan
from testbed.spec import Hardware
from testbed.suite import load_suite, resolve_params

SUITE = "isca-resnet18"

def _fault_free() -> str:
    """The reference run's name, as the suite folder's report.py (loaded as testbed loads it) reads it."""
    from testbed import results

    own = results.load(Path(__file__).resolve().parents[1] / "experiments" / SUITE / "report.py")
    assert own.reporter is not None
    return str(sys.modules[own.reporter.fn.__module__].FAULT_FREE)


FAULT_FREE = _fault_free()
CIFAR10_TRAIN_IMAGES = 50000  # tf.keras.datasets.cifar10 (prepare_data.py:128)

STUB = """#!/bin/bash
echo "$PWD $*" >> "$STUB_LOG"
f=""
while [ $# -gt 0 ]; do [ "$1" = --file ] && f="$2"; shift; done
if [ -n "$f" ]; then b="${f##*/}"; printf 'ours\\n' > "replay_${b%.*}.txt"; fi
"""


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _committed_results(repo: Path) -> dict[bytes, str]:
    """Contents of the authors' committed result files (expected_results/, expected_result/) -> their path."""
    return {p.read_bytes(): str(p.relative_to(repo)) for p in sorted(repo.rglob("*"))
            if p.is_file() and any(part.startswith("expected_result") for part in p.relative_to(repo).parts)}


def _run_launch_and_post(tmp_path: Path, experiment: str) -> tuple[Path, Path, list[str]]:
    """Run the rendered launch and post of ``experiment``: (run folder, home, stub log lines)."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(artifact("ISCA_AE"), home / "ISCA_AE")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "stub.log"
    log.touch()
    plan = plan_for(SUITE, {"experiment": experiment})
    rdir = home / plan.run_dir.removeprefix("~/")
    rdir.mkdir(parents=True)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log)}
    for r in plan.ranks:
        subprocess.run(["bash", "-c", f"cd {rdir} && {r.command}"], env=env, check=True)
    for st in plan.post:
        for cmd in st.commands.values():
            subprocess.run(["bash", "-c", f"cd {rdir} && {cmd}"], env=env, check=True)
    return rdir, home, log.read_text().splitlines()


INJECTIONS = sorted({str(p["experiment"]) for p in points(SUITE) if str(p["experiment"]).startswith("inj_")})


@pytest.mark.parametrize("experiment", INJECTIONS)
def test_injection_results_hold_no_committed_expected_result(tmp_path: Path, experiment: str) -> None:
    """Class 4: the post step copied expected_results/fault_free.txt (the authors' run on their TPU) into every
    injection's run folder, where the report read it as this run's fault-free reference and tabled its rows
    beside ours; collect could not tell it from an output (a fresh copy, not the checkout's file)."""
    committed = _committed_results(artifact("ISCA_AE"))
    assert committed, "the artifact commits expected results"
    rdir, _, _ = _run_launch_and_post(tmp_path, experiment)
    theirs = [f"{p.name} = {committed[p.read_bytes()]}" for p in sorted(rdir.iterdir())
              if p.is_file() and p.read_bytes() in committed]
    assert not theirs, f"the authors' committed results in the run's outputs: {theirs}"


@pytest.mark.parametrize("experiment", ["inj_masked", "inj_slow_degrade"])
def test_an_injection_judged_against_a_fault_free_run_makes_its_own(tmp_path: Path, experiment: str) -> None:
    """Class 4/6: the masked check (README Example 2: final train accuracy within ~2% of the fault-free run) and
    the slow-degrade one (Example 3: significantly lower than the error-free run's) each need a fault-free run from
    the same checkpoint, seed and TPU, in the same point (a point run alone otherwise had no outcome to judge);
    the run makes it with the artifact's own reproduce_injections.py from the injection's CSV with an injection
    step that never comes."""
    repo = artifact("ISCA_AE")
    rdir, home, calls = _run_launch_and_post(tmp_path, experiment)
    ref = [p for p in rdir.iterdir() if p.stem in (FAULT_FREE, f"replay_{FAULT_FREE}") and p.suffix == ".txt"]
    assert len(ref) == 1 and ref[0].read_text() == "ours\n", \
        f"no fault-free reference made by this run in the run folder: {sorted(p.name for p in rdir.iterdir())}"
    fault_injection = home / "ISCA_AE" / "fault_injection"
    files = [c.split()[-1] for c in calls if c.split()[:2] == [str(fault_injection), "reproduce_injections.py"]]
    assert len(files) == 2 and files[-1] == f"injections/{experiment}.csv", calls
    ff_csv = Path(files[0].replace("~", str(home), 1))
    assert ff_csv.stem == FAULT_FREE and ff_csv.is_file()

    sys.path.insert(0, str(repo / "fault_injection"))
    try:
        inj = _module(repo / "fault_injection" / "injection.py", "isca_injection")
        config = _module(repo / "fault_injection" / "config.py", "isca_config")
    finally:
        sys.path.remove(str(repo / "fault_injection"))
    masked = inj.read_injection(str(repo / "fault_injection" / "injections" / f"{experiment}.csv"))
    masked_at = (masked.model, masked.stage, masked.target_epoch, masked.target_step, masked.learning_rate)
    ff = inj.read_injection(str(ff_csv))
    steps_per_epoch = math.ceil(CIFAR10_TRAIN_IMAGES / config.BATCH_SIZE)  # reproduce_injections.py:202
    assert 0 <= masked.target_step < steps_per_epoch  # the masked injection does happen
    assert ff.target_step not in range(steps_per_epoch), "the fault-free run would inject"
    assert (ff.model, ff.target_epoch, ff.learning_rate) == (masked_at[0], masked_at[2], masked_at[4]), \
        "the fault-free run starts from another checkpoint or learning rate than the masked injection"


def _shared_home_plan() -> object:
    s = load_suite(SUITE)
    hosts = [HostInfo(f"tpu{i}", f"10.0.0.{i + 2}", ["master"] if i == 0 else ["workers"], {}) for i in range(2)]
    tb = TestbedInfo("shared", "gcp-tpu", hosts, {"name": "shared", "provider": "gcp-tpu", "subnet": "10.0.0.0/24",
                                                  "ssh_config": "x",
                                                  "hardware": Hardware(shared_home=True).context()})
    return build_plan(s, tb, resolve_params(s, {}))


def test_steps_that_write_the_checkout_run_once_per_home() -> None:
    """Class 7: the replay.py repair (sed -i) and the checkpoint download write into ~/ISCA_AE; where hosts share
    their home they would do it on every host at once, in one tree."""
    artifact("ISCA_AE")
    plan = _shared_home_plan()
    writers = [st for st in plan.prepare if st.cwd and st.cwd.startswith("~/ISCA_AE")]
    assert writers
    assert all(len(st.hosts) == 1 for st in writers), [(st.name, st.hosts) for st in writers]


def test_steps_declare_what_they_need_beyond_a_cpu_host() -> None:
    """TensorFlow 2.6.0 is the TPU VM image's (inventories/tpu.yml runtime tpu-vm-tf-2.6.0; README 'System
    Requirements'); the checkpoints come from Google Drive."""
    tpu = Path(__file__).resolve().parents[1] / "inventories" / "tpu.yml"
    assert "tpu-vm-tf-2.6.0" in tpu.read_text()
    plan = plan_for(SUITE, {})
    tf_steps = [st for st in plan.prepare if any("import tensorflow" in c and "sed" not in c
                                                 for c in st.commands.values())]
    drive = [st for st in plan.prepare if any("drive.google.com" in c for c in st.commands.values())]
    assert tf_steps and drive
    assert all("tpu" in st.needs for st in tf_steps), [(st.name, st.needs) for st in tf_steps]
    assert all("network" in st.needs for st in drive), [(st.name, st.needs) for st in drive]
