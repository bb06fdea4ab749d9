"""The slurm provider: nodes of a Slurm cluster, held by an allocation and reached through the login node.

Provision submits one allocation (``sbatch --parsable`` of a holder script that sleeps: SkyPilot's way) for
``nodes`` nodes and records its job id the moment Slurm returns it; while the job is PENDING, Slurm's reason is
the progress line; past ``pending_timeout`` the job is cancelled and provision stops with one message. The hosts
are the allocated nodes (``scontrol show hostnames``), named ``slot0``, ``slot1``... (stable across repairs; each
slot's node is a fact), reached with ProxyJump through the login node, where the cluster lets a user with a job
on a node log in to it (pam_slurm_adopt puts those processes into the job). A run's ranks start there as steps of
the job holding their node (:meth:`SlurmProvider.rank_launcher`: ``srun --overlap --jobid``), so Slurm tracks them
and ends them with the job; ``SLURM_JOB_ID`` is in the inventory too.

The job carries ``--no-kill``: a node that fails leaves the others allocated. Repair cancels nothing: it asks for
a new one-node allocation (the failed node and the held ones excluded) and the slot takes that node. A dead node
behind the login node does not refuse SSH (the jump only says "Connection closed"): a run finds it lost by Slurm's
word (``reported_states``: DOWN, DRAIN, not responding), so a testbed's ``lost_after`` should exceed the
cluster's SlurmdTimeout. Set-up has no root (``root_on_hosts``): it covers the home and environments.

The time limit is the dead-man's switch: Slurm ends the job at ``--time`` whether or not testbed is running
(``--expire`` shortens it).
Destroy cancels every recorded job (and any this user's testbed job of the same name), then checks with
squeue/sacct that none is left. Slurm's command traps live in :mod:`testbed.providers.slurm.cli`.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import TYPE_CHECKING, Any

from testbed import paths, remote, ssh
from testbed.capabilities import Capability, Expires, Repairs
from testbed.errors import TestbedError, UsageError
from testbed.hosts import Host
from testbed.providers.base import Made, Pacer, Provider
from testbed.providers.slurm.cli import HOLDER, JOB_NAME_PREFIX, Job, Login, node_gone
from testbed.providers.slurm.settings import SlurmSettings
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry

LOGIN_ALIAS = "slurm-login"


class SlurmProvider(Provider, Repairs, Expires):
    kind = "slurm"
    root_on_hosts = False  # a cluster's user has no root on its nodes: set-up covers the home and environments
    lacking = {Capability.EXTEND: "a Slurm job's time limit is set when it is submitted (provider.time_limit), and "
                                  "only the cluster's administrators can raise it",
               Capability.KILL_HOST: "a Slurm cluster's nodes are not testbed's to power off",
               Capability.CUT_NETWORK: "a Slurm cluster's nodes are not testbed's to take off the network"}
    repair_how = "replaced by a new one-node allocation"
    _why: dict[str, str]
    _notes: dict[str, str]
    _expiry: Expiry | None = None

    @property
    def settings(self) -> SlurmSettings:
        assert isinstance(self.spec.provider, SlurmSettings)
        return self.spec.provider

    @property
    def where(self) -> str:
        return self.spec.source or f"inventories/{self.name}.yml"

    @property
    def user(self) -> str:
        return self.settings.login.user or self.spec.user

    @property
    def key(self) -> str:
        k = self.settings.login.key
        return os.path.expanduser(k) if k else str(ssh.key_path(self.name))

    @property
    def job_name(self) -> str:
        """Unique to (state home, testbed): another folder's testbed of the same name is not adopted."""
        tag = hashlib.sha256(str(paths.testbed_dir(self.name)).encode()).hexdigest()[:6]
        return f"{JOB_NAME_PREFIX}{self.name}-{tag}"

    def login(self) -> Login:
        s = self.settings.login
        return Login(s.address, self.user, s.port, self.key, s.proxy_jump, ssh.known_hosts_path(self.name),
                     ssh.control_dir(self.name), self.settings.connect_timeout)

    @property
    def connect_timeout(self) -> int:
        return self.settings.connect_timeout

    # checks ---------------------------------------------------------------------------------------
    def wants_key(self) -> bool:
        return self.settings.login.key is None

    def preflight(self) -> None:
        """The key, then the login node: Slurm answers, the partition and account exist, enough nodes."""
        s = self.settings
        if s.login.key and not os.path.exists(self.key):
            raise TestbedError(f"the SSH key {self.key} for the Slurm login node does not exist",
                               where=f"{self.where}: provider.login.key", fix="name your private key for the cluster")
        if self.store.resources(self.name, "job"):
            return  # already checked when the allocation was made; a repair or destroy need not ask again
        login = self.login()
        login.version()
        parts = login.partitions()
        part = s.partition or login.default_partition()
        if part is None:
            raise UsageError("the cluster has no default partition and the spec names none",
                             where=f"{self.where}: provider.partition",
                             fix=f"set provider.partition to one of: {', '.join(sorted(parts)) or 'none listed'}")
        if part not in parts:
            raise UsageError(f"the cluster has no partition '{part}' (or you may not use it)",
                             where=f"{self.where}: provider.partition",
                             fix=f"partitions you can use: {', '.join(sorted(parts)) or 'none'}")
        if s.nodes > parts[part]:
            raise UsageError(f"partition '{part}' has {plural(parts[part], 'node')}; the spec asks for {s.nodes}",
                             where=f"{self.where}: provider.nodes",
                             fix=f"ask for at most {plural(parts[part], 'node')}")
        if s.account:
            accounts = login.accounts()
            if accounts is not None and s.account not in accounts:
                raise UsageError(f"you have no Slurm account '{s.account}'", where=f"{self.where}: provider.account",
                                 fix=f"your accounts: {', '.join(accounts) or 'none'} ('sacctmgr show assoc "
                                     "user=$USER' on the login node)")

    def check_switch(self, expiry: Expiry) -> None:
        if expiry.idle_after is not None:
            raise UsageError("a Slurm allocation cannot be released when idle: its switch is the job's time limit",
                             where=f"{self.where}: idle_after", fix="remove idle_after; use expire (or --expire), "
                             "which shortens the job's time limit")
        self._expiry = expiry

    def arm_switch(self, hosts: list[Host], expiry: Expiry) -> Expiry:
        """Nothing to install: the job's time limit, set from the expiry at submission, is Slurm's own switch."""
        expiry.switch = "slurm time limit"
        expiry.armed = None
        return expiry

    def disarm_switch(self) -> None:
        return None

    def minutes(self) -> int:
        """The allocation's --time: the spec's limit, shortened to the expiry."""
        m = self.settings.minutes()
        if self._expiry is not None and self._expiry.expire_at is not None:
            m = min(m, max(1, math.ceil((self._expiry.expire_at - time.time()) / 60)))
        return m

    # provision ------------------------------------------------------------------------------------
    def slots(self) -> list[str]:
        return [f"{self.settings.name_prefix}{i}" for i in range(self.settings.nodes)]

    def options(self, nodes: int, exclude: list[str]) -> list[str]:
        s = self.settings
        o = [f"--job-name={self.job_name}", f"--nodes={nodes}", "--ntasks-per-node=1", f"--time={self.minutes()}",
             "--no-kill", "--output=/dev/null", "--error=/dev/null", "--chdir=/tmp"]
        o += [f"--partition={s.partition}"] if s.partition else []
        o += [f"--account={s.account}"] if s.account else []
        o += [f"--qos={s.qos}"] if s.qos else []
        o += [f"--constraint={s.constraint}"] if s.constraint else []
        o += [f"--gpus-per-node={s.gpus_per_node}"] if s.gpus_per_node else []
        o += [f"--exclude={','.join(exclude)}"] if exclude else []
        return o

    def create(self, public_key: str | None) -> Made:
        """The recorded allocations that still run; a new one for the slots none holds (all of them at first, a
        failed node's slot on repair), recorded at once, waited on while it pends."""
        login = self.login()
        recorded = self.store.resources(self.name, "job")
        states = login.jobs([r["id"] for r in recorded])
        held: dict[str, str] = {}  # slot -> node
        for r in recorded:
            if states[r["id"]].ended:  # ended by its time limit, an admin, or a failure: its slots are free
                self.progress(f"job {r['id']}: {states[r['id']].state}")
                self.store.remove_resource(self.name, "job", r["id"])
                continue
            held.update(r["info"].get("slots") or {})
        missing = [s for s in self.slots() if s not in held]
        renewed: set[str] = set()
        if missing:
            # never a failed node, nor one the testbed holds already (a node is shared unless --exclusive)
            exclude = sorted({n for r in recorded for n in r["info"].get("failed") or []} | set(held.values()))
            jid = login.submit(self.options(len(missing), exclude), HOLDER)
            self.store.add_resource(self.name, "job", jid, slots={}, wanted=missing, nodes=len(missing))
            self.progress(f"job {jid}: submitted for {plural(len(missing), 'node')}")
            job = self._wait_running(login, jid)
            nodes = login.hostnames(job.nodes)
            slots = dict(zip(missing, nodes, strict=False))
            self.store.add_resource(self.name, "job", jid, slots=slots, nodes=len(missing), list=job.nodes)
            held.update(slots)
            renewed = set(slots)
        info = login.nodes(sorted(set(held.values())))
        jobs = {slot: r["id"] for r in self.store.resources(self.name, "job") for slot in r["info"].get("slots") or {}}
        hosts = []
        jump = {"alias": LOGIN_ALIAS, "hostname": self.settings.login.address, "port": self.settings.login.port,
                "user": self.user, "identities": [self.key], "identities_only": True,
                "proxy_jump": self.settings.login.proxy_jump}
        for i, slot in enumerate(self.slots()):
            node = held[slot]
            n = info.get(node, {})
            address = n.get("NodeAddr") or node
            hosts.append(Host(name=slot, address=address, port=22, user=self.user, key=self.key,
                              proxy_jump=LOGIN_ALIAS, groups=self.spec.groups_for(slot, i),
                              facts={"provider": "slurm", "slurm_node": node, "slurm_job": jobs.get(slot, ""),
                                     "ssh_jumps": [jump], "mesh_address": address,
                                     "cpus": int(n.get("CPUTot") or 0)}))
        for slot in renewed:  # a slot on a new node: its old node's host key is not this one's
            ssh.pin_host_keys(self.name, slot, [])
        return Made(hosts, renewed=renewed)

    def _wait_running(self, login: Login, jid: str) -> Job:
        """Wait while ``jid`` pends (Slurm's reason as progress); cancel it and stop at pending_timeout."""
        limit = self.settings.pending_timeout
        start = time.monotonic()
        pause = Pacer(0.5, start + limit, cap=10.0)
        last = ""
        while True:
            job = login.jobs([jid])[jid]
            if job.state == "RUNNING" and job.nodes:
                return job
            if job.ended:
                self.store.remove_resource(self.name, "job", jid)
                raise TestbedError(f"Slurm job {jid} ended before it ran ({job.state})",
                                   where=f"{login.where}: job {jid}",
                                   fix=f"see 'sacct -j {jid}' or the cluster's policy; then provision again")
            waited = time.monotonic() - start
            line = f"job {jid}: {job.state}" + (f" ({job.reason})" if job.reason else "")
            if line != last or int(waited) % 30 == 0:
                self.progress(f"{line} {int(waited)} s")
                last = line
            if waited >= limit:
                login.cancel([jid])
                self._wait_ended(login, [jid], 30)
                self.store.remove_resource(self.name, "job", jid)
                raise TestbedError(f"Slurm job {jid} was still {job.state}"
                                   + (f" ({job.reason})" if job.reason else "") + f" after {limit} s; cancelled",
                                   where=f"{login.where}: partition {self.settings.partition or '(default)'}",
                                   fix="raise provider.pending_timeout, ask for fewer nodes or a shorter time_limit, "
                                       "or pick another partition ('sinfo' shows what is idle)")
            pause.sleep()

    def reach(self, made: Made, everyone: list[Host] | None = None) -> None:
        """One login per node through the login node (pinning its key on first use); a node that does not answer
        within ssh_timeout is recorded as unreachable."""
        hosts = made.hosts
        remote.close_connections(self.name, sorted(made.renewed))
        ssh.write_ssh_config(self.name, everyone or hosts, connect_timeout=self.connect_timeout)
        deadline = time.monotonic() + self.settings.ssh_timeout
        todo = {h.name: h for h in hosts}
        self._why = {}
        while todo:
            results = remote.run(self.name, list(todo), "uname -srm; nproc", timeout=self.connect_timeout + 20)
            for r in results:
                h = todo[r.host]
                if r.ok:
                    lines = r.stdout.split("\n")
                    h.state = "up"
                    h.facts["kernel"] = lines[0].strip()
                    if len(lines) > 1 and lines[1].strip().isdigit():
                        h.facts["cpus"] = int(lines[1])
                    del todo[r.host]
                else:
                    self._why[r.host] = r.error or ssh.describe_ssh_failure(r.stderr, r.host, self.name)
            if todo and time.monotonic() >= deadline:
                for h in todo.values():
                    h.state = "unreachable"
                return
            if todo:
                time.sleep(2)
        self.progress(f"{plural(len(hosts), 'node')} answering SSH")

    def unreachable(self, hosts: list[Host]) -> TestbedError:
        bad = [f"{h.name} (node {h.facts.get('slurm_node')}): {self._why.get(h.name, '')}" for h in hosts]
        return TestbedError(f"{plural(len(bad), 'allocated node')} did not answer SSH through the login node: "
                            + "; ".join(bad), where=f"testbed {self.name}",
                            fix="the cluster may not let users log in to their nodes (ask its admins about "
                                "pam_slurm_adopt); 'testbed destroy " + self.name + "' cancels the allocation")

    def inventory_vars(self) -> dict[str, Any]:
        jobs = [r["id"] for r in self.store.resources(self.name, "job")]
        return {**super().inventory_vars(), "slurm_jobs": jobs, "SLURM_JOB_ID": jobs[0] if jobs else ""}

    def rank_launcher(self, host: Host) -> list[str]:
        """A rank runs as a step of the job that holds its node (a repaired slot's: the new one-node job), so
        Slurm accounts and tracks it and ends it with the job (scancel, the time limit): ``srun --overlap``
        beside the holder, one task on that node, no MPI plugin (a rank's own mpirun launches its MPI)."""
        job, node = host.facts.get("slurm_job"), host.facts.get("slurm_node")
        if not job or not node:
            return []
        return ["srun", "--overlap", f"--jobid={job}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
                "--mpi=none", f"--job-name={self.job_name}-rank", "--quiet"]

    def info(self) -> dict[str, Any]:
        return {"login": self.settings.login.address, "partition": self.settings.partition,
                "job_name": self.job_name, "root": False}

    # repair ---------------------------------------------------------------------------------------
    def discard(self, host: Host) -> list[str]:
        """The slot's node leaves the testbed: its job keeps the others (--no-kill); a job left with no slot is
        cancelled. ``create`` then asks for one node, excluding the failed one."""
        node = str(host.facts.get("slurm_node") or "")
        for r in self.store.resources(self.name, "job"):
            slots = dict(r["info"].get("slots") or {})
            if host.name in slots:
                slots.pop(host.name)
                failed = sorted({*(r["info"].get("failed") or []), node} - {""})
                if not slots:
                    login = self.login()
                    login.cancel([r["id"]])
                    self._wait_ended(login, [r["id"]], 30)
                    self.store.remove_resource(self.name, "job", r["id"])
                    r2 = self.store.resources(self.name, "job")
                    if r2:  # keep the exclusion with a job still held
                        self.store.add_resource(self.name, "job", r2[0]["id"], **{**r2[0]["info"], "failed": failed})
                else:
                    self.store.add_resource(self.name, "job", r["id"], **{**r["info"], "slots": slots,
                                                                          "failed": failed})
        return [host.name]

    def repair_fix(self, h: Host) -> str:
        return (f"'testbed destroy {self.name}' cancels the allocation; provision again for a new one "
                "('sinfo' on the login node shows which nodes are up)")

    # destroy --------------------------------------------------------------------------------------
    def release(self) -> None:
        """scancel every recorded job and this testbed's jobs Slurm still lists by name, then check none is left."""
        recorded = [r["id"] for r in self.store.resources(self.name, "job")]
        tb = self.store.testbed(self.name)
        if not recorded and tb is None:
            return
        login = self.login()
        ids = sorted({*recorded, *login.mine(self.job_name)}, key=int)
        login.cancel(ids)
        left = self._wait_ended(login, ids, 60)
        for i in recorded:
            if i not in left:
                self.store.remove_resource(self.name, "job", i)
        if left:
            raise TestbedError(f"Slurm still lists {plural(len(left), 'job')} of '{self.name}' after scancel: "
                               + ", ".join(left), where=f"{login.where}: squeue",
                               fix=f"'scancel {' '.join(left)}' on the login node, then 'testbed destroy {self.name}'")

    def _wait_ended(self, login: Login, ids: list[str], timeout: float) -> list[str]:
        """Wait (bounded) until Slurm reports every job of ``ids`` ended; those that are not."""
        deadline = time.monotonic() + timeout
        pause = Pacer(0.3, deadline, cap=3.0)
        while True:
            jobs = login.jobs(ids)
            left = [i for i, j in jobs.items() if not j.ended]
            if not left or time.monotonic() >= deadline:
                return left
            pause.sleep()

    # status ---------------------------------------------------------------------------------------
    def refresh(self) -> list[Host]:
        """Hosts with their nodes' state: up, down (Slurm marks the node DOWN/DRAIN/not responding), or gone
        (its job ended: the time limit, scancel)."""
        hosts = self.store.hosts(self.name)
        if not hosts:
            return hosts
        login = self.login()
        jobs = login.jobs([r["id"] for r in self.store.resources(self.name, "job")])
        nodes = login.nodes(sorted({str(h.facts.get("slurm_node")) for h in hosts if h.facts.get("slurm_node")}))
        self._notes = {}
        for h in hosts:
            jid = str(h.facts.get("slurm_job") or "")
            job = jobs.get(jid)
            state = nodes.get(str(h.facts.get("slurm_node")), {}).get("State", "")
            h.state = "gone" if job is None or job.ended else "down" if node_gone(state) else "up"
            self._notes[h.name] = (f"Slurm: node {h.facts.get('slurm_node')} {state or 'unknown'}, job {jid} "
                                   + (job.state if job is not None else "not recorded"))
        return hosts

    def state_notes(self) -> dict[str, str]:
        return dict(getattr(self, "_notes", {}))

    def reported_states(self) -> dict[str, str] | None:
        return {h.name: h.state for h in self.refresh()}

    def describe(self) -> dict[str, Any]:
        jobs = self.store.resources(self.name, "job")
        return {"jobs": [r["id"] for r in jobs], "partition": self.settings.partition,
                "time_limit": self.settings.time_limit, "login": self.settings.login.address}

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        """Node-hours: the nodes held, counted from the first allocation's record."""
        jobs = self.store.resources(self.name, "job")
        if not jobs:
            return None
        nodes = sum(len(r["info"].get("slots") or {}) or int(r["info"].get("nodes") or 0) for r in jobs)
        return {"per_hour": float(nodes), "unit": "node-hours", "since": min(r["created"] for r in jobs),
                "basis": f"{plural(nodes, 'node')} of partition {self.settings.partition or '(default)'}"}
