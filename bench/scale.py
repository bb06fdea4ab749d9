"""Scale: N local hosts from one controller, each stage side by side with the peer tool users would run instead.

Run by hand as root:
  .venv/bin/python bench/scale.py [--hosts 1024] [--bridge-ports N] [--exec-rounds 3] [--run-seconds 30]
                                  [--setup-hosts K] [--collect] [--only up,exec,run,collect]

Stages, each printed with its target and MET or MISSED:
- up: the provision, split into its phases (bridges and links, disks, host start, SSH reach, user), and the memory
  of one host (PSS, shared pages split between sharers, of every process in its namespace); target < 60 s for
  1,024 hosts (15 s for 128);
- exec: ``testbed exec NAME -- true`` on every host (the CLI, a process of its own) against parallel-ssh on the same
  hosts with the same ssh config, cold (every connection closed before each call) and warm, alternated round by
  round; target: the CLI at most 1.0x parallel-ssh as users run it (cold, no multiplexing) and warm at most 1.0x
  parallel-ssh over testbed's own masters (pssh+mux);
- run: a suite of one rank per host that logs a step a second (mpi-hello's shape without MPI), run through the CLI
  with its supervisor polling every host; the supervisor's own log gives every poll's time; target: the median
  poll within the pause between polls (``timeouts.poll``, 1 s);
- set-up (``--setup-hosts K``): the ``base`` profile's first run by testbed on K fresh hosts against plain
  ``ansible-playbook`` of the same plan on K other fresh hosts of a second testbed (forks = K, as a user who raised
  them would run it); target: at most 0.5x;
- collect (``--collect``): a collect of 20 files of 20 KB and two of 1 MB per host (every file's sha256 checked on
  both sides) against ``rsync -a`` of the same folders, 32 hosts at a time (collect's own fan-out), alternated;
  target at most 1.0x;
- destroy: its time, then what is left of the testbed on this machine (namespaces, links, cgroups, processes and
  folders under its name, resources in its state); target: nothing.

Past 252 hosts the subnet is wider than a /24; past ``gc_thresh3 - 64`` hosts (1,024 by default) the kernel's
neighbour table is too small and the provider refuses: raise it first (``sysctl -w
net.ipv4.neigh.default.gc_thresh3=4096``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import bed, env_with, loadavg, median, sh, table, tool
from setup_noop import environ, plain_playbook

from testbed.providers.local.provider import LocalProvider, own_cgroup

PHASES: dict[str, float] = {}
VERDICTS: list[str] = []
SUITE = """\
name: scale-ranks
description: one rank per host that logs a step a second (the shape of mpi-hello's ranks, without MPI)
testbed: local
parameters:
  ranks: {type: int, default: 4, min: 1}
  seconds: {type: int, default: 30, min: 1}
placement:
  hosts: "{{ ranks }}"
steps:
  launch:
    command: "for i in $(seq {{ seconds }}); do echo step $i; sleep 1; done"
timeouts: {run: 1800, grace: 5, poll: 1.0}
"""


def verdict(what: str, value: str, target: str, met: bool) -> None:
    """One target's line, kept for the summary at the end."""
    line = f"{what}: {value}; target {target}: {'MET' if met else 'MISSED'}"
    VERDICTS.append(line)
    print(line, flush=True)


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


def stage_up(b: Any, n: int, total: float) -> None:
    """The provision's phases and the memory of a host."""
    rows: list[list[object]] = [[k, v] for k, v in PHASES.items()]
    rows.append(["provision total", total])
    print(table(f"provision of {n} local hosts (seconds; load {loadavg()})", ["phase", "seconds"], rows))
    target = 60.0 if n > 128 else 15.0
    verdict(f"up, {n} hosts", f"{total:.1f} s", f"< {target:.0f} s", total < target)
    pss, rss, procs = host_memory_mb(b.provider)
    print(f"memory per local host: {pss:.1f} MiB PSS ({rss:.1f} MiB RSS, {procs} processes: launcher, init, sshd); "
          f"{pss * n / 1024:.1f} GiB for {n} hosts", flush=True)


def stage_exec(b: Any, rounds: int, tmp: Path) -> None:
    """``testbed exec`` (the CLI) on every host against parallel-ssh, cold and warm, alternated."""
    from testbed import remote

    names = [h.name for h in b.hosts]
    hostfile = tmp / "hosts"
    hostfile.write_text("\n".join(names) + "\n")
    cfg = str(b.ssh_config)
    env = env_with(TESTBED_HOME=str(b.home))
    base = [tool("parallel-ssh"), "-h", str(hostfile), "-p", str(len(names)), "-t", "600"]
    tools: dict[str, Callable[[], float]] = {
        "testbed exec (CLI)": lambda: sh([tool("testbed"), "exec", b.name, "--", "true"], env=env, timeout=900),
        "parallel-ssh": lambda: sh([*base, "-x", f"-F {cfg} -o ControlMaster=no -o ControlPath=none", "true"],
                                   timeout=900)}
    cold: dict[str, list[float]] = {k: [] for k in tools}
    for r in range(rounds):
        for k in (list(tools) if r % 2 == 0 else list(tools)[::-1]):
            remote.close_connections(b.name, names)
            cold[k].append(tools[k]())
    tools["pssh+mux"] = lambda: sh([*base, "-x", f"-F {cfg} -o ControlMaster=no", "true"], timeout=900)
    tools["testbed exec (CLI)"]()  # masters up
    warm: dict[str, list[float]] = {k: [] for k in tools}
    for r in range(rounds):
        order = list(tools)[r % 3:] + list(tools)[:r % 3]
        for k in order:
            warm[k].append(tools[k]())
    rows = [[k, median(cold[k]) if k in cold else "-", median(warm[k]),
             (f"{min(cold[k]):.2f}-{max(cold[k]):.2f}" if k in cold else "-") + f" / {min(warm[k]):.2f}-"
             f"{max(warm[k]):.2f}"] for k in tools]
    print(table(f"exec 'true' on {len(names)} hosts ({rounds} rounds each; seconds; load {loadavg()})",
                ["tool", "cold median", "warm median", "spread cold / warm"], rows))
    c = median(cold["testbed exec (CLI)"]) / median(cold["parallel-ssh"])
    w = median(warm["testbed exec (CLI)"]) / median(warm["pssh+mux"])
    verdict(f"exec cold, {len(names)} hosts", f"CLI/parallel-ssh {c:.2f}", "<= 1.0", c <= 1.0)
    verdict(f"exec warm, {len(names)} hosts", f"CLI/pssh+mux {w:.2f}", "<= 1.0", w <= 1.0)


def stage_run(b: Any, seconds: int, tmp: Path) -> None:
    """A run of one rank per host through the CLI; its supervisor's polls against the pause between them."""
    folder = tmp / "scale-ranks"
    folder.mkdir()
    (folder / "suite.yml").write_text(SUITE)
    env = env_with(TESTBED_HOME=str(b.home))
    n = len(b.hosts)
    t0 = time.perf_counter()
    r = subprocess.run([tool("testbed"), "run", str(folder), "--on", b.name, "--no-setup", "-p", f"ranks={n}",
                        "-p", f"seconds={seconds}", "--json"], capture_output=True, text=True, env=env,
                       timeout=3600, check=False, cwd=b.cwd)
    wall = time.perf_counter() - t0
    m = re.search(r"scale-ranks-[0-9]+-[0-9]+-[0-9a-f]+", r.stdout + r.stderr)
    if r.returncode != 0 or m is None:
        verdict(f"run of {n} ranks", f"FAILED (exit {r.returncode}): {(r.stderr or r.stdout)[-800:]}",
                "succeeded", False)
        return
    from testbed.run import bookkeeping as rs
    from testbed.state import Store

    with environ({"TESTBED_HOME": str(b.home)}):
        events = {e.kind: e for e in rs.events(Store.open_default(), m.group(0))}
        log = (rs.run_home(m.group(0)) / "supervisor.log").read_text()
    started, ended = events["started"], events["ended"]
    line = next((ln.split(" ", 2)[2] for ln in log.splitlines() if " polls: " in ln), "no poll line in the log")
    print(f"run of {n} ranks x {seconds} s: exit {r.returncode} in {wall:.1f} s (prepare "
          f"{started.detail.get('prepare_seconds')} s; launched to ended {ended.ts - started.ts:.1f} s); "
          f"supervisor: {line}", flush=True)
    with environ({"TESTBED_HOME": str(b.home)}):
        wall = poll_profile(m.group(0), 3)
    verdict(f"supervisor poll of {n} hosts", f"{wall:.2f} s (median of 3 polls of every host, as the supervisor "
            "makes them)", "<= 1 s, the pause between polls", wall <= 1.0)


def _busy() -> tuple[float, float]:
    """(this machine's busy CPU seconds since boot, this process's and its children's CPU seconds)."""
    f = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK"), me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def poll_profile(run_id: str, rounds: int) -> float:
    """Where one supervisor poll's time goes: ``rounds`` polls of the ended run's ranks as the supervisor makes them
    (``ranks.poll``, over the open masters), their wall time and CPU, the controller's part and the rest (the hosts'
    sshd and poll script)."""
    from testbed.run import bookkeeping as rs
    from testbed.run import ranks

    plan = rs.load_plan(run_id)
    want: dict[str, list[int]] = {}
    for r in plan.ranks:
        want.setdefault(r.host, []).append(r.rank)
    ranks.poll(plan, want, {}, timeout=600)  # masters up, as during the run
    walls, ctl, rest = [], [], []
    for _ in range(rounds):
        (m0, c0), t0 = _busy(), time.perf_counter()
        polls = ranks.poll(plan, want, {}, timeout=600)
        (m1, c1), t1 = _busy(), time.perf_counter()
        walls.append(t1 - t0)
        ctl.append(c1 - c0)
        rest.append(max(0.0, (m1 - m0) - (c1 - c0)))
        bad = [h for h, hp in polls.items() if not hp.ok]
        if bad:
            print(f"  poll: {len(bad)} hosts did not answer, first {bad[0]}: {polls[bad[0]].error}")
    n, cores = len(want), os.cpu_count() or 1
    per_host = (median(ctl) + median(rest)) / n
    print(f"one poll of {n} hosts ({rounds} rounds, medians): {median(walls):.2f} s wall; CPU {median(ctl):.2f} s in "
          f"the controller (this process and its ssh clients), {median(rest):.2f} s elsewhere (the masters, the hosts' "
          f"sshd and poll script): {per_host * 1000:.1f} ms per host, so at least {n * per_host / cores:.2f} s on "
          f"{cores} cores", flush=True)
    return median(walls)


def stage_collect(b: Any, rounds: int, work: Path) -> None:
    """collect against ``rsync -a`` 32 hosts at a time, into fresh folders, alternated."""
    from collect_vs_rsync import forget, make_files, plain_rsync
    from test_collect import make_run

    from testbed.collect import collect_runs

    run_id, run_dir = make_run(b, suite="bench", outputs={"*": ["small", "large/*.bin"]})
    make_files(b, run_dir, 20, 1)
    n = len(b.hosts)
    pt: list[float] = []
    ct: list[float] = []
    for i in range(rounds):
        for which in (("rsync", "collect") if i % 2 == 0 else ("collect", "rsync")):
            dest = work / f"{which}{i}"
            if which == "rsync":
                pt.append(plain_rsync(b, run_dir, dest, workers=32))
            else:
                forget(b, run_id)
                t0 = time.monotonic()
                res = collect_runs([run_id], dest, store=b.store)[0]
                ct.append(time.monotonic() - t0)
                if not res.ok:
                    print(f"collect FAILED: {'; '.join(res.problems()[:3])}")
            shutil.rmtree(dest, ignore_errors=True)
    t0 = time.monotonic()
    collect_runs([run_id], work / "again", store=b.store)
    collect_runs([run_id], work / "again", store=b.store)
    again = time.monotonic() - t0
    ratio = statistics.median(ct) / statistics.median(pt)
    print(f"collect of {n} hosts x 22 files (2.4 MB per host): collect {median(ct):.1f} s "
          f"({min(ct):.1f}-{max(ct):.1f}), rsync -a {median(pt):.1f} s ({min(pt):.1f}-{max(pt):.1f}); a first collect "
          f"and its unchanged re-collect together {again:.1f} s (load {loadavg()})", flush=True)
    verdict(f"first collect, {n} hosts", f"collect/rsync -a {ratio:.2f}", "<= 1.0", ratio <= 1.0)


def stage_setup(k: int) -> None:
    """testbed's first set-up of ``base`` on k fresh hosts against plain ansible-playbook on k others."""
    from testbed import setup

    plan = setup.resolve_plan(profile="base")
    t: dict[str, float] = {}
    with bed(k, name="seta") as ba, bed(k, name="setp") as bp:
        variables = {"testbed_cache_dir": str(bp.home / "cache"), "testbed_provider": "local",
                     "testbed_offline": True, "testbed_subnet": bp.spec.provider.subnet}
        argv, env = plain_playbook(bp, plan, variables, forks=k)
        t["ansible-playbook"] = sh(argv, env=env, timeout=7200)
        with environ({"TESTBED_HOME": str(ba.home)}):
            os.chdir(ba.cwd)
            t0 = time.perf_counter()
            res = setup.apply(ba.name, profile="base")
            t["testbed setup"] = time.perf_counter() - t0
        if not res.ok:
            print(f"testbed set-up FAILED: {res.error}")
    ratio = t["testbed setup"] / t["ansible-playbook"]
    print(f"first set-up of 'base' on {k} hosts: testbed {t['testbed setup']:.1f} s, plain ansible-playbook "
          f"(forks {k}) {t['ansible-playbook']:.1f} s (load {loadavg()})", flush=True)
    verdict(f"set-up of base, {k} hosts", f"testbed/ansible-playbook {ratio:.2f}", "<= 0.5", ratio <= 0.5)


def leftovers(tag: str, base: Path, home: Path, name: str) -> list[str]:
    """What is left of a destroyed local testbed on this machine."""
    from testbed.state import Store

    left = [f"netns {ns}" for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                   check=False).stdout.split() if ns.startswith(f"tb{tag}")]
    left += [f"link {ln}" for ln in os.listdir("/sys/class/net") if ln.startswith(f"tb{tag}")]
    cg = own_cgroup(f"tb{tag}-node0")
    if cg is not None and cg.parent.is_dir():
        left += [f"cgroup {d}" for d in cg.parent.iterdir() if d.name.startswith(f"tb{tag}")]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            if str(base).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                left.append(f"process {pid}")
    if base.exists():
        left.append(f"folder {base}")
    with environ({"TESTBED_HOME": str(home)}):
        st = Store.open_default()
        left += [f"state resource {r['kind']} {r['id']}" for r in st.resources(name)]
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--bridge-ports", type=int, default=None, help="hosts per bridge (default: the provider's)")
    ap.add_argument("--only", default="up,exec,run", help="stages besides up and destroy: exec, run")
    ap.add_argument("--exec-rounds", type=int, default=3)
    ap.add_argument("--run-seconds", type=int, default=30)
    ap.add_argument("--collect", type=int, default=0, metavar="ROUNDS", help="collect against rsync, ROUNDS rounds")
    ap.add_argument("--setup-hosts", type=int, default=0, help="set-up against ansible-playbook on K hosts each")
    a = ap.parse_args()
    stages = set(a.only.split(","))
    for name, label in (("_ensure_bridge", "bridge"), ("_teardown_hosts", "teardown leftovers"),
                        ("_prepare_disks", "disks"), ("_start_hosts", "start hosts"), ("create", "create (all)"),
                        ("reach", "reach (ssh wait, pin, login)"), ("ready", "ready (user)")):
        if hasattr(LocalProvider, name):
            _timed_method(LocalProvider, name, label)
    print(f"load before: {loadavg()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="tb-scale-"))
    t0 = time.perf_counter()
    with bed(a.hosts, name="scale", bridge_ports=a.bridge_ports) as b:
        stage_up(b, a.hosts, time.perf_counter() - t0)
        tag, base, home = b.provider.tag, b.provider.base, b.home
        if "exec" in stages:
            stage_exec(b, a.exec_rounds, tmp)
        if "run" in stages:
            stage_run(b, a.run_seconds, tmp)
        if a.collect:
            stage_collect(b, a.collect, tmp)
        seen = leftovers(tag, base, home, b.name)  # the same check on the live testbed: it sees what is there
        t2 = time.perf_counter()
        b.provider.destroy()
        gone = time.perf_counter() - t2
        left = leftovers(tag, base, home, b.name)
        b.provider = None  # destroyed above: nothing for the context to do
    print(f"destroy of {a.hosts} hosts: {gone:.1f} s (before it, the check below saw {len(seen):,} things of this "
          f"testbed: {', '.join(sorted({x.split()[0] for x in seen}))})", flush=True)
    verdict(f"after destroy, {a.hosts} hosts", f"{len(left)} left ({', '.join(left[:5]) or 'none'})", "nothing",
            not left)
    if a.setup_hosts:
        stage_setup(a.setup_hosts)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nsummary ({a.hosts} hosts; load at the end {loadavg()}):\n" + "\n".join(VERDICTS))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
