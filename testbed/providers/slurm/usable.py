"""``testbed check slurm``: whether this provider can be used from here (see :mod:`testbed.providers.usable`)."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from testbed.errors import TestbedError
from testbed.providers.slurm.cli import Login
from testbed.providers.slurm.settings import SlurmSettings
from testbed.providers.usable import Report
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec


def check(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    """The ssh client; with a spec: the key, the login node answering, Slurm answering there (its version), the
    partition (and its node count) and the account (where the cluster keeps accounting)."""
    import tempfile
    from pathlib import Path

    missing = [t for t in ("ssh", "ssh-keygen") if shutil.which(t) is None]
    rep.add("ssh client", not missing, "ssh, ssh-keygen on PATH" if not missing else f"missing: {', '.join(missing)}",
            "apt-get install -y openssh-client")
    if spec is None or missing:
        return
    s = spec.provider
    assert isinstance(s, SlurmSettings)
    user = s.login.user or spec.user
    key = os.path.expanduser(s.login.key) if s.login.key else None
    if key and not os.path.isfile(key):
        rep.add("key", False, f"no such key file: {key}", "set provider.login.key to your private key")
        return
    rep.add("key", True, key or "the testbed's own key (made at provision; put its .pub in ~/.ssh/authorized_keys "
            "on the cluster)")
    if key is None:
        rep.add("login node", None, "not checked: the testbed's key is made at provision")
        return
    rep.context["login"] = f"{user}@{s.login.address}:{s.login.port}"
    with tempfile.TemporaryDirectory(prefix="tb-check-") as tmp:  # nothing recorded: a check writes no state
        login = Login(s.login.address, user, s.login.port, key, s.login.proxy_jump, Path(tmp) / "known_hosts", None,
                      s.connect_timeout)
        try:
            major, minor = login.version()
            rep.add("login node", True, f"answers; Slurm {major}.{minor:02d}")
            parts = login.partitions()
            part = s.partition or login.default_partition()
        except TestbedError as e:
            rep.failure("login node", e)
            return
        if part in parts:
            rep.add("partition", True, f"{part}: {plural(parts[part], 'node')}")
        else:
            rep.add("partition", False, f"no partition '{part}'" if part else "no default partition",
                    f"set provider.partition to one of: {', '.join(sorted(parts)) or 'none listed'}")
        if s.account:
            accounts = login.accounts()
            if accounts is None:
                rep.add("account", None, "not checked: the cluster keeps no accounting database", required=False)
            else:
                rep.add("account", s.account in accounts, s.account if s.account in accounts else
                        f"you have no account '{s.account}'", f"your accounts: {', '.join(accounts) or 'none'}")
        rep.context["partition"] = part or ""
