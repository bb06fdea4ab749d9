"""Slurm's client commands on the login node, and their traps, in one place.

testbed talks to Slurm only through the commands every user has (``sbatch``, ``squeue``, ``sacct``, ``scontrol``,
``scancel``, ``sinfo``), run over SSH on the login node. What differs across versions and sites is handled here:
- ``squeue --only-job-state`` is missing before 21.08 (SkyPilot #8907: 20.11): never used; states come from
  ``squeue -h -o`` with a format every version knows, parsed by position;
- ``squeue -j ID`` of a job Slurm has forgotten fails ("Invalid job id specified") on some versions and prints
  nothing on others: both mean "not listed";
- a finished job leaves ``squeue`` after MinJobAge (300 s by default): ``sacct`` then tells how it ended where the
  cluster keeps accounting; where it does not ("accounting storage is disabled"), a job no longer listed has ended;
- ``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER`` (federations, multi-cluster sites);
- node lists are compressed (``node[2-3,7]``): ``scontrol show hostnames`` expands them, as Slurm itself does.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError

JOB_NAME_PREFIX = "testbed-"
HOLDER = """#!/bin/sh
# testbed's allocation holder: the nodes stay allocated while this sleeps; Slurm ends it at the time limit
# (the dead-man's switch) and scancel ends it on destroy
trap 'exit 0' TERM INT
while :; do sleep 60 & wait $!; done
"""
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT", "ENDED"}
NODE_GONE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER")


@dataclass
class Job:
    """One job as Slurm reports it: its state, why it pends (``reason``), its nodes (compressed list)."""

    id: str
    state: str
    reason: str = ""
    nodes: str = ""
    time_left: str = ""

    @property
    def ended(self) -> bool:
        return self.state.split()[0].rstrip("+") in ENDED

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


def parse_parsable(out: str) -> str:
    """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``)."""
    line = out.strip().splitlines()[-1] if out.strip() else ""
    jid = line.split(";", 1)[0].strip()
    if not jid.isdigit():
        raise ValueError(f"sbatch printed no job id: {out.strip()[:200]!r}")
    return jid


SQUEUE_FORMAT = "%i|%T|%r|%N|%L"
"""Job id, state, reason, nodes, time left: letters squeue has known since Slurm 2.x."""


def parse_squeue(out: str) -> dict[str, Job]:
    """``squeue -h -o SQUEUE_FORMAT`` output by job id (array or het job suffixes kept as Slurm prints them)."""
    jobs: dict[str, Job] = {}
    for ln in out.splitlines():
        parts = ln.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        reason = "" if parts[2] in ("None", "(null)") else parts[2]
        jobs[parts[0]] = Job(parts[0], parts[1], reason, "" if parts[3] == "(null)" else parts[3],
                             parts[4] if len(parts) > 4 else "")
    return jobs


def parse_sacct(out: str) -> dict[str, Job]:
    """``sacct -n -P -X -o JobID,State,NodeList`` output by job id (``CANCELLED by 1000`` becomes CANCELLED)."""
    jobs: dict[str, Job] = {}
    for ln in out.splitlines():
        parts = ln.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            jobs[parts[0]] = Job(parts[0], parts[1].split()[0] if parts[1] else "UNKNOWN", "",
                                 parts[2] if len(parts) > 2 else "")
    return jobs


def accounting_disabled(text: str) -> bool:
    return "accounting storage is disabled" in text.lower() or "slurmdbd" in text.lower()


def parse_nodes(out: str) -> dict[str, dict[str, str]]:
    """``scontrol show node -o`` output: each node's fields (NodeName, NodeAddr, NodeHostName, State, ...)."""
    nodes: dict[str, dict[str, str]] = {}
    for ln in out.splitlines():
        fields: dict[str, str] = {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", ln)}
        if fields.get("NodeName"):
            nodes[fields["NodeName"]] = fields
    return nodes


def node_gone(state: str) -> bool:
    """Whether a node state (``IDLE``, ``DOWN*``, ``MIXED+DRAIN``, ``ALLOCATED+NOT_RESPONDING``) means the node
    is lost to a run."""
    s = state.upper()
    return "*" in s or any(g in s for g in NODE_GONE)


def parse_version(out: str) -> tuple[int, int]:
    """``slurm 22.05.8`` -> (22, 5)."""
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@dataclass
class Login:
    """SSH to the login node with the testbed's known_hosts (trust on first use) and one master connection."""

    address: str
    user: str
    port: int
    key: str | None
    proxy_jump: str | None
    known_hosts: Path
    control_dir: Path | None
    connect_timeout: int = 10

    @property
    def where(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    def argv(self) -> list[str]:
        a = ["ssh", "-F", "/dev/null", "-p", str(self.port), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=accept-new",
             "-o", f"ConnectTimeout={self.connect_timeout}", "-o", "LogLevel=ERROR",
             "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"]
        if self.key:
            a += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.proxy_jump:
            a += ["-J", self.proxy_jump]
        if self.control_dir is not None:
            a += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/login-%C",
                  "-o", "ControlPersist=120"]
        return [*a, f"{self.user}@{self.address}"]

    def run(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``command`` in the user's login shell on the login node; raises only when SSH itself fails."""
        try:
            r = subprocess.run([*self.argv(), "--", command], capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the Slurm login node did not answer '{command.split()[0]}' within {int(timeout)} s",
                               where=self.where, fix="check the login node (is it overloaded?) and try again") from None
        if r.returncode == 255:
            why = (r.stderr.strip().splitlines() or ["ssh failed"])[-1]
            raise TestbedError(f"cannot reach the Slurm login node: {why}", where=self.where,
                               fix="check provider.login (address, user, key, proxy_jump) with a plain "
                                   f"'ssh -p {self.port} {self.user}@{self.address}'")
        return r

    def must(self, command: str, what: str, fix: str, timeout: float = 60) -> str:
        """``command``'s output; a clear error with Slurm's own words when it fails."""
        r = self.run(command, timeout)
        if r.returncode != 0:
            said = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[-1]
            raise TestbedError(f"{what}: {said}", where=f"{self.where}: {command.split()[0]}", fix=fix)
        return r.stdout

    # the commands -------------------------------------------------------------------------------------
    def version(self) -> tuple[int, int]:
        return parse_version(self.must("sinfo --version", "sinfo does not answer on the login node",
                                       "check that Slurm's client commands are on your PATH there"))

    def partitions(self) -> dict[str, int]:
        """Every partition this user may see, with its node count (the default one's '*' dropped)."""
        out = self.must("sinfo -h -o '%P|%D'", "sinfo cannot list the partitions",
                        "check that the cluster's slurmctld answers ('sinfo' on the login node)")
        parts: dict[str, int] = {}
        for ln in out.splitlines():
            name, _, count = ln.strip().partition("|")
            if name:
                parts[name.rstrip("*")] = parts.get(name.rstrip("*"), 0) + (int(count) if count.isdigit() else 0)
        return parts

    def default_partition(self) -> str | None:
        out = self.run("sinfo -h -o '%P'").stdout
        return next((p.rstrip("*") for p in out.split() if p.endswith("*")), None)

    def accounts(self) -> list[str] | None:
        """The accounts this user may charge (None: the cluster keeps no accounting database to ask)."""
        r = self.run("sacctmgr -n -P show assoc user=\"$(id -un)\" format=account")
        if r.returncode != 0 or accounting_disabled(r.stderr):
            return None
        return sorted({a.strip() for a in r.stdout.split() if a.strip()})

    def submit(self, options: list[str], script: str) -> str:
        """``sbatch --parsable OPTIONS`` with ``script`` on its stdin: the job id."""
        cmd = "sbatch --parsable " + " ".join(shlex.quote(o) for o in options)
        r = self.run(f"printf '%s' {shlex.quote(script)} | {cmd}", timeout=60)
        if r.returncode != 0:
            said = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[-1]
            raise TestbedError(f"Slurm refused the allocation: {said}", where=f"{self.where}: sbatch",
                               fix="check provider.partition, account, qos, constraint, nodes and gpus_per_node "
                                   "against 'sinfo' and 'sacctmgr show assoc user=$USER' on the login node")
        try:
            return parse_parsable(r.stdout)
        except ValueError as e:
            raise TestbedError(str(e), where=f"{self.where}: sbatch", fix="run the same sbatch by hand") from None

    def jobs(self, ids: list[str]) -> dict[str, Job]:
        """Each of ``ids`` as Slurm knows it: from squeue while listed, else from sacct where accounting is kept,
        else ENDED (a job that left squeue has finished)."""
        if not ids:
            return {}
        r = self.run(f"squeue -h -a -j {','.join(ids)} -o '{SQUEUE_FORMAT}'")
        if r.returncode != 0 and "invalid job id" not in r.stderr.lower():
            raise TestbedError(f"squeue failed: {r.stderr.strip()[-300:]}", where=f"{self.where}: squeue",
                               fix="check that the cluster's slurmctld answers ('squeue' on the login node)")
        seen = parse_squeue(r.stdout if r.returncode == 0 else "")
        gone = [i for i in ids if i not in seen]
        if gone:
            r = self.run(f"sacct -n -P -X -j {','.join(gone)} -o JobID,State,NodeList")
            known = {} if r.returncode != 0 or accounting_disabled(r.stderr) else parse_sacct(r.stdout)
            for i in gone:
                seen[i] = known.get(i) or Job(i, "ENDED")
        return {i: seen[i] for i in ids}

    def mine(self, name: str) -> list[str]:
        """Ids of this user's jobs named ``name`` still listed (to adopt or cancel what state does not record)."""
        r = self.run(f"squeue -h -u \"$(id -un)\" -n {shlex.quote(name)} -o '%i'")
        return [x.strip() for x in r.stdout.split() if x.strip().isdigit()] if r.returncode == 0 else []

    def hostnames(self, nodelist: str) -> list[str]:
        return self.must(f"scontrol show hostnames {shlex.quote(nodelist)}", "scontrol cannot expand a node list",
                         "check the login node's Slurm client").split()

    def nodes(self, names: list[str]) -> dict[str, dict[str, str]]:
        if not names:
            return {}
        return parse_nodes(self.must(f"scontrol show node -o {shlex.quote(','.join(names))}",
                                     "scontrol cannot show the allocated nodes", "check the login node's Slurm "
                                     "client"))

    def cancel(self, ids: list[str]) -> None:
        if ids:
            self.run(f"scancel {' '.join(ids)}")
