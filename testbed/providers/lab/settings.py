"""The lab provider's settings (the ``provider:`` block of a testbed spec).

Pure data: imported when a spec is loaded, so it imports no provider code and no SDK.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from testbed.providers.base_settings import (
    ADDRESS_RE,
    HOSTNAME_RE,
    JUMP_RE,
    PATH_RE,
    USER_RE,
    Settings,
    Strict,
    ssh_value,
)


class LabHost(Strict):
    name: str = Field(pattern=HOSTNAME_RE)
    address: str | None = Field(None, description="hostname or IP; default: name")
    port: int = Field(22, ge=1, le=65535)
    user: str | None = None
    key: str | None = None
    proxy_jump: str | None = Field(None, description="[user@]host[:port][,...]")
    groups: list[str] = Field(default_factory=list)

    _address = field_validator("address")(classmethod(lambda cls, v: ssh_value(v, ADDRESS_RE, "a hostname or IP")))
    _user = field_validator("user")(classmethod(lambda cls, v: ssh_value(v, USER_RE, "a login name")))
    _key = field_validator("key")(classmethod(lambda cls, v: ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: ssh_value(v, JUMP_RE, "[user@]host[:port]")))


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

    _key = field_validator("key")(classmethod(lambda cls, v: ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: ssh_value(v, JUMP_RE, "[user@]host[:port]")))
    _cfg = field_validator("ssh_config")(classmethod(lambda cls, v: ssh_value(v, PATH_RE, "a file path")))
    connect_timeout: int = Field(10, ge=1, le=300)
    ssh_timeout: int = Field(300, ge=5, description="how long a host being repaired may take to answer SSH again "
                                                    "(a reboot)")

    @field_validator("hosts")
    @classmethod
    def _distinct(cls, v: list[LabHost]) -> list[LabHost]:
        """Two hosts of one name would be one host to SSH, Ansible and state."""
        # lazy: start-up (testbed status and exec load this module)
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
