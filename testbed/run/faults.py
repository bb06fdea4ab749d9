"""Faults, first-class: fire one (signal a rank, run a command, kill or cut off a local host) and undo it.

Triggers are evaluated by the run supervisor (``runner``): ``at`` seconds after launch, or ``when`` a regular
expression appears in a rank's log. Firing and restoring are recorded as ``fault``/``restore`` events.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from testbed.errors import TestbedError
from testbed.records import FaultPlan, RunPlan, RunStep
from testbed.run import remote as run_remote

if TYPE_CHECKING:
    from testbed.providers.base import Provider
    from testbed.state import Store


def _provider(testbed: str, store: Store) -> Provider:
    from testbed.resolved import Resolved

    return Resolved.open(testbed, store).provider()


def due(fault: FaultPlan, launched: float, now: float, matched: set[str]) -> bool:
    """Whether ``fault`` should fire now (time since launch, or its log pattern was seen)."""
    if fault.at is not None:
        return now - launched >= fault.at
    return fault.name in matched


def fire(plan: RunPlan, fault: FaultPlan, store: Store) -> dict[str, Any]:
    """Fire ``fault``; returns the event detail (what was done, where, and the outcome)."""
    action, host = fault.action, fault.host
    detail: dict[str, Any] = {"fault": fault.name, "action": action, "host": host, "rank": fault.rank}
    t0 = time.time()
    if action == "signal":
        assert fault.rank is not None  # a signal fault names its rank (checked with the suite)
        res = run_remote.signal_ranks(plan, [plan.rank(fault.rank)], fault.signal)
        detail["signal"] = fault.signal
        detail["ok"] = all(r.ok for r in res)
        if not detail["ok"]:
            detail["error"] = "; ".join(r.error or r.stderr.strip() for r in res if not r.ok)
    elif action == "command":
        res = run_remote.run_step(plan, _one_command(fault, fault.command or "true"), timeout=120)
        detail.update(command=fault.command, ok=res[0].ok, exit_code=res[0].exit_code,
                      output=(res[0].stdout + res[0].stderr)[-400:])
    elif action == "in-workload":
        detail["ok"] = True
    elif action in ("kill-host", "cut-network"):
        prov = _provider(plan.testbed, store)
        why = prov.lacks(action)
        if why:
            raise TestbedError(f"fault '{fault.name}': the {prov.kind} provider cannot {action.replace('-', ' ')}: "
                               f"{why}",
                               where=plan.testbed,
                               fix="run this fault on a testbed whose provider can (local), or use a 'command' fault")
        (prov.kill_host if action == "kill-host" else prov.cut_network)(host)
        detail["ok"] = True
    detail["seconds"] = round(time.time() - t0, 3)
    return detail


def restore(plan: RunPlan, fault: FaultPlan, store: Store) -> dict[str, Any] | None:
    """Undo ``fault`` where it can be undone (its restore command; a cut network); None when nothing to do."""
    host = fault.host
    if fault.action == "cut-network":
        _provider(plan.testbed, store).restore_network(host)
        return {"fault": fault.name, "host": host, "action": "restore-network", "ok": True}
    if fault.restore:
        res = run_remote.run_step(plan, _one_command(fault, fault.restore), timeout=300)
        return {"fault": fault.name, "host": host, "command": fault.restore, "ok": res[0].ok,
                "exit_code": res[0].exit_code}
    return None


def _one_command(fault: FaultPlan, command: str) -> RunStep:
    return RunStep(name=f"fault {fault.name}", hosts=[fault.host], commands={fault.host: command})
