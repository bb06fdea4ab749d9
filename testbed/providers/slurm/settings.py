"""The slurm provider's settings (the ``provider:`` block of a testbed spec).

Pure data: imported when a spec is loaded, so it imports no provider code and no SDK.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from testbed.providers.base_settings import ADDRESS_RE, JUMP_RE, PATH_RE, USER_RE, Settings, Strict, ssh_value

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

    _address = field_validator("address")(classmethod(lambda cls, v: ssh_value(v, ADDRESS_RE, "a hostname or IP")))
    _user = field_validator("user")(classmethod(lambda cls, v: ssh_value(v, USER_RE, "a login name")))
    _key = field_validator("key")(classmethod(lambda cls, v: ssh_value(v, PATH_RE, "a file path")))
    _jump = field_validator("proxy_jump")(classmethod(lambda cls, v: ssh_value(v, JUMP_RE, "[user@]host[:port]")))


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
