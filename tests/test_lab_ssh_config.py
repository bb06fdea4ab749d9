"""Lab hosts honour the user's own OpenSSH config and ssh-agent, with host keys still pinned per testbed: what the
spec leaves out (user, port, jump host, identity files, an alias's real host name) comes from the config for the
host's address, as a plain ``ssh ADDRESS`` would use it. Checked here on the generated ssh_config, read back by
OpenSSH itself (``ssh -G``: nothing is connected); tests/test_lab_provider.py logs in with an agent-only key
through a jump host on local hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed import ssh
from testbed.errors import TestbedError
from testbed.providers.lab.provider import LabProvider
from testbed.spec import load_testbed
from testbed.state import Store

USER_CONFIG = """\
Host gpu1
  HostName gpu1.cluster.example
  User alice
  Port 2222
  ProxyJump bastion
  IdentityFile ~/.ssh/cluster_key
Host gpu2
  User dave
  Port 2200
Host bastion
  HostName bastion.example.org
  User bob
  IdentityFile "~/.ssh/my keys/bastion"
"""


def _spec(tb_home: Path, extra: str = "", user: str = "") -> None:
    (tb_home / "inventories").mkdir(exist_ok=True)
    (tb_home / "inventories" / "lab.yml").write_text(
        "provider:\n  kind: lab\n  ssh_config: " + str(tb_home / "user_ssh_config") + "\n" + extra
        + "  hosts:\n    - {name: g1, address: gpu1}\n    - {name: g2, address: gpu2, port: 22, user: carol}\n"
        + "    - {name: g3, address: 10.9.9.9}\n" + user)


def _generated(tb_home: Path) -> tuple[list, Path]:
    p = LabProvider(load_testbed("lab"), Store.open_default())
    hosts = p.hosts_from_spec()
    ssh.ensure_keypair("lab")
    return hosts, ssh.write_ssh_config("lab", hosts)


def _g(cfg: Path, host: str) -> dict[str, list[str]]:
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL).stdout
    got: dict[str, list[str]] = {}
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        got.setdefault(k, []).append(v)
    return got


def test_what_the_spec_leaves_out_comes_from_the_users_ssh_config(tb_home: Path) -> None:
    (tb_home / "user_ssh_config").write_text(USER_CONFIG)
    _spec(tb_home)
    hosts, cfg = _generated(tb_home)
    by = {h.name: h for h in hosts}
    g1 = by["g1"]
    assert (g1.address, g1.user, g1.port, g1.proxy_jump) == ("gpu1.cluster.example", "alice", 2222, "bastion")
    assert (by["g2"].user, by["g2"].port) == ("carol", 22)  # the spec's own values win
    assert (by["g3"].address, by["g3"].user, by["g3"].port) == ("10.9.9.9", "root", 22)  # nothing configured
    key = str(ssh.key_path("lab"))
    one = _g(cfg, "g1")  # what OpenSSH makes of the generated config
    assert one["hostname"] == ["gpu1.cluster.example"] and one["user"] == ["alice"] and one["port"] == ["2222"]
    assert one["proxyjump"] == ["bastion"] and one["hostkeyalias"] == ["g1"]
    assert one["identityfile"] == ["~/.ssh/cluster_key", key]  # the user's key, then the testbed's
    assert one["identitiesonly"] == ["no"]  # the ssh-agent's keys are offered too (SSH_AUTH_SOCK)
    # host keys stay pinned in the testbed's own known_hosts, for the lab hosts and for the jump host
    pinned = str(ssh.known_hosts_path("lab"))
    for host in ("g1", "bastion"):
        g = _g(cfg, host)
        assert g["userknownhostsfile"] == [pinned] and g["stricthostkeychecking"] == ["accept-new"], host
    jump = _g(cfg, "bastion")  # the jump host as the user's config defines it
    assert jump["hostname"] == ["bastion.example.org"] and jump["user"] == ["bob"]
    assert jump["identityfile"] == ["~/.ssh/my keys/bastion"]
    assert _g(cfg, "g3")["identityfile"] == [key]


def test_a_key_in_the_spec_is_the_only_key_and_the_config_can_be_ignored(tb_home: Path) -> None:
    (tb_home / "user_ssh_config").write_text(USER_CONFIG)
    mine = tb_home / "id_lab"
    mine.write_text("not really a key\n")
    _spec(tb_home, extra=f"  key: {mine}\n")
    _, cfg = _generated(tb_home)
    one = _g(cfg, "g1")
    assert one["identityfile"] == [str(mine)] and one["identitiesonly"] == ["yes"]
    assert one["user"] == ["alice"] and one["proxyjump"] == ["bastion"]  # the rest still from the config
    # a spec-level user wins over the config's; ssh_config: null ignores the config altogether
    _spec(tb_home, user="user: erin\n")
    hosts, _ = _generated(tb_home)
    assert {h.name: h.user for h in hosts} == {"g1": "erin", "g2": "carol", "g3": "erin"}
    text = (tb_home / "inventories" / "lab.yml").read_text().replace(str(tb_home / "user_ssh_config"), "null")
    (tb_home / "inventories" / "lab.yml").write_text(text)
    hosts, cfg = _generated(tb_home)
    assert hosts[0].address == "gpu1" and hosts[0].proxy_jump is None and hosts[0].port == 22
    assert "bastion" not in cfg.read_text()


def test_a_config_openssh_cannot_read_is_one_message(tb_home: Path) -> None:
    (tb_home / "user_ssh_config").write_text("Host gpu1\n  NoSuchOption yes\n")
    _spec(tb_home)
    with pytest.raises(TestbedError) as ei:
        _generated(tb_home)
    assert "OpenSSH cannot read" in ei.value.what and "ssh_config: null" in (ei.value.fix or "")
    assert ei.value.where == str(tb_home / "user_ssh_config")


def test_a_proxycommand_in_the_users_config_is_honoured(tb_home: Path) -> None:
    """ProxyCommand (a cluster's gateway script, `ssh -W`, a VPN helper) as the user's config gives it, quoted as the
    user quoted it, for the lab hosts and their jump hosts: OpenSSH itself runs it with the same arguments a plain
    ``ssh ADDRESS`` would pass (%n is the address the user would type, not the testbed's name for the host)."""
    proxy_dir = tb_home / "my proxy"
    proxy_dir.mkdir()
    seen = tb_home / "seen"
    script = proxy_dir / "gw.sh"
    script.write_text(f"#!/bin/sh\nprintf '%s|' \"$@\" >> '{seen}'\necho >> '{seen}'\nexit 1\n")
    script.chmod(0o755)
    (tb_home / "user_ssh_config").write_text(
        f'Host gpu1\n  HostName gpu1.cluster.example\n  User alice\n  Port 2222\n'
        f'  ProxyCommand "{script}" %h %p %r %n "a b" \'%%\'\n'
        f'Host gpu2\n  ProxyJump bastion\nHost bastion\n  HostName bastion.example.org\n'
        f'  ProxyCommand "{script}" jump %h %n\n')
    _spec(tb_home)
    hosts, cfg = _generated(tb_home)
    by = {h.name: h for h in hosts}
    assert by["g1"].proxy_jump is None and by["g2"].proxy_jump == "bastion"
    one = _g(cfg, "g1")
    assert one["proxycommand"] == [f'"{script}" %h %p %r gpu1 "a b" \'%%\''] and "proxyjump" not in one
    assert _g(cfg, "bastion")["proxycommand"] == [f'"{script}" jump %h bastion']
    assert "proxycommand" not in _g(cfg, "g3")
    for host in ("g1", "g2"):  # OpenSSH runs the commands (each exits 1: nothing is reached)
        r = subprocess.run(["ssh", "-F", str(cfg), "-o", "ControlMaster=no", host, "true"], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=30, check=False)
        assert r.returncode == 255, r.stderr
    assert seen.read_text().splitlines() == ["gpu1.cluster.example|2222|alice|gpu1|a b|%|",
                                             "jump|bastion.example.org|bastion|"]
    # a jump host in the spec wins over the config's ProxyCommand, as the first of the two wins in OpenSSH
    _spec(tb_home, extra="  proxy_jump: gw.example.org\n")
    _, cfg = _generated(tb_home)
    one = _g(cfg, "g1")
    assert one["proxyjump"] == ["gw.example.org"] and "proxycommand" not in one


def test_host_keys_pinned_from_many_threads_at_once_are_all_kept(tb_home: Path) -> None:
    """A provision pins its hosts from many threads: each pin rewrites known_hosts, and none is lost."""
    import threading

    hosts = [f"node{i}" for i in range(64)]
    threads = [threading.Thread(target=ssh.pin_host_keys, args=("many", h, [f"ssh-ed25519 KEY{h} c"])) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(ssh.pinned_keys("many", h) == {f"ssh-ed25519 KEY{h}"} for h in hosts)
    ssh.pin_many("many", {"node1": ["ssh-ed25519 NEW"], "node2": []})  # replaced, and dropped
    assert ssh.pinned_keys("many", "node1") == {"ssh-ed25519 NEW"} and not ssh.pinned_keys("many", "node2")
    assert len(ssh.known_hosts_path("many").read_text().splitlines()) == 63
