"""The five artifact suites against the artifacts' real code (../shared/artifacts; skipped when absent).

For every suite, every matrix point and every value of each choice parameter, the rendered plan is checked
against the real repository at its pinned commit:
- every working folder and every Python script a step or rank uses exists in the real tree (or is made by an
  earlier step, listed in ``MADE``);
- every argv given to a Python script is accepted by that script's own argument parser (read with ``ast`` and
  rebuilt as a real argparse parser: same options, types, actions, choices and prefix matching);
- every declared output and every log line a fault waits for is one the code really writes or prints.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from artifacts import ParseError, artifact, commands, host_path_to_artifact, plan_for, points, python_calls, read_parser

from testbed.suite import load_suite

# suite -> {host path prefix: artifact name (and sub-folder)}
MOUNTS = {
    "jitc": {"~/open-jitc": ("open-jitc", "")},
    "tesla": {"~/Scalable_ViT_DT": ("Scalable_ViT_DT", "")},
    "datastall-emulator": {"~/gpufs": ("gpufs", "")},
    "isca-resnet18": {"~/ISCA_AE": ("ISCA_AE", "")},
    "neuronabox": {"~/NeuronaBox": ("NeuronaBox", ""), "~/NeuronaBox/nccl": ("NeuronaBox-NCCL", "")},
}
# files the profile or an earlier step makes (not in the repository): suite -> host paths
MADE = {
    "tesla": {"~/Scalable_ViT_DT/tesla/setup/hello_mpi"},
}


def mounts(suite: str) -> dict[str, Path]:
    out = {}
    for prefix, (name, sub) in MOUNTS[suite].items():
        out[prefix] = artifact(name) / sub if sub else artifact(name)
    return out


SUITES = sorted(MOUNTS)
CASES = [(s, p) for s in SUITES for p in points(s)]


def _id(case: tuple[str, dict[str, Any]]) -> str:
    return case[0] + ":" + ",".join(f"{k}={v}" for k, v in case[1].items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_paths_and_flags_conform_to_the_real_code(case: tuple[str, dict[str, Any]]) -> None:
    suite_name, given = case
    m = mounts(suite_name)
    s = load_suite(suite_name)
    plan = plan_for(suite_name, given, faults=list(s.faults) if "fault" not in s.parameters else None)
    problems: list[str] = []
    made = MADE.get(suite_name, set())
    checked = 0
    for where, cmd, cwd in commands(plan):
        if cwd:
            local = host_path_to_artifact(cwd, m)
            if local is not None and not local.is_dir():
                problems.append(f"{where}: working folder {cwd} is not in the repository")
        for call in python_calls(cmd, cwd):
            base = call.cwd or "~"
            host_script = call.script if call.script.startswith(("/", "~", "$HOME")) else f"{base}/{call.script}"
            local = host_path_to_artifact(host_script, m)
            if local is None:
                continue  # a script outside the artifact (e.g. python -c)
            if not local.is_file():
                if host_script not in made:
                    problems.append(f"{where}: {'source' if call.compiled else 'script'} {host_script} is not in "
                                    "the repository")
                continue
            if call.compiled:
                continue
            sp = read_parser(local)
            checked += 1
            try:
                sp.parse(call.argv)
            except ParseError as e:
                problems.append(f"{where}: {host_script} {' '.join(call.argv)!r} is refused by its parser: {e}")
    assert not problems, "\n".join(problems)
    PARSED[suite_name] = PARSED.get(suite_name, 0) + checked


PARSED: dict[str, int] = {}


def test_every_suite_had_its_scripts_checked() -> None:
    """The checks above really ran the real parsers (a suite whose commands hid every script would pass)."""
    if not PARSED:
        pytest.skip("no conformance case ran")
    want = {"jitc", "tesla", "datastall-emulator", "isca-resnet18", "neuronabox"}
    assert {k for k, v in PARSED.items() if v > 0} >= want & set(PARSED), PARSED


def _samples(arg: Any) -> list[str]:
    """Lines a print of ``arg`` (a string or f-string node) can produce, its fields filled with a few values."""
    import ast

    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if not isinstance(arg, ast.JoinedStr):
        return []
    out = []
    for v in ("5", "0", "1", "10", "x"):
        out.append("".join(p.value if isinstance(p, ast.Constant) else v for p in arg.values))
    return out


def _printing_ranks(sources: list[Path], when: str) -> list[int | None]:
    """For each print/log call that can print a line matching ``when``: the rank an enclosing ``if ... rank == N``
    limits it to (None: printed on every rank)."""
    import ast

    found: list[int | None] = []

    def visit(node: ast.AST, rank: int | None) -> None:
        if isinstance(node, ast.If):
            cond = ast.unparse(node.test)
            m = re.search(r"\brank\s*==\s*(\d+)|\b(\d+)\s*==\s*rank\b", cond)
            inner = int(m[1] or m[2]) if m else rank
            for child in node.body:
                visit(child, inner)
            for child in node.orelse:
                visit(child, rank)
            return
        if isinstance(node, ast.Call) and node.args:
            fn = ast.unparse(node.func)
            if fn.split(".")[-1] in ("print", "info", "warning", "write") and any(
                    re.search(when, line) for line in _samples(node.args[0])):
                found.append(rank)
        for child in ast.iter_child_nodes(node):
            visit(child, rank)

    for p in sources:
        try:
            visit(ast.parse(p.read_text(errors="replace")), None)
        except SyntaxError:
            continue
    return found


@pytest.mark.parametrize("suite_name", SUITES)
def test_fault_triggers_are_printed_by_the_watched_rank(suite_name: str) -> None:
    """Every ``when:`` regex of a fault names a line the artifact's code prints, on the rank that is watched."""
    s = load_suite(suite_name)
    roots = list(mounts(suite_name).values())
    files = [p for r in roots for p in r.rglob("*.py")]
    for name, f in s.faults.items():
        if not f.when:
            continue
        ranks = _printing_ranks(files, f.when)
        assert ranks, f"{suite_name}: fault '{name}' waits for /{f.when}/, which no print or log call of the code emits"
        plan = plan_for(suite_name, {"fault": name} if "fault" in s.parameters else {}, faults=[name])
        watched = next(x for x in plan.faults if x.name == name).watch_rank
        assert None in ranks or watched in ranks, (
            f"{suite_name}: fault '{name}' watches rank {watched}, but /{f.when}/ is printed only by rank(s) "
            f"{sorted(r for r in ranks if r is not None)}")


def test_tesla_repair_lets_the_environment_set_the_master_address(tmp_path: Path) -> None:
    """The scripts' hard-coded MASTER_ADDR/MASTER_PORT become defaults the environment overrides, run on a copy
    of the real tree with the exact command the suite renders."""
    import ast
    import shutil
    import subprocess

    tesla = tmp_path / "tesla"
    shutil.copytree(artifact("Scalable_ViT_DT") / "tesla", tesla)
    plan = plan_for("tesla", {"task": "train", "gpus": 2})
    (step,) = [s for s in plan.prepare if "MASTER_ADDR" in s.name]
    subprocess.run(["bash", "-c", next(iter(step.commands.values()))], cwd=tesla, check=True, timeout=60)
    for rel in ("deepspeed/run_distributed_training.py", "simple_test/test_nccl.py", "script/baseline_measure.py"):
        tree = ast.parse((tesla / rel).read_text())
        assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript)
                    and "environ" in ast.unparse(n.targets[0]) and "MASTER_" in ast.unparse(n.targets[0])]
        assert not assigned, (rel, [ast.unparse(n) for n in assigned])
        calls = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and ast.unparse(n.func) == "os.environ.setdefault"]
        assert any("MASTER_ADDR" in c and "129.97.92." in c for c in calls), (rel, calls)
    # the repaired code really yields to the environment
    lines = [ln.strip() for ln in (tesla / "simple_test/test_nccl.py").read_text().splitlines()
             if "os.environ.setdefault" in ln]
    snippet = "\n".join(["import os", *lines, "print(os.environ['MASTER_ADDR'])"])
    out = subprocess.run(["python3", "-c", snippet], env={"MASTER_ADDR": "10.0.0.2", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "10.0.0.2"
