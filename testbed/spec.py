"""Testbed specs: ``inventories/<name>.yml`` validated into typed models.

```yaml
provider:            # one of: local, lab, chameleon, gcp-tpu, with that provider's settings
  kind: local
  hosts: 4
user: root           # login user on every host (default: the provider's, e.g. root; tpu on gcp-tpu)
profile: base        # set-up profile applied by default after provision
groups:              # extra host groups; 'all' always exists, 'master' defaults to the first host
  workers: [node1, node2, node3]
```
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from testbed import paths
from testbed.errors import UsageError
from testbed.providers.base_settings import USER_RE as USER_RE
from testbed.providers.base_settings import Strict
from testbed.providers.kinds import ProviderSettings

NAME_RE = r"^[a-z][a-z0-9-]{0,30}$"
IFNAME_RE = r"^[A-Za-z0-9_.-]{1,15}$"  # a Linux interface name (IFNAMSIZ - 1)
TOOL_RE = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"  # a command name (tc, iptables, nvidia-smi)
CAPABILITIES = ("gpu", "tpu", "cuda", "nvidia-driver", "network")
"""What a fault's ``needs:`` may name besides a command; a testbed has them from its hardware and provider."""
DEFAULT_TESTBED = "local"  # where a suite runs when neither --on nor the suite names a testbed (a name, not a kind)


class Gpu(Strict):
    """The GPUs of each host, as the real machines have them."""

    model: str = Field(pattern=r"^[A-Za-z0-9 ._()/-]{1,64}$", description="e.g. 'NVIDIA GeForce RTX 3070'")
    count: int = Field(1, ge=1, le=64, description="GPUs per host")


class HostHardware(Strict):
    """One host's hardware where it differs from the testbed's (a GPU host beside CPU hosts, another NIC)."""

    interface: str | None = Field(None, pattern=IFNAME_RE, description="this host's interface name")
    gpu: Gpu | None = Field(None, description="this host's GPUs; null: none (a CPU host)")


class Hardware(Strict):
    """What the real machines are like where a run depends on it: suites derive interface names, addresses and GPU
    types from here (``{{ testbed.hardware.* }}``, Ansible's ``testbed_hardware``), and ``testbed rehearse`` builds
    its local replica in this shape."""

    shared_home: bool = Field(False, description="every host sees one home folder (NFS): a step that writes "
                              "under ~/ runs once for all hosts")
    interface: str | None = Field(None, pattern=IFNAME_RE, description="the network interface the hosts reach each "
                                  "other on (NCCL_SOCKET_IFNAME, btl_tcp_if_include), e.g. eno1")
    gpu: Gpu | None = Field(None, description="per-host GPUs; none: CPU hosts (or a TPU, from the provider)")
    login_shell: str | None = Field(None, pattern=r"^/[A-Za-z0-9_./-]{1,100}$",
                                    description="the login user's shell before set-up changes it, e.g. /bin/tcsh")
    sudo: bool = Field(True, description="the login user may become root (sudo) on the hosts; false: an account "
                       "without it (a student's lab account), so set-up covers the home and environments and a role "
                       "that needs root says so; a rehearsal's replica gives its user no sudo either")
    tools: list[str] = Field(default_factory=list, description="commands every host has that a fault may need "
                             "(tc, iptables, setpci); a local testbed has this machine's")
    hosts: dict[str, HostHardware] = Field(default_factory=dict, description="per host, where hosts differ: "
                                           "its interface, its GPUs (gpu: null for a CPU host)")

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str]) -> list[str]:
        for t in v:
            if not re.match(TOOL_RE, t):
                raise ValueError(f"'{t}' is not a command name")
        return v

    def context(self, host: str | None = None) -> dict[str, object]:
        """``{{ testbed.hardware }}`` in suites and ``testbed_hardware`` in roles (flat, plain values); with
        ``host``, that host's (``{{ hardware }}`` in a rank's or a step's command, its ``testbed_hardware``)."""
        interface, gpu = self.interface, self.gpu
        own = self.hosts.get(host) if host else None
        if own is not None:
            interface = own.interface or interface
            gpu = own.gpu if "gpu" in own.model_fields_set else gpu
        return {"shared_home": self.shared_home, "interface": interface,
                "gpu_model": gpu.model if gpu else None, "gpus": gpu.count if gpu else 0,
                "login_shell": self.login_shell, "tools": list(self.tools), "sudo": self.sudo}

    def gpu_declared(self, host: str) -> bool:
        """Whether the spec says, for ``host`` itself, whether it has GPUs (``hosts.<host>.gpu``)."""
        own = self.hosts.get(host)
        return own is not None and "gpu" in own.model_fields_set


class EnvVar(Strict):
    """A variable the spec reads from the environment (``${NAME}``): what it is, and a value a rehearsal may use."""

    help: str = Field(min_length=1, max_length=300, description="what to set it to, said when it is not set")
    example: str | None = Field(None, max_length=100, description="a value of its shape; a rehearsal's replica "
                                "stands in with it when the variable is not set, and says so")


class TestbedSpec(Strict):
    """One testbed: ``inventories/<name>.yml``."""

    __test__ = False

    name: str = Field(pattern=NAME_RE)
    description: str = ""
    provider: ProviderSettings
    user: str = Field("root", pattern=USER_RE, description="login user; default: the provider's (root, or tpu)")
    profile: str | None = "base"
    groups: dict[str, list[str]] = Field(default_factory=dict)
    env: dict[str, EnvVar] = Field(default_factory=dict, description="the environment variables the spec reads "
                                   "(${NAME}), each with its help; a missing one is refused with that help")
    vars: dict[str, object] = Field(default_factory=dict, description="variables handed to set-up roles")
    sources: dict[str, str] = Field(default_factory=dict, description="source overrides for every run and set-up "
                                    "on this testbed (name: PATH|URL[@REF]), e.g. offline mirrors; --source wins")
    expire: str | None = Field(None, description="release the testbed this long after provision (8h, 90m, 2d); "
                               "'testbed provision --expire' wins, 'testbed extend' moves it")
    idle_after: str | None = Field(None, description="release the testbed after this long with no run and no "
                                   "testbed command (30m, 2h)")
    expire_images: bool = Field(False, description="let the dead-man's switch also delete the images this testbed "
                                "baked that no other testbed boots from; without it the switch never deletes an "
                                "image ('testbed image prune' does)")
    lost_after: float | None = Field(None, gt=0, le=30 * 86400, allow_inf_nan=False, description="seconds over "
                                     "which a run must "
                                     "find a host of this testbed lost before it repairs it, when more than the "
                                     "suite's timeouts.unreachable (a bare-metal reboot takes minutes)")
    hardware: Hardware = Field(default_factory=Hardware, description="what the real machines are like: shared home, "
                               "interface name, GPUs, login shell")
    source: str | None = Field(None, exclude=True)
    _user_given: bool = PrivateAttr(default=True)  # False: 'user' is the provider's default, the spec named none

    @field_validator("expire", "idle_after")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            # lazy: start-up (testbed status and exec load this module)
            from testbed.expiry import parse_duration

            parse_duration(v)
        return v

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for g in v:
            if not re.match(r"^[a-z_][a-z0-9_]*$", g):
                raise ValueError(f"group name '{g}' must be lower-case letters, digits and _")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str, info: ValidationInfo) -> str:
        """A user the provider's hosts refuse is refused when a spec file is read (a copy recorded at provision
        is not: destroy must work from it whatever this version thinks of its user)."""
        provider = info.data.get("provider")
        if provider is not None and (info.context or {}).get("from_file"):
            why = provider.refuse_user(v)
            if why:
                raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _default_user(self) -> TestbedSpec:
        if "user" not in self.model_fields_set:
            self.user = self.provider.default_user
            self._user_given = False
        return self

    @property
    def user_given(self) -> bool:
        """Whether the spec names its login user (else ``user`` is the provider's default)."""
        return self._user_given

    @property
    def kind(self) -> str:
        return self.provider.kind

    def host_names(self) -> list[str] | None:
        """Host names known from the spec alone; None when the cloud decides."""
        return self.provider.planned_hosts()

    @model_validator(mode="after")
    def _group_members(self) -> TestbedSpec:
        import difflib

        # lazy: start-up (testbed status and exec load this module)
        from testbed.yamlfile import Invalid

        names = self.host_names()
        for g, members in self.groups.items():
            if g == "all":
                raise Invalid("group 'all' is every host already; it cannot be defined", loc=("groups", g),
                              fix="remove it, or give the group another name")
            if names is not None and g in names:
                raise Invalid(f"group '{g}' has the name of a host: '{g}' would select either", loc=("groups", g),
                              fix=f"rename the group (e.g. {g}_group); hosts: {', '.join(names)}")
            if not members:
                raise Invalid(f"group '{g}' has no hosts: a step or a command aimed at it would run nowhere",
                              loc=("groups", g), fix="list its hosts, or remove the group"
                              + (f" (hosts: {', '.join(names)})" if names else ""))
            for i, m in enumerate(members):
                if names is not None and m not in names:
                    close = difflib.get_close_matches(m, names, n=1, cutoff=0.5)
                    raise Invalid(f"group '{g}' names unknown host '{m}'", loc=("groups", g, i),
                                  fix=(f"did you mean '{close[0]}'? " if close else "")
                                  + f"hosts: {', '.join(names)}")
                if m in members[:i]:
                    raise Invalid(f"group '{g}' lists host '{m}' twice", loc=("groups", g, i), fix="list it once")
        return self

    @model_validator(mode="after")
    def _hardware_hosts(self) -> TestbedSpec:
        import difflib

        # lazy: start-up (testbed status and exec load this module)
        from testbed.yamlfile import Invalid

        names = self.host_names()
        for h in self.hardware.hosts:
            if names is not None and h not in names:
                close = difflib.get_close_matches(h, names, n=1, cutoff=0.5)
                raise Invalid(f"hardware.hosts names unknown host '{h}'", loc=("hardware", "hosts", h),
                              fix=(f"did you mean '{close[0]}'? " if close else "") + f"hosts: {', '.join(names)}")
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


@contextlib.contextmanager
def stand_ins(name_or_path: str) -> Iterator[dict[str, str]]:
    """While inside: each variable the spec's ``env:`` declares with an ``example`` and the environment lacks is
    set to that example (a rehearsal's replica only needs a value of the right shape); yields those it set."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import yamlfile

    p = Path(name_or_path)
    path = p if p.suffix in (".yml", ".yaml") and p.exists() else inventory_path(name_or_path)
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        raw = YAML(typ="safe").load(yamlfile.read_text(path))
    except (UsageError, YAMLError):  # a broken spec is refused, with its line, by load_testbed right after
        raw = None
    made = {k: v["example"] for k, v in yamlfile.declared_env(raw).items()
            if v.get("example") and not os.environ.get(k)}
    os.environ.update(made)
    try:
        yield made
    finally:
        for k in made:
            os.environ.pop(k, None)


def load_testbed(name_or_path: str) -> TestbedSpec:
    """Load and validate a testbed spec by name (``local``) or by path (``./my.yml``)."""
    # lazy: start-up (testbed status and exec load this module)
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
    spec = yamlfile.validate(TestbedSpec, data, path, located, from_file=True) if isinstance(data, dict) else \
        yamlfile.validate_file(TestbedSpec, path, from_file=True)
    spec.source = str(path)
    return spec
