"""Each provider's settings (the ``provider:`` block of a testbed spec), validated by pydantic.

A settings class names its kind and knows what the spec alone tells about the hosts (their names and
addresses, before anything exists); the rest is the provider's business. Loading a spec imports only this module,
never a provider or its cloud SDK.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from testbed.textfmt import plural

HOSTNAME_RE = r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$"
USER_RE = r"^[a-z_][a-z0-9_.-]{0,31}$"
# values written into ssh_config and inventories: no whitespace or control characters (a newline in an address
# would add an ssh_config directive such as ProxyCommand, run on this machine)
ADDRESS_RE = r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[?[0-9A-Fa-f:.]+\]?)$"
JUMP_RE = r"^[A-Za-z0-9_.@:\[\],-]{1,512}$"
PATH_RE = r"^[^\x00-\x1f\x7f\"]{1,4096}$"


def _ssh_value(v: str | None, pattern: str, what: str) -> str | None:
    """A value that goes into ssh_config and inventories: refused unless it is plainly ``what``."""
    if v is not None and not re.fullmatch(pattern, v):
        bad = "a line break or control character" if re.search(r"[\x00-\x1f\x7f]", v) else "characters"
        raise ValueError(f"must be {what} ({bad} not allowed: it is written into ssh_config, where a new line "
                         "would add a directive such as ProxyCommand)")
    return v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)


class Settings(Strict):
    """What every provider's settings answer."""

    kind: str
    default_user: ClassVar[str] = "root"  # the spec's login user when it names none

    def refuse_user(self, user: str) -> str | None:
        """Why ``user`` cannot log in on this provider's hosts (None: it can)."""
        return None

    def planned_hosts(self) -> list[str] | None:
        """Host names known from the spec alone; None when the cloud decides."""
        return None

    def planned_addresses(self) -> dict[str, str]:
        """Host addresses known from the spec alone (name -> address)."""
        return {}

    def planned_subnet(self) -> str | None:
        """The hosts' subnet when the spec sets it."""
        return None


class LocalSettings(Settings):
    """Hosts in network namespaces on this machine (needs root, sshd, iproute2)."""

    kind: Literal["local"] = "local"
    hosts: int = Field(4, ge=1, le=252, description="number of hosts (a /24 holds up to 252)")
    name_prefix: str = Field("node", pattern=r"^[a-z][a-z0-9-]{0,15}$")
    subnet: str = Field("10.213.0.0/24", description="IPv4 subnet of the bridge; must not clash with routes")
    bridge: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,15}$", description="default: tb-<testbed>")
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
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            raise ValueError(f"not an IPv4 subnet such as 10.213.0.0/24 ({e})") from None
        if net.prefixlen > 28:
            raise ValueError("the subnet is too small; use /28 or larger")
        if net.is_loopback or net.is_multicast or net.is_link_local or not net.is_private:
            raise ValueError("use a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16) such as "
                             "10.213.0.0/24: a public range would route real addresses into the bridge")
        return v

    @model_validator(mode="after")
    def _fits(self) -> LocalSettings:
        net = ipaddress.IPv4Network(self.subnet)
        if self.hosts + 2 > net.num_addresses - 2:
            verb = "does" if self.hosts == 1 else "do"
            raise ValueError(f"{plural(self.hosts, 'host')} {verb} not fit in {self.subnet}")
        return self

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


class LabHost(Strict):
    name: str = Field(pattern=HOSTNAME_RE)
    address: str | None = Field(None, description="hostname or IP; default: name")
    port: int = Field(22, ge=1, le=65535)
    user: str | None = None
    key: str | None = None
    proxy_jump: str | None = Field(None, description="[user@]host[:port][,...]")
    groups: list[str] = Field(default_factory=list)

    _address = field_validator("address")(classmethod(lambda cls, v: _ssh_value(v, ADDRESS_RE, "a hostname or IP")))
    _user = field_validator("user")(classmethod(lambda cls, v: _ssh_value(v, USER_RE, "a login name")))
    _key = field_validator("key")(classmethod(lambda cls, v: _ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: _ssh_value(v, JUMP_RE, "[user@]host[:port]")))


class LabSettings(Settings):
    """Existing machines reached over SSH (a university cluster)."""

    kind: Literal["lab"] = "lab"
    hosts: list[LabHost] = Field(min_length=1)
    key: str | None = Field(None, description="private key; default: the testbed's own key")
    proxy_jump: str | None = Field(None, description="[user@]host[:port][,...]")

    ssh_config: str | None = Field("~/.ssh/config", description="your own OpenSSH config: its User, Port, "
                                   "ProxyJump, IdentityFile and HostName for a host's address apply where this spec "
                                   "gives none (and, with no key here, your ssh-agent is offered too); null: "
                                   "ignore it")

    _key = field_validator("key")(classmethod(lambda cls, v: _ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: _ssh_value(v, JUMP_RE, "[user@]host[:port]")))
    _cfg = field_validator("ssh_config")(classmethod(lambda cls, v: _ssh_value(v, PATH_RE, "a file path")))
    connect_timeout: int = Field(10, ge=1, le=300)
    ssh_timeout: int = Field(300, ge=5, description="how long a host being repaired may take to answer SSH again "
                                                    "(a reboot)")

    @field_validator("hosts")
    @classmethod
    def _distinct(cls, v: list[LabHost]) -> list[LabHost]:
        """Two hosts of one name would be one host to SSH, Ansible and state."""
        from testbed.yamlfile import Invalid

        seen: dict[str, int] = {}
        for i, h in enumerate(v):
            if h.name in seen:
                raise Invalid(f"two hosts are named '{h.name}' (items {seen[h.name] + 1} and {i + 1})",
                              loc=(i, "name"), fix="give each host its own name (the same machine twice is "
                                                   "one host)")
            seen[h.name] = i
        return v

    def planned_hosts(self) -> list[str]:
        return [h.name for h in self.hosts]

    def planned_addresses(self) -> dict[str, str]:
        return {h.name: h.address or h.name for h in self.hosts}


class ChameleonSettings(Settings):
    """Bare-metal nodes on Chameleon Cloud through python-chi."""

    kind: Literal["chameleon"] = "chameleon"
    site: str = "CHI@UC"
    project: str | None = Field(None, description="project to work in with openrc (v3oidcpassword) credentials; "
                                "default: the openrc's OS_PROJECT_ID; an application credential always uses its "
                                "own project")
    node_type: str = "compute_skylake"
    count: int = Field(1, ge=1, le=64)
    image: str = "CC-Ubuntu22.04"
    hours: float = Field(4, gt=0, le=24 * 7, description="lease duration when start/end are not given "
                         "(Chameleon allows 7 days at most)")
    start: str | None = Field(None, description="'now' or 'YYYY-MM-DD HH:MM' (UTC), Blazar's format")
    end: str | None = Field(None, description="'YYYY-MM-DD HH:MM' (UTC); default: start + hours")
    network: str = "sharednet1"
    floating_ips: bool = True
    reserve_floating_ips: bool = Field(True, description="reserve the floating IPs in the lease (Chameleon's "
                                       "bare-metal sites require it); false: allocate them from 'public' on demand")
    flavor: str = "baremetal"
    @field_validator("start", "end")
    @classmethod
    def _lease_date(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None or (v == "now" and info.field_name == "start"):
            return v
        try:
            datetime.strptime(v, "%Y-%m-%d %H:%M")
        except ValueError:
            raise ValueError(("'now' or " if info.field_name == "start" else "") +
                             "'YYYY-MM-DD HH:MM' (UTC, quoted in YAML): Blazar takes no other form") from None
        return v

    lease_timeout: int = Field(600, ge=10, description="seconds to wait for the lease to start (Blazar takes "
                               "minutes)")
    server_timeout: int = Field(1800, ge=10, description="seconds to wait for bare metal to deploy (10-20 min)")
    ssh_timeout: int = Field(900, ge=5)


NETWORK_RE = r"^(?:projects/[a-z0-9.:-]{1,63}/global/networks/)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$"
SUBNETWORK_RE = (r"^(?:projects/[a-z0-9.:-]{1,63}/regions/[a-z]+-[a-z]+[0-9]+/subnetworks/)?"
                 r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


class TpuSettings(Settings):
    """TPU VMs (single host or multi-host slices) through google-cloud-tpu."""

    kind: Literal["gcp-tpu"] = "gcp-tpu"
    # TPU VMs refuse SSH as root (Compute Engine images ship PermitRootLogin no/prohibit-password and the guest
    # agent makes accounts only for the users named in the ssh-keys metadata): log in as a normal user with sudo
    default_user: ClassVar[str] = "tpu"
    project: str | None = Field(None, description="default: $GOOGLE_CLOUD_PROJECT, else the project of the "
                                 "Application Default Credentials; none: refused")
    zone: str = "us-central1-f"
    accelerator_type: str = "v2-8"
    runtime_version: str = "tpu-vm-tf-2.6.0"
    count: int = Field(1, ge=1, le=64)
    spot: bool = False
    preemptible: bool = False
    queued_resource: bool = False
    internal_ips: bool = False
    network: str | None = Field(None, pattern=NETWORK_RE, description="VPC network (name, or projects/P/global/"
                                "networks/N for a Shared VPC); default: the project's 'default' network")
    subnetwork: str | None = Field(None, pattern=SUBNETWORK_RE, description="subnetwork in the zone's region (name, "
                                   "or projects/P/regions/R/subnetworks/S); default: the network's 'default'")
    endpoint: str | None = Field(None, description="API endpoint override, e.g. http://127.0.0.1:8080")
    service_account: str | None = Field(None, pattern=r"^[a-z0-9-]+@[a-z0-9.-]+\.iam\.gserviceaccount\.com$",
                                        description="e-mail of the service account the nodes run as; needed for "
                                        "an expiry (the dead-man's switch deletes the nodes with its token)")
    create_timeout: int = Field(1800, ge=5, description="seconds to wait for READY nodes (queued: also how long the "
                                "request stays valid in the queue)")
    ssh_timeout: int = Field(600, ge=5)

    def refuse_user(self, user: str) -> str | None:
        if user == "root":
            return ("TPU VMs refuse SSH logins as root (Compute Engine disables root login whatever the ssh-keys "
                    "metadata says); use a normal user, e.g. 'tpu' (the default): it is made from the ssh-keys "
                    "metadata with passwordless sudo")
        return None


SLURM_TIME_RE = r"^(?:\d+-\d{1,2}(?::\d{1,2}){0,2}|\d+(?::\d{1,2}){0,2})$"
SLURM_NAME_RE = r"^[A-Za-z0-9_.+-]{1,64}$"
SLURM_CONSTRAINT_RE = r"^[A-Za-z0-9_.&|!*\[\]()-]{1,256}$"


class SlurmLogin(Strict):
    """The cluster's login node: where testbed runs sbatch, squeue and scancel, and the jump host to the nodes."""

    address: str = Field(description="hostname or IP of the login node")
    user: str | None = Field(None, description="your cluster login; default: the spec's user")
    port: int = Field(22, ge=1, le=65535)
    key: str | None = Field(None, description="private key for the login node and the nodes; default: the "
                            "testbed's own key (add its .pub to ~/.ssh/authorized_keys on the cluster)")
    proxy_jump: str | None = Field(None, description="a jump host before the login node: [user@]host[:port]")

    _address = field_validator("address")(classmethod(lambda cls, v: _ssh_value(v, ADDRESS_RE, "a hostname or IP")))
    _user = field_validator("user")(classmethod(lambda cls, v: _ssh_value(v, USER_RE, "a login name")))
    _key = field_validator("key")(classmethod(lambda cls, v: _ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: _ssh_value(v, JUMP_RE, "[user@]host[:port]")))


class SlurmSettings(Settings):
    """Nodes of a Slurm cluster, held by one allocation (sbatch) and reached through the login node."""

    kind: Literal["slurm"] = "slurm"
    default_user: ClassVar[str] = "root"
    login: SlurmLogin
    partition: str | None = Field(None, pattern=SLURM_NAME_RE, description="default: the cluster's default "
                                  "partition")
    account: str | None = Field(None, pattern=SLURM_NAME_RE)
    qos: str | None = Field(None, pattern=SLURM_NAME_RE)
    constraint: str | None = Field(None, pattern=SLURM_CONSTRAINT_RE, description="node features (--constraint)")
    nodes: int = Field(1, ge=1, le=1024)
    gpus_per_node: int = Field(0, ge=0, le=64)
    time_limit: str = Field("1:00:00", pattern=SLURM_TIME_RE, description="the allocation's --time (minutes, "
                            "HH:MM:SS or D-HH:MM:SS); Slurm ends the job there, testbed running or not")
    name_prefix: str = Field("slot", pattern=r"^[a-z][a-z0-9-]{0,15}$", description="testbed host names: "
                             "<prefix>0, <prefix>1, ... (each holds one allocated node, recorded in its facts)")
    pending_timeout: int = Field(600, ge=1, description="seconds an allocation may stay PENDING before testbed "
                                 "cancels it and gives up")
    ssh_timeout: int = Field(120, ge=5)
    connect_timeout: int = Field(10, ge=1, le=300)

    def minutes(self) -> int:
        """``time_limit`` in whole minutes (Slurm's unit; seconds round up)."""
        days, _, rest = self.time_limit.rpartition("-")
        parts = [int(x) for x in rest.split(":")]
        if days:  # D-HH[:MM[:SS]]
            parts += [0] * (3 - len(parts))
            h, m, s = parts
            return int(days) * 1440 + h * 60 + m + (1 if s else 0)
        if len(parts) == 1:
            return parts[0]
        if len(parts) == 2:
            return parts[0] + (1 if parts[1] else 0)
        return parts[0] * 60 + parts[1] + (1 if parts[2] else 0)

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if v.replace("-", ":").strip("0:") == "":
            raise ValueError("a time limit of 0 means no limit to Slurm: give one, e.g. 1:00:00")
        return v


ProviderSettings = Annotated[
    LocalSettings | LabSettings | ChameleonSettings | TpuSettings | SlurmSettings, Field(discriminator="kind")
]
