"""Provider registry. Modules are imported on demand so cloud SDKs never load for other commands."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.providers.base import Provider

PROVIDERS: dict[str, str] = {
    "local": "testbed.providers.local.provider:LocalProvider",
    "lab": "testbed.providers.lab.provider:LabProvider",
    "chameleon": "testbed.providers.chameleon.provider:ChameleonProvider",
    "gcp-tpu": "testbed.providers.gcp_tpu.provider:TpuProvider",
    "slurm": "testbed.providers.slurm.provider:SlurmProvider",
}

COSTS_MONEY = frozenset({"chameleon", "gcp-tpu"})
"""The providers whose resources bill while held (their classes' ``costs_money``, checked equal in the tests):
what the ledger asks for a cost without importing every provider."""

COUNTS_HOURS = frozenset({"slurm"})
"""The providers whose resources cost no money but are counted (a Slurm allocation's node-hours, charged to an
account's fair share): the ledger shows their ``cost`` too."""

KEEPS_HOSTS = frozenset({"lab"})
"""The providers whose destroy leaves the hosts, and the files on them, as they were (their classes' ``keeps_hosts``,
checked equal in the tests): for every other one, a testbed destroyed and provisioned again has new hosts, so the
files of its earlier runs are gone (what collect tells a user)."""


def provider_class(kind: str) -> type[Provider]:
    """The Provider class for ``kind`` (imports only that provider's module)."""
    mod_name, cls_name = PROVIDERS[kind].split(":")
    return getattr(importlib.import_module(mod_name), cls_name)
