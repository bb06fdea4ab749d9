"""Real local testbeds for tests: hosts in network namespaces with their own sshd.

Each testbed gets its own TESTBED_HOME, working directory (with inventories/<name>.yml, so the CLI
finds it by name) and a free /24 under 10.213.0.0/16 (never a route of this machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import TestbedError
from testbed.hosts import Host
from testbed.providers.local.provider import LocalProvider, check_requirements
from testbed.providers.local.settings import LocalSettings
from testbed.spec import TestbedSpec
from testbed.state import Store


def probe_wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel (tbprobe 1.0) in ``dest``, for pip to install without any index."""
    files = {"tbprobe.py": '__version__ = "1.0"\n',
             "tbprobe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tbprobe\nVersion: 1.0\n",
             "tbprobe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           "Tag: py3-none-any\n"}
    record = "".join(f"{k},,\n" for k in files) + "tbprobe-1.0.dist-info/RECORD,,\n"
    whl = dest / "tbprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr("tbprobe-1.0.dist-info/RECORD", record)
    return whl


def local_available() -> str | None:
    """None when local testbeds can run here, else the reason to skip."""
    problems = check_requirements()
    return "; ".join(problems) if problems else None


def _used_subnets() -> set[str]:
    out = subprocess.run(["ip", "-4", "-j", "route", "show"], capture_output=True, text=True, check=False).stdout
    return {r.get("dst", "") for r in json.loads(out or "[]")}


def free_subnet(prefix: int = 24) -> str:
    """A random 10.213.x.0/``prefix`` (24 or wider) that no route of this machine overlaps."""
    import ipaddress

    used = [ipaddress.IPv4Network(d if "/" in d else f"{d}/32", strict=False)
            for d in _used_subnets() if d and d[0].isdigit()]
    step = 1 << (24 - prefix)
    for _ in range(200):
        n = random.randrange(step, 255 - step + 1, step)
        net = ipaddress.IPv4Network(f"10.213.{n}.0/{prefix}")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise RuntimeError(f"no free 10.213.x.0/{prefix} subnet")


@dataclass
class LocalBed:
    """A provisioned local testbed; ``cwd`` holds inventories/<name>.yml and ``home`` the state."""

    name: str
    cwd: Path
    hosts_n: int = 4
    user: str = "root"
    groups: dict[str, list[str]] = field(default_factory=dict)
    spec: TestbedSpec | None = None
    provider: LocalProvider | None = None
    hosts: list[Host] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    vars: dict[str, object] = field(default_factory=dict)  # the spec's vars: (set-up variables)
    bridge: str | None = None  # provider.bridge (default: one testbed makes)
    hardware: dict[str, object] = field(default_factory=dict)  # the spec's hardware: (shared_home ...)
    own_cgroups: bool = False  # provider.own_cgroups: each host its cgroup namespace (a Slurm node's proctrack)
    prefix: int = 24  # the subnet's size (a /23 for more than 252 hosts)
    bridge_ports: int | None = None  # provider.bridge_ports: hosts per bridge (default: the provider's)

    @property
    def home(self) -> Path:
        return self.cwd / ".testbed"

    @property
    def store(self) -> Store:
        return Store(self.home / "state.db")

    @property
    def ssh_config(self) -> Path:
        return self.home / "testbeds" / self.name / "ssh_config"

    def ssh(self, host: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "ControlMaster=no", host, "--", command],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def up(self) -> LocalBed:
        self.cwd.mkdir(parents=True, exist_ok=True)
        (self.cwd / "inventories").mkdir(exist_ok=True)
        os.environ["TESTBED_HOME"] = str(self.home)
        last: Exception | None = None
        for _ in range(5):
            subnet = free_subnet(self.prefix)
            prov = {"kind": "local", "hosts": self.hosts_n, "subnet": subnet,
                    **({"bridge": self.bridge} if self.bridge else {}),
                    **({"own_cgroups": True} if self.own_cgroups else {}),
                    **({"bridge_ports": self.bridge_ports} if self.bridge_ports else {})}
            self.spec = TestbedSpec(name=self.name, provider=LocalSettings(**prov),  # type: ignore[arg-type]
                                    user=self.user, groups=self.groups, vars=self.vars,
                                    hardware=self.hardware)
            spec_file = self.cwd / "inventories" / f"{self.name}.yml"
            spec_file.write_text(json.dumps({"provider": prov, "user": self.user, "groups": self.groups,
                                             "vars": self.vars, "hardware": self.hardware}))
            self.spec.source = str(spec_file)
            self.provider = LocalProvider(self.spec, self.store)
            try:
                self.hosts = self.provider.provision()
                return self
            except TestbedError as e:  # a concurrent test took the subnet: pick another
                last = e
                if "clashes" not in e.what:
                    raise
                time.sleep(random.random())
        raise RuntimeError(f"could not provision a local testbed: {last}")

    def down(self) -> None:
        if self.provider is not None:
            os.environ["TESTBED_HOME"] = str(self.home)
            with contextlib.suppress(Exception):
                self.provider.destroy()


@contextlib.contextmanager
def local_bed(cwd: Path, name: str = "tb", **kw: object) -> Iterator[LocalBed]:
    old_env, old_cwd = os.environ.get("TESTBED_HOME"), os.getcwd()
    bed = LocalBed(name=name, cwd=cwd, **kw)  # type: ignore[arg-type]
    try:
        os.chdir(cwd) if cwd.exists() else None
        bed.up()
        os.chdir(cwd)
        yield bed
    finally:
        bed.down()
        os.chdir(old_cwd)
        if old_env is None:
            os.environ.pop("TESTBED_HOME", None)
        else:
            os.environ["TESTBED_HOME"] = old_env


RESET_TABLES = ("collected", "events", "run_hosts", "runs", "campaigns")  # what runs leave in the state


def _controller_leftovers(home: Path) -> list[int]:
    """This machine's processes started with TESTBED_HOME=``home`` (a detached supervisor, a follower), not us."""
    mine = f"TESTBED_HOME={home}".encode()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            with contextlib.suppress(OSError):
                if mine in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    out.append(int(d))
    return out


def reset(bed: LocalBed) -> bool:
    """Bring a shared testbed back to just provisioned, between the test modules that share it: the
    controller's processes on its state home and the hosts' processes other than their init and sshd killed,
    every host up with its link up and unshaped, the run folders on the hosts, the runs in the state and what
    the modules wrote beside the testbed's inventory removed. False (nothing cleaned) when a module set the
    hosts up (a set-up record on a host): roles change more than a reset can undo, the caller provisions
    another testbed. Raises when a host does not answer afterwards."""
    import shutil
    import signal
    import sqlite3

    assert bed.provider is not None
    os.environ["TESTBED_HOME"] = str(bed.home)
    for _ in range(3):  # bounded: a killed supervisor's children may be forking
        pids = _controller_leftovers(bed.home)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.2)
    prov = bed.provider
    for sl in prov.slots():
        prov.restore_network(sl.name)
    if not all(prov._alive(sl) for sl in prov.slots()):
        bed.hosts = prov.provision()  # brings back the hosts a module killed (the others are kept)
    from testbed.setup.address import RECORD

    rec = RECORD.replace("setup.json", "setup*.json")  # every host's and the per-host records
    set_up = f'for f in /root/{rec} /home/*/{rec}; do [ -e "$f" ] && exit 0; done; exit 1'
    if any(prov.console(sl.name, set_up).returncode == 0 for sl in prov.slots()):
        return False
    # inside each host: every process but init, sshd (its listener and the open sessions) and this shell
    script = ('for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
              'c=$(cat /proc/$p/comm 2>/dev/null) || continue; case $c in sshd*) continue;; esac; '
              'kill -9 $p 2>/dev/null; done; rm -rf /root/.testbed-runs /home/*/.testbed-runs')
    for sl in prov.slots():
        r = prov.console(sl.name, script)
        if r.returncode != 0:
            raise RuntimeError(f"reset of {sl.name}: {r.stderr.strip()}")
    with contextlib.closing(sqlite3.connect(bed.home / "state.db", timeout=30)) as db, db:
        for table in RESET_TABLES:
            db.execute(f"DELETE FROM {table}")  # names from the tuple above
        db.execute("UPDATE hosts SET state = 'up' WHERE testbed = ?", (bed.name,))
    keep = {"inventories", ".testbed"}
    for p in bed.cwd.iterdir():
        if p.name not in keep:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in (bed.cwd / "inventories").iterdir():
        if p.name != f"{bed.name}.yml":
            p.unlink()
    for p in bed.home.iterdir():
        if p.name != "testbeds" and not p.name.startswith("state.db"):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for sl in prov.slots():
        r = bed.ssh(sl.name, "true", timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{sl.name} does not answer after the reset: {r.stderr.strip()}")
    return True


def can_raise_memlock() -> bool:
    """Whether this machine may raise RLIMIT_MEMLOCK (CAP_SYS_RESOURCE): the memlock role's `unlimited` needs it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        return False
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))
    return True


# each rank counts to 12, saving its count every 3 steps in ckpt.txt (in its own run folder) and going on from it
SURVIVOR = """\
name: survivor
placement: {hosts: 2}
steps:
  launch:
    command: >-
      i=$(cat ckpt.txt 2>/dev/null || echo 0); echo rank {{ rank }} from $i;
      while [ $i -lt 12 ]; do i=$((i + 1)); echo step $i; if [ $((i % 3)) = 0 ]; then echo $i > ckpt.txt;
      echo saved $i; fi; sleep 0.5; done
  recovery:
    - {name: repair the lost host, repair: true, setup: false}
    - {name: start again, relaunch: true}
checkpoint: {file: ckpt.txt, on: "rank:1", rank: 0, saved: "saved ([0-9]+)", progress: "step ([0-9]+)"}
timeouts: {poll: 0.5, grace: 1, unreachable: 3}
"""


def install_login(bed, address: str, user: str, pub_lines: list[str]) -> None:
    """What a cloud image does at boot: the login user with sudo, the key from metadata authorized."""
    host = next(h.name for h in bed.hosts if h.address == address)
    keys = "\n".join(pub_lines)
    script = (f"id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}; "
              f"echo '{user} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/cloud-{user}; "
              f"printf '%s\\n' '{keys}' >> /etc/ssh/testbed_authorized_keys")
    r = bed.provider.console(host, script)
    assert r.returncode == 0, r.stderr


def boot(bed, address: str) -> None:  # type: ignore[no-untyped-def]
    """A cloud's new server or node lands on the machine behind ``address``: it starts with a new, empty disk
    (and so a new host key), unless it is already running."""
    import shutil

    name = next(h.name for h in bed.hosts if h.address == address)
    sl = bed.provider.slot(name)
    if not bed.provider._alive(sl):
        shutil.rmtree(sl.upper, ignore_errors=True)
        (sl.root / "host_key.pub").unlink(missing_ok=True)
        bed.provider.repair(name)


def invoke(*args: str) -> tuple[int, str, BaseException | None]:
    """``testbed <args>`` in this process through Typer's runner: exit code, stdout, the exception that escaped."""
    from typer.testing import CliRunner

    from testbed.cli import app

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.exception


CHAMELEON_SPEC = ("provider:\n  kind: chameleon\n  site: CHI@UC\n  count: 2\n  lease_timeout: 60\n"
                  "  server_timeout: 60\n  ssh_timeout: 60\nuser: cc\n")


@contextlib.contextmanager
def chameleon_cloud(bed, monkeypatch: pytest.MonkeyPatch, spec: str = CHAMELEON_SPEC, *,  # type: ignore[no-untyped-def]
                    boots: bool = False, gateway: bool = False, **fake_kw: Any) -> Iterator[Any]:
    """The fake Chameleon whose floating IPs are ``bed``'s hosts (binding one installs the server's login and key,
    as the image does at boot; ``boots``: the machine behind it is first powered on with a new disk), its openrc's
    OS_* environment, and inventories/chameleon.yml holding ``spec``. ``gateway``: the fake listens on the
    testbed's gateway, where the hosts reach it (the dead-man's switch's agent). Destroyed and stopped after."""
    pytest.importorskip("chi")
    from fakes.chameleon_api import FakeChameleon

    from testbed.providers.chameleon.cloud import Cloud

    def hook(addr: str, pub: str | None) -> None:
        if boots and pub:
            boot(bed, addr)
        if pub or not boots:
            install_login(bed, addr, "cc", [pub] if pub else [])

    if gateway:
        fake_kw["host"] = bed.provider.gateway
    fake = FakeChameleon(fip_pool=[h.address for h in bed.hosts], ssh_hook=hook, **fake_kw).start()
    try:
        for k in [k for k in os.environ if k.startswith("OS_")]:
            monkeypatch.delenv(k)
        for k, v in fake.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(Cloud, "poll_interval", 0.05)
        (Path(bed.cwd) / "inventories" / "chameleon.yml").write_text(spec)
        yield fake
    finally:
        invoke("destroy", "chameleon", "--yes")
        fake.stop()


@contextlib.contextmanager
def tpu_cloud(bed, monkeypatch: pytest.MonkeyPatch, provider: str, *,  # type: ignore[no-untyped-def]
              ip_for: Callable[[str, int], str] | None = None, boots: bool = False, gateway: bool = False,
              **fake_kw: Any) -> Iterator[Any]:
    """The fake TPU API whose workers are ``bed``'s hosts (``ip_for(node, worker)``; default: the hosts in turn),
    its guest agent installing login keys (``boots``: the machine is first powered on with a new disk), and
    inventories/tpu.yml for project p at the fake (``provider``: more lines under ``provider:``). ``gateway``: the
    fake listens on the testbed's gateway, where the hosts reach it. Destroyed and stopped after."""
    pytest.importorskip("google.cloud.tpu_v2")
    from fakes.tpu_api import FakeTpuApi

    from testbed.providers.gcp_tpu import cloud, wait
    from testbed.providers.gcp_tpu import provider as tpu_provider  # ``provider``: this function's argument

    addrs = [h.address for h in bed.hosts]

    def install(address: str, user: str, keys: list[str]) -> None:  # the guest agent (never for root)
        if boots:
            boot(bed, address)
        install_login(bed, address, user, keys)

    if gateway:
        fake_kw["host"] = bed.provider.gateway
    fake = FakeTpuApi(ip_for=ip_for or (lambda node, k: addrs[k % len(addrs)]), authorized_keys=install, **fake_kw)
    endpoint = fake.start()
    try:
        monkeypatch.setenv(cloud.ANONYMOUS_ENV, "1")
        monkeypatch.setattr(tpu_provider, "Polling", lambda: wait.FAST_POLLING)
        (Path(bed.cwd) / "inventories" / "tpu.yml").write_text(
            f"provider:\n  kind: gcp-tpu\n  project: p\n  endpoint: {endpoint}\n  create_timeout: 60\n"
            f"  ssh_timeout: 60\n  runtime_version: tpu-ubuntu2204-base\n{provider}")
        yield fake
    finally:
        invoke("destroy", "tpu", "--yes")
        fake.stop()


def lose_a_host_mid_run(bed, testbed: str, rank_host: int = 1, *, how: str = "kill",  # type: ignore[no-untyped-def]
                        at: list[float] | None = None,
                        cloud: Callable[[str], None] | None = None) -> tuple[str, list]:
    """Run 'survivor' with its supervisor in this process; the machine behind rank ``rank_host``'s host is lost
    (no fault fired: a real failure) once the rank has started: ``how`` "kill" kills its every process (its kernel
    still refuses connections), "netns" takes its network namespace and link away too (no route to it). ``cloud``
    (given the lost host's address) makes a cloud fake say so, as the cloud would. Returns the run's status and
    events; ``at`` gets the time it was lost."""
    def lose(victim: str) -> None:
        if how == "netns":
            bed.provider._teardown_hosts([bed.provider.slot(victim)], keep_disk=True)
        else:
            bed.provider.kill_host(victim)
        if cloud is not None:
            cloud(bed.provider.slot(victim).address)

    return disturb_mid_run(bed, testbed, lose, rank_host, at=at)


def assert_succeeded(status: str, evs: list[Any], kinds: tuple[str, ...] = ("failed", "ended")) -> None:
    """The run succeeded; else the test fails with each event of ``kinds`` in full (an assertion's repr is cut to
    a line, and the reason of a failed repair is at its end)."""
    if status != "succeeded":
        pytest.fail(f"the run {status}:\n" + "\n".join(f"{e.kind} {e.host or ''}: {json.dumps(e.detail)}"
                                                      for e in evs if e.kind in kinds), pytrace=False)


def disturb_mid_run(bed, testbed: str, act: Callable[[str], None], rank_host: int = 1, *,  # type: ignore[no-untyped-def]
                    suite: str = SURVIVOR, delay: float = 1.5, at: list[float] | None = None) -> tuple[str, list]:
    """Run ``suite`` (named 'survivor') with its supervisor in this process; ``act(host)`` runs on the local host
    behind rank ``rank_host``'s host ``delay`` seconds after the rank has started (in a thread; ``at`` gets the
    time it started). Returns the run's status and events."""
    import threading

    from testbed.run import bookkeeping as rs
    from testbed.run import runner
    from testbed.run.supervisor import Supervisor

    (Path(bed.cwd) / "experiments").mkdir(exist_ok=True)
    (Path(bed.cwd) / "experiments" / "survivor.yml").write_text(suite)
    st = Store.open_default()
    plan = runner.plan_run("survivor", testbed, {}, store=st)
    rs.create(st, plan)
    cloud_host = plan.rank(rank_host).host
    address = next(h.address for h in st.hosts(testbed) if h.name == cloud_host)
    victim = next(h.name for h in bed.hosts if h.address == address)

    def work() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(r.status == "running" for r in rs.ranks(st, plan.run_id)):
                time.sleep(delay)
                if at is not None:
                    at.append(time.time())
                act(victim)
                return
            time.sleep(0.2)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    status = Supervisor(plan.run_id).run()
    t.join(120)
    return status, rs.events(st, plan.run_id)


def throttle(veth: str, rate: str = "1kbit") -> str:
    """The link ``veth`` throttled by a token bucket (sch_tbf, in kernels without sch_netem too): ``rate`` gets
    through and the rest queues for up to a minute, like a link saturated by a download. Undone by deleting the root
    qdisc. Says how."""
    subprocess.run(["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", rate, "burst", "1600", "latency",
                    "60s"], capture_output=True, check=True)
    return f"tbf rate {rate} latency 60s"


@contextlib.contextmanager
def sshd_refusing(bed, host: str) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """``host``'s sshd refuses connections (its listener and its sessions killed, its init held stopped so that it
    does not start another), while everything else on it runs on: the machine is up, its ranks keep running, and the
    provider says so. Undone on leaving (the init, let go, starts sshd again within a second)."""
    import signal

    prov = bed.provider
    init = prov._init_pid(prov.slot(host))
    assert init is not None, f"{host} is not running"
    os.kill(init, signal.SIGSTOP)
    try:
        kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        for pid in kids:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith((b"/usr/sbin/sshd\0-D",
                                                                          b"sshd: /usr/sbin/sshd")):  # the listener
                    os.kill(int(pid), signal.SIGKILL)
        r = prov.console(host, "pkill -9 -f '^sshd(-session)?: [a-z]+@'")  # the sessions (the run's master among them)
        assert r.returncode in (0, 1), r.stderr
        yield
    finally:
        os.kill(init, signal.SIGCONT)


@contextlib.contextmanager
def starved(bed, host: str, *, delay_ms: int = 3000, cpu_percent: float = 1.0) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """``host`` made slow, not lost: every packet to it delayed ``delay_ms`` (tc netem on its link; where the kernel
    has no netem, a token bucket lets 1 kbit/s through and queues the rest up to a minute) and its processes, and
    every one they start, held to ``cpu_percent`` of one CPU (a cpu cgroup: cpu.max on cgroup v2,
    cpu.cfs_quota_us on v1). Yields how the link was slowed; undone on leaving."""
    sl = bed.provider.slot(host)
    root = Path("/sys/fs/cgroup")
    v2 = "cpu" in (root / "cgroup.controllers").read_text().split() if (root / "cgroup.controllers").exists() else False
    base = root if v2 else root / "cpu"
    group = base / f"tb-starve-{bed.provider.tag}-{host}"
    if not (base / "cgroup.procs").exists():
        pytest.skip("no cpu cgroup on this machine")
    ino = os.stat(f"/run/netns/{sl.netns}").st_ino

    def members() -> list[int]:
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}/ns/net").st_ino == ino:
                        out.append(int(d))
        return out

    def move(pids: list[int], to: Path) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):  # gone meanwhile
                (to / "cgroup.procs").write_text(str(pid))

    group.mkdir(exist_ok=True)
    try:  # from here on, the link and the group are undone whatever fails
        period = 100_000
        quota = max(1000, int(period * cpu_percent / 100))
        if v2:
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        try:
            bed.provider.slow_network(host, delay_ms=delay_ms)
            how = f"netem delay {delay_ms} ms"
        except TestbedError as e:
            if "unknown" not in e.what:
                raise
            how = throttle(sl.veth) + " (no sch_netem in this kernel)"
        move(members(), group)
        yield f"{how}, {cpu_percent:g}% of a CPU"
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", sl.veth, "root"], capture_output=True, check=False)
        for _ in range(50):  # bounded: processes forked meanwhile land in the group too
            left = [int(x) for x in (group / "cgroup.procs").read_text().split()]
            if not left:
                break
            move(left, base)
        with contextlib.suppress(OSError):
            group.rmdir()
