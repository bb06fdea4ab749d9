"""A user's ``playbooks/roles`` adds to the shipped roles and never hides them: a role of a new name runs beside
the shipped ones, a role of a shipped name overrides it with a notice, and a broken user role fails with its file,
line and Ansible's words in the one error."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import setup


@pytest.fixture
def bed(shared_local_testbed: Any) -> Iterator[Any]:
    yield shared_local_testbed
    shutil.rmtree(Path(shared_local_testbed.cwd) / "playbooks", ignore_errors=True)


def _role(cwd: Path, name: str, tasks: str) -> Path:
    d = cwd / "playbooks" / "roles" / name / "tasks"
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.yml").write_text(tasks)
    return d.parent


def test_a_user_role_runs_beside_the_shipped_ones(bed: Any) -> None:
    _role(Path(bed.cwd), "mine", "- name: Leave a mark\n  ansible.builtin.copy:\n    content: mine\n"
                                 "    dest: /tmp/user-role-mark\n    mode: '0644'\n")
    res = setup.apply(bed.name, roles=["ssh_mesh", "mine"])
    assert res.ok, res.to_json()
    assert res.overrides == {}
    assert bed.ssh("node1", "cat /tmp/user-role-mark").stdout == "mine"
    assert "ssh_mesh" in setup.available_roles() and "mine" in setup.available_roles()


def test_a_user_role_of_a_shipped_name_overrides_it_and_says_so(bed: Any) -> None:
    folder = _role(Path(bed.cwd), "memlock", "- name: Mine instead\n  ansible.builtin.debug:\n    msg: mine\n")
    res = setup.apply(bed.name, roles=["memlock", "shell"])
    assert res.ok, res.to_json()
    assert res.overrides == {"memlock": str(folder.resolve())}


def test_a_broken_user_role_names_its_file_and_line(bed: Any) -> None:
    _role(Path(bed.cwd), "broken", "- name: Oops\n  ansible.builtin.debug:\n    msg: [unclosed\n")
    res = setup.apply(bed.name, roles=["broken"])
    assert not res.ok
    said = (res.error or "") + " ".join(h.error or "" for h in res.hosts.values())
    assert "broken/tasks/main.yml" in said, res.to_json()


def test_a_user_role_that_downloads_is_refused_on_offline_hosts_before_any_host(bed: Any) -> None:
    from testbed.errors import UsageError

    _role(Path(bed.cwd), "fetcher", "- name: Leave a mark\n  ansible.builtin.copy:\n    content: ran\n"
                                    "    dest: /tmp/fetcher-mark\n    mode: '0644'\n"
                                    "- name: Get curl\n  ansible.builtin.apt:\n    name: curl\n")
    bed.ssh("node1", "rm -f /tmp/fetcher-mark")
    with pytest.raises(UsageError) as e:
        setup.apply(bed.name, roles=["ssh_mesh", "fetcher"])
    said = str(e.value) + " " + (e.value.where or "")
    assert "role 'fetcher' reaches the network in task 'Get curl'" in said
    assert "fetcher/tasks/main.yml:6" in said and "testbed_offline" in (e.value.fix or "")
    assert bed.ssh("node1", "test -e /tmp/fetcher-mark; echo $?").stdout.strip() == "1"  # nothing ran
