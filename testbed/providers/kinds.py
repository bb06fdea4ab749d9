"""Every kind's settings as one discriminated union: what a spec's ``provider:`` block is validated against.

Pure data: each kind's settings module beside its provider, never the provider itself or its cloud SDK.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from testbed.providers.chameleon.settings import ChameleonSettings
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.lab.settings import LabSettings
from testbed.providers.local.settings import LocalSettings
from testbed.providers.slurm.settings import SlurmSettings

ProviderSettings = Annotated[
    LocalSettings | LabSettings | ChameleonSettings | TpuSettings | SlurmSettings, Field(discriminator="kind")
]
