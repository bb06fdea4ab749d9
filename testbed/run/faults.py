"""Faults, first-class: fire one and undo it, by its kind (``testbed.fault_kinds``: signal a rank, run a command,
kill or cut off a host, ...), through what a kind may do on a run (``_Firing``).

Triggers are evaluated by the run supervisor (``runner``): ``at`` seconds after launch, or ``when`` a regular
expression appears in a rank's log. Firing and restoring are recorded as ``fault``/``restore`` events.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from testbed import fault_kinds
from testbed.errors import TestbedError
from testbed.records import FaultPlan, RunPlan, RunStep
from testbed.run import ranks as run_remote
from testbed.run.plan import able_kinds

if TYPE_CHECKING:
    from collections.abc import Callable

    from testbed.providers.base import Provider
    from testbed.remote import HostResult


def due(fault: FaultPlan, launched: float, now: float, matched: set[str]) -> bool:
    """Whether ``fault`` should fire now (time since launch, or its log pattern was seen)."""
    if fault.at is not None:
        return now - launched >= fault.at
    return fault.name in matched


class _Firing:
    """What a fault kind may do on the run of ``plan`` (``testbed.fault_kinds.Firing``): signal a rank, run a
    command on the fault's host, reach the testbed's provider: the one the caller resolved once (``provider``, a
    getter that opens it on first use: a run whose faults need none never opens it)."""

    def __init__(self, plan: RunPlan, provider: Callable[[], Provider]) -> None:
        self.plan, self._provider = plan, provider

    def signal(self, rank: int, signal: str) -> list[HostResult]:
        return run_remote.signal_ranks(self.plan, [self.plan.rank(rank)], signal)

    def command(self, fault: FaultPlan, command: str, timeout: float) -> HostResult:
        return run_remote.run_step(self.plan, _one_command(fault, command), timeout=timeout)[0]

    def provider(self) -> Provider:
        return self._provider()


def fire(plan: RunPlan, fault: FaultPlan, provider: Callable[[], Provider]) -> dict[str, Any]:
    """Fire ``fault`` (its kind's ``fire``, after checking the provider has the capability the kind needs);
    returns the event detail (what was done, where, and the outcome). ``provider``: the testbed's, as the caller
    resolved it (see :class:`_Firing`)."""
    kind = fault_kinds.get(fault.action)
    detail: dict[str, Any] = {"fault": fault.name, "action": fault.action, "host": fault.host, "rank": fault.rank}
    t0 = time.time()
    firing = _Firing(plan, provider)
    if kind.capability is not None:
        prov = firing.provider()
        why = prov.lacks(kind.capability)
        if why:
            raise TestbedError(f"fault '{fault.name}': the {prov.kind} provider cannot "
                               f"{fault.action.replace('-', ' ')}: {why}",
                               where=plan.testbed,
                               fix=f"run this fault on a testbed whose provider can "
                                   f"({', '.join(able_kinds(kind.capability))}), or use a 'command' fault")
    detail.update(kind.fire(firing, fault))
    detail["seconds"] = round(time.time() - t0, 3)
    return detail


def restore(plan: RunPlan, fault: FaultPlan, provider: Callable[[], Provider]) -> dict[str, Any] | None:
    """Undo ``fault`` where it can be undone (its kind's ``restore``: by default its restore command; a cut
    network is put back); None when nothing to do."""
    return fault_kinds.get(fault.action).restore(_Firing(plan, provider), fault)


def _one_command(fault: FaultPlan, command: str) -> RunStep:
    return RunStep(name=f"fault {fault.name}", hosts=[fault.host], commands={fault.host: command})
