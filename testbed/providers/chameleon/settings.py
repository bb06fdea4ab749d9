"""The chameleon provider's settings (the ``provider:`` block of a testbed spec).

Pure data: imported when a spec is loaded, so it imports no provider code and no SDK.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from testbed.providers.base_settings import Settings


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
