"""The dead-man's switch: a testbed past its expiry (or idle too long) is released without the controller.

On cloud hosts an agent (``testbed/scripts/deadman_agent.py``, standard-library Python) runs under the host's
init (a systemd unit where systemd is PID 1, else a detached process) and reads a deadline file that the
controller rewrites over SSH whenever it acts on the testbed. At the deadline it sends the release requests the
provider prepared, with the narrowest credential the provider offers (Chameleon: an application credential whose
access rules allow only those DELETE calls; gcp-tpu: the node's own service account through the metadata server).
On the local provider the hosts are this machine's kernel objects, so the switch is a watchdog process on this
machine, in a session of its own (no CLI, terminal or test process is its parent), that runs ``destroy``.

Host-side files live in ``AGENT_DIR`` (root only). The controller side keeps the expiry in the testbed's state row.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import expiry as exp
from testbed.capabilities import BakesImages, Expires
from testbed.errors import TestbedError, UsageError, by_door
from testbed.expiry import Expiry
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.hosts import Host
    from testbed.providers.base import Provider
    from testbed.spec import TestbedSpec
    from testbed.state import Store

AGENT_DIR = "/var/lib/testbed-deadman"
INTERVAL_ENV = "TESTBED_DEADMAN_INTERVAL"  # seconds between the switch's checks (default 30; tests lower it)


def interval() -> float:
    try:
        return max(0.2, float(os.environ.get(INTERVAL_ENV, "30")))
    except ValueError:
        return 30.0


def recorded(store: Store, name: str) -> Expiry | None:
    tb = store.testbed(name)
    return Expiry.from_info(tb["info"]) if tb else None


def planned(spec: TestbedSpec, expire: str | None, old: Expiry | None, now: float | None = None) -> Expiry | None:
    """The expiry a provision sets: ``--expire`` (from now) wins; else a recorded deadline stays; else the spec's
    ``expire`` counts from now. ``idle_after`` comes from the spec. None when neither is set."""
    now = now or time.time()
    idle = exp.parse_duration(spec.idle_after) if spec.idle_after else None
    if expire:
        at: float | None = now + exp.parse_duration(expire)
    elif old is not None and old.expire_at is not None:
        if old.expire_at <= now:  # re-made now, it would be released at once
            raise UsageError(f"testbed '{spec.name}' expired at {exp.iso(old.expire_at)} (its switch releases it)",
                             where=f"testbed {spec.name}",
                             fix=by_door(f"give a new expiry: 'testbed provision {spec.name} --expire 8h', or turn "
                                         f"it off first: 'testbed extend {spec.name} --off'",
                                         "give a new expiry: provision(expire='8h')"))
        at = old.expire_at
    else:
        at = now + exp.parse_duration(spec.expire) if spec.expire else None
    if at is None and idle is None:
        return None
    return Expiry(expire_at=at, idle_after=idle, touched=now, switch=old.switch if old else "",
                  armed=old.armed if old else None)


def save(store: Store, name: str, e: Expiry) -> None:
    store.update_testbed_info(name, expiry=e.to_json())


# the agent on cloud hosts ---------------------------------------------------------------------------------
def _ctl(mode: str) -> str:
    """A one-line sh command running the agent's installer (``deadman_ctl.py``) as root in ``mode``; its input
    (which may hold a credential) travels on stdin, never on a command line."""
    import base64

    # lazy: start-up (testbed status and exec load this module)
    from testbed import scripts
    from testbed.remote import sh

    ctl = base64.b64encode(scripts.text("deadman_ctl.py").encode()).decode()
    body = ('S=; [ "$(id -u)" = 0 ] || S="sudo -n"\n'
            f'exec $S python3 -c "$(echo {ctl} | base64 -d)" {shlex.quote(AGENT_DIR)} {shlex.quote(mode)}\n')
    return sh(body)


def deadline_doc(e: Expiry) -> dict[str, Any]:
    return {"expire_at": e.expire_at, "idle_after": e.idle_after}


def install_agent(p: Provider, hosts: list[Host], e: Expiry, release: dict[str, Any]) -> list[str]:
    """Put the agent on every host with its release plan and deadline, and start it; the hosts armed."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import remote, scripts

    bundle = {"agent": scripts.text("deadman_agent.py"),
              "config": {"testbed": p.name, "interval": interval(), **release},
              "deadline": deadline_doc(e)}
    data = json.dumps(bundle).encode()
    names = [h.name for h in hosts]
    res = remote.run(p.name, names, _ctl("install"), stdin=data, timeout=60)
    bad = [r for r in res if not r.ok]
    if bad:
        why = "; ".join(f"{r.host}: {(r.error or r.stderr or r.stdout).strip()[-200:]}" for r in bad)
        raise TestbedError(f"the dead-man's switch could not be installed on {plural(len(bad), 'host')}: {why}",
                           where=f"testbed {p.name}",
                           fix=f"the hosts need python3 and passwordless sudo; run 'testbed provision {p.name}' "
                               f"again, or 'testbed destroy {p.name}' (the resources are held and billing)")
    return names


def push_deadline(p_name: str, hosts: list[str], e: Expiry) -> list[str]:
    """Rewrite the deadline file on ``hosts`` (its time is the last action); the hosts that did not take it."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import remote

    if not hosts:
        return []
    res = remote.run(p_name, hosts, _ctl("refresh"), stdin=json.dumps(deadline_doc(e)).encode(), timeout=20)
    return [r.host for r in res if not r.ok]


def disarm_agents(p_name: str, hosts: list[str]) -> None:
    """Stop the agents (before a destroy; best effort: a host may already be gone)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import remote

    if hosts:
        remote.run(p_name, hosts, _ctl("disarm"), stdin=b"{}", timeout=20)


def agent_status(p_name: str, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """What each host's agent reports (status.json, released.json), over SSH."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import remote

    out: dict[str, dict[str, Any]] = {}
    for r in remote.run(p_name, hosts, _ctl("status"), stdin=b"{}", timeout=20):
        try:
            out[r.host] = json.loads(r.stdout) if r.ok else {"error": r.error or r.stderr.strip()}
        except ValueError:
            out[r.host] = {"error": "unreadable status"}
    return out


# arming and refreshing ------------------------------------------------------------------------------------
def check(p: Provider, e: Expiry | None) -> None:
    """Refuse an expiry the provider cannot enforce (before anything is made)."""
    if e is None:
        return
    if not isinstance(p, Expires):
        raise UsageError(f"testbed '{p.name}' ({p.kind}) cannot expire: its hosts are not released by testbed",
                         where=f"{p.spec.source or 'inventory'}: expire/idle_after (or --expire)",
                         fix="remove expire/idle_after from the spec and "
                             + by_door("--expire from the command line", "expire= from provision()"))
    p.check_switch(e)


def arm(p: Provider, hosts: list[Host], e: Expiry) -> Expiry:
    """Arm the provider's switch for ``e`` and record it."""
    switch = Expires.of(p)
    e.touched = time.time()
    e = switch.arm_switch(hosts, e)
    save(p.store, p.name, e)
    p.progress(f"dead-man's switch armed ({e.switch}): released at "
               f"{exp.iso(e.release_at())} unless extended or used")
    return e


def refresh(store: Store, name: str, *, moved: Expiry | None = None) -> list[str]:
    """testbed acted on the testbed: its idle clock restarts (and ``moved`` replaces the deadline); the hosts'
    agents get the new deadline. Returns the hosts that could not be told (their old deadline stands)."""
    e = moved or recorded(store, name)
    if e is None or not e.active:
        return []
    e.touched = time.time()
    save(store, name, e)
    if e.switch == "agent":
        try:
            return push_deadline(name, list(e.armed or []), e)
        except TestbedError:
            return list(e.armed or [])
    return []


def touch(name: str, store: Store | None = None) -> None:
    """``refresh`` for a command that acted on testbed ``name`` (never fails the command); ``store``: the command's
    own open store (else the default one is opened and closed here)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.state import Store

    try:
        st = store or Store.open_default()
        try:
            refresh(st, name)
        finally:
            if store is None:
                st.close()
    except Exception:  # noqa: S110 (the command itself succeeded; the switch keeps the old deadline)
        pass


# the local provider's watchdog -----------------------------------------------------------------------------
def watchdog_pidfile(name: str) -> Path:
    # lazy: start-up (testbed status and exec load this module)
    from testbed import paths

    return paths.testbed_dir(name) / "deadman.pid"


def start_watchdog(name: str) -> int:
    """A process in a session of its own (no terminal, not a child that dies with the CLI) that destroys
    testbed ``name`` at its deadline; its pid (recorded next to the testbed's files)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import paths

    stop_watchdog(name)
    log = open(paths.testbed_dir(name) / "deadman.log", "ab")  # noqa: SIM115
    pkg_parent = str(Path(__file__).resolve().parents[1])  # this testbed, installed or a checkout
    env = {**os.environ, "TESTBED_HOME": str(paths.home()),
           "PYTHONPATH": os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "testbed.deadman", "watch", name], cwd=os.getcwd(), env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    log.close()
    watchdog_pidfile(name).write_text(str(proc.pid))
    return proc.pid


def _watchdog_pid(name: str) -> int | None:
    try:
        pid = int(watchdog_pidfile(name).read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"testbed.deadman" in cmd and name.encode() in cmd else None


def stop_watchdog(name: str) -> None:
    pid = _watchdog_pid(name)
    if pid is not None and pid != os.getpid():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    watchdog_pidfile(name).unlink(missing_ok=True)


def watch(name: str) -> int:
    """The watchdog's loop: sleep until the testbed's release time (re-read from state each round, so commands
    and ``extend`` move it; an active run holds the idle limit), then destroy it. Bounded: it ends when the
    testbed is gone or released, or after 3 failed destroys."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.records import ACTIVE
    from testbed.resolved import Resolved
    from testbed.state import Store

    failures = 0
    last_run = 0.0
    while True:
        st = Store.open_default()
        try:
            e = recorded(st, name)
            if e is None or not e.active or e.switch != "watchdog":
                print(f"{exp.iso(time.time())} {name}: no deadline any more; watchdog ends", flush=True)
                return 0
            if any(r.testbed == name and r.status in ACTIVE for r in st.runs(50)):
                last_run = time.time()
            at = e.release_at(last_run=last_run)
            if at is not None and time.time() >= at:
                print(f"{exp.iso(time.time())} {name}: deadline {exp.iso(at)} passed; destroying", flush=True)
                try:
                    tb = Resolved.open(name, st, recorded_ok=True)
                    p = tb.provider()
                    p.destroy()
                    print(f"{exp.iso(time.time())} {name}: destroyed", flush=True)
                    if tb.spec is not None and tb.spec.expire_images:  # told to: its images go too
                        _delete_images(st, p)
                    return 0
                except (TestbedError, OSError) as err:
                    failures += 1
                    print(f"{exp.iso(time.time())} {name}: destroy failed: {err}", flush=True)
                    if failures >= 3:
                        return 1
        finally:
            st.close()
        time.sleep(interval())


def _delete_images(st: Store, p: Provider) -> None:
    """The images the testbed baked that no other testbed boots from (its spec said ``expire_images: true``)."""
    for r in st.expiring_images(p.name, p.kind):
        try:
            BakesImages.of(p).delete_image(r)
            st.remove_image(r["provider"], r["id"])
            print(f"{exp.iso(time.time())} {p.name}: deleted image {r['id']} (expire_images)", flush=True)
        except (TestbedError, OSError) as err:
            print(f"{exp.iso(time.time())} {p.name}: image {r['id']} not deleted: {err}", flush=True)


if __name__ == "__main__":  # python -m testbed.deadman watch NAME
    if len(sys.argv) == 3 and sys.argv[1] == "watch":
        sys.exit(watch(sys.argv[2]))
    sys.exit("usage: python -m testbed.deadman watch NAME")
