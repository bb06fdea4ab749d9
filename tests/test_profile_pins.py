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


def _get_pip_choice(version: str, **given: str) -> dict[str, str]:
    """The python_env role's pick of get-pip.py for a venv of Python ``version``, rendered by Ansible's own templar
    from the role's task and defaults as shipped."""
    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = Path(__file__).resolve().parents[1] / "playbooks" / "roles" / "python_env"
    tasks = yaml.safe_load((role / "tasks" / "venv.yml").read_text())
    block = next(t for t in tasks if t.get("name") == "Bootstrap pip with get-pip.py")["block"]
    expr = next(t for t in block if t["name"].startswith("Pick"))["ansible.builtin.set_fact"]["python_env_get_pip"]
    variables = {**yaml.safe_load((role / "defaults" / "main.yml").read_text()), **given,
                 "python_env_version": {"stdout": version}}
    return dict(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr)))


def test_the_role_bootstraps_an_old_python_from_pypas_frozen_checksummed_get_pip() -> None:
    old = _get_pip_choice("3.8")
    assert old["url"] == "https://bootstrap.pypa.io/pip/3.8/get-pip.py" and len(old["sha256"]) == 64
    assert _get_pip_choice("3.9")["url"].endswith("/pip/3.9/get-pip.py")
    assert _get_pip_choice("3.12") == {"url": lint.GET_PIP, "sha256": ""}
    mine = _get_pip_choice("3.8", python_env_get_pip_url="https://mirror.example/get-pip.py",
                           python_env_get_pip_sha256="ab" * 32)
    assert mine == {"url": "https://mirror.example/get-pip.py", "sha256": "ab" * 32}


BOOT_PROFILE = """\
description: boot
roles:
  - role: python_env
    vars: {python_env_python: [/usr/bin/python3.8, python3],
           python_env_get_pip_url: https://bootstrap.pypa.io/get-pip.py}
  - role: python_env
    vars: {python_env_path: ~/e2, python_env_python: python3.8}
"""
BOOT_SUITE = """\
name: boot
profile: boot
steps:
  prepare:
    - {name: pip, run: "curl -sSL https://bootstrap.pypa.io/get-pip.py | python3.7 - --user"}
    - {name: fine, run: "curl -sSL https://bootstrap.pypa.io/pip/3.7/get-pip.py | python3.7 - --user"}
  launch:
    command: python3.8 train.py
"""


def test_a_bootstrap_that_refuses_the_python_it_is_given_is_named(tb_home: Path) -> None:
    from testbed.suite import load_suite

    (tb_home / "playbooks" / "profiles").mkdir(parents=True)
    (tb_home / "playbooks" / "profiles" / "boot.yml").write_text(BOOT_PROFILE)
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "boot.yml").write_text(BOOT_SUITE)
    found = lint.bootstrap_refusals(load_suite("boot"))
    assert [f.where.rsplit("/", 1)[-1] for f in found] == ["boot.yml:5", "boot.yml:3"], [f.line() for f in found]
    assert "Python 3.7, which it refuses" in found[0].what and "pip/3.7/get-pip.py" in found[0].what
    assert "Python 3.8, which it refuses" in found[1].what and "leave python_env_get_pip_url empty" in found[1].what
