"""``testbed check local``: whether this provider can be used from here (see :mod:`testbed.providers.usable`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from testbed.providers.local.provider import REQUIRED_TOOLS
from testbed.providers.usable import Report

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec


def check(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    linux = sys.platform.startswith("linux")
    rep.add("linux", linux, sys.platform, "the local provider needs Linux (network namespaces)")
    root = os.geteuid() == 0
    rep.add("root", root, "running as root" if root else f"running as uid {os.geteuid()}",
            "run as root (sudo -E testbed ...): namespaces, mounts and veth links need it")
    missing = {t: p for t, p in REQUIRED_TOOLS.items() if shutil.which(t) is None}
    rep.add("tools", not missing, ", ".join(sorted(REQUIRED_TOOLS)) + " on PATH" if not missing else
            f"missing: {', '.join(missing)}", f"apt-get install -y {' '.join(sorted(set(missing.values())))}")
    sshd = "/usr/sbin/sshd"
    has_sshd = os.access(sshd, os.X_OK)
    rep.add("sshd", has_sshd, sshd if has_sshd else f"no executable {sshd}", "apt-get install -y openssh-server")
    if not (linux and root and shutil.which("unshare")):
        rep.add("network namespaces", None, "not checked: needs Linux, root and unshare")
        return
    try:  # a namespace made and dropped at once: what each local host gets, without leaving anything
        r = subprocess.run(["unshare", "--net", "--mount", "--", "true"], capture_output=True, text=True,
                           timeout=10, check=False)
        ok, why = r.returncode == 0, (r.stderr or r.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    rep.add("network namespaces", ok, "a network and mount namespace can be made" if ok else
            f"unshare --net --mount failed: {why[:200]}",
            "run on a host (or a privileged container) that allows namespaces (CAP_SYS_ADMIN)")
