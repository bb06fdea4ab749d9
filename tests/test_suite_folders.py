"""A suite is a folder (issue 38 item 1): ``experiments/<name>/suite.yml`` with its workloads, profile.yml,
roles/ and report.py beside it, found in the working folder, then shipped, or by its path; the single file
``experiments/<name>.yml`` keeps working."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed import paths
from testbed.errors import UsageError
from testbed.suite import list_suites, load_suite, suite_path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "description: echoes\nsteps:\n  launch:\n    command: echo hi\n"
SHIPPED = ["datastall-emulator", "fault-drill", "isca-resnet18", "jitc", "matmul-baseline", "mpi-hello", "neuronabox",
           "tesla"]


def _folder(base: Path, name: str, text: str = SUITE) -> Path:
    d = base / "experiments" / name
    d.mkdir(parents=True)
    (d / "suite.yml").write_text(text)
    return d


def test_every_shipped_suite_is_a_folder_holding_its_workloads() -> None:
    """The eight shipped suites are folders; each file a suite's ``files:`` names is inside its own folder (no
    shared experiments/workloads/ left), and no single-file suite is left beside them."""
    assert sorted(p.name for p in (ROOT / "experiments").iterdir()) == SHIPPED
    for name in SHIPPED:
        s = load_suite(name)
        assert Path(s.source) == ROOT / "experiments" / name / "suite.yml" and s.name == name
        for rel in s.files:
            assert (ROOT / "experiments" / name / rel).is_file(), (name, rel)


def test_a_folder_in_the_working_folder_is_found_by_name_and_named_by_its_folder(tb_home: Path) -> None:
    _folder(tb_home, "echoes")
    s = load_suite("echoes")
    assert s.name == "echoes" and s.source == str(tb_home / "experiments" / "echoes" / "suite.yml")
    assert list_suites()["echoes"] == tb_home / "experiments" / "echoes" / "suite.yml"


def test_a_single_file_suite_keeps_working(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "single.yml").write_text(SUITE)
    assert load_suite("single").name == "single"
    assert list_suites()["single"] == tb_home / "experiments" / "single.yml"


def test_the_working_folders_suite_overrides_the_shipped_one_of_its_name(tb_home: Path) -> None:
    _folder(tb_home, "mpi-hello", SUITE.replace("echoes", "mine"))
    assert load_suite("mpi-hello").description == "mine"
    assert list_suites()["mpi-hello"].is_relative_to(tb_home) and "tesla" in list_suites()


def test_a_suite_folder_is_found_by_its_path(tmp_path: Path, tb_home: Path) -> None:
    elsewhere = tmp_path / "mine" / "ckpt"
    elsewhere.mkdir(parents=True)
    (elsewhere / "suite.yml").write_text(SUITE)
    assert suite_path(str(elsewhere)) == elsewhere / "suite.yml"
    assert load_suite(str(elsewhere)).name == "ckpt"
    (tmp_path / "mine" / "empty").mkdir()
    with pytest.raises(UsageError, match=r"holds no suite\.yml"):
        suite_path(str(tmp_path / "mine" / "empty"))
    with pytest.raises(UsageError, match=r"or write experiments/nosuch/suite\.yml"):
        suite_path("nosuch")


def test_a_suite_folders_roles_add_to_the_shipped_ones_and_one_of_a_shipped_name_overrides_it(tb_home: Path) -> None:
    """A user's suite folder brings roles/: every shipped role stays, a new one is found, one named like a shipped
    role replaces it and is reported as an override (the notice set-up prints)."""
    from testbed.setup import profiles

    d = _folder(tb_home, "ckpt")
    for role in ("checkfreq", "memlock"):
        (d / "roles" / role / "tasks").mkdir(parents=True)
        (d / "roles" / role / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: hi}\n")
    folders = profiles.role_folders()
    assert folders["checkfreq"] == (d / "roles" / "checkfreq").resolve()
    assert folders["memlock"] == (d / "roles" / "memlock").resolve()
    assert {"ssh_mesh", "packages", "mpi"} <= set(folders)
    used, hidden = profiles.overridden_roles()["memlock"]
    assert used == (d / "roles" / "memlock").resolve() and hidden == ROOT / "playbooks" / "roles" / "memlock"
    farm = profiles.roles_dir()
    assert {"checkfreq", "ssh_mesh"} <= {p.name for p in farm.iterdir()}


def test_a_suite_folders_profile_is_the_profile_of_its_name(tb_home: Path) -> None:
    """experiments/<name>/profile.yml is profile <name> (a spec's ``profile: tesla`` finds the shipped one in
    its suite folder), and a suite folder of the user's adds its own."""
    from testbed.setup import profiles

    assert profiles.available_profiles()["tesla"] == ROOT / "experiments" / "tesla" / "profile.yml"
    assert "ssh_mesh" in profiles.load_profile("tesla").roles
    d = _folder(tb_home, "ckpt", SUITE + "profile: ckpt\n")
    (d / "profile.yml").write_text("include: [base]\nroles: [mpi]\n")
    assert profiles.available_profiles()["ckpt"] == d / "profile.yml"
    assert profiles.load_profile("ckpt").roles[-1] == "mpi"
    assert profiles.suite_profile("ckpt") == "ckpt"


def _elsewhere(base: Path) -> Path:
    """A suite folder outside experiments/ (named by its path) with its own profile ckpt and role checkfreq."""
    d = base / "else" / "ckpt"
    (d / "roles" / "checkfreq" / "tasks").mkdir(parents=True)
    (d / "roles" / "checkfreq" / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: hi}\n")
    (d / "suite.yml").write_text(SUITE + "profile: ckpt\n")
    (d / "profile.yml").write_text("include: [base]\nroles: [checkfreq]\n")
    return d


def test_a_suite_folder_named_by_its_path_counts_for_its_command_only(tb_home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two commands in one process (CliRunner, as the tests run them): the first names a suite folder by its
    path and finds its profile and roles by name for the rest of that command; the next command does not."""
    from typer.testing import CliRunner

    from testbed import suite as suite_mod
    from testbed.cli.typer_app import app
    from testbed.setup import profiles

    d = _elsewhere(tb_home)
    seen: list[bool] = []
    real = suite_mod.load_suite

    def spy(name_or_path: str) -> suite_mod.Suite:
        s = real(name_or_path)
        seen.append(profiles.available_profiles().get("ckpt") == d / "profile.yml"
                    and profiles.role_folders().get("checkfreq") == (d / "roles" / "checkfreq").resolve())
        return s

    monkeypatch.setattr(suite_mod, "load_suite", spy)
    for mod in [m for n, m in sys.modules.items() if n.startswith("testbed.")]:  # the modules that bound it at
        if getattr(mod, "load_suite", None) is real:  # their import, the command's stages among them
            monkeypatch.setattr(mod, "load_suite", spy)
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(d)])
    assert r.exit_code == 0, r.output
    assert seen == [True]  # within the command: found by name after the path named it
    r = runner.invoke(app, ["list", "profiles", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert "ckpt" not in {p["name"] for p in out["profiles"]} and "checkfreq" not in out["roles"]
    assert "ckpt" not in profiles.available_profiles() and paths.named_suite_folders() == []


def test_a_verb_of_the_python_api_is_one_command(tb_home: Path) -> None:
    """services' verbs (what testbed.open()'s methods call) each are one command; one_command blocks nest (a
    verb the CLI calls is part of the CLI's command); outside any command, naming a folder keeps nothing."""
    from testbed import services
    from testbed.setup import profiles

    d = _elsewhere(tb_home)
    services.plan(str(d), None, dry_run=True)
    assert "ckpt" not in profiles.available_profiles()
    with paths.one_command():
        load_suite(str(d))
        with paths.one_command():
            assert paths.named_suite_folders() == [d.resolve()]
            services.plan(str(d), None, dry_run=True)
        assert profiles.available_profiles()["ckpt"] == d / "profile.yml"
        assert profiles.load_profile("ckpt").roles[-1] == "checkfreq"
    assert paths.named_suite_folders() == []
    load_suite(str(d))
    assert "ckpt" not in profiles.available_profiles()


def test_collect_copies_a_folder_suite_under_its_name(tb_home: Path) -> None:
    """A folder suite is copied into the run folder as .suite/<name>/ with its workloads, and reads back under
    its name although its suite.yml does not say it."""
    from testbed.collect.suite_copy import copy_suite, verified

    d = _folder(tb_home, "echoes", SUITE + "files: [workloads/job.py]\n")
    (d / "workloads").mkdir()
    (d / "workloads" / "job.py").write_text("print(1)\n")
    sha = hashlib.sha256((d / "suite.yml").read_bytes()).hexdigest()
    info = {"suite": "echoes", "suite_file": str(d / "suite.yml"), "suite_sha256": sha, "profile": "base",
            "suite_files": {"workloads/job.py": hashlib.sha256(b"print(1)\n").hexdigest()}}
    run = tb_home / "results" / "echoes" / "echoes-1"
    run.mkdir(parents=True)
    rec, why = copy_suite(info, run, None)
    assert why is None and rec is not None and rec["path"] == ".suite/echoes/suite.yml"
    assert list(rec["files"]) == [".suite/echoes/workloads/job.py"]
    path, _ = verified(run, rec)
    assert load_suite(str(path)).name == "echoes"


def test_report_py_is_found_beside_a_folder_suites_yaml(tb_home: Path) -> None:
    from testbed.report.declared import report_py

    d = _folder(tb_home, "echoes")
    (d / "report.py").write_text(textwrap.dedent("""\
        from testbed import results
        """))
    assert report_py(load_suite("echoes")) == d / "report.py"


def test_paths_find_suite_prefers_the_folder_and_the_working_folder(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "both.yml").write_text(SUITE)
    _folder(tb_home, "both")
    assert paths.find_suite("both") == tb_home / "experiments" / "both" / "suite.yml"
    assert paths.find_suite("tesla") == ROOT / "experiments" / "tesla" / "suite.yml"
    assert paths.find_suite("nosuch") is None


# --- where a suite comes from (testbed list suites) -----------------------------------------------------------------
def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(cwd / ".testbed"),
                               "COLUMNS": "300"})


def test_list_suites_says_where_each_suite_comes_from(tb_home: Path) -> None:
    _folder(tb_home, "echoes")
    (tb_home / "experiments" / "single.yml").write_text(SUITE)
    r = _cli(tb_home, "list", "suites", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["echoes"]["origin"] == {"from": "here"} and rows["single"]["origin"] == {"from": "here"}
    assert rows["tesla"]["origin"] == {"from": "shipped"}
    table = _cli(tb_home, "list", "suites").stdout
    assert re.search(r"echoes\s+│ here", table) and re.search(r"tesla\s+│ shipped", table), table


def test_origin_of_a_suite_named_by_its_path(tmp_path: Path, tb_home: Path) -> None:
    from testbed import suite_fetch

    (tmp_path / "else").mkdir()
    (tmp_path / "else" / "suite.yml").write_text(SUITE)
    assert suite_fetch.origin(tmp_path / "else" / "suite.yml") == {"from": "path"}


# --- a suite at a git URL with a commit ------------------------------------------------------------------------------
def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A local git repository holding the suite folder suites/ckpt (with a role), and its commit."""
    r = tmp_path / "upstream"
    d = r / "suites" / "ckpt"
    (d / "roles" / "checkfreq" / "tasks").mkdir(parents=True)
    (d / "suite.yml").write_text(SUITE.replace("echoes", "from git") + "files: [workloads/job.py]\n")
    (d / "workloads").mkdir()
    (d / "workloads" / "job.py").write_text("print(1)\n")
    (d / "roles" / "checkfreq" / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: hi}\n")
    _git(r.parent, "init", "-q", str(r))
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "a suite")
    return r, _git(r, "rev-parse", "HEAD")


def test_a_suite_at_a_git_url_and_commit_is_fetched_into_the_state_home(tb_home: Path, repo: tuple[Path, str]
                                                                        ) -> None:
    """Fetched once at that exact commit into .testbed/suites/<commit>/, found there later (the repository gone),
    its roles added, its origin (URL and commit) known for the manifest and testbed list suites."""
    from testbed import suite_fetch
    from testbed.setup import profiles

    upstream, commit = repo
    arg = f"git+file://{upstream}@{commit}#suites/ckpt"
    with paths.one_command():  # its roles count for the command that fetched it
        s = load_suite(arg)
        top = tb_home / ".testbed" / "suites" / commit
        assert profiles.role_folders()["checkfreq"] == (top / "suites/ckpt/roles/checkfreq").resolve()
    assert s.name == "ckpt" and s.description == "from git" and Path(s.source) == top / "suites/ckpt/suite.yml"
    assert _git(top, "rev-parse", "HEAD") == commit and (top / "suites/ckpt/workloads/job.py").is_file()
    assert suite_fetch.git_origin(Path(s.source)) == {"url": f"file://{upstream}", "commit": commit,
                                                      "path": "suites/ckpt/suite.yml"}
    shutil.rmtree(upstream)
    assert load_suite(arg).source == s.source  # the checkout is found: nothing fetched again
    r = _cli(tb_home, "list", "suites", "--json")
    row = next(x for x in json.loads(r.stdout) if x["name"] == "ckpt")
    assert row["origin"] == {"from": "git", "url": f"file://{upstream}", "commit": commit,
                             "path": "suites/ckpt/suite.yml"}
    assert f"git file://{upstream}@{commit}" in _cli(tb_home, "list", "suites").stdout


def test_a_run_of_a_git_suite_records_its_url_and_commit(tb_home: Path, repo: tuple[Path, str]) -> None:
    """The plan of a (non-dry) run of a fetched suite carries {url, commit, path}; the manifest writes it under
    suite_file.git."""
    from testbed.run import runner

    upstream, commit = repo
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text(
        "provider: {kind: lab, hosts: [{name: h0, address: 10.0.0.2}]}\nuser: u\n")
    from testbed.hosts import Host
    from testbed.state import Store

    st = Store.open_default()
    st.upsert_testbed("lab1", "lab", str(tb_home / "inventories" / "lab1.yml"), "up")
    st.set_hosts("lab1", [Host(name="h0", address="10.0.0.2")])
    plan = runner.plan_run(f"git+file://{upstream}@{commit}#suites/ckpt", "lab1", {}, store=st)
    assert plan.suite_git == {"url": f"file://{upstream}", "commit": commit, "path": "suites/ckpt/suite.yml"}
    assert plan.suite_files == {"workloads/job.py": hashlib.sha256(b"print(1)\n").hexdigest()}


def test_the_manifest_records_where_a_git_suite_came_from(tmp_path: Path) -> None:
    import time

    from testbed.collect import manifest as mf
    from testbed.state import Store

    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "lab", None, "up")
    git = {"url": "file:///r", "commit": "c" * 40, "path": "suites/ckpt/suite.yml"}
    info = {"suite_file": "/s/suite.yml", "suite_sha256": "a" * 64, "suite_git": git}
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, info) "
                   "VALUES ('r1','ckpt','tb','{}','succeeded',?,?)", (time.time(), json.dumps(info)))
    m = mf.build(st, "r1", hosts=[], facts={}, software={}, files=[], provider="lab", secrets=[])
    assert m["suite_file"] == {"path": "/s/suite.yml", "sha256": "a" * 64, "git": git}


@pytest.mark.parametrize(("arg", "what"), [
    ("git+file:///r@main#s", "'main' is not a full commit"),
    ("git+file:///r@abc123#s", "'abc123' is not a full commit"),
    ("git+file:///r#s", "names no commit"),
    (f"git+-oProxyCommand=x@{'a' * 40}", "looks like an option"),
    (f"git+ext::sh -c touch% /tmp/pwned@{'a' * 40}", "is not one of https://"),
    (f"git+https://u:secret@host/r.git@{'a' * 40}", "holds a password"),
    (f"git+file:///r\n@{'a' * 40}", "control character"),
    (f"git+file:///r@{'a' * 40}#../../etc", "is not a path inside the repository"),
    (f"git+file:///r@{'a' * 40}#/etc", "is not a path inside the repository"),
])
def test_a_bad_git_suite_argument_is_refused_before_git_runs(tb_home: Path, arg: str, what: str) -> None:
    with pytest.raises(UsageError) as e:
        suite_path(arg)
    assert what in e.value.what, e.value.render()
    assert not (tb_home / ".testbed" / "suites").exists()  # nothing fetched, nothing made


def test_git_failures_are_one_line_each(tb_home: Path, repo: tuple[Path, str]) -> None:
    upstream, commit = repo
    with pytest.raises(UsageError) as e:
        load_suite(f"git+file://{upstream}@{'0' * 40}#suites/ckpt")
    assert e.value.what == f"commit {'0' * 40} is not in file://{upstream}", e.value.render()
    with pytest.raises(UsageError) as e:
        load_suite(f"git+file://{upstream}-gone@{commit}#suites/ckpt")
    assert e.value.what.startswith(f"cannot fetch file://{upstream}-gone: ") and "\n" not in e.value.what
    with pytest.raises(UsageError) as e:
        load_suite(f"git+file://{upstream}@{commit}#suites/nothing")
    assert e.value.what == f"no suite at suites/nothing of file://{upstream}@{commit[:12]}"
    r = _cli(tb_home, "show", f"git+file://{upstream}@main#suites/ckpt")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'main' is not a full commit" in r.stderr, r.stderr
