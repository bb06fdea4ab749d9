"""The shared local testbed's reset (tests/localbed.py): what one test module leaves on it is gone for the next."""

from __future__ import annotations

import sqlite3
import time

from localbed import LocalBed, reset


def test_a_reset_leaves_the_shared_testbed_as_provisioned(shared_local_testbed: LocalBed) -> None:
    bed = shared_local_testbed
    assert bed.provider is not None
    # what a module leaves: a process and a run folder on a host, a host killed, a link cut, runs in the state,
    # files beside the inventory and in the state home
    r = bed.ssh("node0", "mkdir -p ~/.testbed-runs/r1 && touch ~/.testbed-runs/r1/rank0.out && "
                         "(setsid sleep 600 </dev/null >/dev/null 2>&1 &) && echo ok")
    assert r.stdout.strip() == "ok", r.stderr
    bed.provider.kill_host("node2")
    bed.provider.cut_network("node1")
    with sqlite3.connect(bed.home / "state.db") as db:
        db.execute("INSERT INTO runs (id, suite, testbed, params, status, created) VALUES "
                   "('r1', 's', ?, '{}', 'running', ?)", (bed.name, time.time()))
    (bed.cwd / "results").mkdir()
    (bed.cwd / "inventories" / "other.yml").write_text("provider: {kind: local}\n")
    (bed.home / "prices.json").write_text("{}")

    assert reset(bed)
    for h in ("node0", "node1", "node2", "node3"):
        assert bed.ssh(h, "true").returncode == 0, h
    assert bed.ssh("node0", "pgrep -x sleep").returncode == 1  # gone
    assert bed.ssh("node0", "test -e ~/.testbed-runs").returncode == 1
    with sqlite3.connect(bed.home / "state.db") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
        assert {s for (s,) in db.execute("SELECT state FROM hosts WHERE testbed = ?", (bed.name,))} == {"up"}
    assert sorted(p.name for p in bed.cwd.iterdir()) == [".testbed", "inventories"]
    assert [p.name for p in (bed.cwd / "inventories").iterdir()] == [f"{bed.name}.yml"]
    assert not (bed.home / "prices.json").exists() and (bed.home / "testbeds" / bed.name).is_dir()

    # a set-up changed the hosts beyond what a reset undoes: it says so, and the next module gets a new testbed
    rec = "~/.cache/testbed/setup.json"
    assert bed.ssh("node3", f"mkdir -p ~/.cache/testbed && echo '{{}}' > {rec}").returncode == 0
    assert not reset(bed)
    assert bed.ssh("node3", f"rm {rec}").returncode == 0
    assert reset(bed)
