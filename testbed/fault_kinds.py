"""Fault kinds, one object each, registered where it is defined: the registry every other module reads.

A kind (a suite fault's ``action``) is a :class:`FaultKind` subclass decorated with :func:`register`. It carries
its name, its validation of a suite's fault (:meth:`FaultKind.check`), its line in the dry run
(:meth:`FaultKind.describe`), the provider capability it needs (``capability``: a ``Capability`` value of
``testbed.providers.base``, None when it needs none), and what firing and restoring it do (:meth:`FaultKind.fire`,
:meth:`FaultKind.restore`) through a :class:`Firing`, which the run floor gives (``testbed.run.faults``). The
suite's and the plan's ``action`` (:data:`FaultAction`), the suite reference, the dry run, the dispatch and the
capability check all read this registry; a new kind is one class here (a kind a provider carries out also needs
its ``Capability`` and the providers' method: docs/architecture.md, "Where a change goes").

Pure data and logic: nothing here touches a host; firing goes through the :class:`Firing` it is handed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from testbed.capabilities import CutsNetwork, KillsHosts

if TYPE_CHECKING:
    from testbed.providers.base import Provider
    from testbed.records import FaultPlan
    from testbed.remote import HostResult
    from testbed.suite import Fault


class Firing(Protocol):
    """What a kind's ``fire`` and ``restore`` may do on a run's hosts (given by ``testbed.run.faults``)."""

    def signal(self, rank: int, signal: str) -> list[HostResult]:
        """Send ``signal`` to rank ``rank``'s process group; one result per host."""
        ...

    def command(self, fault: FaultPlan, command: str, timeout: float) -> HostResult:
        """Run ``command`` (already rendered) on the fault's host, in the run folder."""
        ...

    def provider(self) -> Provider:
        """The run's testbed's provider (for a kind with a ``capability``, checked able before ``fire``)."""
        ...


class FaultKind(ABC):
    """One kind of fault. Subclass, set ``name`` (and ``doc``, ``capability``), and decorate with :func:`register`."""

    name: ClassVar[str]
    doc: ClassVar[str]
    """What it does, in words (the suite reference's ``action`` lists each kind with it)."""
    capability: ClassVar[str | None] = None
    """The provider ``Capability`` (its value) firing needs; the run refuses the fault on a provider without it."""
    runs_command: ClassVar[bool] = False
    """Its ``command`` runs on its host (a rehearsal looks there for the programs it and ``restore`` call)."""

    def check(self, fault: Fault) -> None:
        """Refuse (``ValueError``, its reason) a suite's fault this kind cannot fire; by default it needs exactly
        one trigger. Runs after the fault's own fields are valid."""
        if (fault.at is None) == (fault.when is None):
            raise ValueError("a fault needs exactly one trigger: 'at' (seconds) or 'when' (log regex)")

    @abstractmethod
    def describe(self, fault: FaultPlan) -> str:
        """The dry run's line for the rendered ``fault``: what firing it will do."""

    @abstractmethod
    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        """Fire ``fault``; the event detail's own keys (``ok`` at least; the caller adds name, host and time)."""

    def restore(self, firing: Firing, fault: FaultPlan) -> dict[str, Any] | None:
        """Undo ``fault`` before recovery; the ``restore`` event's detail, None when there is nothing to undo. By
        default: run the fault's ``restore`` command on its host, if it has one."""
        if not fault.restore:
            return None
        res = firing.command(fault, fault.restore, 300)
        return {"fault": fault.name, "host": fault.host, "command": fault.restore, "ok": res.ok,
                "exit_code": res.exit_code}


_KINDS: dict[str, FaultKind] = {}
K = TypeVar("K", bound=type[FaultKind])


def register(cls: K) -> K:
    """Class decorator: add one instance of ``cls`` to the registry under ``cls.name`` (a name taken twice is a
    bug, refused at import)."""
    kind = cls()
    if kind.name in _KINDS:
        raise ValueError(f"fault kind '{kind.name}' is registered twice ({type(_KINDS[kind.name]).__name__}, "
                         f"{cls.__name__})")
    _KINDS[kind.name] = kind
    return cls


def names() -> list[str]:
    """Every registered kind's name, in the order they were registered."""
    return list(_KINDS)


def kinds() -> list[FaultKind]:
    """Every registered kind, in the order they were registered."""
    return list(_KINDS.values())


def get(name: str) -> FaultKind:
    """The kind named ``name`` (an unknown one is refused when the suite or plan is read, so a KeyError here is a
    bug)."""
    return _KINDS[name]


def expected() -> str:
    """The known names as pydantic lists a Literal's: ``'a', 'b' or 'c'``."""
    quoted = [f"'{n}'" for n in _KINDS]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _known(value: Any) -> str:
    if isinstance(value, str) and value in _KINDS:
        return value
    raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected()})


class _KindName:
    """Pydantic type of an ``action``: a registered kind's name, checked against the registry when validated
    (so a kind registered after the models were built is known), with the JSON schema's ``enum`` read then too."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(_known, serialization=core_schema.to_string_ser_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"type": "string", "enum": names()}

    @staticmethod
    def choices() -> list[str]:
        """The values it takes (the suite reference writes them as 'one of ...')."""
        return names()


FaultAction = Annotated[str, _KindName]
"""A fault's ``action`` (suite and plan alike): the name of a registered kind; anything else is refused as a
Literal would refuse it ("Input should be 'signal', 'command' or ...")."""


# the shipped kinds ----------------------------------------------------------------------------------------------

@register
class Signal(FaultKind):
    """Send a signal to one rank's process group (testbed's own signal script: the shell's kill)."""

    name = "signal"
    doc = "send 'signal' to the target rank's process group"

    def check(self, fault: Fault) -> None:
        super().check(fault)
        if fault.rank is None:
            raise ValueError("a 'signal' fault needs 'rank'")

    def describe(self, fault: FaultPlan) -> str:
        return f"kill -s {fault.signal[3:]} <rank {fault.rank} process group>"

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        assert fault.rank is not None  # a signal fault names its rank (checked with the suite)
        res = firing.signal(fault.rank, fault.signal)
        out: dict[str, Any] = {"signal": fault.signal, "ok": all(r.ok for r in res)}
        if not out["ok"]:
            out["error"] = "; ".join(r.error or r.stderr.strip() for r in res if not r.ok)
        return out


@register
class Command(FaultKind):
    """Run a shell command on the target host."""

    name = "command"
    doc = "run 'command' on the target host"
    runs_command = True

    def check(self, fault: Fault) -> None:
        super().check(fault)
        if not fault.command:
            raise ValueError("a 'command' fault needs 'command'")

    def describe(self, fault: FaultPlan) -> str:
        return fault.command or ""

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        res = firing.command(fault, fault.command or "true", 120)
        return {"command": fault.command, "ok": res.ok, "exit_code": res.exit_code,
                "output": (res.stdout + res.stderr)[-400:]}


@register
class KillHost(FaultKind):
    """Power the target host off abruptly, through its provider."""

    name = "kill-host"
    doc = "power the target host off abruptly (its provider must be able to)"
    capability = "kill-host"

    def describe(self, fault: FaultPlan) -> str:
        return f"kill host {fault.host}"

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        KillsHosts.of(firing.provider()).kill_host(fault.host)
        return {"ok": True}


@register
class CutNetwork(FaultKind):
    """Take the target host off the network, through its provider; restoring puts it back (and runs no
    ``restore`` command)."""

    name = "cut-network"
    doc = "take the target host off the network, put back before recovery (its provider must be able to)"
    capability = "cut-network"

    def describe(self, fault: FaultPlan) -> str:
        return f"cut the network of {fault.host}"

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        CutsNetwork.of(firing.provider()).cut_network(fault.host)
        return {"ok": True}

    def restore(self, firing: Firing, fault: FaultPlan) -> dict[str, Any] | None:
        CutsNetwork.of(firing.provider()).restore_network(fault.host)
        return {"fault": fault.name, "host": fault.host, "action": "restore-network", "ok": True}


@register
class InWorkload(FaultKind):
    """The workload injects the fault itself; firing only records it."""

    name = "in-workload"
    doc = ("the workload injects it itself (a flag its command adds when the fault is in {{ faults }}); firing "
           "only records the event; with no trigger it fires at launch")

    def check(self, fault: Fault) -> None:
        if fault.at is None and fault.when is None:
            fault.at = 0.0

    def describe(self, fault: FaultPlan) -> str:
        return "injected by the workload itself (its command carries the flag)"

    def fire(self, firing: Firing, fault: FaultPlan) -> dict[str, Any]:
        return {"ok": True}
