"""The lab provider against local-testbed hosts used as existing static machines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed import ssh
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

    from testbed import remote

    ssh.pin_host_keys("lab", "lab1", remote.scan_host_keys(other.address))

    remote.close_connections("lab", ["lab1"])
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
    from testbed.providers.lab.provider import LabProvider
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


def test_lab_hosts_log_in_as_the_users_own_ssh_would(local_testbed, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec naming only aliases of the user's ~/.ssh/config (its own file here): gpu0 takes a key held only by
    the ssh-agent (deleted from disk); gpu1 takes only the IdentityFile the config names, and only from the jump
    host's address (``from=`` in its authorized_keys), so it answers only through the config's ProxyJump. The
    testbed's own key is authorized nowhere. Host keys are pinned in the testbed's known_hosts."""
    import os
    import re
    import signal
    import subprocess

    bed = local_testbed(hosts=3, name="machines")
    node0, node1, node2 = (h.address for h in bed.hosts)
    for k in ("agent_only", "cluster"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / k)], check=True)
    agent_pub = (tmp_path / "agent_only.pub").read_text().strip()
    file_pub = (tmp_path / "cluster.pub").read_text().strip()
    for host, line in (("node0", agent_pub), ("node2", agent_pub), ("node1", f'from="{node2}" {file_pub}')):
        r = bed.ssh(host, f"mkdir -p ~/.ssh && printf '%s\\n' '{line}' >> ~/.ssh/authorized_keys")
        assert r.returncode == 0, r.stderr
    sock = tmp_path / "agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True).stdout
    pid = int(re.search(r"SSH_AGENT_PID=(\d+)", out)[1])  # type: ignore[index]
    try:
        subprocess.run(["ssh-add", "-q", str(tmp_path / "agent_only")], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        (tmp_path / "agent_only").unlink()  # the agent holds the only copy
        (tmp_path / "user_config").write_text(
            f"Host gpu0\n  HostName {node0}\n  User root\nHost jump\n  HostName {node2}\n  User root\n"
            f"Host gpu1\n  HostName {node1}\n  ProxyJump jump\n  IdentityFile {tmp_path / 'cluster'}\n")
        (Path(bed.cwd) / "inventories" / "lab.yml").write_text(
            f"provider:\n  kind: lab\n  ssh_config: {tmp_path / 'user_config'}\n  connect_timeout: 5\n"
            "  hosts:\n    - {name: gpu0, address: gpu0}\n    - {name: gpu1, address: gpu1}\nprofile: base\n")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        r = CliRunner().invoke(app, ["provision", "lab", "--json"])
        assert r.exit_code == 0, (r.stdout, r.exception)
        hosts = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
        assert hosts["gpu0"]["address"] == node0 and hosts["gpu1"]["proxy_jump"] == "jump"
        assert all(h["state"] == "up" for h in hosts.values()), hosts
        r = CliRunner().invoke(app, ["exec", "lab", "--json", "--", "hostname"])
        assert [x["stdout"].strip() for x in json.loads(r.stdout)] == ["node0", "node1"]
        pinned = (Path(bed.home) / "testbeds" / "lab" / "known_hosts").read_text()
        assert re.search(r"(?m)^gpu0 ", pinned) and re.search(r"(?m)^gpu1 ", pinned)
        assert node2 in pinned  # the jump host's key is pinned too
        # the agent was what let gpu0 in: without it, gpu0 refuses (gpu1 still takes the config's key file)
        from testbed import remote

        remote.close_connections("lab", ["gpu0", "gpu1"])
        monkeypatch.delenv("SSH_AUTH_SOCK")
        res = {x.host: x for x in remote.run("lab", ["gpu0"], "true", timeout=20, mux="none")}
        assert not res["gpu0"].ok and "Permission denied" in (res["gpu0"].stderr + (res["gpu0"].error or ""))
    finally:
        os.kill(pid, signal.SIGTERM)
        CliRunner().invoke(app, ["destroy", "lab", "--yes"])
