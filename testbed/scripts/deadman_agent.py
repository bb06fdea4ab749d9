#!/usr/bin/env python3
"""testbed's dead-man's switch, run on each host of a testbed (standard library only; Python 3.6+).

usage: python3 deadman_agent.py DIR

DIR (root-only, 0700) holds:
  config.json    what to do at the deadline: {"testbed", "interval", "auth": {...}, "requests": [[METHOD, URL]...]}
                 auth is {"type": "keystone", "auth_url", "id", "secret"} (an OpenStack application credential whose
                 access rules allow exactly these requests) or {"type": "gce-metadata", "url"} (the token of the
                 VM's own service account, from the metadata server) or {"type": "none"}
  deadline.json  {"expire_at": EPOCH or null, "idle_after": SECONDS or null}; the controller rewrites it whenever it
                 acts on the testbed, and its modification time is the last action
It writes status.json (the next release time, whether a run is active) and, once done, released.json, then exits.
A run is active while a rank of a run under some user's ~/.testbed-runs has a live process and no exit file, or
while a run folder is being set up (no rank started yet; 10 minutes at most).
Every loop is bounded: requests time out after 30 s; a failed release is retried every interval, 120 times at most.
"""

import glob
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: F401, UP035 (type comments: 3.6 has no PEP 563)

MAX_TRIES = 120


def _read(path, default=None):
    # type: (str, Any) -> Any
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _write(path, data):
    # type: (str, Any) -> None
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


SETUP_GRACE = 600  # a run folder with no rank started yet counts as a run being set up, this long at most


def run_active(now=None, homes=None):
    # type: (Optional[float], Optional[List[str]]) -> bool
    """True while a testbed run on this host is alive: a rank with a live process and no exit file, or a run
    folder still being set up (uploaded, no rank started yet) for at most SETUP_GRACE seconds."""
    now = now or time.time()
    for home in homes if homes is not None else ["/root", *glob.glob("/home/*")]:
        for run_dir in glob.glob(os.path.join(home, ".testbed-runs", "*")):
            pidfiles = glob.glob(os.path.join(run_dir, "rank*.pid"))
            if not pidfiles and not glob.glob(os.path.join(run_dir, "rank*.exit")):
                try:
                    if now - os.path.getmtime(run_dir) < SETUP_GRACE:
                        return True
                except OSError:
                    pass
            for pidfile in pidfiles:
                if os.path.exists(pidfile[:-len(".pid")] + ".exit"):
                    continue
                try:
                    with open(pidfile) as f:
                        pid = int(f.read().strip())
                    os.kill(pid, 0)
                    return True
                except (OSError, ValueError):
                    continue
    return False


def _http(method, url, body=None, headers=None):
    # type: (str, str, Any, Optional[Dict[str, str]]) -> Tuple[int, Any, bytes]
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if not url.startswith(("http://", "https://")):
        raise RuntimeError("not an HTTP URL: " + url)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (http(s) only, checked above)
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def token(auth):
    # type: (Dict[str, Any]) -> Dict[str, str]
    """The header that authorizes the release requests."""
    kind = auth.get("type")
    if kind == "keystone":
        body = {"auth": {"identity": {"methods": ["application_credential"],
                                      "application_credential": {"id": auth["id"], "secret": auth["secret"]}}}}
        status, headers, _ = _http("POST", auth["auth_url"].rstrip("/") + "/auth/tokens", body)
        if status != 201:
            raise RuntimeError(f"keystone refused the credential: HTTP {status}")
        return {"X-Auth-Token": headers["X-Subject-Token"]}
    if kind == "gce-metadata":
        status, _, raw = _http("GET", auth["url"], headers={"Metadata-Flavor": "Google"})
        if status != 200:
            raise RuntimeError(f"the metadata server gave no token: HTTP {status}")
        return {"Authorization": "Bearer " + json.loads(raw.decode())["access_token"]}
    return {}


def release(cfg, log):
    # type: (Dict[str, Any], Callable[[str], None]) -> bool
    """Send every release request; True when each is done (2xx) or already gone (404)."""
    headers = token(cfg.get("auth") or {})
    ok = True
    for method, url in cfg.get("requests", []):
        status, _, raw = _http(method, url, headers=headers)
        log(f"{method} {url} -> {status}")
        if status == 404 or 200 <= status < 300:
            continue
        ok = False
        log("  " + raw.decode(errors="replace")[:300])
    return ok


def main(argv):
    # type: (List[str]) -> int
    d = argv[1]
    cfg = _read(os.path.join(d, "config.json"), {})
    interval = float(cfg.get("interval", 30))
    logf = open(os.path.join(d, "agent.log"), "a")  # noqa: SIM115 (open for the agent's life)

    def log(msg):
        # type: (str) -> None
        logf.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + msg + "\n")
        logf.flush()

    log(f"started for testbed {cfg.get('testbed')} (pid {os.getpid()})")
    last_run = 0.0
    tries = 0
    while True:
        now = time.time()
        path = os.path.join(d, "deadline.json")
        deadline = _read(path)
        if deadline is None or os.path.exists(os.path.join(d, "disarmed")):
            log("disarmed: no deadline file")
            return 0
        touched = os.path.getmtime(path)
        active = run_active()
        if active:
            last_run = now
        due = []
        if deadline.get("expire_at") is not None:
            due.append(float(deadline["expire_at"]))
        if deadline.get("idle_after") is not None:
            due.append(max(touched, last_run) + float(deadline["idle_after"]))
        at = min(due) if due else None
        _write(os.path.join(d, "status.json"), {"release_at": at, "run_active": active, "checked": now})
        if at is not None and now >= at:
            log("deadline passed ({}); releasing".format(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))))
            try:
                done = release(cfg, log)
            except Exception as e:  # a network error: retry
                log(f"release failed: {e}")
                done = False
            if done:
                _write(os.path.join(d, "released.json"), {"at": time.time()})
                log("released")
                return 0
            tries += 1
            if tries >= MAX_TRIES:
                log(f"giving up after {tries} tries")
                return 1
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
