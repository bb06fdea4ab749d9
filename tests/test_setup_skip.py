"""Set-up that knows when to skip, on real local hosts with real Ansible: a re-run whose recorded address matches
is skipped without Ansible, any change re-runs where it matters, --verify finds drift, a failed or interrupted
set-up leaves no address.

One 4-host local testbed for the module; the ``shell`` role (with the base profile's variables) is the set-up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from localbed import probe_wheel

from testbed import remote, setup
from testbed.errors import UsageError

pytestmark = [pytest.mark.local, pytest.mark.slow]
ROLES = ["shell"]
UNFINISHED_SHELL = "an earlier set-up did not finish ('roles: shell', started "  # the reason a re-run gives


@pytest.fixture(scope="module")
def bed(shared_local_testbed: Any) -> Any:
    return shared_local_testbed


def _apply(bed: Any, **kw: Any) -> tuple[setup.SetupResult, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    res = setup.apply(bed.name, roles=ROLES, on_event=seen.append, **kw)
    return res, seen


def _ok(bed: Any, **kw: Any) -> tuple[setup.SetupResult, list[dict[str, Any]]]:
    res, seen = _apply(bed, **kw)
    assert res.ok, res.to_json()
    return res, seen


def _names(bed: Any) -> list[str]:
    return [h.name for h in bed.hosts]


def _record(bed: Any, host: str) -> str:
    return bed.ssh(host, "cat ~/.cache/testbed/setup.json 2>/dev/null || true").stdout


def _runs(bed: Any) -> int:
    d = bed.home / "ansible" / "runs" / bed.name / "artifacts"
    return len(list(d.iterdir())) if d.is_dir() else 0


def test_unchanged_rerun_is_skipped_without_ansible(bed: Any) -> None:
    first, seen = _ok(bed, verify=True)  # whatever the bed held before: now applied and recorded
    assert first.ran and seen and not first.unchanged and set(first.hosts) == set(_names(bed))
    for name in _names(bed):
        rec = json.loads(_record(bed, name))
        assert rec["host"] == name and rec["testbed"] == bed.name and len(rec["address"]) == 64
        assert bed.spec.provider.subnet.split("/")[0] not in json.dumps(rec)  # hashes, never values
    runs = _runs(bed)
    t = time.monotonic()
    again, seen = _ok(bed)
    took = time.monotonic() - t
    assert not again.ran and again.status == "skipped" and seen == [], again.to_json()
    assert sorted(again.unchanged) == sorted(_names(bed)) and again.changed == 0
    assert {h.status for h in again.hosts.values()} == {"unchanged"}
    assert _runs(bed) == runs  # no ansible-runner artifact directory: Ansible never started
    assert took < 0.5 * first.elapsed, (took, first.elapsed)


def test_a_changed_variable_reruns_everywhere_then_skips(bed: Any) -> None:
    _ok(bed)
    res, seen = _ok(bed, extra_vars={"tb_skip_probe": "1"})
    assert res.ran and seen and not res.unchanged
    assert all("variables" in r for r in res.reasons.values()) and set(res.reasons) == set(_names(bed)), res.reasons
    again, seen = _ok(bed, extra_vars={"tb_skip_probe": "1"})
    assert not again.ran and not seen


def test_a_changed_role_file_reruns(bed: Any) -> None:
    _ok(bed)
    copy = Path(bed.cwd) / "playbooks" / "roles"  # a playbooks/roles in the working directory is the one used
    shutil.copytree(setup.roles_dir(), copy)
    try:
        assert setup.roles_dir().resolve() == copy.resolve()
        with (copy / "shell" / "tasks" / "main.yml").open("a") as f:
            f.write("# edited by test_setup_skip\n")
        res, seen = _ok(bed)
        assert res.ran and seen and set(res.reasons) == set(_names(bed))
        assert all("role shell" in r and "variables" not in r for r in res.reasons.values()), res.reasons
        again, _ = _ok(bed)
        assert not again.ran
    finally:
        shutil.rmtree(Path(bed.cwd) / "playbooks")


def test_a_removed_record_reruns_only_that_host(bed: Any) -> None:
    _ok(bed)
    assert bed.ssh("node1", "rm ~/.cache/testbed/setup.json").returncode == 0
    res, seen = _ok(bed)
    assert res.ran and res.reasons == {"node1": "no record of a set-up"}, res.to_json()
    assert sorted(res.unchanged) == sorted(n for n in _names(bed) if n != "node1")
    hosts_seen = {(e.get("event_data") or {}).get("host") for e in seen} - {None}
    assert hosts_seen == {"node1"}, hosts_seen  # Ansible ran on node1 only
    assert res.hosts["node1"].status == "ok" and res.hosts["node2"].status == "unchanged"
    assert _record(bed, "node1")
    assert not _ok(bed)[0].ran


def test_verify_finds_drift_and_sets_it_right(bed: Any) -> None:
    _ok(bed)
    assert bed.ssh("node2", "usermod -s /bin/sh root").returncode == 0  # behind testbed's back
    remote.control(bed.name, "node2", "exit")  # the next probe's connection logs in with /bin/sh
    plain, _ = _ok(bed)
    assert not plain.ran  # the record still matches: only --verify looks at the host itself
    res, _ = _ok(bed, verify=True)
    assert res.ran and not res.unchanged and set(res.reasons.values()) == {"--verify"}
    assert set(res.drift) == {"node2"}, res.drift
    assert any("login shell" in c for c in res.drift["node2"]), res.drift
    assert bed.ssh("node2", "getent passwd root").stdout.strip().endswith("bash")
    # a multiplexed session (testbed exec) logs in anew: the probe's connection predates the shell set again
    assert remote.run(bed.name, ["node2"], 'echo "$SHELL"')[0].stdout.strip().endswith("bash")
    assert not _ok(bed)[0].ran


def test_verify_in_check_mode_reports_drift_and_changes_nothing(bed: Any) -> None:
    _ok(bed)
    assert bed.ssh("node3", "usermod -s /bin/sh root").returncode == 0
    res, _ = _ok(bed, verify=True, check=True)
    assert res.check and set(res.drift) == {"node3"}, res.drift
    assert bed.ssh("node3", "getent passwd root").stdout.strip().endswith("/bin/sh")
    assert _record(bed, "node3")  # check mode neither removes nor writes records
    _ok(bed, verify=True)


def test_a_failed_apply_leaves_no_address(bed: Any) -> None:
    _ok(bed)
    bad, _ = _apply(bed, extra_vars={"shell_name": "tb-no-such-shell"})
    assert not bad.ok and all(h.failed for h in bad.hosts.values())
    assert all(_record(bed, n) == "" for n in _names(bed))
    res, _ = _ok(bed)
    assert res.ran and sorted(res.unfinished) == sorted(_names(bed)), res.to_json()
    assert all(r.startswith(UNFINISHED_SHELL) for r in res.reasons.values()), res.reasons


def test_an_interrupted_apply_leaves_no_address(bed: Any) -> None:
    _ok(bed)
    sent: list[int] = []

    def interrupt(ev: dict[str, Any]) -> None:
        """Ctrl-C as a user gives it, as soon as the first task starts on a host."""
        if ev.get("event") == "runner_on_start" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        setup.apply(bed.name, roles=ROLES, verify=True, on_event=interrupt)  # the same address as recorded
    assert sent
    assert all(_record(bed, n) == "" for n in _names(bed))
    res, _ = _ok(bed)
    assert res.ran and sorted(res.unfinished) == sorted(_names(bed)), res.to_json()
    assert all(r.startswith(UNFINISHED_SHELL) for r in res.reasons.values()), res.reasons


def test_cli_says_skipped(bed: Any) -> None:
    _ok(bed)
    env = {**os.environ, "TESTBED_HOME": str(bed.home)}
    r = subprocess.run([sys.executable, "-m", "testbed", "setup", bed.name, "--role", "shell"], cwd=bed.cwd,
                       capture_output=True, text=True, timeout=120, env=env, check=False)
    assert r.returncode == 0 and f"skipped: unchanged on {len(bed.hosts)} hosts" in r.stdout, (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "testbed", "setup", bed.name, "--role", "shell", "--json"],
                       cwd=bed.cwd, capture_output=True, text=True, timeout=120, env=env, check=False)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["ran"] is False and data["status"] == "skipped"


def test_verify_named_hosts_runs_them_and_skips_the_others(bed: Any) -> None:
    """``verify=[hosts]`` (what a repair uses): Ansible runs on those hosts whatever their record says, the others
    whose record matches are skipped."""
    _ok(bed)
    res, seen = _ok(bed, verify=["node1"])
    assert res.ran and res.reasons == {"node1": "--verify"} and not res.verify, res.to_json()
    assert sorted(res.unchanged) == sorted(n for n in _names(bed) if n != "node1")
    hosts_seen = {(e.get("event_data") or {}).get("host") for e in seen} - {None}
    assert hosts_seen == {"node1"}, hosts_seen
    with pytest.raises(UsageError) as ei:
        setup.apply(bed.name, roles=ROLES, verify=["node9"])
    assert ei.value.what == "verify names unknown host 'node9'"


def test_a_new_pinned_host_key_reruns_every_host(bed: Any) -> None:
    """The testbed's pinned host keys are part of every host's address (a host rebuilt with a new disk changes
    them); pinning the same keys again in another order changes nothing. A record that differs only in the hosts
    (keys, inventory) runs only the roles that depend on the other hosts (ssh_mesh, mpi): shell does not, so
    nothing runs and the new address is recorded."""
    from testbed import ssh

    _ok(bed)
    kh = ssh.known_hosts_path(bed.name)
    saved = kh.read_text()
    try:
        kh.write_text("\n".join(reversed(saved.splitlines())) + "\n")  # the same pins, another order
        again, _ = _ok(bed)
        assert not again.ran, again.to_json()
        with kh.open("a") as f:
            f.write("node9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRlc3RiZWQtbm90LWEtcmVhbC1rZXktanVzdC1ieXRlcw\n")
        res, _ = _ok(bed)
        assert set(res.reasons) == set(_names(bed)) and set(res.partial) == set(_names(bed)), res.to_json()
        assert all(r == "changed: host keys" for r in res.reasons.values()), res.reasons
        assert not res.ran and res.partial_roles == [], res.to_json()
        assert not _ok(bed)[0].ran  # recorded: the new pins are part of the address now
    finally:
        kh.write_text(saved)
    _ok(bed)  # recorded again with the real pins


UNFINISHED_PROFILE = """description: a venv with tbprobe, downloaded once on the controller (python_env's wheelhouse)
roles:
  - role: python_env
    vars:
      python_env_path: "{{{{ ansible_facts.user_dir }}}}/tb-unfinished-env"
      python_env_pip_packages: [tbprobe==1.0]
      python_env_pip_no_index: true
      python_env_pip_find_links: [{wheels}]
      python_env_wheelhouse: true
      python_env_verify_imports: [tbprobe]
"""


def test_a_set_up_stopped_by_one_hosts_failure_is_recorded_nowhere_and_runs_again(bed: Any,
                                                                                  tmp_path: Path) -> None:
    """Issue 41: the wheelhouse download (``run_once`` on the controller) fails, which Ansible counts as node0's
    failure and which ends the play on every host. No host may be recorded as set up (the others never installed
    the wheel); the plain re-run (the wheel now there) runs on every host, says why, and sets each one up."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    profiles = Path(bed.cwd) / "playbooks" / "profiles"  # a profile in the working directory, as a user's
    profiles.mkdir(parents=True)
    (profiles / "tb-unfinished.yml").write_text(UNFINISHED_PROFILE.format(wheels=json.dumps(str(wheels))))
    env = {**os.environ, "TESTBED_HOME": str(bed.home)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "testbed", "setup", bed.name, "--profile", "tb-unfinished",
                               *args], cwd=bed.cwd, capture_output=True, text=True, timeout=300, env=env, check=False)

    def has_tbprobe() -> dict[str, str]:
        return {n: bed.ssh(n, "~/tb-unfinished-env/bin/python -c 'import tbprobe' 2>&1 && echo yes").stdout.strip()
                for n in _names(bed)}

    try:
        failed = cli("--json")
        res = json.loads(failed.stdout)
        assert failed.returncode == 1 and not res["ok"], failed.stdout + failed.stderr
        assert {n for n, h in res["hosts"].items() if h["status"] == "failed"} == {"node0"}, res["hosts"]
        assert {h["status"] for n, h in res["hosts"].items() if n != "node0"} == {"stopped"}, res["hosts"]
        assert {n: _record(bed, n) for n in _names(bed)} == dict.fromkeys(_names(bed), "")  # set up nowhere
        probe_wheel(wheels)
        again = cli()
        out = " ".join(again.stdout.split())  # Rich wraps long lines
        assert again.returncode == 0, again.stdout + again.stderr
        assert "unchanged" not in out, out
        assert f"an earlier set-up did not finish on {', '.join(_names(bed))}" in out, out
        assert has_tbprobe() == dict.fromkeys(_names(bed), "yes")  # on the hosts, not only in the records
        assert all(json.loads(_record(bed, n))["plan"] == "tb-unfinished" for n in _names(bed))
        assert f"skipped: unchanged on {len(bed.hosts)} hosts" in cli().stdout
    finally:
        shutil.rmtree(Path(bed.cwd) / "playbooks")
