"""The set-up address without hosts: what changes it, what the records say, moving source refs resolved."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.setup import address

INV: dict[str, Any] = {"all": {"hosts": {"n0": {"ansible_host": "n0"}, "n1": {"ansible_host": "n1"}},
                               "vars": {"testbed_name": "tb"}}}


def _parts(roles_dir: Path, **kw: Any) -> dict[str, str]:
    args: dict[str, Any] = {"playbook": [{"roles": [{"role": "r"}]}], "roles": ["r"], "roles_dir": roles_dir,
                            "variables": {"a": 1}, "inventory": INV, **kw}
    return address.common_parts(**args)


def _role(tmp_path: Path) -> Path:
    d = tmp_path / "roles"
    (d / "r" / "tasks").mkdir(parents=True)
    (d / "r" / "tasks" / "main.yml").write_text("- debug: msg=hi\n")
    (d / "r" / "meta").mkdir()
    (d / "r" / "meta" / "main.yml").write_text("dependencies: [dep]\n")
    (d / "dep" / "tasks").mkdir(parents=True)
    (d / "dep" / "tasks" / "main.yml").write_text("- debug: msg=dep\n")
    return d


def test_every_input_moves_the_address_and_is_named(tmp_path: Path) -> None:
    roles = _role(tmp_path)
    base = _parts(roles)
    assert {"plan", "variables", "inventory", "environment", "tools", "role r", "role dep"} <= set(base)
    addr, parts = address.host_address(base, INV, "n0")
    assert address.host_address(_parts(roles), INV, "n0")[0] == addr  # deterministic
    assert address.host_address(base, INV, "n1")[0] != addr  # per host
    (roles / "dep" / "tasks" / "main.yml").write_text("- debug: msg=changed\n")  # a dependency's file
    moved = address.host_address(_parts(roles), INV, "n0")
    assert moved[0] != addr
    rec = address.record("tb", "n0", "p", addr, parts)
    assert address.compare("tb", "n0", "p", *moved, rec).reason == "changed: role dep"
    v = address.compare("tb", "n0", "p", *address.host_address(_parts(roles, variables={"a": 2}), INV, "n0"), rec)
    assert v.reason == "changed: role dep, variables"
    assert address.compare("tb", "n0", "p", addr, parts, rec).unchanged
    assert address.compare("tb", "n0", "q", *moved, rec).reason == "last set-up was 'p'"
    assert address.compare("tb", "n1", "p", addr, parts, rec).reason.startswith("record of another host")
    assert address.compare("tb", "n0", "p", addr, parts, "").reason == "no record of a set-up"
    assert address.compare("tb", "n0", "p", addr, parts, "{oops").reason == "unreadable record"


def test_the_record_holds_hashes_not_values(tmp_path: Path) -> None:
    secret = "https://user:s3cret@index.example/simple"
    parts = _parts(_role(tmp_path), variables={"python_env_pip_index_url": secret})
    rec = address.record("tb", "n0", "p", *address.host_address(parts, INV, "n0"))
    assert "s3cret" not in rec and json.loads(rec)["format"] == address.FORMAT


def test_read_command_keeps_only_a_matching_record(tmp_path: Path) -> None:
    """The host-side commands, run by a real shell with HOME here: print, then keep or remove."""
    addr, other = "ab" * 32, "cd" * 32
    rec = address.record("tb", "n0", "p", addr, {})

    def host(command: str) -> tuple[str, bool]:
        out = subprocess.run(["sh", "-c", command], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, check=True).stdout
        return out, (tmp_path / address.RECORD).exists()

    assert host(address.read_command(addr)) == ("", False)  # no record yet: nothing, and no error
    host(address.write_command(rec))
    assert host(address.read_command(addr)) == (rec, True)  # matches: kept
    assert host(address.read_command(None)) == (rec, True)  # check mode: never removed
    assert host(address.read_command(other)) == (rec, False)  # differs: printed, then removed
    host(address.write_command(rec))
    assert host(address.read_command("")) == (rec, False)  # --verify: always removed
    assert oct((tmp_path / ".cache" / "testbed").stat().st_mode & 0o777) == "0o700"
    with pytest.raises(ValueError):
        address.read_command("x; rm -rf /")


def test_the_probe_leaves_a_pending_mark_until_the_record_is_written(tmp_path: Path) -> None:
    """The probe's command, run by a real shell: a host whose record goes gets a pending mark (not in check mode,
    not where the record matches); writing the record removes it; a record beside a mark is not trusted."""
    addr, other = "ab" * 32, "cd" * 32
    rec, mark = address.record("tb", "n0", "p", addr, {}), address.pending("p")

    def sh(command: str) -> str:
        return subprocess.run(["sh", "-c", command], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, check=True).stdout

    def host(command: str) -> tuple[str, str, bool]:
        out = sh(command)
        found, sep, record = out.partition(f"\n{address.PENDING_MARK}\n")
        assert sep, out
        return found, record, (tmp_path / address.RECORD).exists()

    marked = tmp_path / address.pending_path()
    assert host(address.probe_command(None, mark)) == ("", "", False) and not marked.exists()  # check mode
    assert host(address.probe_command(addr, mark)) == ("", "", False) and marked.read_text() == mark  # no record
    assert host(address.probe_command(addr, mark))[0] == mark  # the mark of the set-up that did not finish
    sh(address.write_command(rec))
    assert not marked.exists()  # finished: the record replaces the mark
    assert host(address.probe_command(addr, mark)) == ("", rec, True) and not marked.exists()  # matches: kept
    assert host(address.probe_command(other, mark)) == ("", rec, False) and marked.exists()  # differs: marked
    sh(address.write_command(rec) + " && " + f"printf %s '{mark}' > \"$HOME/{address.pending_path()}\"")
    assert host(address.probe_command(addr, mark)) == (mark, "", False)  # a record beside a mark is not trusted
    v = address.compare("tb", "n0", "p", addr, {}, rec, mark=mark)
    assert not v.unchanged and v.reason.startswith(address.UNFINISHED + " ('p', started "), v
    assert address.compare("tb", "n0", "p", addr, {}, rec).unchanged
    assert address.pending_path("n0").endswith("setup-n0+pending.json")


def test_a_moving_branch_is_resolved_to_its_commit(tmp_path: Path) -> None:
    repo = tmp_path / "src"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    git("commit", "-q", "--allow-empty", "-m", "one")
    steps = [("source_build", {"source_build_repo": str(repo), "source_build_version": "main"}),
             ("source_build", {"source_build_repo": str(repo), "source_build_version": "abc1234"}),  # a commit
             ("source_build", {"source_build_repo": "{{ x }}", "source_build_version": "main"})]  # a template
    refs = address.source_refs({}, steps, {})
    assert list(refs.values()) == [(str(repo), "main")]
    first = address.source_commits(refs)
    assert list(first.values()) == [git("rev-parse", "HEAD")]
    git("commit", "-q", "--allow-empty", "-m", "two")
    assert address.source_commits(refs) != first
    gone = address.source_commits({"x": (str(tmp_path / "nowhere"), "main")}, timeout=5)
    assert gone == {"x": "unresolved main"}


def test_the_pinned_host_keys_move_every_address_whatever_their_order(tmp_path: Path) -> None:
    roles = _role(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text("n0 ssh-ed25519 AAAAC3Nza0\nn1 ssh-ed25519 AAAAC3Nza1\n")
    base = _parts(roles, known_hosts=kh)
    rec = address.record("tb", "n1", "p", *address.host_address(base, INV, "n1"))
    kh.write_text("n1 ssh-ed25519 AAAAC3Nza1\n\nn0  ssh-ed25519 AAAAC3Nza0\n")  # pinned again: another order
    assert _parts(roles, known_hosts=kh) == base
    kh.write_text("n0 ssh-ed25519 AAAAC3NzaNEW\nn1 ssh-ed25519 AAAAC3Nza1\n")  # n0 rebuilt: a new host key
    for host in ("n0", "n1"):  # every host's address moves, named
        moved = address.host_address(_parts(roles, known_hosts=kh), INV, host)
        assert moved[0] != address.host_address(base, INV, host)[0]
    assert address.compare("tb", "n1", "p", *address.host_address(_parts(roles, known_hosts=kh), INV, "n1"),
                           rec).reason == "changed: host keys"
    assert _parts(roles, known_hosts=tmp_path / "missing") == _parts(roles)  # none pinned
