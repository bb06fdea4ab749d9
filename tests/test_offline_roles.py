"""A user's role that reaches the network is refused on a testbed whose hosts have none, in one line naming the
task's file and line, before any host is touched (it would otherwise wait on a mirror for minutes, silent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.setup.reach import network_tasks, shipped


def _role(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / "tasks").mkdir(parents=True, exist_ok=True)
        (root / "tasks" / name).write_text(text)
    return root


@pytest.mark.parametrize("task, why", [
    ("ansible.builtin.apt:\n    name: curl\n", "apt module"),
    ("apt:\n    name: [curl]\n    update_cache: true\n", "apt module"),
    ("ansible.builtin.get_url:\n    url: https://example.org/x\n    dest: /tmp/x\n    mode: '0644'\n", "get_url"),
    ("ansible.builtin.git:\n    repo: https://example.org/x.git\n    dest: /tmp/x\n", "git module"),
    ("ansible.builtin.pip:\n    name: torch\n", "pip installs from an index"),
    ("ansible.builtin.shell: cd /tmp && curl -fsSL https://example.org/x | tar x\n", "'curl'"),
    ("ansible.builtin.command:\n    cmd: git clone https://example.org/x.git /tmp/x\n", "'git clone'"),
    ("ansible.builtin.shell: pip install --user numpy\n", "'pip install'"),
    ("ansible.builtin.unarchive:\n    src: https://example.org/x.tgz\n    dest: /tmp\n    remote_src: true\n",
     "unarchive downloads"),
    ("community.general.npm:\n    name: left-pad\n", "npm module"),
])
def test_each_kind_of_download_is_found_with_its_line(tmp_path: Path, task: str, why: str) -> None:
    role = _role(tmp_path / "mine", {"main.yml": "- name: Harmless\n  ansible.builtin.debug:\n    msg: hi\n"
                                                 f"- name: Fetch it\n  {task}"})
    found = network_tasks(role)
    assert [(t.name, t.line) for t in found] == [("Fetch it", 4)]
    assert why in found[0].why


@pytest.mark.parametrize("task", [
    "ansible.builtin.pip:\n    name: torch\n    extra_args: --no-index --find-links /wheels\n",
    "ansible.builtin.shell: pip install --no-index --find-links /wheels torch\n",
    "ansible.builtin.apt:\n    deb: /tmp/x.deb\n",
    "ansible.builtin.apt:\n    name: curl\n    state: absent\n",
    "ansible.builtin.unarchive:\n    src: files/x.tgz\n    dest: /tmp\n",
    "ansible.builtin.copy:\n    src: x\n    dest: /tmp/x\n    mode: '0644'\n",
])
def test_what_stays_on_the_host_is_not_refused(tmp_path: Path, task: str) -> None:
    role = _role(tmp_path / "mine", {"main.yml": f"- name: Local\n  {task}"})
    assert network_tasks(role) == []


def test_a_condition_excuses_a_task_or_a_block(tmp_path: Path) -> None:
    """``when: not testbed_offline`` is the guard to write; any condition may keep a task from running (the shipped
    shell role installs its shell only when the host lacks it), so a conditional task is left to Ansible."""
    role = _role(tmp_path / "mine", {"main.yml": (
        "- name: Guarded\n  ansible.builtin.apt:\n    name: curl\n  when: not testbed_offline\n"
        "- name: A guarded block\n  when: [x is defined, not (testbed_offline | bool)]\n  block:\n"
        "    - name: Inside\n      ansible.builtin.get_url:\n        url: https://example.org\n        dest: /tmp/y\n"
        "- name: An unguarded block\n  block:\n"
        "    - name: Deep inside\n      ansible.builtin.git:\n        repo: https://example.org/x.git\n"
        "        dest: /tmp/x\n")})
    assert [(t.name, t.line) for t in network_tasks(role)] == [("Deep inside", 14)]


def test_included_task_files_are_read_and_a_loop_of_includes_ends(tmp_path: Path) -> None:
    role = _role(tmp_path / "mine", {
        "main.yml": "- name: More\n  ansible.builtin.include_tasks: more.yml\n",
        "more.yml": "- name: Back\n  ansible.builtin.import_tasks: main.yml\n"
                    "- name: Fetch\n  ansible.builtin.shell: wget -q https://example.org/x\n",
    })
    found = network_tasks(role)
    assert [(t.name, t.file.name, t.line) for t in found] == [("Fetch", "more.yml", 3)]


def test_a_task_file_that_does_not_parse_is_left_to_ansible(tmp_path: Path) -> None:
    role = _role(tmp_path / "mine", {"main.yml": "- name: Oops\n  ansible.builtin.debug:\n    msg: [unclosed\n"})
    assert network_tasks(role) == []


def test_the_shipped_roles_are_told_apart_from_a_users() -> None:
    from testbed.setup.profiles import role_folders

    folders = role_folders()
    assert folders and all(shipped(f) for f in folders.values())
    assert not shipped(Path("/tmp/playbooks/roles/mine"))
