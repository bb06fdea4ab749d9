"""A login account without sudo (``hardware.sudo: false``, a student's lab account) is as strict on local hosts as
on the real machines: the user gets no sudo there, and set-up covers the home and environments, a role that needs
root failing with the role's name and what to do."""

from __future__ import annotations

from typing import Any

from testbed import setup


def test_an_account_without_sudo_gets_none_and_a_role_that_needs_root_says_so(local_testbed: Any) -> None:
    bed = local_testbed(hosts=1, name="nosudo", user="alice", hardware={"sudo": False})
    r = bed.ssh("node0", "id -un; sudo -n true")
    assert r.stdout.split()[:1] == ["alice"] and r.returncode != 0, (r.stdout, r.stderr)
    res = setup.apply(bed.name, roles=["packages"], extra_vars={"packages_system": ["cowsay"]})  # not installed here
    assert not res.ok
    h = res.hosts["node0"]
    assert h.failed and "packages" in (h.error_task or "") and "no root" in (h.error or ""), h
    assert "ask the cluster's admins" in (h.error or "") and "cowsay" in (h.error or "")
    fine = setup.apply(bed.name, roles=["packages"], extra_vars={"packages_system": ["openssh-server"]})
    assert fine.ok, fine.to_json()  # what is installed needs no root


def test_the_same_account_with_sudo_may_become_root(local_testbed: Any) -> None:
    bed = local_testbed(hosts=1, name="sudo", user="alice")
    r = bed.ssh("node0", "sudo -n id -un")
    assert r.returncode == 0 and r.stdout.strip() == "root", (r.stdout, r.stderr)


def test_a_replica_of_an_account_without_sudo_has_none(tmp_path: Any) -> None:
    from testbed.rehearse import replica_spec
    from testbed.spec import load_testbed
    from testbed.suite import load_suite

    spec = tmp_path / "lab.yml"
    spec.write_text("provider: {kind: lab, hosts: [{name: a, address: a.example}]}\nuser: alice\n"
                    "hardware: {sudo: false}\n")
    replica = replica_spec(load_testbed(str(spec)), load_suite("mpi-hello"), [{}], "10.219.0.0/24")
    assert replica["user"] == "alice" and replica["hardware"]["sudo"] is False
