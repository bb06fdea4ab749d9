"""The gcp-tpu provider's settings (the ``provider:`` block of a testbed spec).

Pure data: imported when a spec is loaded, so it imports no provider code and no SDK.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from testbed.providers.base_settings import Settings

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
