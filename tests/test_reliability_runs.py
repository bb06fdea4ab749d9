"""Reliability of runs: a host killed at a random moment of a run (10 seeds) on a real local testbed.

Each seed: a 'ticker' suite runs one rank per host (each appends a line every 0.2 s); one random host is
killed (every process of it, like pulling its power) at a random moment. The run must fail fast and name
that host; collecting it afterwards gets the survivors' outputs and reports the victim; results collected
for earlier seeds stay byte-identical. The killed host is brought back with ``provision`` for the next seed.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from testbed.records import RunRecord

pytestmark = [pytest.mark.local]

SUITE = """
name: ticker
description: every rank appends a line every 0.2 s
requires: {hosts: 2}
parameters:
  ticks: {type: int, default: 40}
steps:
  launch:
    command: for i in $(seq 1 {{ ticks }}); do echo "{{ rank }} $i" >> ticks.txt; sleep 0.2; done
timeouts: {run: 60, grace: 2, poll: 0.3, unreachable: 2}
outputs: [ticks.txt]
"""


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _wait_status(run_id: str, wanted: set[str], timeout: float) -> RunRecord:
    from testbed.run import bookkeeping as rs
    from testbed.state import Store

    st = Store.open_default()
    deadline = time.monotonic() + timeout
    try:
        while True:
            row = rs.require(st, run_id)
            if row.status in wanted or time.monotonic() > deadline:
                return row
            time.sleep(0.1)
    finally:
        st.close()


@pytest.mark.slow  # ten seeds of a drill
@pytest.mark.timeout(420)
def test_host_killed_at_random_moment_of_a_run(shared_local_testbed) -> None:  # type: ignore[no-untyped-def]
    from testbed import collect
    from testbed.run import runner

    bed = shared_local_testbed
    (bed.cwd / "experiments").mkdir(exist_ok=True)
    (bed.cwd / "experiments" / "ticker.yml").write_text(textwrap.dedent(SUITE))
    results = bed.cwd / "results"
    kept: dict[str, str] = {}
    summary = []
    for seed in range(10):
        rng = random.Random(seed)
        names = [h.name for h in bed.hosts]
        victim = rng.choice(names)
        plan = runner.plan_run("ticker", bed.name, {}, faults=[])
        run_id = runner.start_run(plan)
        row = _wait_status(run_id, {"running", "failed", "succeeded"}, 30)
        assert row.status == "running", row
        time.sleep(rng.uniform(0.3, 2.5))
        t_kill = time.monotonic()
        bed.provider.kill_host(victim)
        row = runner.wait(run_id, timeout=60, interval=0.2)
        noticed = time.monotonic() - t_kill
        assert row.status == "failed", row
        assert victim in str(row.reason), row
        assert noticed < 15, f"seed {seed}: the run ended {noticed:.1f} s after {victim} died"
        (res,) = collect.collect_runs([run_id], results, timeout=5, io_timeout=5)
        got = {h.host: h for h in res.hosts} if hasattr(res, "hosts") else {}
        for n in names:
            if n == victim or n not in got:
                continue
            f = results / "ticker" / run_id / n / "ticks.txt"
            assert f.exists(), f"seed {seed}: survivor {n}'s output was not collected"
        after = _tree_digest(results)
        for k, v in kept.items():  # earlier seeds' results are untouched
            assert after.get(k) == v, f"seed {seed}: {k} changed or vanished"
        kept = after
        summary.append((seed, victim, round(noticed, 2)))
        # Bring the victim back. Work-around: the controller's ARP entry for the victim's address still holds
        # the old veth's MAC (kept REACHABLE by the run's live SSH traffic) and the restarted host gets a new
        # random MAC, so without the flush provision's SSH wait times out for ~30 s (fix belongs in
        # LocalProvider._start_hosts: a stable MAC per host, or flushing the neighbour entry).
        addr = next(h.address for h in bed.hosts if h.name == victim)
        subprocess.run(["ip", "neigh", "flush", "to", addr], check=False, capture_output=True)
        bed.hosts = bed.provider.provision()
    print("seed, victim, seconds from kill to failed run:", summary)
