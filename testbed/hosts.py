"""A host of a testbed as the controller reaches it: the record every stage passes around."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Host:
    """One machine of a testbed, as the controller reaches it over SSH."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key: str | None = None  # private key path; None = the testbed's own key
    groups: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    proxy_jump: str | None = None
    state: str = "up"  # up | down | unknown | preempted | ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def mesh_address(self) -> str:
        """The address the testbed's hosts reach this one at (a cloud's private IP, not the floating/external one
        the controller uses): ``facts['mesh_address']``, ``private_address`` or ``internal_ip``, else ``address``."""
        f = self.facts
        return str(f.get("mesh_address") or f.get("private_address") or f.get("internal_ip") or self.address)
