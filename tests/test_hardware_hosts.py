"""Per-host hardware in a testbed spec (hardware.hosts): a GPU host beside a CPU host, another NIC.

Suites see the host's own (``{{ host_hardware }}`` in a step's or rank's command), ranks that need a GPU are
refused on a host the spec says has none, a fault's needs are judged on the host it fires on, and set-up hands each
host its own ``testbed_hardware``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import UsageError
from testbed.run import runner
from testbed.spec import load_testbed

SPEC = """provider: {kind: lab, hosts: [{name: gpu0, address: 10.0.0.2}, {name: cpu0, address: 10.0.0.3}]}
user: u
hardware:
  interface: eno1
  gpu: {model: NVIDIA A100, count: 2}
  hosts:
    cpu0: {gpu: null, interface: ens3}
"""
SUITE = """name: mixed
requires: {hosts: 2}
parameters:
  fault: {type: str, default: none, choices: [none, gpu-reset]}
steps:
  prepare:
    - {name: nic, on: all, run: "echo {{ host_hardware.interface }} {{ host_hardware.gpus }}"}
  launch:
    on: gpu0
    needs: [gpu]
    command: "NCCL_SOCKET_IFNAME={{ host_hardware.interface }} python3 train.py"
faults:
  gpu-reset: {action: command, host: cpu0, at: 1, needs: [gpu], command: nvidia-smi -r}
"""


@pytest.fixture
def mixed(tb_home: Path) -> Path:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "mixed.yml").write_text(SPEC)
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "mixed.yml").write_text(SUITE)
    return tb_home


def test_each_host_has_its_own_hardware_where_the_spec_says(mixed: Path) -> None:
    spec = load_testbed("mixed")
    assert spec.hardware.context("gpu0")["gpus"] == 2 and spec.hardware.context("gpu0")["interface"] == "eno1"
    assert spec.hardware.context("cpu0") | {"tools": []} == {
        "shared_home": False, "interface": "ens3", "gpu_model": None, "gpus": 0, "login_shell": None, "tools": [],
        "sudo": True}
    plan = runner.plan_run("mixed", "mixed", {}, dry_run=True)
    assert plan.prepare[0].commands == {"gpu0": "echo eno1 2", "cpu0": "echo ens3 0"}
    assert plan.ranks[0].command.startswith("NCCL_SOCKET_IFNAME=eno1 ")


def test_a_rank_that_needs_a_gpu_is_refused_on_a_host_declared_without_one(mixed: Path) -> None:
    (mixed / "experiments" / "mixed.yml").write_text(SUITE.replace("on: gpu0", "on: all"))
    with pytest.raises(UsageError) as e:
        runner.plan_run("mixed", "mixed", {}, dry_run=True)
    assert e.value.what == "rank 1 of suite 'mixed' needs gpu, but host cpu0 of testbed 'mixed' has no GPU " \
        "(hardware.hosts.cpu0)", e.value.what
    assert "placement" in e.value.fix
    (mixed / "experiments" / "mixed.yml").write_text(SUITE)
    with pytest.raises(UsageError, match="needs gpu, which host cpu0 of testbed 'mixed'"):
        runner.plan_run("mixed", "mixed", {"fault": "gpu-reset"}, dry_run=True)  # fired on the CPU host
    assert runner.plan_run("mixed", "mixed", {}, dry_run=True).ranks[0].host == "gpu0"


def test_a_spec_naming_an_unknown_host_in_hardware_is_refused(tb_home: Path) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "typo.yml").write_text(SPEC.replace("cpu0: {gpu", "cpu1: {gpu"))
    with pytest.raises(UsageError) as e:
        load_testbed("typo")
    assert "hardware.hosts names unknown host 'cpu1'" in e.value.what and "cpu0" in e.value.fix


def test_set_up_hands_each_host_its_own_hardware(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory set-up writes: testbed_hardware per host where the spec says per host (gpu_check, NCCL)."""
    from testbed import setup

    seen: dict[str, object] = {}

    def stop(testbed: str, plan: object, playbook: object, inventory: dict, *a: object, **k: object) -> object:
        seen.update(inventory)
        raise SystemExit(0)

    monkeypatch.setattr(setup, "_probe", stop)
    from testbed.handle import Testbed
    from testbed.state import Host

    tb = Testbed.open("mixed", need_spec=True)
    hosts = [Host(name=n, address=a, port=22, user="u", groups=[], facts={})
             for n, a in (("gpu0", "10.0.0.2"), ("cpu0", "10.0.0.3"))]
    monkeypatch.setattr(Testbed, "hosts", property(lambda self: hosts))
    with pytest.raises(SystemExit):
        setup.apply(tb, roles=["gpu_check"])
    hv = seen["all"]["hosts"]  # type: ignore[index]
    assert hv["cpu0"]["testbed_hardware"]["gpus"] == 0 and hv["cpu0"]["testbed_hardware"]["interface"] == "ens3"
    assert seen["all"]["vars"]["testbed_hardware"]["gpus"] == 2  # type: ignore[index]
