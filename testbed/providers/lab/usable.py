"""``testbed check lab``: whether this provider can be used from here (see :mod:`testbed.providers.usable`)."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, cast

from testbed.providers.lab.provider import LabProvider
from testbed.providers.usable import Report

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec
    from testbed.state import Store


def check(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    tools = ("ssh", "ssh-keygen", "ssh-keyscan")
    missing = [t for t in tools if shutil.which(t) is None]
    rep.add("ssh client", not missing, ", ".join(tools) + " on PATH" if not missing else
            f"missing: {', '.join(missing)}", "apt-get install -y openssh-client")
    agent = os.environ.get("SSH_AUTH_SOCK")
    rep.add("ssh agent", None if not agent else True, f"SSH_AUTH_SOCK={agent}" if agent else "no SSH_AUTH_SOCK "
            "(only key files are offered)", required=False)
    if spec is None:
        return
    hosts = LabProvider(spec, cast("Store", None)).hosts_from_spec()  # reads the spec only
    keys = sorted({h.key for h in hosts if h.key})
    gone = [k for k in keys if not os.path.isfile(k)]
    if gone:
        rep.add("keys", False, f"no such key file: {', '.join(gone)}", "set provider.key (or the host's key) to "
                "your private key")
    else:
        rep.add("keys", True, ", ".join(keys) if keys else "the testbed's own key (made at provision; "
                "put its .pub in each host's authorized_keys)")
    rep.context["hosts"] = ", ".join(f"{h.user}@{h.address}:{h.port}" for h in hosts)
