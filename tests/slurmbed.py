"""A real Slurm on local hosts, for the slurm provider's tests.

One local testbed (shared /home, a normal user) plays the cluster: host 0 is the login node, host 1 runs
slurmctld, hosts 2.. run slurmd; every host runs munged with one key made for the cluster. The daemons are
Debian's (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``: the Makefile's APT_PACKAGES).

slurm.conf, written here, chooses ``ProctrackType=proctrack/cgroup`` (cgroup.conf: ``cgroup/v1``, nothing
constrained), as most clusters do: a step's processes are killed when it ends, orphans included. The local hosts
are started with ``own_cgroups`` (testbed/providers/local/init.py): each host's init runs in a freezer cgroup of
its own, ``/sys/fs/cgroup/freezer/testbed/<host>``, with a cgroup namespace rooted there and the hierarchies
mounted afresh, so each slurmd's ``slurm_<node>/uid_U/job_J/step_S`` folders live under its host and go with it.
(With this machine's tree bound into every host, proctrack/cgroup works as well, since Slurm names each node's
root ``slurm_<node>``, but its folders land in this machine's tree, stay there when a host is killed, and two
clusters with the same node names would share them.) No accounting storage (no slurmdbd):
``sacct`` answers that accounting is disabled, the case the provider must handle by treating a job that left
``squeue`` as ended.
The controller finds a silent slurmd quickly (SlurmdTimeout 6 s) and forgets a finished job soon (MinJobAge
2 s), so the tests see both within seconds. The cluster dies with the local hosts (every process of a host is
killed when its namespace goes), and ``leftovers.slurm_daemons`` finds any daemon that outlived them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localbed import LocalBed

from testbed.hosts import Host

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch")
PARTITION = "debug"
USER = "alice"


def slurm_available() -> str | None:
    """None when Debian's Slurm and munge are installed here, else the reason to skip."""
    missing = [p for p in DAEMONS if not os.access(p, os.X_OK)]
    return ("Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge): missing "
            + ", ".join(missing)) if missing else None


SLURM_CONF = """# written by tests/slurmbed.py: a small Slurm cluster on local testbed hosts
ClusterName=tb
SlurmctldHost={ctld}({ctld_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# each local host has its own cgroup namespace: see tests/slurmbed.py
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=6
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=2
OverTimeLimit=0
{nodes}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""
CGROUP_CONF = """# written by tests/slurmbed.py: process tracking only (the freezer), nothing constrained
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainSwapSpace=no
ConstrainDevices=no
"""


@dataclass
class SlurmCluster:
    """The cluster on ``bed``: the login host, the controller's host, the compute hosts (Slurm node names)."""

    bed: LocalBed
    login: Host
    ctld: Host
    computes: list[Host]
    user: str = USER
    partition: str = PARTITION
    log: list[str] = field(default_factory=list)

    def root(self, host: str, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``script`` as root on a host of the cluster (its console: no SSH)."""
        assert self.bed.provider is not None
        with self._home():  # the cluster's hosts are recorded there, not in a test's home
            return self.bed.provider.console(host, script, timeout=timeout)

    def as_user(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``script`` as the cluster's user on the login node (Slurm's client commands)."""
        return self.root(self.login.name, f"runuser -u {self.user} -- sh -c {shlex.quote(script)}", timeout)

    def squeue(self) -> list[str]:
        """Every job Slurm still lists, as 'id state nodes' lines."""
        r = self.root(self.login.name, "squeue -h -a -o '%i %T %N'")
        assert r.returncode == 0, r.stderr
        return [ln for ln in r.stdout.splitlines() if ln.strip()]

    def left(self, timeout: float = 15) -> list[str]:
        """The jobs squeue still lists once those that are ending (COMPLETING, then gone after MinJobAge) have
        had ``timeout`` seconds to go."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.squeue()
            if not jobs or time.monotonic() > deadline:
                return jobs
            time.sleep(0.3)

    def node_states(self) -> dict[str, str]:
        r = self.root(self.login.name, "sinfo -h -N -o '%N %T'")
        return dict(ln.split() for ln in r.stdout.splitlines() if ln.strip())

    def wait_nodes(self, state: str, nodes: list[str] | None = None, timeout: float = 40) -> dict[str, str]:
        """Wait (bounded) until ``nodes`` (default: every compute node) are ``state`` (a prefix: 'idle', 'down')."""
        want = nodes or [h.name for h in self.computes]
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(n, "").startswith(state) for n in want):
                return states
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes {want} not {state} within {timeout} s: {states}; "
                                     f"{self.root(self.ctld.name, 'tail -20 /var/log/slurm/slurmctld.log').stdout}")
            time.sleep(0.3)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL the slurmd of ``node`` (the host stays up; Slurm marks the node DOWN once it is silent)."""
        self.root(node, "pkill -KILL -x slurmd; true")

    def start_slurmd(self, node: str) -> None:
        r = self.root(node, "slurmd </dev/null >/dev/null 2>&1")
        assert r.returncode == 0, r.stderr

    def lose(self, node: str) -> None:
        """The machine behind ``node`` dies: every process of its local host killed (slurmd, sshd, what ran)."""
        assert self.bed.provider is not None
        self.bed.provider._kill_all([self._slot(node)])

    def bring_back(self, node: str) -> None:
        """Restart a lost node's host on its own disk, with munged and slurmd, and return it to service."""
        assert self.bed.provider is not None
        with self._home():
            self.bed.provider.repair(node)
        r = self.root(node, "mkdir -p /run/munge && chown munge:munge /run/munge && "
                            "runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1 && "
                            "slurmd </dev/null >/dev/null 2>&1")
        assert r.returncode == 0, r.stderr
        self.resume(node)

    def _slot(self, node: str):  # type: ignore[no-untyped-def]
        assert self.bed.provider is not None
        with self._home():
            return self.bed.provider.slot(node)

    @contextlib.contextmanager
    def _home(self) -> Iterator[None]:
        """The cluster's own state home (its hosts are recorded there), for the length of the block."""
        old = os.environ.get("TESTBED_HOME")
        os.environ["TESTBED_HOME"] = str(self.bed.home)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TESTBED_HOME", None)
            else:
                os.environ["TESTBED_HOME"] = old

    def resume(self, node: str) -> None:
        self.root(self.ctld.name, f"scontrol update nodename={node} state=resume")

    def spec(self, key: Path, **provider: object) -> dict[str, object]:
        """The ``provider:`` block of a slurm testbed on this cluster."""
        return {"kind": "slurm", "login": {"address": self.login.address, "user": self.user, "key": str(key)},
                "partition": self.partition, "nodes": 2, "time_limit": "30:00", **provider}


def start(bed: LocalBed, timeout: float = 40) -> SlurmCluster:
    """Bring up munge and Slurm on ``bed``'s hosts (login, controller, computes: at least 3 hosts)."""
    assert bed.provider is not None and len(bed.hosts) >= 3
    login, ctld, computes = bed.hosts[0], bed.hosts[1], bed.hosts[2:]
    cpus = os.cpu_count() or 1
    nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} RealMemory=256 State=UNKNOWN"
                      for h in computes)
    conf = SLURM_CONF.format(ctld=ctld.name, ctld_addr=ctld.address, nodes=nodes, partition=PARTITION,
                             node_list=",".join(h.name for h in computes))
    key = base64.b64encode(os.urandom(1024)).decode()
    common = (
        "set -e; mkdir -p /etc/slurm /etc/munge /var/lib/munge /var/log/munge /run/munge /var/spool/slurmd "
        "/var/spool/slurmctld /var/log/slurm; "
        f"echo {key} | base64 -d > /etc/munge/munge.key; "
        "chown munge:munge /etc/munge /etc/munge/munge.key /var/lib/munge /var/log/munge /run/munge; "
        "chmod 0700 /etc/munge /var/lib/munge /var/log/munge; chmod 0400 /etc/munge/munge.key; "
        "chmod 0755 /run/munge; "
        f"printf '%s' {shlex.quote(conf)} > /etc/slurm/slurm.conf; "
        f"printf '%s' {shlex.quote(CGROUP_CONF)} > /etc/slurm/cgroup.conf; "
        "runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1; "
        # a cluster's user has no root: the sudo the local provider gave them goes
        f"rm -f /etc/sudoers.d/testbed-{USER}; ")
    cluster = SlurmCluster(bed, login, ctld, computes)
    for h in bed.hosts:
        r = bed.provider.console(h.name, common)
        assert r.returncode == 0, f"{h.name}: {r.stderr}"
    r = bed.provider.console(ctld.name, "slurmctld -c </dev/null >/dev/null 2>&1")
    assert r.returncode == 0, r.stderr
    for h in computes:
        cluster.start_slurmd(h.name)
    cluster.wait_nodes("idle", timeout=timeout)
    return cluster
