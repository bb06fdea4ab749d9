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
