"""The provider protocol: every provider turns a testbed spec into hosts recorded in state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from testbed.hosts import Host

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec
    from testbed.state import Store


Progress = Callable[[str], None]
"""A provider reports progress as short human lines (``"lease tb-lease: PENDING (30 s)"``)."""


def _quiet(_: str) -> None:
    return None


class Provider(ABC):
    """Provision and destroy the hosts of one testbed.

    Rules every provider keeps:
    - every cloud resource id is written to state (``store.add_resource``) the moment the API returns it;
    - ``provision`` is idempotent and records the hosts with ``store.set_hosts``;
    - ``destroy`` is safe to run again after a partial failure and leaves no resource behind;
    - SDKs are imported inside methods, never at module import.
    """

    kind: ClassVar[str]
    # What the provider can do; callers test these, never a provider's name.
    costs_money: ClassVar[bool] = False  # its resources bill while held (destroy asks first at a terminal)
    offline_hosts: ClassVar[bool] = False  # hosts have no route out (set-up installs from the controller)
    shares_controller_files: ClassVar[bool] = False  # hosts see the controller's files (its Python env)
    # Optional operations it implements: "extend" (the lease end), "kill-host", "cut-network" (faults).
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress = _quiet):
        self.spec = spec
        self.store = store
        self.progress = progress

    @property
    def name(self) -> str:
        return self.spec.name

    @abstractmethod
    def provision(self) -> list[Host]:
        """Create (or find) the hosts, wait until SSH answers, record them in state, return them."""

    @abstractmethod
    def destroy(self) -> None:
        """Release every resource recorded for this testbed; safe to repeat."""

    def record_testbed(self, status: str, info: dict[str, Any] | None = None) -> None:
        """Record the testbed with a copy of its validated spec, so destroy works from state alone even when the
        spec file is later edited, deleted or needs an unset variable."""
        # what destroy needs (provider settings, user, groups); not vars or sources, which may carry tokens
        spec = self.spec.model_dump(mode="json", exclude={"source", "vars", "sources"})
        self.store.upsert_testbed(self.name, self.kind, self.spec.source, status, {**(info or {}), "spec": spec})

    def can(self, capability: str) -> bool:
        """Whether this provider implements an optional operation (see ``capabilities``)."""
        return capability in self.capabilities

    def extend(self, hours: float) -> str:
        """Move the end of the testbed's reservation ``hours`` later; the new end (ISO UTC)."""
        raise NotImplementedError(f"{self.kind} has no reservation to extend")

    def kill_host(self, host: str) -> None:
        """Power ``host`` off abruptly (a fault)."""
        raise NotImplementedError(f"{self.kind} cannot kill a host")

    def cut_network(self, host: str) -> None:
        """Take ``host`` off the network (a fault); ``restore_network`` undoes it."""
        raise NotImplementedError(f"{self.kind} cannot cut a host's network")

    def restore_network(self, host: str) -> None:
        """Undo ``cut_network``."""
        raise NotImplementedError(f"{self.kind} cannot cut a host's network")

    def describe(self) -> dict[str, Any]:
        """Provider-specific status from state only (no network): lease end, slice type, ..."""
        return {}

    def refresh(self) -> list[Host]:
        """Ask the provider for the hosts' real state (network allowed); default: state as recorded."""
        return self.store.hosts(self.name)
