"""The local provider's settings (the ``provider:`` block of a testbed spec).

Pure data: imported when a spec is loaded, so it imports no provider code and no SDK.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from testbed.providers.base_settings import HOSTNAME_RE, Settings
from testbed.textfmt import plural

PRIVATE = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
"""The private ranges of RFC 1918: the only ones a local testbed's bridge may take."""
MAX_HOSTS = 1024
"""The most hosts one local testbed holds (each a namespace, an sshd and an init on this machine)."""
BR_MAX_PORTS = 1024
"""The most ports a Linux bridge takes (the kernel's BR_MAX_PORTS): past it the hosts need a second bridge."""


def subnet_problem(text: str) -> str | None:
    """Why ``text`` cannot be a local testbed's subnet (None: it can): an IPv4 network of /28 or more in one of
    RFC 1918's ranges."""
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as e:
        return f"not an IPv4 subnet such as 10.213.0.0/24 ({e})"
    if net.prefixlen > 28:
        return "the subnet is too small; use /28 or larger"
    if not any(net.subnet_of(p) for p in PRIVATE):  # Python's is_private also admits 0/8, 240/4, the TEST-NETs
        return ("use a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16) such as 10.213.0.0/24: a public "
                "range would route real addresses into the bridge")
    return None


def room(net: ipaddress.IPv4Network) -> int:
    """How many hosts ``net`` holds: its addresses less the network, the bridge's (.1), one spare and broadcast."""
    return max(0, net.num_addresses - 4)


def prefix_for(hosts: int) -> int:
    """The longest prefix (the smallest subnet) that holds ``hosts`` hosts: 24 for 252, 23 for 253..508, ..."""
    p = 28
    while (1 << (32 - p)) - 4 < hosts:
        p -= 1
    return p


class LocalSettings(Settings):
    """Hosts in network namespaces on this machine (needs root, sshd, iproute2)."""

    kind: Literal["local"] = "local"
    hosts: int = Field(4, ge=1, le=MAX_HOSTS, description="number of hosts, at most 1,024 (each is a namespace "
                       "with its own sshd on this machine); the subnet must hold them: a /24 holds 252, a /23 508, "
                       "a /22 1,020, a /21 1,024")
    name_prefix: str = Field("node", pattern=r"^[a-z][a-z0-9-]{0,15}$")
    subnet: str = Field("10.213.0.0/24", description="IPv4 subnet of the bridge(s); must not clash with routes; "
                        "larger than a /24 for more than 252 hosts")
    bridge: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,15}$", description="default: tb<tag>br")
    bridge_ports: int = Field(1000, ge=2, le=BR_MAX_PORTS - 24,
                              description="hosts per bridge (a Linux bridge takes at most 1,024 ports): the hosts "
                                          "past it go on further bridges, each linked to the first, all one subnet")
    sshd: str = "/usr/sbin/sshd"
    own_cgroups: bool = Field(False, description="each host gets a cgroup namespace and a freezer subtree of its "
                              "own (/sys/fs/cgroup/freezer/testbed/<host>): what a Slurm node's proctrack/cgroup "
                              "needs; by default the hosts share this machine's cgroup tree")
    names: list[str] | None = Field(None, description="the hosts' names (default: name_prefix0, 1, ...); a replica "
                                    "of another testbed takes its names")

    @field_validator("names")
    @classmethod
    def _names(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is not None:
            bad = [n for n in v if not re.fullmatch(HOSTNAME_RE, n) or "." in n]
            if bad or len(set(v)) != len(v):
                raise ValueError(f"host names must be distinct and plain (letters, digits, '-'): {bad or v}")
            if len(v) != info.data.get("hosts", len(v)):
                raise ValueError(f"{plural(len(v), 'name')} for {plural(int(info.data.get('hosts') or 0), 'host')}")
        return v

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        why = subnet_problem(v)
        if why is not None:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _fits(self) -> LocalSettings:
        net = ipaddress.IPv4Network(self.subnet)
        if self.hosts > room(net):
            verb = "does" if self.hosts == 1 else "do"
            p = prefix_for(self.hosts)
            wider = ipaddress.IPv4Network(f"{net.network_address}/{p}", strict=False)
            raise ValueError(f"{plural(self.hosts, 'host')} {verb} not fit in {self.subnet} (provider.subnet: "
                             f"room for {room(net)}): give a /{p} or larger, such as {wider}, or fewer hosts")
        return self

    def bridges(self) -> int:
        """How many bridges the hosts need (``bridge_ports`` hosts on each)."""
        return -(-self.hosts // self.bridge_ports)

    def planned_hosts(self) -> list[str]:
        return list(self.names) if self.names else [f"{self.name_prefix}{i}" for i in range(self.hosts)]

    def planned_subnet(self) -> str:
        return self.subnet

    def planned_addresses(self) -> dict[str, str]:
        """The subnet's slots: .1 is the bridge, hosts from .2."""
        net = ipaddress.IPv4Network(self.subnet)
        return {name: str(net.network_address + 2 + i) for i, name in enumerate(self.planned_hosts())}


def local_replica(names: list[str], subnet: str) -> dict[str, object]:
    """The ``provider:`` block of local hosts named ``names`` (a replica of another testbed, for a rehearsal)."""
    return {"kind": "local", "hosts": len(names), "names": list(names), "subnet": subnet}
