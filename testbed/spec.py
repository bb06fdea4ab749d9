"""Testbed specs: ``inventories/<name>.yml`` validated into typed models.

```yaml
provider:            # one of: local, lab, chameleon, gcp-tpu, with that provider's settings
  kind: local
  hosts: 4
user: root           # login user on every host
profile: base        # set-up profile applied by default after provision
groups:              # extra host groups; 'all' always exists, 'master' defaults to the first host
  workers: [node1, node2, node3]
```
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed import paths
from testbed.errors import UsageError

NAME_RE = r"^[a-z][a-z0-9-]{0,30}$"
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
    model_config = ConfigDict(extra="forbid", frozen=False)


class LocalSettings(Strict):
    """Hosts in network namespaces on this machine (needs root, sshd, iproute2)."""

    kind: Literal["local"] = "local"
    hosts: int = Field(4, ge=1, le=64, description="number of hosts")
    name_prefix: str = Field("node", pattern=r"^[a-z][a-z0-9-]{0,15}$")
    subnet: str = Field("10.213.0.0/24", description="IPv4 subnet of the bridge; must not clash with routes")
    bridge: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,15}$", description="default: tb-<testbed>")
    sshd: str = "/usr/sbin/sshd"

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
            raise ValueError(f"{self.hosts} hosts do not fit in {self.subnet}")
        return self


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


class LabSettings(Strict):
    """Existing machines reached over SSH (a university cluster)."""

    kind: Literal["lab"] = "lab"
    hosts: list[LabHost] = Field(min_length=1)
    key: str | None = Field(None, description="private key; default: the testbed's own key")
    proxy_jump: str | None = Field(None, description="[user@]host[:port][,...]")

    _key = field_validator("key")(classmethod(lambda cls, v: _ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: _ssh_value(v, JUMP_RE, "[user@]host[:port]")))
    connect_timeout: int = Field(10, ge=1, le=300)


class ChameleonSettings(Strict):
    """Bare-metal nodes on Chameleon Cloud through python-chi."""

    kind: Literal["chameleon"] = "chameleon"
    site: str = "CHI@UC"
    project: str | None = Field(None, description="default: $OS_PROJECT_NAME")
    node_type: str = "compute_skylake"
    count: int = Field(1, ge=1, le=64)
    image: str = "CC-Ubuntu22.04"
    hours: float = Field(4, gt=0, le=24 * 7, description="lease duration when start/end are not given")
    start: str | None = Field(None, description="'now' or 'YYYY-MM-DD HH:MM' (UTC)")
    end: str | None = None
    network: str = "sharednet1"
    floating_ips: bool = True
    reserve_floating_ips: bool = Field(True, description="reserve the floating IPs in the lease (Chameleon's "
                                       "bare-metal sites require it); false: allocate them from 'public' on demand")
    flavor: str = "baremetal"
    lease_timeout: int = Field(600, ge=10)
    server_timeout: int = Field(1800, ge=10)
    ssh_timeout: int = Field(900, ge=5)


class TpuSettings(Strict):
    """TPU VMs (single host or multi-host slices) through google-cloud-tpu."""

    kind: Literal["gcp-tpu"] = "gcp-tpu"
    project: str | None = Field(None, description="default: $GOOGLE_CLOUD_PROJECT")
    zone: str = "us-central1-f"
    accelerator_type: str = "v2-8"
    runtime_version: str = "tpu-vm-tf-2.6.0"
    count: int = Field(1, ge=1, le=64)
    spot: bool = False
    preemptible: bool = False
    queued_resource: bool = False
    internal_ips: bool = False
    endpoint: str | None = Field(None, description="API endpoint override, e.g. http://127.0.0.1:8080")
    create_timeout: int = Field(1800, ge=5)
    ssh_timeout: int = Field(600, ge=5)


ProviderSettings = Annotated[
    LocalSettings | LabSettings | ChameleonSettings | TpuSettings, Field(discriminator="kind")
]


class TestbedSpec(Strict):
    """One testbed: ``inventories/<name>.yml``."""

    __test__ = False

    name: str = Field(pattern=NAME_RE)
    description: str = ""
    provider: ProviderSettings
    user: str = Field("root", pattern=USER_RE)
    profile: str | None = "base"
    groups: dict[str, list[str]] = Field(default_factory=dict)
    vars: dict[str, object] = Field(default_factory=dict, description="variables handed to set-up roles")
    sources: dict[str, str] = Field(default_factory=dict, description="source overrides for every run and set-up "
                                    "on this testbed (name: PATH|URL[@REF]), e.g. offline mirrors; --source wins")
    source: str | None = Field(None, exclude=True)

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for g in v:
            if not re.match(r"^[a-z_][a-z0-9_]*$", g):
                raise ValueError(f"group name '{g}' must be lower-case letters, digits and _")
        return v

    @property
    def kind(self) -> str:
        return self.provider.kind

    def host_names(self) -> list[str] | None:
        """Host names known from the spec alone (local and lab); None when the cloud decides."""
        p = self.provider
        if isinstance(p, LocalSettings):
            return [f"{p.name_prefix}{i}" for i in range(p.hosts)]
        if isinstance(p, LabSettings):
            return [h.name for h in p.hosts]
        return None

    @model_validator(mode="after")
    def _group_members(self) -> TestbedSpec:
        names = self.host_names()
        if names is not None:
            for g, members in self.groups.items():
                for m in members:
                    if m not in names:
                        raise ValueError(f"group '{g}' names unknown host '{m}' (hosts: {', '.join(names)})")
        return self

    def groups_for(self, host: str, index: int) -> list[str]:
        gs = [g for g, members in self.groups.items() if host in members]
        if "master" not in self.groups and index == 0:
            gs.insert(0, "master")
        if "workers" not in self.groups and index > 0:
            gs.append("workers")
        return gs


def inventory_path(name: str) -> Path:
    """The spec file for testbed ``name`` (cwd inventories/ first, then the shipped ones)."""
    if not re.match(NAME_RE, name):
        raise UsageError(f"'{name}' is not a testbed name", fix="use lower-case letters, digits and '-'",
                         where="command line")
    p = paths.find_resource("inventories", f"{name}.yml")
    if p is None:
        known = ", ".join(paths.list_resources("inventories")) or "none"
        import difflib

        close = difflib.get_close_matches(name, list(paths.list_resources("inventories")), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UsageError(f"no testbed named '{name}'", where="inventories/",
                         fix=f"{hint}known testbeds: {known}; or write inventories/{name}.yml")
    return p


def load_testbed(name_or_path: str) -> TestbedSpec:
    """Load and validate a testbed spec by name (``local``) or by path (``./my.yml``)."""
    from testbed import yamlfile

    p = Path(name_or_path)
    if p.suffix in (".yml", ".yaml") and p.exists():
        path = p
        default_name = p.stem
    else:
        path = inventory_path(name_or_path)
        default_name = name_or_path
    data, located = yamlfile.load(path)
    if isinstance(data, dict):
        data.setdefault("name", default_name)
    spec = yamlfile.validate(TestbedSpec, data, path, located) if isinstance(data, dict) else \
        yamlfile.validate_file(TestbedSpec, path)
    spec.source = str(path)
    return spec


def check_vars(spec: TestbedSpec) -> None:
    """Refuse a misspelt role variable in the spec's ``vars:`` (file:line), before any host is touched.

    Called by the commands that hand ``vars`` to set-up (provision, setup), not on every spec load: it reads
    every role's defaults, which the CLI's quick commands need not pay for.
    """
    if not spec.vars:
        return
    from testbed import yamlfile
    from testbed.setup import available_roles, check_role_vars

    located = yamlfile.load(Path(spec.source))[1] if spec.source and Path(spec.source).is_file() else None
    for key in spec.vars:
        line = located.line(("vars", key)) if located else None
        where = f"{spec.source}:{line}" if line else f"{spec.source or spec.name}: vars"
        check_role_vars({key}, available_roles(), where)
