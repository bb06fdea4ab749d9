"""Nothing of a testbed stays in /tmp after destroy: no SSH control folder, socket or master connection."""

from __future__ import annotations

import os
from pathlib import Path

from leftovers import control_dirs_under

from testbed import remote, setup, ssh

MADE_BY_TESTBED = ("tbcm-", "tbac-", "testbed-")  # control folders (ours, Ansible's before), temporary files


def _tmp_entries(home: Path) -> set[str]:
    """What testbed made in /tmp: its prefixes, less the control folders that other testbeds own (other homes:
    tests running beside this one)."""
    others = {d.name for d, owner in ssh.control_dirs() if owner is not None and not owner.is_relative_to(home)}
    return {n for n in os.listdir("/tmp") if n.startswith(MADE_BY_TESTBED)} - others


def _masters(cdir: Path) -> list[int]:
    """Processes whose command line names a socket in ``cdir`` (ssh masters)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if str(cdir).encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def test_provision_exec_setup_destroy_leave_nothing_in_tmp(local_testbed, tmp_path):
    before = _tmp_entries(tmp_path)
    bed = local_testbed(hosts=2)
    names = [h.name for h in bed.hosts]
    cdir = ssh.control_dir(bed.name, make=False)
    assert cdir.is_dir() and (cdir / ssh.CONTROL_OWNER).read_text().strip() == str(bed.home / "testbeds/tb")
    assert all(r.ok for r in remote.run(bed.name, names, "true", mux="auto")), "exec"  # masters started
    res = setup.apply(bed.name, roles=["shell"], extra_vars={"shell_name": "bash"})
    assert res.ok, res
    sockets = [p for p in cdir.rglob("*") if p.is_socket()]
    assert {p.parent.name for p in sockets} == {cdir.name, "ansible"}, sockets  # testbed's and Ansible's masters
    assert _masters(cdir)

    bed.provider.destroy()
    assert not cdir.exists() and control_dirs_under(tmp_path) == []
    assert _masters(cdir) == []  # every master stopped, Ansible's too
    assert _tmp_entries(tmp_path) - before == set()
