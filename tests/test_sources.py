"""Source overrides (--source NAME=PATH|URL[@REF]) and output patterns, checked before any host (no hosts here)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from testbed import sources
from testbed.errors import UsageError
from testbed.run import runner
from testbed.suite import load_suite, output_pattern_problem


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "main.py").write_text("print('v1')\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "v1")
    git(r, "tag", "v1")
    (r / "main.py").write_text("print('v2')\n")
    git(r, "commit", "-q", "-am", "v2")
    return r


def bundle_files(bundle: str, commit: str, tmp: Path) -> dict[str, str]:
    out = tmp / f"clone-{commit[:8]}"
    subprocess.run(["git", "clone", "-q", "--no-checkout", bundle, str(out)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(out), "checkout", "-q", commit], check=True, capture_output=True)
    return {p.name: p.read_text() for p in out.iterdir() if p.is_file()}


def test_git_checkout_at_ref_head_and_uncommitted(tb_home: Path, repo: Path) -> None:
    v1 = sources.resolve("x", f"{repo}@v1")
    assert v1.kind == "path" and v1.commit == git(repo, "rev-parse", "v1") and not v1.dirty
    assert bundle_files(v1.bundle or "", v1.commit or "", tb_home)["main.py"] == "print('v1')\n"
    head = sources.resolve("x", str(repo))
    assert head.commit == git(repo, "rev-parse", "HEAD")
    (repo / "main.py").write_text("print('mine')\n")  # a user's own change, not committed
    mine = sources.resolve("x", str(repo))
    assert mine.dirty and mine.commit != head.commit
    assert bundle_files(mine.bundle or "", mine.commit or "", tb_home)["main.py"] == "print('mine')\n"
    assert sources.resolve("x", str(repo)).commit == mine.commit  # the same changes: the same snapshot
    assert git(repo, "status", "--porcelain") == "M main.py"  # the user's repository is left as it was
    assert "refs/heads/testbed-source" not in git(repo, "show-ref")


def test_plain_folder_is_snapshotted_deterministically(tb_home: Path, tmp_path: Path) -> None:
    d = tmp_path / "plain"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("a")
    (d / "sub" / "b.txt").write_text("b")
    (d / ".gitignore").write_text("*.txt\n")  # a plain folder is taken as it is, ignore files included
    one, two = sources.resolve("p", str(d)), sources.resolve("p", str(d))
    assert one.commit == two.commit and one.bundle == two.bundle
    files = bundle_files(one.bundle or "", one.commit or "", tb_home)
    assert files["a.txt"] == "a"
    with pytest.raises(UsageError, match="not a git repository"):
        sources.resolve("p", f"{d}@main")


@pytest.mark.parametrize("spec, match", [
    ("{repo}@no-such-branch", "has no commit, branch or tag 'no-such-branch'"),
    ("/no/such/folder", "is not a folder"),
    ("https://127.0.0.1:9/none.git", "cannot reach the repository"),
])
def test_bad_overrides_refused(tb_home: Path, repo: Path, spec: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        sources.resolve("x", spec.format(repo=repo))


def test_parse_and_split() -> None:
    assert sources.parse(["a=/x", "b.c=https://h/r.git@dev"]) == {"a": "/x", "b.c": "https://h/r.git@dev"}
    for bad in ("noequals", "=x", "a=", "a b=x"):
        with pytest.raises(UsageError):
            sources.parse([bad])
    assert sources._split_ref("git@github.com:me/fork.git") == ("git@github.com:me/fork.git", None)
    assert sources._split_ref("git@github.com:me/fork.git@main") == ("git@github.com:me/fork.git", "main")
    assert sources.repo_key("git@github.com:A/B.git") == sources.repo_key("https://github.com/a/b")


def test_run_override_unknown_name_refused_and_bundle_planned(tb_home: Path, repo: Path) -> None:
    s = load_suite("jitc")
    with pytest.raises(UsageError, match=r"no source named 'jtic'"):
        runner.plan_run(s, None, {}, dry_run=True, sources={"jtic": str(repo)})
    plan = runner.plan_run(s, None, {}, dry_run=True, sources={"jitc": str(repo)})
    assert "src-jitc.bundle" in plan.files and Path(plan.files["src-jitc.bundle"]).is_file()
    cmd = plan.sources[0].commands[plan.hosts[0].name]
    assert "src-jitc.bundle" in cmd and git(repo, "rev-parse", "HEAD") in cmd
    assert plan.source_info["jitc"]["override"] == str(repo)
    # the profile's build of the same repository (open-jitc) gets the same override
    # the plan carries the resolved override, typed, through its file (unset fields left out of it)
    o = plan.source_overrides["jitc"]
    assert isinstance(o, sources.Override) and o.kind == "path" and o.commit == git(repo, "rev-parse", "HEAD")
    assert plan.to_json()["source_overrides"]["jitc"] == o.to_dict() and "ref" not in o.to_dict()
    again = type(plan).model_validate(json.loads(json.dumps(plan.to_json())))
    assert again.source_overrides == plan.source_overrides
    # the profile's build of the same repository (open-jitc) gets the same override
    extra = sources.setup_vars(again.source_overrides, s)
    builds = extra["testbed_source_overrides"]
    assert set(extra) == {"testbed_source_overrides"} and set(builds) == {"open-jitc"}
    assert builds["open-jitc"]["commit"] == git(repo, "rev-parse", "HEAD") and builds["open-jitc"]["kind"] == "path"
    assert sources.setup_vars({}, s) == {} and sources.setup_vars(again.source_overrides, None, {}) == {}
    assert set(sources.setup_vars(again.source_overrides, None, {"jitc": "x"})["testbed_source_overrides"]) == {"jitc"}


@pytest.mark.parametrize("pattern, ok", [
    ("out/*.csv", True), ("~/repo/log/**", True), ("/tmp/jit_checkpoints/*.cp", True), ("~/*.txt", True),
    ("", False), ("../x", False), ("~root/x", False), ("/**", False), ("/*/x", False), ("~/**", False),
    ("$HOME/x", False), ("a\nb", False), ("{a,b}.txt", False), ("/", False),
])
def test_output_patterns(pattern: str, ok: bool) -> None:
    assert (output_pattern_problem(pattern) is None) == ok, output_pattern_problem(pattern)


def test_uncollectable_output_refused_at_load_with_line(tb_home: Path) -> None:
    p = tb_home / "bad.yml"
    p.write_text("name: bad\nsteps:\n  launch:\n    command: 'true'\noutputs:\n  - ok.txt\n  - ../up.txt\n")
    with pytest.raises(UsageError) as e:
        load_suite(str(p))
    assert e.value.where == f"{p}:7" and "'..'" in e.value.what


def test_a_source_comes_from_the_users_mirror_fetched_once_on_this_machine(tb_home: Path, repo: Path,
                                                                          tmp_path: Path) -> None:
    """What a rehearsal's replica cannot reach: the user's cache (paths.user_cache) keeps one bare mirror per
    repository, fetched on this machine when it lacks the ref and read from there afterwards, origin gone or not."""
    url = f"file://{repo}"
    v1 = git(repo, "rev-parse", "v1")
    said: list[str] = []
    assert "no copy of" in str(sources.from_mirror("x", url, "v1", fetch=False))
    o = sources.from_mirror("x", url, v1[:7], fetch=True, say=said.append)
    assert not isinstance(o, str), o
    assert o.kind == "path" and o.commit == v1
    assert bundle_files(o.bundle or "", v1, tmp_path) == {"main.py": "print('v1')\n"}
    assert len(said) == 1 and "fetching" in said[0] and "once per user" in said[0]
    mirror = sources.mirror_path(url)
    assert mirror.is_relative_to(Path(os.environ["TESTBED_CACHE"])) and (mirror / "HEAD").is_file()
    assert Path(o.bundle or "").parent == Path(os.environ["TESTBED_CACHE"]) / "bundles"  # once per user, by commit
    repo.rename(repo.with_name("gone"))  # the origin is unreachable now: the mirror still answers, without a fetch
    again = sources.from_mirror("x", url, "main", fetch=True, say=said.append)
    assert not isinstance(again, str) and again.commit != v1 and len(said) == 1
    missing = sources.from_mirror("x", url, "v9", fetch=True, say=said.append)
    assert isinstance(missing, str) and "fetching" in missing and "failed" in missing


def test_a_mirror_fetch_off_this_machine_is_refused_by_git_in_the_tests(tb_home: Path) -> None:
    """The suite sends no traffic off loopback: git itself refuses other transports here (GIT_ALLOW_PROTOCOL)."""
    got = sources.from_mirror("vit", "https://github.com/trinhgiahuy/Scalable_ViT_DT.git", "b9f281b", fetch=True)
    assert isinstance(got, str) and "not allowed" in got, got


def test_a_suite_source_given_reaches_the_profile_build_of_its_repository_through_a_template(
        tb_home: Path, repo: Path) -> None:
    """tesla's profile names its build's repository through a variable (source_build_repo: "{{ tesla_repo }}"):
    the override of the suite's 'vit' reaches that build too, so set-up never clones from the network."""
    assert sources.profile_build_refs("tesla") == {
        "Scalable_ViT_DT": ("https://github.com/trinhgiahuy/Scalable_ViT_DT.git", "b9f281b")}
    o = sources.resolve("vit", str(repo))
    got = sources.setup_vars({"vit": o}, load_suite("tesla"))
    assert set(got["testbed_source_overrides"]) == {"Scalable_ViT_DT"}
    assert got["testbed_source_overrides"]["Scalable_ViT_DT"]["commit"] == o.commit
    assert "nccl-emu" not in sources.profile_build_refs("neuronabox")  # a name from host facts: left out
