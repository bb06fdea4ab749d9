"""Reliability: concurrent ``testbed`` processes on one state, hosts killed or cut off during a fan-out.

Every wait is bounded (subprocess timeouts, pytest-timeout); network traffic stays on loopback and the
local testbed's own bridge.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.state import Store

PY = sys.executable
WRITER = """
import sys
from pathlib import Path
from testbed.state import Store
from testbed.hosts import Host
db, w, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
st = Store(db)
st.upsert_testbed(f"w{w}", "lab", None, "up")
st.set_hosts(f"w{w}", [Host(name=f"h{i}", address=f"10.0.0.{i+2}") for i in range(3)])
for i in range(n):
    st.add_resource(f"w{w}", "thing", str(i), i=i)
    st.update_testbed_info(f"w{w}", last=i)
    st.set_host_state(f"w{w}", f"h{i % 3}", f"s{i}")
"""


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "TESTBED_HOME": str(home), "COLUMNS": "200"}


def _integrity(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


@pytest.mark.timeout(180)
def test_ten_concurrent_commands_on_one_state(tmp_path: Path) -> None:
    """10 ``testbed`` CLI processes (status/list, JSON) and 4 writer processes start together on a fresh state."""
    home = tmp_path / ".testbed"
    db = home / "state.db"
    env = _env(home)
    cli = [[PY, "-m", "testbed", "status", "--json"]] * 7 + [[PY, "-m", "testbed", "list", "runs", "--json"]] * 3
    writers = [[PY, "-c", WRITER, str(db), str(w), "60"] for w in range(4)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=tmp_path) for argv in [*cli, *writers]]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        outs.append((p.args, p.returncode, out, err))
    for args, rc, out, err in outs:
        assert rc == 0, f"{args}: rc {rc}\n{err}"
        assert "Traceback" not in err
    for _, _, out, _ in outs[:10]:
        json.loads(out)  # every reader printed whole JSON
    assert _integrity(db) == "ok"
    st = Store(db)
    for w in range(4):
        assert len(st.resources(f"w{w}")) == 60
        assert st.testbed(f"w{w}")["info"] == {"last": 59}  # type: ignore[index]
        assert [h.state for h in st.hosts(f"w{w}")] == ["s57", "s58", "s59"]
    final = json.loads(subprocess.run([PY, "-m", "testbed", "status", "--json"], capture_output=True, text=True,
                                      env=env, cwd=tmp_path, timeout=60, check=True).stdout)
    assert sorted(t["name"] for t in final["testbeds"]) == ["w0", "w1", "w2", "w3"]


# ---------------------------------------------------------------------------------------------------
# On a real local testbed (root, namespaces, sshd).

@pytest.mark.local
@pytest.mark.timeout(240)
def test_concurrent_exec_and_probe_on_one_testbed(shared_local_testbed) -> None:  # type: ignore[no-untyped-def]
    """5 exec + 3 status --probe (which write host states) + 2 status, all at once, through the CLI."""
    bed = shared_local_testbed
    env = _env(bed.home)
    argvs = ([[PY, "-m", "testbed", "exec", bed.name, "--json", "--", "hostname"]] * 5
             + [[PY, "-m", "testbed", "status", bed.name, "--probe", "--json"]] * 3
             + [[PY, "-m", "testbed", "status", "--json"]] * 2)
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=bed.cwd)
             for a in argvs]
    results = [(p.args, *p.communicate(timeout=120), p.returncode) for p in procs]
    names = sorted(h.name for h in bed.hosts)
    for args, out, err, rc in results:
        assert rc == 0 and "Traceback" not in err, f"{args}: {rc}\n{err}"
        data = json.loads(out)
        if "exec" in args:
            assert sorted(r["stdout"].strip() for r in data) == names
        elif "--probe" in args:
            assert all(h["state"] == "up" for h in data["hosts"])
    assert _integrity(bed.home / "state.db") == "ok"


@pytest.mark.local
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", range(2))
def test_host_killed_during_exec_is_named_fast(local_testbed, seed: int) -> None:  # type: ignore[no-untyped-def]
    """A host killed at a random moment of a fan-out: the call ends quickly and names exactly that host."""
    from testbed import remote

    rng = random.Random(seed)
    bed = local_testbed(hosts=3, name=f"kill{seed}")
    victim = rng.choice([h.name for h in bed.hosts])
    names = [h.name for h in bed.hosts]
    assert all(r.ok for r in remote.run(bed.name, names, "true", timeout=30))  # masters up: the warm path
    delay = rng.uniform(0.2, 1.5)
    killer = threading.Timer(delay, bed.provider.kill_host, args=(victim,))
    t0 = time.monotonic()
    killer.start()
    results = remote.run(bed.name, names, "sleep 4; echo done", timeout=60)
    dt = time.monotonic() - t0
    killer.join(10)
    by = {r.host: r for r in results}
    assert not by[victim].ok and by[victim].exit_code != 0
    assert victim in (by[victim].error or by[victim].stderr or victim)
    for n in names:
        if n != victim:
            assert by[n].ok and by[n].stdout.strip() == "done", by[n]
    assert dt < 20, f"fan-out took {dt:.1f} s after a host died"
    assert by[victim].seconds < 4 + 5, f"the dead host was noticed after {by[victim].seconds} s"


@pytest.mark.local
@pytest.mark.timeout(240)
def test_network_cut_during_exec_times_out_and_recovers(local_testbed) -> None:  # type: ignore[no-untyped-def]
    """A host cut off mid-command: its result says 'timed out' within the timeout; the others are unaffected;
    once the link is back the same host answers again (the multiplexed master survived or was replaced)."""
    from testbed import remote

    bed = local_testbed(hosts=3, name="cut")
    names = [h.name for h in bed.hosts]
    assert all(r.ok for r in remote.run(bed.name, names, "true", timeout=30))
    victim = names[1]
    cutter = threading.Timer(0.5, bed.provider.cut_network, args=(victim,))
    cutter.start()
    t0 = time.monotonic()
    results = remote.run(bed.name, names, "sleep 2; echo done", timeout=6)
    dt = time.monotonic() - t0
    cutter.join(10)
    by = {r.host: r for r in results}
    assert by[victim].error and "timed out" in by[victim].error
    assert all(by[n].ok for n in names if n != victim)
    assert dt < 12
    bed.provider.restore_network(victim)
    deadline = time.monotonic() + 60
    while True:  # bounded: a stale master is dropped by ServerAlive (30 s) at worst
        r = remote.run(bed.name, [victim], "echo back", timeout=15)[0]
        if r.ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.ok and r.stdout.strip() == "back", r
