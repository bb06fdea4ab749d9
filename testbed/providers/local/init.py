"""PID 1 of a local testbed host (stdlib only; run by the controller inside the host's namespaces).

It mounts the host's copy-on-write root (overlay with lower ``/``, or an image's layer over ``/``), fresh
``/proc``, ``/sys``, ``/dev``, the cgroup tree (this machine's, or with ``--own-cgroups`` its hierarchies mounted
afresh in the host's cgroup namespace) and a tmpfs ``/run``, chroots into it and keeps ``sshd -D`` running. Signals, as
sent by the host's own ``reboot``/``shutdown`` (installed in its upper layer):
- SIGUSR1: reboot: every other process is killed, a new boot id is written, sshd starts again;
- SIGTERM: halt: every process is killed and the host stays down.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

SSHD_CONFIG = "/etc/ssh/sshd_config_testbed"


class Reboot(Exception):
    pass


class Halt(Exception):
    pass


def _on_usr1(signum: int, frame: object) -> None:
    raise Reboot


def _on_term(signum: int, frame: object) -> None:
    raise Halt


MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2) through libc: no mount(8) process per mount (a host start is ~7 mounts; 128 hosts on 2 cores)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                    data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def setup_network(address: str, gateway: str, interface: str = "eth0") -> None:
    """This host's loopback, address on its interface and default route (one ``ip -batch`` in its namespace)."""
    cmds = (f"link set lo up\naddr add {address} dev {interface}\nlink set {interface} up\n"
            f"route add default via {gateway}\n")
    subprocess.run(["ip", "-batch", "-"], input=cmds.encode(), check=True)


def mount_root(a: argparse.Namespace) -> None:
    m = a.merged
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    lower = f"{a.lower}:/" if a.lower else "/"  # an image's layer (what a set-up changed) over this machine's /
    mount("overlay", m, "overlay", 0, f"lowerdir={lower},upperdir={a.upper},workdir={a.work}")
    mount("proc", f"{m}/proc", "proc")
    mount("/dev", f"{m}/dev", None, MS_BIND | MS_REC)
    mount("sysfs", f"{m}/sys", "sysfs")
    if os.path.isdir("/sys/fs/cgroup"):
        try:
            if a.own_cgroups:
                mount_cgroups(f"{m}/sys/fs/cgroup")
            else:
                mount("/sys/fs/cgroup", f"{m}/sys/fs/cgroup", None, MS_BIND | MS_REC)
        except OSError as e:  # optional: hosts work without their cgroup view
            print(f"note: {e}", file=sys.stderr, flush=True)
    mount("tmpfs", f"{m}/run", "tmpfs", 0, "mode=755")
    mount(a.boot_id, f"{m}/proc/sys/kernel/random/boot_id", None, MS_BIND)
    if a.home:  # one home folder for every host of the testbed, as a lab's NFS home
        mount(a.home, f"{m}/home", None, MS_BIND)
        if os.path.isdir(f"{a.home}/root"):
            mount(f"{a.home}/root", f"{m}/root", None, MS_BIND)


def mount_cgroups(target: str) -> None:
    """Fresh mounts of this machine's cgroup hierarchies at ``target``, made in this host's cgroup namespace: each
    is rooted at the cgroup the host started in (its own freezer or unified cgroup), so what a Slurm node makes
    there (``slurm/uid_U/job_J``) is its own folder, not every node's."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for ln in f:
            pre, _, post = ln.partition(" - ")
            point, (fstype, _src, opts) = pre.split()[4], post.split()[:3]
            if fstype in ("cgroup", "cgroup2") and (point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/")):
                found.append((point, fstype, ",".join(o for o in opts.split(",") if o not in ("rw", "ro"))))
    if any(p == "/sys/fs/cgroup" and t == "cgroup2" for p, t, _ in found):  # cgroup v2 only
        mount("cgroup2", target, "cgroup2")
        return
    mount("tmpfs", target, "tmpfs", 0, "mode=755")
    for point, fstype, opts in found:
        sub = f"{target}/{point[len('/sys/fs/cgroup/'):]}"
        os.makedirs(sub, exist_ok=True)
        mount(fstype, sub, fstype, 0, opts if fstype == "cgroup" else None)


def kill_all(grace: float = 2.0) -> None:
    """Stop every process of this host but PID 1 (TERM, then KILL), reaping them."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.05)


def fresh_run() -> None:
    subprocess.run(["umount", "-l", "/run"], check=False)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run"], check=False)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def start_sshd() -> subprocess.Popen[bytes]:
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open("/var/log/sshd-testbed.log", "ab")  # noqa: SIM115
    return subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", SSHD_CONFIG], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hostname", required=True)
    p.add_argument("--upper", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--merged", required=True)
    p.add_argument("--boot-id", required=True)
    p.add_argument("--address", required=True, help="this host's address/prefix on eth0")
    p.add_argument("--gateway", required=True)
    p.add_argument("--interface", default="eth0", help="the name of this host's link into the bridge")
    p.add_argument("--home", default=None, help="a folder mounted at /home on every host (a shared home)")
    p.add_argument("--lower", default=None, help="an image's read-only layer, between the host's own and /")
    p.add_argument("--own-cgroups", action="store_true", help="mount the cgroup hierarchies afresh (started in a "
                   "cgroup namespace of the host's own)")
    a = p.parse_args()
    if os.getpid() != 1:
        print("testbed/providers/local/init.py must run as PID 1 of a new PID namespace", file=sys.stderr)
        return 2
    socket.sethostname(a.hostname)
    setup_network(a.address, a.gateway, a.interface)
    mount_root(a)
    os.chroot(a.merged)
    os.chdir("/")
    signal.signal(signal.SIGUSR1, _on_usr1)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    print(f"{a.hostname}: up", flush=True)
    while True:
        try:
            sshd = start_sshd()
            while True:
                try:
                    pid, _ = os.waitpid(-1, 0)
                except ChildProcessError:
                    time.sleep(0.5)
                    continue
                if pid == sshd.pid:
                    time.sleep(1)
                    break  # restart sshd
        except Reboot:
            print(f"{a.hostname}: rebooting", flush=True)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            kill_all()
            with open("/proc/sys/kernel/random/boot_id", "w") as f:
                f.write(str(uuid.uuid4()) + "\n")
            fresh_run()
            signal.signal(signal.SIGUSR1, _on_usr1)
            print(f"{a.hostname}: up", flush=True)
        except Halt:
            print(f"{a.hostname}: halting", flush=True)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            kill_all()
            return 0


if __name__ == "__main__":
    sys.exit(main())
