"""The set-up driver without hosts: profiles, plans, unknown names, events, JSON, inventory, playbook."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed import setup
from testbed.cli import setup_view
from testbed.errors import UsageError
from testbed.hosts import Host
from testbed.setup import events

REPO = Path(__file__).resolve().parent.parent
ARTIFACT_PROFILES = ["tesla", "jitc", "datastall-emulator", "isca-resnet18", "neuronabox"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / ".testbed"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_profile_loads_and_names_known_roles(home: Path) -> None:
    profiles = setup.available_profiles()
    for name in ["base", "local-suites", *ARTIFACT_PROFILES]:
        assert name in profiles, name
        plan = setup.load_profile(name)
        assert plan.steps, name
        assert set(plan.roles) <= set(setup.available_roles())


def test_roles_are_the_ten_concerns(home: Path) -> None:
    assert set(setup.available_roles()) >= {"ssh_mesh", "shell", "mpi", "python_env", "source_build", "memlock",
                                            "packages", "dataset", "gpu_check", "tpu_check"}
    for role in setup.available_roles():
        d = REPO / "playbooks" / "roles" / role
        assert (d / "defaults" / "main.yml").exists(), role
        assert (d / "meta" / "main.yml").exists(), role


def test_base_is_ssh_mesh_shell_packages(home: Path) -> None:
    assert setup.load_profile("base").roles == ["ssh_mesh", "shell", "packages"]


def test_artifact_profiles_start_with_base(home: Path) -> None:
    for name in ARTIFACT_PROFILES:
        assert setup.load_profile(name).roles[:3] == ["ssh_mesh", "shell", "packages"], name


def test_included_profile_vars_are_overridden(home: Path) -> None:
    plan = setup.load_profile("tesla")
    assert plan.vars["shell_name"] == "tcsh"


def test_unknown_profile_is_refused_with_the_closest_name(home: Path) -> None:
    with pytest.raises(UsageError) as e:
        setup.resolve_plan(profile="telsa")
    assert "unknown profile 'telsa'" in e.value.what
    assert "did you mean 'tesla'" in (e.value.fix or "")


def test_unknown_role_is_refused_with_the_closest_name(home: Path) -> None:
    with pytest.raises(UsageError) as e:
        setup.resolve_plan(roles=["ssh-mesh"])
    assert "did you mean 'ssh_mesh'" in (e.value.fix or "")


def test_profile_and_role_together_are_refused(home: Path) -> None:
    with pytest.raises(UsageError):
        setup.resolve_plan(profile="base", roles=["mpi"])


def test_role_takes_its_vars_from_the_default_profile(home: Path) -> None:
    plan = setup.resolve_plan(roles=["python_env"], default_profile="tesla")
    assert plan.roles == ["python_env"]
    assert plan.steps[0].vars["python_env_dotenv_path"] == "~/.deepspeed_env"
    assert plan.vars["shell_name"] == "tcsh"
    plain = setup.resolve_plan(roles=["memlock"], default_profile="base")
    assert plain.steps[0].vars == {}


def test_suite_names_its_profile(home: Path) -> None:
    (home / "experiments").mkdir()
    (home / "experiments" / "mysuite.yml").write_text("profile: tesla\nruns: []\n")
    assert setup.suite_profile("mysuite") == "tesla"
    assert setup.resolve_plan(suite="mysuite").name == "tesla"
    # no suite file yet: the suite's name is the profile's
    assert setup.resolve_plan(suite="jitc").name == "jitc"


def test_cwd_profiles_override_and_bad_profiles_are_refused(home: Path) -> None:
    d = home / "playbooks" / "profiles"
    d.mkdir(parents=True)
    (d / "mine.yml").write_text("roles:\n  - role: mpi\n    vars: {mpi_slots: 2}\n")
    (d / "typo.yml").write_text("roles:\n  - role: mpii\n")
    (d / "loop.yml").write_text("include: [loop]\nroles: [mpi]\n")
    (d / "extra.yml").write_text("rolez: [mpi]\n")
    assert setup.load_profile("mine").steps[0].vars == {"mpi_slots": 2}
    with pytest.raises(UsageError, match="unknown role 'mpii'"):
        setup.load_profile("typo")
    with pytest.raises(UsageError, match="includes itself"):
        setup.load_profile("loop")
    with pytest.raises(UsageError, match="unknown keys"):
        setup.load_profile("extra")
    # a misspelt role variable is refused (Ansible would ignore it and run the role with its default)
    (d / "misspelt.yml").write_text("roles:\n  - role: mpi\n    vars: {mpi_slot: 2}\n")
    with pytest.raises(UsageError, match="role 'mpi' has no variable 'mpi_slot'") as e:
        setup.load_profile("misspelt")
    assert "did you mean 'mpi_slots'" in (e.value.fix or "")
    (d / "when.yml").write_text("roles:\n  - role: mpi\n    when: \"x | bool\"\n  - role: shell\n")
    assert [s.when for s in setup.load_profile("when").steps] == ["x | bool", None]
    assert setup.build_playbook(setup.load_profile("when"))[0]["roles"] == [{"role": "mpi", "when": "x | bool"},
                                                                          {"role": "shell"}]


def _ev(kind: str, host: str | None = None, task: str = "t", **data: object) -> dict:
    d: dict = {"task": task, **data}
    if host:
        d["host"] = host
    return {"event": kind, "event_data": d}


def test_events_fold_into_counts_and_first_errors() -> None:
    agg = setup.EventAggregator(["a", "b"])
    agg.handle(_ev("playbook_on_task_start", task="install"))
    agg.handle(_ev("runner_on_start", "a", "install"))
    agg.handle(_ev("runner_on_ok", "a", "install", res={"changed": True}))
    agg.handle(_ev("runner_on_ok", "b", "install", res={"changed": False}))
    agg.handle(_ev("runner_on_failed", "b", "build", res={"msg": "non-zero return code", "rc": 2,
                                                         "stderr": "make: *** [all] Error 2"}))
    agg.handle(_ev("runner_on_failed", "b", "later", res={"msg": "second error"}))
    agg.handle(_ev("runner_on_failed", "a", "probe", res={"msg": "ignored"}, ignore_errors=True))
    agg.handle(_ev("runner_on_unreachable", "c", "gather", res={"msg": "ssh: connect to host c: refused"}))
    agg.handle(_ev("runner_on_skipped", "a", "optional"))
    agg.handle(_ev("runner_on_async_poll", "a", "build"))
    hosts, current, polls, task = agg.snapshot()
    assert (hosts["a"].ok, hosts["a"].changed, hosts["a"].skipped, hosts["a"].ignored) == (1, 1, 1, 1)
    assert hosts["a"].failed == 0 and hosts["a"].error is None
    assert hosts["b"].failed == 2
    assert hosts["b"].error_task == "build"
    assert "Error 2" in (hosts["b"].error or "") and "rc=2" in (hosts["b"].error or "")
    assert hosts["c"].unreachable == 1 and "refused" in (hosts["c"].error or "")
    assert polls == {"a": 1} and task == "install"
    # Ansible's final stats replace the running counts
    agg.handle({"event": "playbook_on_stats", "event_data": {
        "ok": {"a": 5, "b": 1}, "changed": {"a": 2}, "failures": {"b": 1}, "dark": {"c": 1},
        "skipped": {"a": 1}, "rescued": {}, "ignored": {"a": 1}}})
    hosts, current, _, _ = agg.snapshot()
    assert (hosts["a"].ok, hosts["a"].changed, hosts["b"].failed, hosts["c"].unreachable) == (5, 2, 1, 1)
    assert current["a"] == "done"


def test_only_a_host_that_reached_the_plays_last_task_finished() -> None:
    """The play ends with FINISHED_TASK (after the roles); a host that never ran it, though it failed nothing (its
    play was stopped by another host's failure), is not finished, nor is a role's task of the same name."""
    from testbed.setup.events import FINISHED_TASK

    play = setup.build_playbook(setup.resolve_plan(roles=["shell"]))[0]
    assert [t["name"] for t in play["post_tasks"]] == [FINISHED_TASK] and "tasks" not in play
    agg = setup.EventAggregator(["a", "b", "c"])
    agg.handle(_ev("runner_on_ok", "a", FINISHED_TASK))
    agg.handle(_ev("runner_on_ok", "b", "install"))
    agg.handle(_ev("runner_on_ok", "c", FINISHED_TASK, role="shell"))
    assert agg.finished == {"a"}


def test_loop_failures_report_the_failed_item() -> None:
    res = {"msg": "One or more items failed", "results": [{"failed": False}, {"failed": True, "msg": "boom"}]}
    assert events.first_line_error(res) == "boom"
    res = {"msg": "All items completed", "unreachable": True,  # a delegated item whose host did not answer
           "results": [{"failed": False}, {"unreachable": True, "msg": "Failed to connect to node2"}]}
    assert events.first_line_error(res) == "Failed to connect to node2"


def test_result_json_and_tables() -> None:
    from rich.console import Console

    r = setup.SetupResult(testbed="tb", plan="base", roles=["ssh_mesh"], check=False, rc=2, status="failed",
                          elapsed=3.14159, hosts={"a": setup.HostSetupResult("a", ok=3, changed=1),
                                                  "b": setup.HostSetupResult("b", ok=1, failed=1, error="boom",
                                                                        error_task="x")})
    d = json.loads(r.to_json())
    assert d["ok"] is False and d["elapsed"] == 3.14 and d["changed_total"] == 1
    assert d["hosts"]["a"]["status"] == "changed" and d["hosts"]["b"]["status"] == "failed"
    assert d["hosts"]["b"]["error"] == "boom"
    con = Console(record=True, width=120)
    con.print(setup_view.render_summary(r))
    view = setup_view.SetupProgress(["a", "b"])
    view.handle(_ev("runner_on_start", "a", "Build detached"))
    view.handle(_ev("runner_on_async_poll", "a", "Build detached"))
    con.print(view)
    text = con.export_text()
    assert "b: x: boom" in text and "Build detached (running 5 s)" in text


def test_inventory_uses_the_testbed_ssh_config(home: Path) -> None:
    hosts = [Host("n0", "10.1.0.2", groups=["master"], facts={"python": "/usr/bin/python3", "accelerator": "cpu"}),
             Host("n1", "10.1.0.3", user="cc", groups=["workers"], facts={"private_address": "192.168.0.3"})]
    inv = setup.build_inventory("tb", hosts, {"testbed_subnet": "10.1.0.0/24"})
    v = inv["all"]["vars"]
    assert v["ansible_ssh_common_args"].startswith("-F ") and v["ansible_ssh_common_args"].endswith("ssh_config")
    assert Path(v["ansible_ssh_common_args"][3:]).exists()
    assert inv["all"]["hosts"]["n0"]["testbed_mesh_address"] == "10.1.0.2"
    assert inv["all"]["hosts"]["n1"]["testbed_mesh_address"] == "192.168.0.3"
    assert inv["all"]["hosts"]["n1"]["ansible_user"] == "cc"
    assert inv["all"]["hosts"]["n0"]["testbed_accelerator"] == "cpu"
    assert inv["all"]["children"]["workers"]["hosts"] == {"n1": {}}
    # the plain inventory.yml users give to ansible is the same inventory (it lacked the mesh addresses, so
    # ssh_mesh wrote /etc/hosts lines like "node1 node1" through it)
    from testbed import ssh

    assert json.loads(ssh.write_inventory("tb", hosts, {"testbed_subnet": "10.1.0.0/24"}).read_text()) == inv


def test_playbook_and_environment_stay_under_the_home(home: Path) -> None:
    plan = setup.load_profile("local-suites")
    pb = setup.build_playbook(plan)
    assert pb[0]["hosts"] == "all" and [r["role"] for r in pb[0]["roles"]] == plan.roles
    env = setup.ansible_env("tb", 5)
    tb_home = str(home / ".testbed")
    for k in ("ANSIBLE_HOME", "ANSIBLE_LOCAL_TEMP", "ANSIBLE_CACHE_PLUGIN_CONNECTION", "ANSIBLE_CONFIG"):
        assert env[k].startswith(tb_home), k
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["ANSIBLE_PIPELINING"] == "True" and env["ANSIBLE_FORKS"] == "5"


def test_apply_refuses_before_touching_hosts(home: Path) -> None:
    from testbed.state import Store

    st = Store(home / ".testbed" / "state.db")
    (home / "inventories").mkdir()
    (home / "inventories" / "tb.yml").write_text("provider: {kind: local, hosts: 2, subnet: 10.213.150.0/24}\n")
    st.upsert_testbed("tb", "local", str(home / "inventories" / "tb.yml"), "up")
    with pytest.raises(UsageError, match="no hosts"):
        setup.apply("tb")
    st.set_hosts("tb", [Host("node0", "10.213.150.2"), Host("node1", "10.213.150.3")])
    with pytest.raises(UsageError, match="unknown profile"):
        setup.apply("tb", profile="nope")
    with pytest.raises(UsageError) as e:
        setup.apply("tb", profile="base", limit=["node7"])
    assert "node0" in (e.value.fix or "")
    assert not (home / ".testbed" / "ansible" / "runs").exists()


SECRETS = {"OS_PASSWORD": "Sup3r-S3cret-pw", "OS_APPLICATION_CREDENTIAL_SECRET": "app-cred-s3cret-xyz",
           "OS_TOKEN": "gAAAAAtok3n-s3cret", "AWS_SECRET_ACCESS_KEY": "aws/s3cret+key",
           "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.s3cret-token", "MY_API_TOKEN": "plain-api-t0ken"}


@pytest.mark.slow
def test_setup_leaves_no_secret_from_the_environment_under_the_home(home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-runner wrote the whole environment into artifacts/<id>/command: a real set-up against an unreachable
    host, with secrets planted the ways users hold them, and every byte under the state home grepped."""
    _unreachable_lab(home, "sec")
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    res = setup.apply("sec", roles=["shell"])
    assert res.rc != 0 and res.artifact_dir  # it ran (and could not reach the host)
    assert (Path(res.artifact_dir) / "command").is_file()
    leaks = [str(p) for p in (home / ".testbed").rglob("*") if p.is_file()
             and any(v.encode() in p.read_bytes() for v in SECRETS.values())]
    assert not leaks, leaks
    assert "PATH" in json.loads((Path(res.artifact_dir) / "command").read_text())["env"]


@pytest.mark.slow
def test_a_killed_setup_leaves_no_ansible_playbook_behind(home: Path) -> None:
    """SIGKILL of `testbed setup` mid-run: its ansible-playbook (started with a parent-death signal) ends too."""
    import contextlib
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import testbed
    from testbed.hosts import Host
    from testbed.state import Store

    mute = socket.create_server(("127.0.0.1", 0))  # accepts, never says a word: ssh waits for its banner
    port = mute.getsockname()[1]
    (home / "inventories").mkdir()
    (home / "inventories" / "mute.yml").write_text(
        f"provider:\n  kind: lab\n  hosts:\n    - {{name: n0, address: 127.0.0.1, port: {port}}}\nuser: root\n")
    st = Store.open_default()
    st.upsert_testbed("mute", "lab", "inventories/mute.yml", "up")
    st.set_hosts("mute", [Host(name="n0", address="127.0.0.1", port=port)])
    st.close()

    def playbooks() -> list[str]:
        out = subprocess.run(["pgrep", "-f", f"ansible-playbook.*{home}"], capture_output=True, text=True).stdout
        return out.split()

    cli = subprocess.Popen([sys.executable, "-m", "testbed", "setup", "mute", "--role", "shell"], cwd=home,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONPATH": str(Path(testbed.__file__).parents[1])})
    try:
        deadline = time.monotonic() + 60
        while not playbooks() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert playbooks(), "ansible-playbook never started"
        mute.settimeout(60)
        _conn, _ = mute.accept()  # ansible's ssh is connected and waiting: the play is under way
        time.sleep(1)
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        deadline = time.monotonic() + 20
        while playbooks() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not playbooks(), "ansible-playbook outlived the killed CLI"
    finally:
        cli.kill()
        for pid in playbooks():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        mute.close()


@pytest.mark.slow
def test_setup_puts_the_signal_handlers_back(home: Path) -> None:
    """ansible-runner installs its own SIGINT/SIGTERM handlers and leaves them: Ctrl-C after a set-up (following
    a run) would only set its flag. After apply, the process's own handlers are back."""
    import signal

    _unreachable_lab(home, "sig")
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    res = setup.apply("sig", roles=["shell"])
    assert res.rc != 0  # it ran (and could not reach the host)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _unreachable_lab(home: Path, name: str) -> None:
    """A recorded lab testbed whose one host does not answer (port 1 on loopback): a set-up runs and fails."""
    from testbed.hosts import Host
    from testbed.state import Store

    (home / "inventories").mkdir()
    (home / "inventories" / f"{name}.yml").write_text(
        "provider:\n  kind: lab\n  hosts:\n    - {name: n0, address: 127.0.0.1, port: 1}\nuser: root\n")
    st = Store.open_default()
    st.upsert_testbed(name, "lab", f"inventories/{name}.yml", "up")
    st.set_hosts(name, [Host(name="n0", address="127.0.0.1", port=1)])
    st.close()


def _mesh_check() -> Any:
    """The ssh_mesh role's check module, imported from its file (it runs on the hosts, not in testbed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ssh_mesh_check",
                                                  setup.roles_dir() / "ssh_mesh" / "library" / "ssh_mesh_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ssh_mesh_check_reads_known_hosts_as_ssh_does() -> None:
    import base64
    import hashlib
    import hmac

    m = _mesh_check()
    k1, k2 = ("ssh-ed25519", "AAAAC3Nz1"), ("ecdsa-sha2-nistp256", "AAAAE2Vj2")
    salt = b"0123456789abcdefghij"
    hashed = "|1|{}|{}".format(base64.b64encode(salt).decode(),
                               base64.b64encode(hmac.new(salt, b"node7", hashlib.sha1).digest()).decode())
    lines = ["# comment", f"node1,10.0.0.1 {k1[0]} {k1[1]}", f"[node2]:2222 {k2[0]} {k2[1]}",
             f"{hashed} {k1[0]} {k1[1]}", f"node*,!node9 {k2[0]} {k2[1]}", f"@revoked node3 {k1[0]} {k1[1]}",
             f"@cert-authority node4 {k1[0]} {k1[1]}"]
    assert m.pinned(lines, "node1") == ({k1, k2}, set())
    assert m.pinned(lines, "10.0.0.1") == ({k1}, set())
    assert m.pinned(lines, "[node2]:2222") == ({k2}, set())  # the port form is its own name: node* misses it
    assert m.pinned(lines, "node7") == ({k1, k2}, set())  # hashed entry and the wildcard
    assert m.pinned(lines, "node9") == (set(), set())  # negated
    assert m.pinned(lines, "node3") == ({k2}, {k1})
    assert m.pinned(lines, "node4") == ({k2}, set())  # a CA line pins no host key


def test_ssh_mesh_check_names_what_is_missing_per_peer() -> None:
    m = _mesh_check()
    user = "ssh-ed25519 AAAAC3NzUser peer@x"
    host = "127.0.0.1 ssh-ed25519 AAAAC3NzHost"
    peer = {"name": "127.0.0.1", "address": "127.0.0.1", "user_key": user, "host_keys": [host]}
    good_known = ["127.0.0.1 ssh-ed25519 AAAAC3NzHost"]
    assert m.content_problems([peer], 22, ['command="x y" ' + user], good_known) == []
    probs = m.content_problems([peer, {**peer, "name": "tb-no-such-host.invalid", "user_key": ""}], 2222,
                               ["ssh-ed25519 AAAAC3NzOther"], good_known)
    assert "127.0.0.1: its key is not in authorized_keys" in probs
    assert "127.0.0.1: 1 of its 1 host keys not pinned under [127.0.0.1]:2222" in probs
    assert "tb-no-such-host.invalid: no user key was read from it" in probs
    assert "tb-no-such-host.invalid resolves to nothing, not to 127.0.0.1 first" in probs
