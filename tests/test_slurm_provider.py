"""The slurm provider against a real Slurm (slurmctld, slurmd, munge) on local hosts (tests/slurmbed.py), and its
parsers on the outputs of the versions it meets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localbed import invoke

from testbed.providers.slurm import cli as slurm_cli
from testbed.providers.slurm.settings import SlurmSettings

# -- parsers: the traps of Slurm's client commands (no cluster) ---------------------------------------------


def test_sbatch_parsable_with_and_without_cluster() -> None:
    assert slurm_cli.parse_parsable("1234\n") == "1234"
    assert slurm_cli.parse_parsable("1234;tesla\n") == "1234"  # a multi-cluster site
    with pytest.raises(ValueError, match="no job id"):
        slurm_cli.parse_parsable("sbatch: error: Batch job submission failed\n")


def test_squeue_format_parsed_by_position_and_pending_reason() -> None:
    jobs = slurm_cli.parse_squeue("7|PENDING|Resources|(null)|30:00\n8|RUNNING|None|node[2-3]|29:10\n")
    assert jobs["7"].pending and jobs["7"].reason == "Resources" and jobs["7"].nodes == ""
    assert jobs["8"].state == "RUNNING" and jobs["8"].reason == "" and jobs["8"].nodes == "node[2-3]"
    assert not jobs["8"].ended


def test_sacct_states_and_disabled_accounting() -> None:
    jobs = slurm_cli.parse_sacct("5|CANCELLED by 1000|node2\n6|TIMEOUT|node3\n")
    assert jobs["5"].state == "CANCELLED" and jobs["5"].ended and jobs["6"].ended
    assert slurm_cli.accounting_disabled("Slurm accounting storage is disabled\n")


def test_node_states_that_lose_a_host() -> None:
    for s in ("DOWN", "DOWN*", "IDLE+DRAIN", "MIXED+DRAIN", "ALLOCATED*", "ALLOCATED+NOT_RESPONDING"):
        assert slurm_cli.node_gone(s), s
    for s in ("IDLE", "ALLOCATED", "MIXED", "COMPLETING"):
        assert not slurm_cli.node_gone(s), s


def test_time_limit_in_minutes() -> None:
    login = {"address": "login"}
    for text, minutes in (("30", 30), ("1:30", 2), ("1:00:00", 60), ("2-0", 2880), ("1-2:30", 1590)):
        assert SlurmSettings(login=login, time_limit=text).minutes() == minutes, text  # type: ignore[arg-type]


def test_zero_time_limit_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="0 means no limit"):
        SlurmSettings(login={"address": "login"}, time_limit="0")  # type: ignore[arg-type]


# -- a real cluster ---------------------------------------------------------------------------------------


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``testbed ARGS`` in a process of its own (this checkout's package), in the current folder."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)


def _spec(cluster, cwd: Path, name: str = "hpc", **provider: object) -> None:  # type: ignore[no-untyped-def]
    key = cluster.bed.home / "testbeds" / cluster.bed.name / "id_ed25519"
    (cwd / "inventories").mkdir(exist_ok=True)
    spec = {"provider": cluster.spec(key, **provider), "user": cluster.user}
    (cwd / "inventories" / f"{name}.yml").write_text(json.dumps(spec))


def test_the_cluster_runs_a_job_across_nodes_on_a_shared_home(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    c = slurm_cluster
    r = c.as_user("cd ~ && echo shared > seen.txt && srun -N 2 -n 2 sh -c 'hostname; cat ~/seen.txt'", timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines.count("shared") == 2 and len({x for x in lines if x != "shared"}) == 2, r.stdout
    assert c.left() == []


def test_provision_run_destroy_through_slurm(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    from testbed import remote
    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    t0 = time.monotonic()
    code, out, exc = invoke("provision", "hpc")
    assert code == 0, out + repr(exc)
    provisioned = time.monotonic() - t0
    st = Store(tb_home / ".testbed" / "state.db")
    jobs = st.resources("hpc", "job")
    assert len(jobs) == 1
    jid = jobs[0]["id"]
    assert [ln.split()[:2] for ln in c.squeue()] == [[jid, "RUNNING"]]
    hosts = st.hosts("hpc")
    assert [h.name for h in hosts] == ["slot0", "slot1"]
    nodes = {h.facts["slurm_node"] for h in hosts}
    assert nodes <= {h.name for h in c.computes} and len(nodes) == 2
    res = remote.run("hpc", ["slot0", "slot1"], "hostname; id -un")
    assert all(r.ok for r in res), res
    assert {r.stdout.split()[0] for r in res} == nodes and {r.stdout.split()[1] for r in res} == {c.user}
    code, out, _ = invoke("status", "--json")
    assert "node-hours" in out, out
    code, out, exc = invoke("destroy", "hpc", "--yes")
    assert code == 0, out + repr(exc)
    assert c.left() == [], "destroy left a job in squeue"
    print(f"provisioned 2 Slurm nodes in {provisioned:.1f} s")


def test_pending_shows_slurm_reason_and_cancels_at_the_deadline(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    c = slurm_cluster
    r = c.as_user("sbatch --parsable -N 2 --exclusive --output=/dev/null --wrap 'sleep 120'")  # holds 2 of 3
    assert r.returncode == 0, r.stderr
    other = r.stdout.strip()
    try:
        _spec(c, tb_home, pending_timeout=3)
        r = cli("provision", "hpc")
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "PENDING (Resources)" in out and "cancelled" in out and "pending_timeout" in out, out
        assert "Traceback" not in out
        c.root(c.login.name, f"scancel {other}")
        left = c.left()
        assert left == [], f"the pending allocation was not cancelled: {left}"
    finally:
        c.root(c.login.name, f"scancel {other}")
        invoke("destroy", "hpc", "--yes")


def test_unknown_partition_refused_before_any_job(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    c = slurm_cluster
    _spec(c, tb_home, partition="gpu-a100")
    r = cli("provision", "hpc")
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "no partition 'gpu-a100'" in out and "partitions you can use: debug" in out, out
    assert "provider.partition" in out and "Traceback" not in out
    assert c.left() == []


def test_missing_login_refused_before_anything(tb_home: Path) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "hpc.yml").write_text("provider:\n  kind: slurm\n  partition: debug\n")
    r = cli("provision", "hpc")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "missing required field 'provider.login'" in r.stderr and "hpc.yml:1" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_node_slurm_marks_down_is_replaced_by_a_one_node_allocation(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    from testbed import remote
    from testbed.handle import Testbed
    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    assert cli("provision", "hpc").returncode == 0
    try:
        st = Store(tb_home / ".testbed" / "state.db")
        first = st.resources("hpc", "job")[0]["id"]
        victim = next(h for h in st.hosts("hpc") if h.name == "slot1")
        keep = next(h for h in st.hosts("hpc") if h.name == "slot0").facts["slurm_node"]
        lost = victim.facts["slurm_node"]
        c.kill_slurmd(lost)
        c.wait_nodes("down", [lost], timeout=30)  # SlurmdTimeout 6 s
        p = Testbed.open("hpc", st).provider()
        assert p.reported_states() == {"slot0": "up", "slot1": "down"}
        t0 = time.monotonic()
        done = p.repair("slot1")
        assert done.replaced == ["slot1"]
        hosts = {h.name: h for h in st.hosts("hpc")}
        new = hosts["slot1"].facts["slurm_node"]
        assert new not in (lost, keep) and hosts["slot0"].facts["slurm_node"] == keep
        jobs = {ln.split()[0]: ln.split()[1:] for ln in c.squeue()}
        assert jobs[first][0] == "RUNNING", jobs  # --no-kill: the first allocation kept its other node
        assert hosts["slot1"].facts["slurm_job"] != first and jobs[hosts["slot1"].facts["slurm_job"]][0] == "RUNNING"
        r = remote.run("hpc", ["slot1"], "hostname")[0]
        assert r.ok and r.stdout.strip() == new
        print(f"repaired slot1 ({lost} -> {new}) in {time.monotonic() - t0:.1f} s")
    finally:
        r = cli("destroy", "hpc", "--yes")
        c.start_slurmd(lost)
        c.resume(lost)
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.left() == []
    c.wait_nodes("idle", timeout=30)


@pytest.mark.slow
def test_expire_is_the_jobs_time_limit_and_slurm_ends_it(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """The dead-man's switch is Slurm's own: --expire 1m submits --time=1, and slurmctld ends the job with no
    testbed process running (its time-limit sweep runs every 30 s: ended within 100 s)."""
    from testbed.handle import Testbed
    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    r = cli("provision", "hpc", "--expire", "1m")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "slurm time limit" in r.stdout + r.stderr
    try:
        st = Store(tb_home / ".testbed" / "state.db")
        jid = st.resources("hpc", "job")[0]["id"]
        limit = c.root(c.login.name, f"squeue -h -j {jid} -o %l").stdout.strip()
        assert limit == "1:00", limit
        t0 = time.monotonic()
        deadline = t0 + 100
        while any(ln.split()[0] == jid for ln in c.squeue()) and time.monotonic() < deadline:
            time.sleep(2)
        ended = time.monotonic() - t0
        assert ended < 100, "Slurm did not end the job at its time limit"
        p = Testbed.open("hpc", st).provider()
        assert p.reported_states() == {"slot0": "gone", "slot1": "gone"}  # left squeue, no accounting: ended
        print(f"Slurm ended the allocation {ended:.0f} s after provision (time limit 1 min)")
    finally:
        r = cli("destroy", "hpc", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.left() == []


def test_what_a_step_leaves_running_is_killed_when_it_ends(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """A step's background process, orphaned when the step's shell exits: proctrack/cgroup (most clusters, and
    this harness: see tests/slurmbed.py) kills it at the step's end, on this node only; (proctrack/linuxproc
    tracks by ancestry, and an orphan reparented to the node's init escapes). So a rank must live as long as its
    step: testbed's rank wrapper is the step's task and waits for the rank. srun also waits for the step's output
    to close, so an orphan that keeps stdout open holds srun (redirected here)."""
    c = slurm_cluster
    node, other = c.computes[0].name, c.computes[1].name
    conf = c.root(c.login.name, "scontrol show config | grep -i '^ProctrackType'").stdout
    assert "proctrack/cgroup" in conf, conf
    # one step on two nodes whose task here ends first: with one cgroup folder for both nodes (this machine's tree
    # bound into every host), ending it here would freeze and kill the task on the other node too
    script = f"""#!/bin/sh
srun --overlap -w {node},{other} -N2 -n2 sh -c 'if [ "$(hostname)" = {other} ]; then sleep 4; echo kept; fi' \\
  > ~/.tb-kept &
srun --overlap -w {node} -N1 -n1 sh -c 'sleep 300 >/dev/null 2>&1 & echo started'
sleep 2
srun --overlap -w {node} -N1 -n1 sh -c 'pgrep -u {c.user} -f "^sleep 300" || echo none' > ~/.tb-orphan
wait
cat ~/.tb-kept >> ~/.tb-orphan
"""
    r = c.as_user(f"sbatch --parsable -N2 -w {node},{other} --output=/dev/null <<'EOF'\n{script}EOF\n")
    try:
        assert r.returncode == 0, r.stderr
        jid = r.stdout.strip()
        deadline = time.monotonic() + 40
        while any(ln.split()[0] == jid for ln in c.squeue()) and time.monotonic() < deadline:
            time.sleep(0.5)
        out = c.as_user("cat ~/.tb-orphan; rm -f ~/.tb-orphan ~/.tb-kept").stdout.split()
        assert out == ["none", "kept"], f"the orphan outlived its step, or the other node's task was ended: {out}"
    finally:
        for n in (node, other):
            c.root(n, f"pkill -u {c.user} -x sleep; true")
    assert c.left() == []


def test_the_home_is_one_folder_on_every_node(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """A run folder written on one node is the same folder on the others (a lab's NFS home): ranks must write
    files of their own (rank<k>.out), never one name from every node."""
    c = slurm_cluster
    a, b = c.computes[0].name, c.computes[1].name
    r = c.as_user(f"srun -w {a} -N1 sh -c 'mkdir -p ~/.tb-shared && hostname > ~/.tb-shared/from-{a}' && "
                  f"srun -w {b} -N1 cat ~/.tb-shared/from-{a} && rm -rf ~/.tb-shared")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == a


def test_check_asks_the_login_node(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    c = slurm_cluster
    _spec(c, tb_home)
    r = cli("check", "hpc", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = next(x for x in json.loads(r.stdout)["providers"] if x["provider"] == "slurm")
    rows = {x["check"]: x for x in rep["checks"]}
    assert rep["usable"] and rows["login node"]["detail"] == "answers; Slurm 22.05", rows
    assert rows["partition"]["detail"] == "debug: 3 nodes"
    _spec(c, tb_home, partition="gpu")
    r = cli("check", "hpc", "--json")
    assert r.returncode != 0
    rep = next(x for x in json.loads(r.stdout)["providers"] if x["provider"] == "slurm")
    assert rep["reason"] == "partition: no partition 'gpu'" and "debug" in rep["fix"], rep


@pytest.mark.slow
def test_mpi_hello_and_fault_drill_run_on_slurm_nodes(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """The suites run on the allocated nodes as on any testbed: set-up without root (the mesh in ~/.ssh/config,
    the env from the controller's site-packages, which the harness's nodes see as a lab's shared env), mpirun
    across the nodes over the mesh, and fault-drill's rank killed and restarted from its checkpoint."""
    import sysconfig

    pytest.importorskip("torch")
    c = slurm_cluster
    _spec(c, tb_home)
    spec = json.loads((tb_home / "inventories" / "hpc.yml").read_text())
    spec["vars"] = {"testbed_controller_site_packages": sysconfig.get_paths()["purelib"]}
    spec["hardware"] = {"shared_home": True}
    (tb_home / "inventories" / "hpc.yml").write_text(json.dumps(spec))
    assert cli("provision", "hpc").returncode == 0
    try:
        r = cli("run", "mpi-hello", "--on", "hpc", "--json", "--collect", timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        # one file on the shared home, collected from each host: the same two lines under each
        hello = {ln for p in (tb_home / "results" / "mpi-hello").rglob("rank0.out") for ln in p.read_text().split("\n")
                 if ln.startswith("Hello world from processor")}
        assert len(hello) == 2 and {ln.split()[4].rstrip(",") for ln in hello} <= {h.name for h in c.computes}, hello
        r = cli("run", "fault-drill", "--on", "hpc", "-p", "ranks=2", "--json", "--collect", timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        log = next((tb_home / "results" / "fault-drill").rglob("train_log.csv")).read_text()
        assert any(ln.split(",")[1:2] == ["1"] for ln in log.splitlines()[1:]), log[-500:]  # attempt 1 resumed
    finally:
        r = cli("destroy", "hpc", "--yes")
    assert r.returncode == 0
    assert c.left() == []


def test_a_node_lost_mid_run_is_replaced_and_the_run_resumes(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """The machine behind rank 1's node dies mid-run (slurmd, sshd and the rank with it): the run finds the host
    lost, repair asks Slurm for one new node (the lost one excluded) while the first allocation keeps rank 0's
    (--no-kill), and the rank starts again there from the checkpoint on the shared home (one run folder for
    every node: 'survivor' keeps one ckpt.txt there, so rank 1 resumes from the last count either rank saved)."""
    import types

    from localbed import assert_succeeded, disturb_mid_run

    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    spec = json.loads((tb_home / "inventories" / "hpc.yml").read_text())
    spec["hardware"] = {"shared_home": True}
    # a dead node behind the login node is no refused connection: ssh through the jump says only "Connection
    # closed by remote host"; the host is lost once Slurm marks its node DOWN (SlurmdTimeout, 6 s here, plus a
    # ping), so a run waits longer than that before it gives a silent host up
    spec["lost_after"] = 20
    (tb_home / "inventories" / "hpc.yml").write_text(json.dumps(spec))
    assert cli("provision", "hpc").returncode == 0
    st = Store(tb_home / ".testbed" / "state.db")
    first = st.resources("hpc", "job")[0]["id"]
    lost: list[str] = []
    try:
        def act(node: str) -> None:
            lost.append(node)
            c.lose(node)

        status, evs = disturb_mid_run(types.SimpleNamespace(cwd=tb_home, hosts=c.bed.hosts), "hpc", act, 1)
        assert_succeeded(status, evs)
        repaired = [e for e in evs if e.kind == "repaired" and e.host]
        assert [(e.host, e.detail["replaced"]) for e in repaired] == [("slot1", ["slot1"])]
        assert not any(e.kind == "fault" for e in evs)
        # the evidence names the node and what Slurm says of it, and that the login node opened no connection
        why = next(e for e in evs if e.kind == "host-lost" and e.host == "slot1").detail["summary"]
        assert f"Slurm: node {lost[0]} " in why and ("DOWN" in why or "NOT_RESPONDING" in why), why
        assert "no SSH greeting: a jump host could not reach it" in why, why
        hosts = {h.name: h for h in st.hosts("hpc")}
        assert hosts["slot1"].facts["slurm_node"] not in lost and hosts["slot1"].facts["slurm_job"] != first
        assert hosts["slot0"].facts["slurm_job"] == first
        resumed = next(e for e in evs if e.kind == "resumed").detail
        print(f"lost {lost}; slot1 now on {hosts['slot1'].facts['slurm_node']}; resumed: {resumed}")
    finally:
        r = cli("destroy", "hpc", "--yes")
        for node in lost:
            c.bring_back(node)
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.left() == []
    c.wait_nodes("idle", timeout=40)


SLEEPER = """\
name: sleeper
placement: {hosts: 2}
steps:
  launch:
    command: >-
      echo "job=$TESTBED_SLURM_JOB step_vars=$(env | grep -c '^SLURM_')";
      (setsid sleep 308 >/dev/null 2>&1 &); exec sleep 307
timeouts: {poll: 0.5, grace: 1, unreachable: 3}
"""


def test_ranks_are_steps_of_the_allocation_and_destroy_ends_them(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """Each rank runs as a step of the job holding its node (srun --overlap --jobid, one task there): Slurm lists
    the steps, the rank sees none of the step's SLURM_* variables (an MPI inside would take the step for its own
    launch) but TESTBED_SLURM_JOB, and destroy's scancel ends the ranks, and what they left running (an orphan
    of the rank, reparented to the node's init: proctrack/cgroup's trap): no rank process is left on a node."""
    from testbed.run import bookkeeping as rs
    from testbed.run import runner
    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    (tb_home / "experiments").mkdir(exist_ok=True)
    (tb_home / "experiments" / "sleeper.yml").write_text(SLEEPER)
    assert cli("provision", "hpc").returncode == 0
    st = Store(tb_home / ".testbed" / "state.db")
    jid = st.resources("hpc", "job")[0]["id"]
    nodes = sorted(str(h.facts["slurm_node"]) for h in st.hosts("hpc"))
    plan = runner.plan_run("sleeper", "hpc", {}, store=st)
    runner.start_run(plan, store=st)  # a supervisor process of its own: c.root switches TESTBED_HOME in this one
    try:
        deadline = time.monotonic() + 60
        steps: list[str] = []
        while time.monotonic() < deadline:
            steps = c.root(c.login.name, "squeue -h -s -o '%i %N'").stdout.split("\n")
            steps = sorted(ln for ln in steps if ln.startswith(f"{jid}.") and not ln.startswith(f"{jid}.batch"))
            if len(steps) == 2 and all(r.status == "running" for r in rs.ranks(st, plan.run_id)):
                break
            time.sleep(0.5)
        why = [(e.kind, e.host, e.detail.get("reason")) for e in rs.events(st, plan.run_id)
               if e.kind in ("failed", "ended")]
        launch = c.root(c.computes[0].name, "cat /home/alice/.testbed-runs/*/rank*.launch").stdout
        assert sorted(ln.split()[1] for ln in steps) == nodes, \
            f"the ranks are not steps of job {jid}: {steps}; {why}; {launch}"
        out = c.root(c.computes[0].name, "find /home/alice/.testbed-runs -name 'rank*.out' -exec cat {} +").stdout
        assert out.count(f"job={jid} step_vars=0") == 2, out
        r = cli("destroy", "hpc", "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        left = {n: c.root(n, "pgrep -u alice -a -f 'sleep 30[78]' || true").stdout.strip() for n in nodes}
        assert not any(left.values()), f"ranks outlived the allocation: {left}"
    finally:
        deadline = time.monotonic() + 60
        while rs.require(st, plan.run_id).active and time.monotonic() < deadline:  # the ranks vanished: it ends
            time.sleep(0.5)
        if rs.require(st, plan.run_id).active:
            runner.stop_run(plan.run_id, grace=1, store=st)
        for n in nodes:
            c.root(n, "pkill -KILL -u alice -f 'sleep 30[78]'; true")
        invoke("destroy", "hpc", "--yes")
    assert c.left() == []


def test_mpi_role_without_root_uses_the_path_or_says_what_to_do(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """No root on a cluster's nodes: the mpi role never asks sudo. An MPI on the PATH (a module, a conda env)
    is used though the distribution's packages are not all there; a node with none refuses in one message that
    says what is missing, where, and what to do (the admins, a module, a conda MPI, mpi_source: prefix)."""
    from testbed.state import Store

    c = slurm_cluster
    _spec(c, tb_home)
    spec = json.loads((tb_home / "inventories" / "hpc.yml").read_text())
    # a package the distribution lacks (no sudo to install it), and no hello across the nodes (no mesh here)
    spec["vars"] = {"mpi_packages_debian": ["openmpi-bin", "testbed-no-such-mpi-package"], "mpi_check": False}
    (tb_home / "inventories" / "hpc.yml").write_text(json.dumps(spec))
    assert cli("provision", "hpc").returncode == 0
    st = Store(tb_home / ".testbed" / "state.db")
    nodes = sorted(str(h.facts["slurm_node"]) for h in st.hosts("hpc"))
    hide = "for f in mpirun mpicc; do mv /usr/bin/$f /usr/bin/$f.hidden; done"
    try:
        # the MPI on the PATH serves, no sudo is asked
        r = cli("setup", "hpc", "--role", "mpi", timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        assert "sudo" not in out.lower(), out[-3000:]
        for n in nodes:  # a node with no MPI at all
            assert c.root(n, hide).returncode == 0
        r = cli("setup", "hpc", "--role", "mpi", timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out[-3000:]
        assert "sudo password" not in out.lower(), out[-3000:]
        assert "has no MPI (no mpirun and mpicc on the PATH)" in out and "ask the cluster's admins" in out, out[-3000:]
        assert "module load openmpi" in out and "Traceback" not in out
    finally:
        for n in nodes:
            c.root(n, "for f in mpirun mpicc; do [ -e /usr/bin/$f.hidden ] && mv /usr/bin/$f.hidden /usr/bin/$f; done; "
                      "true")
        r = cli("destroy", "hpc", "--yes")
    assert r.returncode == 0
    assert c.left() == []


ECHOER = """\
name: echoer
placement: {hosts: 2}
steps:
  launch:
    command: echo rank {{ rank }} on $(hostname); head -c 200000 /dev/urandom > blob{{ rank }}.bin
outputs: ["blob*.bin"]
"""


def test_collect_fetches_a_shared_homes_run_folder_once(slurm_cluster, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    """On a shared home the run folder is one folder on every node: collect fetches each file once (from the
    first node) and links it into the other nodes' folders, which hold the same files, verified all the same."""
    c = slurm_cluster
    _spec(c, tb_home)
    spec = json.loads((tb_home / "inventories" / "hpc.yml").read_text())
    spec["hardware"] = {"shared_home": True}
    (tb_home / "inventories" / "hpc.yml").write_text(json.dumps(spec))
    (tb_home / "experiments").mkdir(exist_ok=True)
    (tb_home / "experiments" / "echoer.yml").write_text(ECHOER)
    assert cli("provision", "hpc").returncode == 0
    try:
        r = cli("run", "echoer", "--on", "hpc", "--json", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        r = cli("collect", "--all", "--json", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs = json.loads(r.stdout)
        hosts = (runs[0] if isinstance(runs, list) else runs["runs"][0])["hosts"]
        by = {h["host"]: h for h in hosts}
        run_folder = next((tb_home / "results" / "echoer").iterdir())
        folders = [p for p in run_folder.iterdir() if p.is_dir() and not p.name.startswith(".")]  # .suite: its copy
        names = {p.name: sorted(f.name for f in p.iterdir() if f.is_file()) for p in folders}
        assert set(names) == {"slot0", "slot1"} and names["slot0"] == names["slot1"], names
        assert {"blob0.bin", "blob1.bin", "rank0.out", "rank1.out"} <= set(names["slot0"]), names
        assert by["slot0"]["sent"] == len(names["slot0"]) and by["slot1"]["sent"] == 0, by
        assert by["slot1"]["shared"] == len(names["slot1"]), by
        for f in names["slot0"]:
            a, b = (p / f for p in sorted(folders))
            assert a.read_bytes() == b.read_bytes(), f
    finally:
        r = cli("destroy", "hpc", "--yes")
    assert r.returncode == 0
    assert c.left() == []
