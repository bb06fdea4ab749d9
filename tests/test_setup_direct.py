"""The per-testbed roles applied without Ansible (testbed.setup.direct): the files it writes are those Ansible's
roles write (checked here against the real ``blockinfile`` module and the roles' own templates, and on real hosts in
tests/test_images.py), and it is used only where that holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.setup import direct
from testbed.setup.profiles import RoleStep, roles_dir

CASES = {  # file name -> (text before, marker, body, insert at the start)
    "new": (None, "testbed ssh_mesh peers", "a\nb", False),
    "append": ("x\ny\n", "testbed ssh_mesh peers", "a", False),
    "no-final-newline": ("x\ny", "testbed ssh_mesh peers", "a\nb", False),
    "replace": ("x\n# BEGIN m\nold\nold2\n# END m\ny\n", "m", "new", False),
    "reversed-markers": ("x\n# END m\nold\n# BEGIN m\ny\n", "m", "new", False),
    "bof": ("Host *\n  User u\n", "testbed ssh_mesh peers", "Host a b\n  Port 22", True),
    "bof-replace": ("# BEGIN m\nHost old\n# END m\nHost *\n", "m", "Host new", True),
    "empty-body": ("x\n", "m", "", False),
}


def test_blocks_are_written_as_ansible_blockinfile_writes_them(tmp_path: Path) -> None:
    """The same files through the real ansible.builtin.blockinfile (one playbook, local connection) and through
    direct.block: byte for byte equal."""
    tasks = []
    for name, (before, marker, body, bof) in CASES.items():
        if before is not None:
            (tmp_path / f"{name}.ansible").write_text(before)
        args = {"path": str(tmp_path / f"{name}.ansible"), "marker": f"# {{mark}} {marker}", "block": body,
                "create": True}
        if bof:
            args["insertbefore"] = "BOF"
        tasks.append({"ansible.builtin.blockinfile": args})
    pb = tmp_path / "pb.json"
    pb.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_HOME": str(tmp_path / "ah"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        str(pb)], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-2000:]
    for name, (before, marker, body, bof) in CASES.items():
        want = (tmp_path / f"{name}.ansible").read_text()
        assert direct.block(before or "", marker, body, bof=bof) == want, name


def test_the_roles_templates_render_the_mesh_and_the_hostfiles() -> None:
    """The role's own templates with its defaults: known_hosts under name and address, the config block, hostfiles."""
    names = ["node0", "node1"]
    hv = {"node0": {"ansible_host": "node0", "testbed_mesh_address": "10.9.0.2"},
          "node1": {"ansible_host": "node1", "testbed_mesh_address": "10.9.0.3"}}
    keys = {n: {"user_key": f"ssh-ed25519 AAAAuser{n} testbed@{n}",
                "host_keys": [f"{hv[n]['testbed_mesh_address']} ssh-ed25519 AAAAhost{n}"]} for n in names}
    ctx = {"ansible_facts": {"user_dir": "/root", "user_id": "root", "python": {"executable": "/usr/bin/python3"}},
           "hostvars": hv, "groups": {"all": names}, "inventory_hostname": "node0", "ssh_mesh_keys": keys,
           "testbed_subnet": "10.9.0.0/24"}
    ctx.update(direct.role_vars(roles_dir(), ["ssh_mesh", "mpi"], ctx))
    assert ctx["ssh_mesh_key_file"] == "~/.ssh/id_ed25519" and ctx["mpi_dir"] == "/root/testbed-mpi"
    assert ctx["mpi_tcp_include"] == "10.9.0.0/24" and ctx["ssh_mesh_user"] == "root"
    files, check = direct._host_files("node0", names, ctx, ["ssh_mesh", "mpi"], roles_dir(), keys,
                                      {n: hv[n]["testbed_mesh_address"] for n in names}, True)
    by = {f["path"]: f for f in files["files"]}
    kh = by["/root/.ssh/known_hosts"]["blocks"][0]["body"]
    assert kh.splitlines() == ["node0,10.9.0.2 ssh-ed25519 AAAAhostnode0", "node1,10.9.0.3 ssh-ed25519 AAAAhostnode1"]
    assert by["/root/.ssh/authorized_keys"]["blocks"][0]["body"].count("AAAAuser") == 2
    cfg = by["/root/.ssh/config"]["blocks"][0]
    assert cfg["bof"] and cfg["body"].splitlines()[0] == "Host node0 10.9.0.2 node1 10.9.0.3"
    assert by["/etc/hosts"]["blocks"][0]["body"].splitlines() == ["10.9.0.2 node0", "10.9.0.3 node1"]
    assert by["/root/testbed-mpi/2_hosts.txt"]["text"].splitlines()[1:] == ["node0 slots=1", "node1 slots=1"]
    assert check["login"] == ["node1", "10.9.0.3"] and [p["name"] for p in check["peers"]] == ["node1"]
    assert check["hello"][:3] == ["mpirun", "-np", "2"] and "--allow-run-as-root" in check["hello"]


@pytest.mark.parametrize(("roles", "steps", "plan_vars", "extra", "hw", "why"), [
    (["ssh_mesh", "mpi"], [RoleStep("mpi")], {"packages_system": []}, {}, {}, ""),
    (["ssh_mesh", "other"], [], {}, {}, {}, "roles other than"),
    (["mpi"], [RoleStep("mpi", vars={"mpi_slots": 2})], {}, {}, {}, "gives role mpi variables"),
    (["mpi"], [RoleStep("mpi", when="x")], {}, {}, {}, "condition"),
    (["ssh_mesh"], [], {"ssh_mesh_port": 2222}, {}, {}, "ssh_mesh_port"),
    (["ssh_mesh"], [], {}, {"testbed_absent_hosts": ["node1"]}, {}, "testbed_absent_hosts"),
    (["ssh_mesh"], [], {}, {}, {"testbed_hardware": {"shared_home": "/home"}}, "share one home"),
])
def test_the_direct_pass_is_used_only_where_it_is_exact(roles, steps, plan_vars, extra, hw, why) -> None:  # type: ignore[no-untyped-def]
    got = direct.why_not(roles, steps, plan_vars, extra, hw)
    assert (why in got) if why else got == ""
