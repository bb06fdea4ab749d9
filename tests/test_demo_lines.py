"""The demo's last lines: the killed host's downtime and the goodput against a fault-free run, read from the run's
recorded events (testbed.run.recovery.outage_lines), never from fixed figures."""

from __future__ import annotations

from typing import Any

from testbed.records import RunEvent
from testbed.run.recovery import outage_lines


def _ev(seq: int, kind: str, host: str | None = None, **detail: Any) -> RunEvent:
    return RunEvent(seq=seq, run_id="r1", ts=float(seq), kind=kind, host=host, detail=detail)


def test_the_lines_say_the_downtime_its_parts_and_the_goodput_from_the_events() -> None:
    evs = [_ev(1, "started"), _ev(2, "fault", "node3", action="kill-host"),
           _ev(3, "repaired", "node3", image="4df86c731e75", setup_roles=["ssh_mesh", "mpi"], setup_seconds=1.7),
           _ev(4, "resumed", hosts_repaired=["node3"], downtime_seconds=6.21, detect_seconds=0.8,
               repair_seconds=0.5, setup_seconds=1.7, relaunch_seconds=3.1),
           _ev(5, "goodput", steps=24, seconds=40.0, fault_free_seconds=30.0, ratio=0.75)]
    down, good = outage_lines(evs)
    assert down.startswith("downtime of node3: 6.21 s") and "from image 4df86c731e75" in down
    assert "set-up 1.7 s: ssh_mesh, mpi only" in down and "detected 0.8 s" in down
    assert good.startswith("goodput: 75% of a fault-free run") and "fault-free 30.0 s" in good
    assert "estimated from this run" in good


def test_a_repair_with_no_image_says_so_and_a_run_without_a_lost_host_has_no_lines() -> None:
    evs = [_ev(1, "repaired", "node1", setup_roles=None),
           _ev(2, "resumed", hosts_repaired=["node1"], downtime_seconds=30.04, setup_seconds=20.5)]
    (down,) = outage_lines(evs)
    assert "30.04 s" in down and "no image of its set-up: a whole set-up" in down
    assert outage_lines([_ev(1, "resumed", hosts_repaired=[], downtime_seconds=2.0)]) == []


def test_the_demo_runs_what_the_suites_declare_and_names_none_itself() -> None:
    """testbed demo's runs come from the suites' ``demo:`` lists (by name, in order), {seed} filled in; its set-up
    profiles from those suites."""
    import re

    from testbed.cli.tools import demo_runs
    from testbed.suite import list_suites, load_suite

    profiles, runs = demo_runs("bed1")
    declared = {n: load_suite(n) for n, p in list_suites().items() if re.search(r"^demo:", p.read_text(), re.M)}
    assert declared and [r[1] for r in runs] == [n for n, s in declared.items() for _ in s.demo]
    assert all(r[2:5] == ["--on", "bed1", "--no-setup"] for r in runs)
    assert profiles == list(dict.fromkeys(s.profile for s in declared.values() if s.profile))
    assert not any("{seed}" in o for r in runs for o in r)
    seeded = [o for r in runs for o in r if o.startswith("seed=")]
    assert seeded and all(re.fullmatch(r"seed=\d+", o) for o in seeded)
