"""``testbed check`` (``testbed doctor`` is the same): this machine, then each provider asked about.

A target is a provider kind (``local``, ``lab``, ``chameleon``, ``gcp-tpu``: its defaults and the environment's
credentials) or a testbed name (its spec's settings: site, project, zone, endpoint). Every target is resolved
before anything is asked of a network. The result is data; the CLI renders it (``testbed.cli.tools``).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from testbed.distribution import install_command
from testbed.errors import UsageError
from testbed.providers.usable import KINDS, Report, check
from testbed.spec import TestbedSpec, load_testbed


def machine() -> Report:
    """What every provider needs on this machine: Python, Ansible (setup), rsync (collect), mpirun (MPI suites)."""
    rep = Report("machine")
    py = ".".join(map(str, sys.version_info[:3]))
    rep.add("python >= 3.11", sys.version_info >= (3, 11), f"{py} ({sys.executable})", "install Python 3.11")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    rep.add("ansible-playbook", os.path.exists(playbook), playbook if os.path.exists(playbook) else
            f"not next to python ({playbook})", f"{install_command()} (ansible-core comes with it)")
    rsync = shutil.which("rsync")
    rep.add("rsync", rsync is not None, rsync or "not on PATH (collect needs it)", "apt-get install -y rsync")
    mpirun = shutil.which("mpirun")
    rep.add("mpirun", mpirun is not None, mpirun or "not on PATH (needed by MPI suites only)",
            "apt-get install -y openmpi-bin libopenmpi-dev", required=False)
    return rep


def resolve(targets: list[str]) -> list[tuple[str, TestbedSpec | None]]:
    """(kind, spec or None) for each target; an unknown one is refused (with the closest names) before any check."""
    out: list[tuple[str, TestbedSpec | None]] = []
    for t in targets or list(KINDS):
        if t in KINDS:
            out.append((t, None))
            continue
        try:
            spec = load_testbed(t)
        except UsageError as e:
            raise UsageError(f"'{t}' is neither a provider ({', '.join(KINDS)}) nor a testbed: {e.what}",
                             where=e.where, fix=e.fix or "testbed list testbeds") from None
        out.append((spec.kind, spec))
    return out


def run(targets: list[str] | None = None) -> dict[str, Any]:
    """Check this machine and each target (none: every provider kind). ``ok``: the machine is ready and every
    provider asked about (every kind, when none is named) is usable: a check never exits 0 over a provider it
    found not usable."""
    plan = resolve(list(targets or []))
    host = machine()
    reports = [check(kind, spec) for kind, spec in plan]
    ok = host.usable and all(r.usable for r in reports)
    return {"ok": ok, "targets": list(targets or []), "machine": host.to_json(),
            "providers": [r.to_json() for r in reports]}
