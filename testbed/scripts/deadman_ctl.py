"""testbed's dead-man's switch, host side: install, refresh, disarm or report the agent (run as root).

usage: python3 -c "$(cat deadman_ctl.py)" DIR MODE     with the input on stdin (JSON)
  install  {"agent": TEXT, "config": {...}, "deadline": {...}}: DIR (0700) with agent.py, config.json (0600),
           deadline.json; the agent (re)started: a systemd unit where systemd is PID 1, else a detached process
  refresh  {"expire_at", "idle_after"}: deadline.json rewritten (its time is the controller's last action)
  disarm   the agent stopped, its unit removed, DIR deleted (the credential with it)
  status   prints {"status": ..., "released": ..., "alive": bool} as JSON
Standard library only (Python 3.6+).
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Optional  # noqa: F401, UP035 (type comments: 3.6 has no PEP 563)

UNIT = "/etc/systemd/system/testbed-deadman.service"


def _write(path, data, mode=0o600):
    # type: (str, str, int) -> None
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def _systemd():
    # type: () -> bool
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "systemd" and os.path.isdir("/run/systemd/system")
    except OSError:
        return False


def _pid(d):
    # type: (str) -> Optional[int]
    try:
        with open(os.path.join(d, "agent.pid")) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if b"agent.py" in f.read() else None
    except (OSError, ValueError):
        return None


def _stop(d):
    # type: (str) -> None
    if os.path.exists(UNIT):
        subprocess.call(["systemctl", "disable", "--now", "testbed-deadman.service"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.unlink(UNIT)
        subprocess.call(["systemctl", "daemon-reload"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = _pid(d)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if _pid(d) is None:
                break
            time.sleep(0.1)


def _start(d):
    # type: (str) -> None
    agent = os.path.join(d, "agent.py")
    py = sys.executable or "/usr/bin/python3"
    if _systemd():
        _write(UNIT, "[Unit]\nDescription=testbed dead-man's switch\nAfter=network-online.target\n\n"
                     f"[Service]\nExecStart={py} {agent} {d}\nRestart=on-failure\nRestartSec=30\n\n"
                     "[Install]\nWantedBy=multi-user.target\n", 0o644)
        subprocess.check_call(["systemctl", "daemon-reload"])
        subprocess.check_call(["systemctl", "enable", "--now", "testbed-deadman.service"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    if os.fork() == 0:  # detached: a session of its own, reparented to the host's init
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            _write(os.path.join(d, "agent.pid"), str(os.getpid()), 0o644)
            os.execv(py, [py, agent, d])  # noqa: S606 (the agent, by absolute path)
        os._exit(0)
    os.wait()
    for _ in range(50):
        if _pid(d) is not None:
            return
        time.sleep(0.1)
    raise SystemExit("the agent did not start")


def main(d, mode):
    # type: (str, str) -> None
    doc = json.loads(sys.stdin.read() or "{}")
    if mode == "install":
        _stop(d)
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
        for name in ("released.json", "status.json", "disarmed"):
            if os.path.exists(os.path.join(d, name)):
                os.unlink(os.path.join(d, name))
        _write(os.path.join(d, "agent.py"), doc["agent"])
        _write(os.path.join(d, "config.json"), json.dumps(doc["config"]))
        _write(os.path.join(d, "deadline.json"), json.dumps(doc["deadline"]))
        _start(d)
    elif mode == "refresh":
        if not os.path.isdir(d):
            raise SystemExit("no agent here")
        _write(os.path.join(d, "deadline.json"), json.dumps(doc))
    elif mode == "disarm":
        if os.path.isdir(d):
            _write(os.path.join(d, "disarmed"), "")
            _stop(d)
            shutil.rmtree(d, ignore_errors=True)
    elif mode == "status":
        out = {"alive": _pid(d) is not None or os.path.exists(UNIT)}  # type: Dict[str, Any]
        for name in ("status", "released"):
            try:
                with open(os.path.join(d, name + ".json")) as f:
                    out[name] = json.load(f)
            except (OSError, ValueError):
                out[name] = None
        print(json.dumps(out))
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
