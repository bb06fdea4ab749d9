"""Profiles and roles: what set-up applies (``playbooks/profiles/<name>.yml``, ``playbooks/roles/``) as a ``Plan``.

A profile's ``include``s come first, then its roles in order; a role entry may carry ``vars`` and an Ansible
``when``. Role variables are checked against each role's ``defaults/main.yml`` so a misspelt one is refused with
file:line before any host is touched.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import paths
from testbed.errors import TestbedError, UsageError


# --- profiles and plans ---------------------------------------------------------------------------------
@dataclass
class RoleStep:
    """One role of a plan, with the variables the profile gives it."""

    role: str
    vars: dict[str, Any] = field(default_factory=dict)
    when: str | None = None


@dataclass
class Plan:
    """What one ``apply`` runs: a name for humans, play-wide vars and ordered role steps."""

    name: str
    steps: list[RoleStep]
    vars: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def roles(self) -> list[str]:
        return [s.role for s in self.steps]


def roles_dir() -> Path:
    """The roles folder (a ``playbooks/roles`` in the working directory overrides the shipped one)."""
    p = paths.find_resource("playbooks", "roles")
    if p is None:
        raise TestbedError("no playbooks/roles folder found", where="playbooks/",
                           fix="reinstall testbed or run from a checkout that has playbooks/roles")
    return p


def available_roles() -> list[str]:
    """Role names: every folder under any playbooks/roles with a tasks/main.yml."""
    names: set[str] = set()
    for d in paths.resource_dirs("playbooks"):
        for t in (d / "roles").glob("*/tasks/main.yml"):
            names.add(t.parent.parent.name)
    return sorted(names)


def available_profiles() -> dict[str, Path]:
    """Profile name -> file (working directory first)."""
    return paths.list_resources("playbooks", "profiles/*.yml")


def closest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'? " if close else ""


def _load_yaml(path: Path) -> Any:
    from ruamel.yaml import YAML

    try:
        return YAML(typ="safe").load(path.read_text())
    except Exception as e:  # ruamel raises many types; all mean "bad YAML"
        raise UsageError(f"cannot read {path.name}: {e}", where=str(path), fix="fix the YAML syntax") from None


def _check_role(role: str, where: str) -> None:
    known = available_roles()
    if role not in known:
        raise UsageError(f"unknown role '{role}'", where=where,
                         fix=f"{closest(role, known)}known roles: {', '.join(known)}")


@functools.cache
def role_variables(role: str) -> frozenset[str]:
    """The variables a role knows: the keys of its defaults/main.yml and vars/main.yml."""
    out: set[str] = set()
    for d in paths.resource_dirs("playbooks"):
        for sub in ("defaults", "vars"):
            f = d / "roles" / role / sub / "main.yml"
            if f.is_file():
                data = _load_yaml(f) or {}
                out |= set(data) if isinstance(data, dict) else set()
    return frozenset(out)


def check_role_vars(names: list[str] | set[str], roles: list[str], where: str) -> None:
    """Refuse a variable named like one of ``roles``' (``<role>_...``) that the role does not know: a typo that
    Ansible would silently ignore (the role would run with its default)."""
    for role in sorted(set(roles)):
        known = role_variables(role)
        for n in sorted(names):
            if n.startswith(role + "_") and n not in known:
                raise UsageError(f"role '{role}' has no variable '{n}'", where=where,
                                 fix=f"{closest(n, sorted(known))}see playbooks/roles/{role}/defaults/main.yml")


def load_profile(name: str, _seen: tuple[str, ...] = ()) -> Plan:
    """Read and check a profile (and the profiles it includes) into a plan."""
    profiles = available_profiles()
    if name not in profiles:
        raise UsageError(f"unknown profile '{name}'", where="playbooks/profiles/",
                         fix=f"{closest(name, list(profiles))}known profiles: {', '.join(profiles) or 'none'}")
    if name in _seen:
        raise UsageError(f"profile '{name}' includes itself", where=str(profiles[name]),
                         fix="remove the include cycle: " + " -> ".join((*_seen, name)))
    path = profiles[name]
    data = _load_yaml(path) or {}
    if not isinstance(data, dict):
        raise UsageError(f"profile '{name}' is not a mapping", where=str(path),
                         fix="write description:, include:, vars: and roles: keys")
    unknown = set(data) - {"description", "include", "vars", "roles"}
    if unknown:
        raise UsageError(f"profile '{name}' has unknown keys: {', '.join(sorted(unknown))}", where=str(path),
                         fix="allowed keys: description, include, vars, roles")
    steps: list[RoleStep] = []
    pvars: dict[str, Any] = {}
    for inc in data.get("include") or []:
        sub = load_profile(str(inc), (*_seen, name))
        steps += sub.steps
        pvars.update(sub.vars)
    pvars.update(data.get("vars") or {})
    for i, entry in enumerate(data.get("roles") or []):
        if isinstance(entry, str):
            entry = {"role": entry}
        if not isinstance(entry, dict) or "role" not in entry:
            raise UsageError(f"profile '{name}': roles[{i}] needs a 'role:' key", where=str(path),
                             fix="write '- role: <name>' with optional 'vars:' and 'when:'")
        extra = set(entry) - {"role", "vars", "when"}
        if extra or not isinstance(entry.get("vars") or {}, dict) or not isinstance(entry.get("when", ""), str):
            raise UsageError(f"profile '{name}': roles[{i}] ({entry['role']}) has unknown keys or bad values",
                             where=str(path), fix="a role entry has role:, vars: (a mapping) and when: (a "
                                                  "condition string) only" + (f"; remove {', '.join(sorted(extra))}"
                                                                              if extra else ""))
        _check_role(str(entry["role"]), f"{path}: roles[{i}]")
        check_role_vars(set(entry.get("vars") or {}), [str(entry["role"])], f"{path}: roles[{i}] ({entry['role']})")
        steps.append(RoleStep(str(entry["role"]), dict(entry.get("vars") or {}), entry.get("when") or None))
    return Plan(name=name, steps=steps, vars=pvars, description=str(data.get("description", "")))


def suite_profile(suite: str) -> str:
    """The profile a suite names (``profile:`` in experiments/<suite>.yml); the suite's own name otherwise."""
    p = paths.find_resource("experiments", f"{suite}.yml")
    if p is None:
        return suite
    data = _load_yaml(p) or {}
    if isinstance(data, dict):
        setup = data.get("setup")
        prof = data.get("profile") or (setup.get("profile") if isinstance(setup, dict) else None)
        if prof:
            return str(prof)
    return suite


def resolve_plan(*, profile: str | None = None, suite: str | None = None, roles: list[str] | None = None,
                 default_profile: str | None = "base") -> Plan:
    """Turn the command line's choice into a checked plan (UsageError before any host is touched)."""
    chosen = [x for x in (profile, suite, roles) if x]
    if len(chosen) > 1:
        raise UsageError("choose one of --profile, --suite and --role", where="command line",
                         fix="--profile P, or --suite S, or one or more --role R")
    if roles:
        for r in roles:
            _check_role(r, "--role")
        base = None
        if default_profile and default_profile in available_profiles():
            base = load_profile(default_profile)
        steps: list[RoleStep] = []
        for r in roles:
            matches = [s for s in (base.steps if base else []) if s.role == r]
            steps += matches or [RoleStep(r)]
        return Plan(name="roles: " + ", ".join(roles), steps=steps, vars=base.vars if base else {})
    if suite:
        return load_profile(suite_profile(suite))
    return load_profile(profile or default_profile or "base")


def build_playbook(plan: Plan) -> list[dict[str, Any]]:
    """One play over all hosts applying the plan's roles in order."""
    roles = [{"role": s.role, **({"vars": s.vars} if s.vars else {}), **({"when": s.when} if s.when else {})}
             for s in plan.steps]
    return [{
        "name": f"testbed set-up: {plan.name}",
        "hosts": "all",
        "gather_facts": True,
        "gather_subset": ["!all"],
        "vars": plan.vars,
        "roles": roles,
    }]
