"""The lab provider against local-testbed hosts used as existing static machines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed.cli import app
from testbed.errors import TestbedError

pytestmark = pytest.mark.local


def _lab_spec(cwd: Path, bed, extra_hosts: str = "") -> None:
    key = Path(bed.home) / "testbeds" / bed.name / "id_ed25519"
    lines = ["provider:", "  kind: lab", f"  key: {key}", "  connect_timeout: 3", "  hosts:"]
    lines += [f"    - {{name: lab{i}, address: {h.address}}}" for i, h in enumerate(bed.hosts)]
    (cwd / "inventories" / "lab.yml").write_text("\n".join(lines) + extra_hosts + "\nuser: root\nprofile: base\n")


def test_lab_hosts_checked_in_parallel_and_pinned(local_testbed) -> None:
    bed = local_testbed(hosts=3, name="machines")
    _lab_spec(Path(bed.cwd), bed)
    r = CliRunner().invoke(app, ["provision", "lab", "--json"])
    assert r.exit_code == 0, (r.stdout, r.exception)
    hosts = json.loads(r.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["lab0", "lab1", "lab2"]
    assert all(h["state"] == "up" and h["facts"]["cpus"] >= 1 for h in hosts)
    # host keys were pinned on first use under the lab host names
    kh = (Path(bed.home) / "testbeds" / "lab" / "known_hosts").read_text()
    assert all(f"lab{i} " in kh for i in range(3))
    r = CliRunner().invoke(app, ["exec", "lab", "--json", "--", "hostname"])
    assert [x["stdout"].strip() for x in json.loads(r.stdout)] == ["node0", "node1", "node2"]
    # a changed host key is refused with a clear message (simulate a rebuilt machine)
    lines = [ln if not ln.startswith("lab1 ") else "lab1 " + ln.split(" ", 1)[1][::-1] for ln in kh.splitlines()]
    bogus = [ln for ln in lines if ln.startswith("lab1 ")]
    assert bogus
    other = bed.hosts[0]  # pin lab1 to another host's real key instead of garbage
    from testbed import ssh

    ssh.pin_host_keys("lab", "lab1", ssh.scan_host_keys(other.address))
    from testbed import remote

    ssh.close_connections("lab", ["lab1"])
    res = remote.run("lab", ["lab1"], "true", timeout=20)[0]
    assert not res.ok and "host key of lab1 changed" in (res.error or ""), res
    r = CliRunner().invoke(app, ["destroy", "lab"])
    assert r.exit_code == 0
    # lab machines are never touched by destroy
    assert bed.ssh("node1", "true").returncode == 0


def test_unreachable_lab_host_is_named_with_its_ssh_error(local_testbed) -> None:
    bed = local_testbed(hosts=2, name="machines")
    _lab_spec(Path(bed.cwd), bed, "\n    - {name: gone, address: 127.0.0.1, port: 1}")
    bed.provider.cut_network("node1")
    from testbed.providers.lab import LabProvider
    from testbed.spec import load_testbed
    from testbed.state import Store

    p = LabProvider(load_testbed("lab"), Store(Path(bed.home) / "state.db"))
    with pytest.raises(TestbedError) as e:
        p.provision()
    msg = e.value.what
    assert "2 of 3 lab hosts are unreachable" in msg
    assert "lab1" in msg and "gone" in msg and "refused" in msg.lower()
    assert "lab0" not in msg.split("unreachable:")[1]
    assert e.value.fix and "authorized_keys" in e.value.fix
    states = {h.name: h.state for h in p.store.hosts("lab")}
    assert states == {"lab0": "up", "lab1": "unreachable", "gone": "unreachable"}


def test_lab_repair_waits_for_a_rebooted_machine_and_names_one_that_stays_down(local_testbed) -> None:
    """testbed cannot remake a lab machine: repair waits for it to answer again (a reboot), leaves the other
    hosts' records alone, and when it never answers says to power-cycle it."""
    import threading

    bed = local_testbed(hosts=2, name="machines")
    _lab_spec(Path(bed.cwd), bed, "\n  ssh_timeout: 20")
    r = CliRunner().invoke(app, ["provision", "lab", "--json"])
    assert r.exit_code == 0, (r.stdout, r.exception)
    from testbed.handle import Testbed

    tb = Testbed.open("lab")
    lab0 = next(h for h in tb.hosts if h.name == "lab0")
    bed.provider.kill_host("node1")
    threading.Timer(3, bed.provider.repair, args=("node1",)).start()  # the machine comes back from its reboot
    done = tb.repair("lab1", setup=False)
    assert done.hosts == ["lab1"] and done.replaced == [] and done.repair_seconds >= 2
    assert next(h for h in tb.hosts if h.name == "lab0").to_dict() == lab0.to_dict()
    assert [h.state for h in tb.hosts] == ["up", "up"]
    bed.provider.kill_host("node1")
    spec = (Path(bed.cwd) / "inventories" / "lab.yml").read_text().replace("ssh_timeout: 20", "ssh_timeout: 5")
    (Path(bed.cwd) / "inventories" / "lab.yml").write_text(spec)
    with pytest.raises(TestbedError) as ei:
        Testbed.open("lab").repair("lab1", setup=False)
    assert "lab host lab1" in ei.value.what and "did not answer within 5 s" in ei.value.what
    assert "power-cycle lab1" in (ei.value.fix or "")
