"""Scale: bring up N local hosts, say where the time goes and what a host costs in memory; then (optionally) a
set-up of the base profile and a collect on all of them.

Run by hand as root:  .venv/bin/python bench/scale.py [--hosts 128] [--bridge-ports N] [--setup] [--collect]
[--keep-going] (past 252 hosts the subnet is wider than a /24)

Prints the provision time split into its phases (bridge and links, disks, host start, SSH reach, user), the
target (128 hosts within 15 s) and whether it is met, and the memory of one host: the proportional set size
(PSS, shared pages split between sharers) of every process in the host's namespace, averaged over hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import bed, loadavg, table

from testbed.providers.local.provider import LocalProvider

PHASES: dict[str, float] = {}


def _timed_method(cls: type, name: str, label: str) -> None:
    """Add the wall time of every call of ``cls.name`` to PHASES[label]."""
    orig: Callable[..., Any] = getattr(cls, name)

    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            PHASES[label] = PHASES.get(label, 0.0) + time.perf_counter() - t0

    setattr(cls, name, wrapper)


def _pss_kb(pid: str) -> int:
    try:
        for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if ln.startswith("Pss:"):
                return int(ln.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_memory_mb(prov: LocalProvider) -> tuple[float, float, int]:
    """(mean PSS per host in MiB, mean RSS per host in MiB, processes per host) over the testbed's hosts."""
    import subprocess

    pss = rss = procs = 0
    slots = prov.slots()
    for sl in slots:
        pids = subprocess.run(["ip", "netns", "pids", sl.netns], capture_output=True, text=True,
                              check=False).stdout.split()
        procs += len(pids)
        for p in pids:
            pss += _pss_kb(p)
            with contextlib.suppress(OSError, ValueError, IndexError):
                rss += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    n = max(1, len(slots))
    return pss / n / 1024, rss / n / 1024, round(procs / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--bridge-ports", type=int, default=None, help="hosts per bridge (default: the provider's)")
    ap.add_argument("--target", type=float, default=15.0, help="seconds allowed for the provision")
    ap.add_argument("--setup", action="store_true", help="also apply the base profile to every host")
    ap.add_argument("--collect", action="store_true", help="also run a suite's collect on every host")
    ap.add_argument("--no-mesh-verify", action="store_true",
                    help="set-up without ssh_mesh's check of every pair of hosts (n*(n-1)*2 logins: 32,512 at 128)")
    a = ap.parse_args()
    for name, label in (("_ensure_bridge", "bridge"), ("_teardown_hosts", "teardown leftovers"),
                        ("_prepare_disks", "disks"), ("_start_hosts", "start hosts"), ("create", "create (all)"),
                        ("reach", "reach (ssh wait, pin, login)"), ("ready", "ready (user)")):
        if hasattr(LocalProvider, name):
            _timed_method(LocalProvider, name, label)
    print(f"load before: {loadavg()}", flush=True)
    t0 = time.perf_counter()
    with bed(a.hosts, name="scale", bridge_ports=a.bridge_ports) as b:
        total = time.perf_counter() - t0
        assert b.provider is not None
        rows: list[list[object]] = [[k, v] for k, v in PHASES.items()]
        rows.append(["provision total", total])
        print(table(f"provision of {a.hosts} local hosts (seconds; load {loadavg()})",
                    ["phase", "seconds"], rows))
        met = total <= a.target if a.hosts >= 128 else None
        print(f"\n{a.hosts} hosts up in {total:.1f} s: target <= {a.target:.0f} s for 128 hosts "
              + ("MET" if met else "MISSED" if met is not None else "(not a 128-host run)"))
        pss, rss, procs = host_memory_mb(b.provider)
        print(f"memory per local host: {pss:.1f} MiB PSS ({rss:.1f} MiB RSS, {procs} processes: launcher, init, sshd)")
        if a.setup:
            from testbed import setup as setup_mod

            t1 = time.perf_counter()
            extra = {"ssh_mesh_verify": False} if a.no_mesh_verify else None
            res = setup_mod.apply(b.name, profile="base", extra_vars=extra)
            print(f"set-up of the base profile{' (ssh_mesh_verify off)' if extra else ''} on {a.hosts} hosts: "
                  f"{'ok' if res.ok else 'FAILED'} in "
                  f"{time.perf_counter() - t1:.1f} s{'' if res.ok else ': ' + str(res.error)}", flush=True)
        if a.collect:
            from collect_vs_rsync import collect_once

            collect_once(b, small=20, large_mb=1)
        t2 = time.perf_counter()
    print(f"destroy: {time.perf_counter() - t2:.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
