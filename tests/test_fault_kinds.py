"""Fault kinds are one object each, registered where defined (testbed/fault_kinds.py): every shipped kind is found
only through the registry, and a kind registered here (a toy) is validated, described by a dry run, fired, restored
and refused on a provider without its capability, without any other file knowing its name."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from testbed import fault_kinds, suite
from testbed.errors import TestbedError, UsageError
from testbed.fault_kinds import FaultKind, Firing
from testbed.providers import provider_class
from testbed.providers.base import Capability
from testbed.records import FaultPlan, RunPlan
from testbed.run import faults, runner
from testbed.run.plan import dry_run_lines

PKG = Path(__file__).resolve().parents[1] / "testbed"
SHIPPED = ["signal", "command", "kill-host", "cut-network", "in-workload"]  # the order the error lists them in

ALLOWED: dict[tuple[str, str], str] = {
    ("capabilities.py", "kill-host"): "Capability.KILL_HOST: the provider operation the kill-host kind needs is "
                                        "named by the same word (the kind's capability; checked below)",
    ("capabilities.py", "cut-network"): "Capability.CUT_NETWORK: likewise, the operation cut-network needs",
    ("cli/tools.py", "kill-host"): "the name of a fault of experiments/fault-drill/suite.yml (--fault NAME), not a "
                                   "kind",
}
"""(file under testbed/, kind name) -> why that file may write the name: each is a different thing by that word."""


def _mentions_kind_field(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute | ast.Name) and (getattr(n, "attr", None) or getattr(n, "id", ""))
               in ("action", "kind") for n in ast.walk(node))


def kind_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each place ``source`` decides by a kind's name: a name that cannot be a field or key of the
    same word (it has a '-'), a comparison with an ``action``/``kind``, a ``case``, a ``Literal[...]``, or two
    names in one list, set, tuple or dict (a hand-kept list or dispatch table)."""
    found: set[tuple[int, str]] = set()

    def literal(n: ast.AST) -> str | None:
        return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names else None

    for node in ast.walk(ast.parse(source)):
        if (name := literal(node)) and "-" in name:
            found.add((node.lineno, name))
        elif isinstance(node, ast.Compare) and _mentions_kind_field(node):
            found |= {(n.lineno, v) for n in ast.walk(node) if (v := literal(n))}
        elif isinstance(node, ast.MatchValue) and (name := literal(node.value)):
            found.add((node.lineno, name))
        elif isinstance(node, ast.Subscript) and "Literal" in ast.unparse(node.value):
            found |= {(n.lineno, v) for n in ast.walk(node.slice) if (v := literal(n))}
        elif isinstance(node, ast.List | ast.Set | ast.Tuple | ast.Dict):
            items = [literal(n) for n in (node.keys if isinstance(node, ast.Dict) else node.elts) if n is not None]
            if sum(v is not None for v in items) >= 2:
                found |= {(node.lineno, v) for v in items if v}
    return sorted(found)


def test_the_shipped_kinds_are_registered_complete() -> None:
    assert fault_kinds.names() == SHIPPED
    for k in fault_kinds.kinds():
        assert fault_kinds.get(k.name) is k and k.doc
        assert k.capability is None or k.capability in {c.value for c in Capability}, k.name
    assert [k.name for k in fault_kinds.kinds() if k.capability] == ["kill-host", "cut-network"]


def test_every_shipped_kind_is_found_only_through_the_registry() -> None:
    """No module but testbed/fault_kinds.py decides by a kind's name: no comparison with an action, no hand-kept
    list, Literal or dispatch table of them (ALLOWED names each exception and why)."""
    names = set(fault_kinds.names())
    found = [f"{rel}:{line}: '{name}'" for p in sorted(PKG.rglob("*.py")) if p.name != "fault_kinds.py"
             for rel in [p.relative_to(PKG).as_posix()]
             for line, name in kind_uses(p.read_text(), names) if (rel, name) not in ALLOWED]
    assert not found, "kind names outside testbed/fault_kinds.py (ask the registry instead):\n" + "\n".join(found)


def test_the_scan_sees_the_shapes_a_hand_kept_list_takes() -> None:
    names = {"signal", "command", "kill-host"}
    src = textwrap.dedent("""\
        if f.action != "command": pass
        what = {"signal": 1, "command": 2}[f.action]
        A = Literal["signal", "x"]
        x = "kill-host"
        d.get("signal") or d.get("command")
        if w in ("command", "exec"): pass
        """)
    assert kind_uses(src, names) == [(1, "command"), (2, "command"), (2, "signal"), (3, "signal"), (4, "kill-host")]


def test_a_kind_must_describe_and_fire_and_take_a_free_name() -> None:
    class Half(FaultKind):
        name = "half"
        doc = "no describe"

        def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
            return {"ok": True}

    with pytest.raises(TypeError):
        fault_kinds.register(Half)
    with pytest.raises(ValueError, match="registered twice"):
        fault_kinds.register(type(fault_kinds.get("signal")))
    assert fault_kinds.names() == SHIPPED


# a kind registered here, and nowhere else ------------------------------------------------------------------------
FIRED: list[tuple[str, str]] = []


class Toy(FaultKind):
    name = "toy-pause"
    doc = "a test's own kind"

    def check(self, fault: suite.Fault) -> None:
        super().check(fault)
        if fault.host is None:
            raise ValueError("a 'toy-pause' fault needs 'host'")

    def describe(self, fault: FaultPlan) -> str:
        return f"pause {fault.host} for a moment"

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        FIRED.append(("fire", fault.host))
        return {"paused": fault.host, "ok": True}

    def restore(self, firing: Firing, fault: FaultPlan) -> dict[str, Any] | None:
        FIRED.append(("restore", fault.host))
        return {"fault": fault.name, "host": fault.host, "action": "resume", "ok": True}


class NeedsPower(Toy):
    name = "toy-power"
    capability = Capability.KILL_HOST.value


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fault_kinds, "_KINDS", dict(fault_kinds._KINDS))  # the registry as it was, afterwards
    fault_kinds.register(Toy)
    fault_kinds.register(NeedsPower)
    FIRED.clear()
    yield


def _suite(home: Path, name: str, fault: str) -> Path:
    (home / "experiments").mkdir(exist_ok=True)
    path = home / "experiments" / f"{name}.yml"
    path.write_text(f"name: {name}\nsteps:\n  launch:\n    command: echo hi\nfaults:\n  f: {fault}\n")
    return path


def _plan(name: str) -> RunPlan:
    return runner.plan_run(name, None, {}, faults=["f"], dry_run=True)


def test_a_new_kind_is_validated_described_fired_and_restored(tb_home: Path, toy: None) -> None:
    _suite(tb_home, "toy", "{action: toy-pause, host: master, at: 2}")
    assert suite.load_suite("toy").faults["f"].action == "toy-pause"
    plan = _plan("toy")
    (line,) = [ln for ln in dry_run_lines(plan) if ln["phase"] == "fault"]
    assert line["command"] == f"pause {plan.master} for a moment" and line["step"] == "f (at 2 s)"
    assert RunPlan.model_validate(plan.to_json()) == plan  # its plan file loads back

    fault = plan.faults[0]

    def unopened() -> Any:  # a kind that needs no capability never opens the testbed's provider
        raise AssertionError("the provider was opened")

    detail = faults.fire(plan, fault, unopened)
    assert {k: v for k, v in detail.items() if k != "seconds"} == {
        "fault": "f", "action": "toy-pause", "host": plan.master, "rank": None, "paused": plan.master, "ok": True}
    assert faults.restore(plan, fault, unopened) == {"fault": "f", "host": plan.master,
                                                                 "action": "resume", "ok": True}
    assert FIRED == [("fire", plan.master), ("restore", plan.master)]


def test_a_new_kind_checks_its_own_fields_at_file_line(tb_home: Path, toy: None) -> None:
    path = _suite(tb_home, "toyless", "{action: toy-pause, at: 2}")
    with pytest.raises(UsageError) as e:
        suite.load_suite("toyless")
    assert "a 'toy-pause' fault needs 'host'" in e.value.what and e.value.where == f"{path}:6"
    _suite(tb_home, "untimed", "{action: toy-pause, host: master}")
    with pytest.raises(UsageError, match="exactly one trigger"):  # the default check: one trigger
        suite.load_suite("untimed")


def test_a_kind_needing_a_capability_is_refused_on_a_provider_without_it(tb_home: Path, toy: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(tb_home, "power", "{action: toy-power, host: master, at: 2}")
    plan = _plan("power")
    lab = provider_class("lab")
    with pytest.raises(TestbedError) as e:  # the caller's provider (here a class: it answers lacks())
        faults.fire(plan, plan.faults[0], lambda: cast(Any, lab))
    assert e.value.what == f"fault 'f': the lab provider cannot toy power: {lab.lacks(Capability.KILL_HOST)}"
    assert FIRED == []  # refused before its fire


@pytest.mark.parametrize("registered", [False, True])
def test_an_unknown_action_is_refused_at_its_line_with_the_kinds_listed(tb_home: Path, request: pytest.FixtureRequest,
                                                                       registered: bool) -> None:
    if registered:
        request.getfixturevalue("toy")
    path = _suite(tb_home, "typo", "{action: kill-rank, at: 1}")
    with pytest.raises(UsageError) as e:
        suite.load_suite("typo")
    known = [*SHIPPED, "toy-pause", "toy-power"] if registered else SHIPPED
    listed = ", ".join(f"'{n}'" for n in known[:-1]) + f" or '{known[-1]}'"
    assert e.value.what == f"typo.yml: bad value for 'faults.f.action': Input should be {listed} (got 'kill-rank')"
    assert e.value.where == f"{path}:6"
    with pytest.raises(ValueError, match="Input should be 'signal', 'command'"):  # a plan file's too
        FaultPlan.model_validate({"name": "f", "action": "kill-rank", "host": "h", "watch_host": "h"})
