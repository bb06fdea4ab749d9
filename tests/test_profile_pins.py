"""A profile's source builds are pinned: a ``source_build`` whose version is a branch or tag (or none) builds what
the branch holds on the day of the set-up, and the static checks say so at the profile's file:line before any
host (``rehearse`` stops there; ``show`` and ``run --dry-run`` warn)."""

from __future__ import annotations

from pathlib import Path

from testbed import lint

PROFILE = """\
description: pins
vars:
  my_version: develop
  my_pin: 0123456789abcdef0123456789abcdef01234567
  my_flavor: "{{ 'emu' if inventory_hostname == 'a' else 'ori' }}"
roles:
  - role: source_build
    vars: {source_build_name: tip, source_build_repo: https://example.org/tip.git}
  - role: source_build
    vars: {source_build_name: branchy, source_build_repo: https://example.org/b.git, source_build_version: main}
  - role: source_build
    vars: {source_build_name: through-a-var, source_build_repo: https://example.org/v.git,
           source_build_version: "{{ my_version }}"}
  - role: source_build
    vars: {source_build_name: pinned, source_build_repo: https://example.org/p.git,
           source_build_version: "{{ my_pin }}"}
  - role: source_build
    vars: {source_build_name: short, source_build_repo: https://example.org/s.git, source_build_version: 177a2b3}
  - role: source_build
    vars: {source_build_name: per-host, source_build_repo: https://example.org/h.git,
           source_build_version: "{{ my_flavor }}"}
"""


def test_a_branch_build_is_named_at_its_profile_line_and_a_commit_is_not(tb_home: Path) -> None:
    path = tb_home / "playbooks" / "profiles" / "pins.yml"
    path.parent.mkdir(parents=True)
    path.write_text(PROFILE)
    found = lint.profile_branch_builds("pins")
    got = {f.what.split(" at ")[0].removeprefix("the profile builds "): f for f in found}
    assert sorted(got) == ["branchy", "through-a-var", "tip"], [f.line() for f in found]
    assert got["tip"].where == f"{path}:7" and "'HEAD'" in got["tip"].what
    assert got["branchy"].where == f"{path}:9" and "'main'" in got["branchy"].what
    assert "'develop'" in got["through-a-var"].what and "pin one" in got["through-a-var"].what
    assert all(f.kind == "branch-head" for f in found)


def test_no_profile_or_an_unknown_one_has_no_finding(tb_home: Path) -> None:
    assert lint.profile_branch_builds(None) == [] and lint.profile_branch_builds("no-such-profile") == []


def test_the_shipped_profiles_pin_every_build_they_can() -> None:
    from testbed.setup.profiles import available_profiles

    for name in available_profiles():
        assert lint.profile_branch_builds(name) == [], name


GPU_PROFILE = """\
description: gpu
vars:
  my_packages: [numpy, "torch>=2.0", deepspeed==0.15.1]
roles:
  - role: python_env
    vars: {python_env_path: ~/env, python_env_pip_packages: "{{ my_packages }}"}
  - role: python_env
    vars: {python_env_path: ~/env2, python_env_pip_packages: [torchvision, "tensorflow[and-cuda]", torchaudio==2.4.1]}
"""
SUITE = """\
name: {name}
profile: gpu
steps:
  launch:
    command: python3 train.py
    needs: [{needs}]
"""


def test_an_unpinned_gpu_framework_of_a_gpu_suite_is_named_and_a_pinned_one_is_not(tb_home: Path) -> None:
    from testbed.suite import load_suite

    (tb_home / "playbooks" / "profiles").mkdir(parents=True)
    (tb_home / "playbooks" / "profiles" / "gpu.yml").write_text(GPU_PROFILE)
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "trains.yml").write_text(SUITE.format(name="trains", needs="gpu"))
    (tb_home / "experiments" / "cpu.yml").write_text(SUITE.format(name="cpu", needs=""))
    found = lint.unpinned_frameworks(load_suite("trains"))
    named = sorted(f.what.split(" without")[0].removeprefix("the profile installs ") for f in found)
    assert named == ["tensorflow", "torch", "torchvision"], [f.line() for f in found]  # a lower bound still moves
    where = tb_home / "playbooks" / "profiles" / "gpu.yml"
    assert {f.where for f in found} == {f"{where}:5", f"{where}:7"} and all(f.kind == "unpinned" for f in found)
    assert lint.unpinned_frameworks(load_suite("cpu")) == []  # a CPU suite: no driver to outrun
    assert any(f.kind == "unpinned" for f in lint.lint_suite(load_suite("trains")))
