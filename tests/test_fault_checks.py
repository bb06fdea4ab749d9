"""Faults and hardware are judged before anything is rented (issue 38, item 5): a fault whose kind needs a provider
capability the testbed lacks, a fault aimed at several hosts, and a GPU suite on a spec that declares no GPU are
refused, with the suite's file:line, at ``show --on``, ``plan``, ``run --dry-run`` (after the commands) and ``run``
(before any state or host), through the real command line. No host is made: the testbeds are specs only."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import line_of

from testbed.providers import provider_class

LAB3 = """\
provider:
  kind: lab
  hosts:
    - {name: a, address: 10.241.0.10, user: root, key: ~/.ssh/id_ed25519}
    - {name: b, address: 10.241.0.11, user: root, key: ~/.ssh/id_ed25519}
    - {name: c, address: 10.241.0.12, user: root, key: ~/.ssh/id_ed25519}
"""

DRILL = """\
name: drill
requires: {hosts: 2}
parameters:
  fault: {type: str, default: none, choices: [none, kill-rank, kill-host]}
matrix:
  fault: [none, kill-host]
steps:
  launch:
    command: "sleep 5"
faults:
  kill-rank:
    action: signal
    rank: 1
    at: 1
  kill-host:
    action: kill-host
    rank: 1
    at: 2
"""

WIDE = """\
name: wide
requires: {hosts: 3}
steps:
  launch:
    command: "sleep 5"
faults:
  cut:
    action: command
    command: "true"
    host: workers
    at: 1
default_faults: [cut]
"""

GPUISH = """\
name: gpuish
requires: {hosts: 1}
steps:
  launch:
    command: "python train.py"
    needs: [gpu]
"""

GPUBOX = LAB3 + "hardware: {gpu: {model: NVIDIA A100, count: 1}}\n"


@pytest.fixture
def cli(user_cli):  # type: ignore[no-untyped-def]
    """``testbed ARGS`` in a working folder holding the suites and specs above."""
    return user_cli({"inventories/lab3.yml": LAB3, "inventories/gpubox.yml": GPUBOX,
                     **{f"experiments/{n}.yml": t for n, t in (("drill", DRILL), ("wide", WIDE), ("gpuish", GPUISH))}})


def test_a_fault_the_provider_cannot_fire_is_refused_before_anything_is_rented(cli, tb_home: Path) -> None:
    why = provider_class("lab").lacks("kill-host")
    assert why
    what = "fault 'kill-host' of suite 'drill' (kill-host) cannot fire on testbed 'lab3'"
    where = f"drill.yml:{line_of(DRILL, 'action: kill-host')}"
    for args in (("run", "drill", "--on", "lab3", "-p", "fault=kill-host", "--dry-run"),
                 ("run", "drill", "--on", "lab3", "--fault", "kill-host", "--dry-run"),
                 ("run", "drill", "--on", "lab3", "--matrix", "--dry-run"),  # the second point picks it
                 ("plan", "drill", "--on", "lab3", "--matrix"),
                 ("plan", "drill", "--on", "lab3", "--fault", "kill-host"),
                 ("run", "drill", "--on", "lab3", "--fault", "kill-host")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert what in flat and why in flat and where in flat and "Traceback" not in r.stderr, (args, flat)
        assert "fix: run it on a testbed whose provider can (local" in flat, flat  # derived from the classes
    assert "dry run" in cli("run", "drill", "--on", "lab3", "--fault", "kill-host", "--dry-run").stdout  # commands
    assert not (tb_home / ".testbed" / "state.db").exists()  # refused before any state, let alone a lease
    # the same suite with no such fault, or on a provider that can kill a host, is not refused
    assert cli("run", "drill", "--on", "lab3", "--dry-run").returncode == 0
    assert cli("run", "drill", "--on", "local", "--fault", "kill-host", "--dry-run").returncode == 0


def test_show_on_a_testbed_refuses_a_default_fault_and_warns_of_the_others(cli, tb_home: Path) -> None:
    r = cli("show", "drill", "--on", "lab3")
    assert r.returncode == 0, r.stderr  # no fault by default: kill-host would only be fired on request
    assert "warning: fault 'kill-host' of suite 'drill' (kill-host) cannot fire" in " ".join(r.stderr.split())
    (tb_home / "experiments" / "drill.yml").write_text(DRILL.replace("default: none", "default: kill-host"))
    r = cli("show", "drill", "--on", "lab3")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and "error: fault 'kill-host' of suite 'drill'" in flat, r.stderr
    assert f"drill.yml:{line_of(DRILL, 'action: kill-host')}" in flat
    assert cli("show", "drill", "--on", "local").returncode == 0


def test_a_fault_aimed_at_several_hosts_is_refused_never_cut_to_one(cli, tb_home: Path) -> None:
    where = f"wide.yml:{line_of(WIDE, 'host: workers')}"
    for args in (("run", "wide", "--on", "local", "--dry-run"), ("plan", "wide", "--on", "local")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stderr)
        assert "faults.cut.host 'workers' selects 3 hosts (node1, node2, node3); a command fault fires on one " \
               "host" in flat and where in flat, flat
    (tb_home / "experiments" / "wide.yml").write_text(WIDE.replace("host: workers", "host: node2"))
    assert cli("run", "wide", "--on", "local", "--dry-run").returncode == 0


def test_a_gpu_suite_on_a_spec_without_gpus_is_refused_at_show_plan_and_dry_run(cli) -> None:
    what = "the ranks of suite 'gpuish' need gpu (steps.launch.needs), which testbed 'lab3' (lab) lacks"
    where = f"gpuish.yml:{line_of(GPUISH, 'needs: [gpu]')}"
    for args in (("show", "gpuish", "--on", "lab3"), ("plan", "gpuish", "--on", "lab3"),
                 ("run", "gpuish", "--on", "lab3", "--dry-run"), ("run", "gpuish", "--on", "lab3")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2 and what in flat and where in flat, (args, flat)
        assert "hardware.gpu" in flat
    for args in (("show", "gpuish", "--on", "gpubox"), ("plan", "gpuish", "--on", "gpubox"),
                 ("run", "gpuish", "--on", "gpubox", "--dry-run")):
        r = cli(*args)
        assert r.returncode == 0, (args, r.stderr)
