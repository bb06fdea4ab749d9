"""The local provider on real hosts: up, idempotent, isolated, rebootable, killable, cut off, gone."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from testbed import remote


def _kernel_objects(tag: str) -> dict[str, list[str]]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return {"netns": [ln for ln in ns.splitlines() if f"tb{tag}" in ln],
            "links": [ln for ln in links.splitlines() if f"tb{tag}" in ln],
            "procs": [ln for ln in procs.splitlines()
                      if f"tb{tag}" in ln or ("providers/local/init.py" in ln and tag in ln)]}


def test_up_isolated_idempotent_and_gone(local_testbed):
    t0 = time.monotonic()
    bed = local_testbed(hosts=4)
    up_s = time.monotonic() - t0
    assert [h.name for h in bed.hosts] == ["node0", "node1", "node2", "node3"]
    assert up_s < 60
    # each host answers with its own hostname and address
    res = remote.run(bed.name, [h.name for h in bed.hosts], "hostname; hostname -I", timeout=30)
    for h, r in zip(bed.hosts, res):
        assert r.ok, r
        name, addr = r.stdout.split("\n")[:2]
        assert name == h.name and h.address in addr
    # copy-on-write root: a file written on one host is absent on the others and on the controller
    assert bed.ssh("node0", "echo x > /root/tb-isolation && cat /root/tb-isolation").stdout.strip() == "x"
    assert bed.ssh("node1", "test -e /root/tb-isolation; echo $?").stdout.strip() == "1"
    assert not __import__("os").path.exists("/root/tb-isolation")
    # hosts reach each other by name
    assert bed.ssh("node1", "getent hosts node3").stdout.split()[0] == bed.hosts[3].address
    # idempotent: a second provision keeps the same hosts (same boot id) and is quick
    boot = bed.ssh("node2", "cat /proc/sys/kernel/random/boot_id").stdout
    again = bed.provider.provision()
    assert [h.address for h in again] == [h.address for h in bed.hosts]
    assert bed.ssh("node2", "cat /proc/sys/kernel/random/boot_id").stdout == boot
    tag = bed.provider.tag
    assert _kernel_objects(tag)["netns"]
    bed.provider.destroy()
    left = _kernel_objects(tag)
    assert left == {"netns": [], "links": [], "procs": []}, left
    assert not (bed.home / "testbeds" / bed.name).exists()
    assert bed.store.testbed(bed.name) is None
    bed.provider = None


@pytest.mark.parametrize("broken", ["deleted", "edited", "unset variable"])
def test_destroy_works_from_state_when_the_spec_no_longer_loads(local_testbed, broken):
    import os
    import sys
    from pathlib import Path

    import testbed

    bed = local_testbed(hosts=1, name="gone")
    spec = bed.cwd / "inventories" / "gone.yml"
    if broken == "deleted":
        spec.unlink()
    elif broken == "edited":
        spec.write_text("provider: {kind: local, hosts: -1}\n")
    else:
        spec.write_text("provider: {kind: local}\nuser: ${TB_NEVER_SET_VARIABLE}\n")
    tag = bed.provider.tag
    r = subprocess.run([sys.executable, "-m", "testbed", "destroy", "gone", "--yes"], cwd=bed.cwd, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "TESTBED_HOME": str(bed.home),
                                                    "PYTHONPATH": str(Path(testbed.__file__).parents[1])})
    assert r.returncode == 0, r.stderr
    assert "using the copy recorded when it was provisioned" in " ".join(r.stderr.split())
    assert _kernel_objects(tag) == {"netns": [], "links": [], "procs": []}
    assert bed.store.testbed("gone") is None


def test_reboot_through_ansible_reboot_module(local_testbed):
    bed = local_testbed(hosts=1)
    before = bed.ssh("node0", "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    inv = bed.home / "testbeds" / bed.name / "inventory.yml"
    import os
    import sys

    env = {**os.environ, "ANSIBLE_HOME": str(bed.home / "ansible"), "ANSIBLE_HOST_KEY_CHECKING": "True",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible"), "-i", str(inv), "node0", "-m",
                        "ansible.builtin.reboot", "-a", "reboot_timeout=60"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    after = bed.ssh("node0", "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert after and after != before


def test_kill_and_cut_seen_from_controller(local_testbed):
    bed = local_testbed(hosts=2)
    p = bed.provider
    p.cut_network("node1")
    r = remote.run(bed.name, ["node0", "node1"], "true", timeout=15)
    assert r[0].ok and not r[1].ok
    p.restore_network("node1")
    assert remote.run(bed.name, ["node1"], "true", timeout=15)[0].ok
    p.kill_host("node1")
    r = remote.run(bed.name, ["node1"], "true", timeout=15)[0]
    assert not r.ok and r.error
    assert {h.name: h.state for h in p.refresh()}["node1"] == "down"
    p.provision()  # brings the killed host back
    assert bed.ssh("node1", "hostname").stdout.strip() == "node1"


def test_non_root_user_gets_sudo(local_testbed):
    bed = local_testbed(hosts=1, user="alice")
    r = bed.ssh("node0", "id -un; sudo -n id -u")
    assert r.stdout.split() == ["alice", "0"], r.stderr


def test_status_json_and_exec_with_one_failing_host(local_testbed):
    bed = local_testbed(hosts=3)
    from typer.testing import CliRunner

    from testbed.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["status", bed.name, "--json", "--probe"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert [h["state"] for h in data["hosts"]] == ["up", "up", "up"]
    assert set(data["hosts"][0]) >= {"name", "address", "port", "user", "state"}
    out = runner.invoke(app, ["exec", bed.name, "--json", "--", "test $(hostname) != node1 && echo fine"])
    assert out.exit_code == 1
    rows = json.loads(out.stdout)
    assert [(r["host"], r["exit_code"]) for r in rows] == [("node0", 0), ("node1", 1), ("node2", 0)]
    assert rows[0]["stdout"] == "fine\n" and set(rows[0]) >= {"host", "exit_code", "stdout", "stderr"}


@pytest.mark.parametrize("bad", ["10.213.0.0/33", "127.0.0.0/24", "nonsense"])
def test_bad_subnet_refused(tb_home, bad):
    from testbed.errors import UsageError
    from testbed.spec import load_testbed

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "x.yml").write_text(f"provider:\n  kind: local\n  subnet: {bad}\n")
    with pytest.raises(UsageError) as e:
        load_testbed("x")
    assert "x.yml:3" in e.value.where


def test_destroy_leaves_a_bridge_it_did_not_make(local_testbed):
    """A spec may name an existing bridge: destroy takes back only the address testbed added, never the bridge."""
    import random

    br = f"tbpre{random.randint(1000, 9999)}"
    subprocess.run(["ip", "link", "add", br, "type", "bridge"], check=True)
    try:
        bed = local_testbed(hosts=1, name="onbr", bridge=br)
        assert bed.ssh("node0", "true").returncode == 0
        gw = str(bed.provider.gateway)
        assert gw in subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", br], capture_output=True,
                                    text=True).stdout
        bed.provider.destroy()
        show = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", br], capture_output=True, text=True)
        assert show.returncode == 0, f"destroy deleted the machine's bridge {br}"
        assert gw not in show.stdout
    finally:
        subprocess.run(["ip", "link", "del", br], check=False)
