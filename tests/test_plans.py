"""Typed plans: the plan file keeps the shape earlier versions wrote, and plans in that shape load and run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testbed.errors import TestbedError, UsageError
from testbed.records import RelaunchStep, RunPlan, RunStep
from testbed.run import bookkeeping as rs
from testbed.run import runner
from testbed.run.plan import dry_run_lines
from testbed.suite import load_suite

PLANS = Path(__file__).parent / "samples" / "plans"
# the plan files in tests/samples/plans were written by testbed before plans were typed (plain dicts), for:
CASES = {"fault-drill": ("fault-drill", {}, ["kill-rank", "kill-rank-at"]),
         "jitc": ("jitc", {"fault": "shred-libtorch"}, None)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_plan_file_in_the_earlier_shape_loads_and_gives_it_back(name: str) -> None:
    path = PLANS / f"{name}.json"
    plan = RunPlan.load(path)
    assert plan.to_json() == json.loads(path.read_text())  # nothing lost, nothing added
    assert dry_run_lines(plan)[0]["phase"] == "setup"
    for f in plan.faults:
        assert [type(s) for s in f.recovery_steps(1)] == [RelaunchStep]
        assert all(r.attempt == 1 for s in f.recovery_steps(1) if isinstance(s, RelaunchStep) for r in s.ranks)
    assert all(isinstance(s, RunStep) for s in plan.sources + plan.prepare + plan.post)


@pytest.mark.parametrize("name", ["jitc"])  # fault-drill has since gained a seed, a repair step and a checkpoint
def test_planning_writes_the_earlier_shape(tb_home: Path, name: str) -> None:
    """The same suite, parameters and faults give a plan JSON of the shape the untyped planner wrote: the same keys
    at every level (the suite's commands have been repaired since; what a rank or step needs beyond a CPU host is
    the one key added, and only where it is needed)."""
    suite, params, faults = CASES[name]
    plan = runner.plan_run(suite, None, params, faults=faults, dry_run=True, run_id=f"{suite}-20250101-120000-abcd")
    text = json.dumps(plan.to_json()).replace(str(load_suite(suite).dir.resolve()), "<suite-dir>")
    now = json.loads(text)
    for key in ("checkpoint", "progress"):  # jitc has since declared its checkpoint (its recovery is judged on it)
        now.pop(key, None)
    assert _shape(now, drop="needs") == _shape(json.loads((PLANS / f"{name}.json").read_text()))
    assert {r["run_id"] for r in [json.loads(text)]} == {f"{suite}-20250101-120000-abcd"}


def _shape(v: object, drop: str = "") -> object:
    """The keys of ``v`` at every level (lists by the union of their items' shapes), leaving out ``drop``."""
    if isinstance(v, dict):
        return {k: _shape(x, drop) for k, x in v.items() if k != drop}
    if isinstance(v, list):
        shapes = [_shape(x, drop) for x in v]
        return [s for i, s in enumerate(shapes) if s not in shapes[:i]]
    return "number" if isinstance(v, int | float) and not isinstance(v, bool) else type(v).__name__


def test_a_plan_file_round_trips_through_the_run_home(tb_home: Path) -> None:
    plan = RunPlan.load(PLANS / "jitc.json")
    path = rs.save_plan(plan)
    assert rs.load_plan(plan.run_id) == plan and "environments" not in json.loads(path.read_text())["sources"][0]
    with pytest.raises(UsageError, match="has no plan file"):
        rs.load_plan("nope-20250101-120000-0000")


@pytest.mark.parametrize("content", ["{", '{"run_id": "x"}', '{"faults": "no"}', "[]"])
def test_an_unreadable_plan_file_is_one_error_naming_it(tb_home: Path, content: str) -> None:
    path = rs.run_home("bad-20250101-120000-0000") / "plan.json"
    path.write_text(content)
    with pytest.raises(TestbedError) as e:
        rs.load_plan("bad-20250101-120000-0000")
    assert "plan file is unreadable" in e.value.what and e.value.where == str(path) and e.value.fix


SUITE = """
name: gen
steps:
  {phase}:
    - name: again
      relaunch: true
  launch:
    command: echo {{{{ rank }}}}
"""


@pytest.mark.parametrize("phase", ["prepare", "post"])
def test_relaunch_outside_recovery_is_refused_before_any_host(tb_home: Path, phase: str) -> None:
    """A relaunch step restarts the ranks after a fault; in prepare or post it has no ranks to restart."""
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "gen.yml").write_text(SUITE.format(phase=phase))
    with pytest.raises(UsageError) as e:
        runner.plan_run("gen", None, {}, dry_run=True)
    assert f"steps.{phase}[0]" in e.value.what and "recovery" in (e.value.fix or "")


def test_a_plan_with_repair_and_checkpoint_round_trips(tb_home: Path) -> None:
    from testbed.records import RepairStep

    plan = runner.plan_run("fault-drill", None, {"seed": 5}, faults=["kill-host"], dry_run=True)
    assert plan.checkpoint is not None and plan.checkpoint.hosts == [plan.master] and plan.checkpoint.file == "ckpt.pt"
    (f,) = plan.faults
    assert f.action == "kill-host" and f.when == "epoch [0-9]+ step 8 loss"  # 4 + 1 + 5 * 7 % (12 - 4)
    assert [type(s) for s in f.recovery_steps(1)] == [RepairStep, RelaunchStep]
    assert [type(s) for s in plan.recovery["1"]] == [RepairStep, RelaunchStep] and set(plan.recovery) == {"1", "2"}
    assert RunPlan.model_validate(plan.to_json()) == plan
    assert any(ln["step"] == "repair any lost host and set it up again" for ln in dry_run_lines(plan))


def test_fault_drill_says_it_resumed_from_the_checkpoint_only_when_one_was_loaded(tb_home: Path) -> None:
    """The check 'training resumed from the checkpoint' reads what rank 0 said it did: it passes on "restored
    checkpoint ... at step N" and fails on "found no checkpoint ...: starting again from step 0"; and kill-host, for
    every seed the demo may pick, strikes after the first checkpoint, so the claim is true of a real run."""
    import re

    plan = runner.plan_run("fault-drill", None, {}, faults=["kill-host"], dry_run=True)
    (ck,) = [c for c in plan.checks if c.name == "training resumed from the checkpoint"]
    assert ck.file == "rank0.out" and ck.contains
    said = {"rank 0 restored checkpoint ckpt.pt at step 8": True,
            "rank 0 found no checkpoint ckpt.pt: starting again from step 0": False,
            "rank 0 restored checkpoint ckpt.pt at step 0": False}
    for line, ok in said.items():  # grep -E, as the run's check step uses it
        r = subprocess.run(["grep", "-E", "-q", "-e", ck.contains, "-"], input=line + "\n", text=True, check=False)
        assert (r.returncode == 0) is ok, line
    for seed in (*range(9), 96):  # (seed * 7) % 8: every value the step takes
        (f,) = runner.plan_run("fault-drill", None, {"seed": seed}, faults=["kill-host"], dry_run=True).faults
        m = re.search(r"step (\d+) loss", f.when or "")
        assert m and 4 < int(m.group(1)) <= 12, (seed, f.when)  # after the checkpoint of step 4, in the first half
