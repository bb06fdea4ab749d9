"""Profiles and roles: what set-up applies (``playbooks/profiles/<name>.yml``, ``playbooks/roles/``) as a ``SetupPlan``.

A profile's ``include``s come first, then its roles in order; a role entry may carry ``vars`` and an Ansible
``when``. Each role declares its variables in ``meta/argument_specs.yml`` (Ansible's role argument format, which
Ansible checks again at role start): variables given to roles are checked against it (misspelt names, types,
choices, required ones) and refused with file:line before any host is touched.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import paths, yamlfile
from testbed.distribution import install_command
from testbed.errors import TestbedError, UsageError, by_door
from testbed.setup.events import FINISHED_TASK
from testbed.yamlfile import Loc, Located, read_text

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec

Where = str | Callable[[Loc], str]  # a place, or a function from a path inside the given vars to one
VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what Ansible takes as a variable name


# --- profiles and plans ---------------------------------------------------------------------------------
@dataclass
class RoleStep:
    """One role of a plan, with the variables the profile gives it."""

    role: str
    vars: dict[str, Any] = field(default_factory=dict)
    when: str | None = None
    source: str = ""  # the profile file that lists it, or "--role NAME"
    index: int | None = None  # its place in that profile's roles:

    def where(self) -> str:
        """Where the step was asked for: profile file:line, or the command line."""
        if self.index is None:
            return self.source or "command line"
        return _locator(Path(self.source), ("roles", self.index))(())


@dataclass
class SetupPlan:
    """What one ``apply`` runs: a name for humans, play-wide vars and ordered role steps."""

    name: str
    steps: list[RoleStep]
    vars: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def roles(self) -> list[str]:
        return [s.role for s in self.steps]


def role_roots() -> list[Path]:
    """Every folder of roles, highest priority first: the ``roles/`` of a suite folder named by its path; then,
    in the working folder, then in the shipped ones, each suite folder's ``roles/`` and ``playbooks/roles``."""
    out: list[Path] = [f / "roles" for f in paths.named_suite_folders()]
    for root in paths.resource_roots():
        out += [p.parent / "roles" for p in sorted((root / "experiments").glob(f"*/{paths.SUITE_FILE}"))]
        out.append(root / "playbooks" / "roles")
    seen: list[Path] = []
    for r in out:
        if r.is_dir() and r.resolve() not in seen:
            seen.append(r.resolve())
    return seen


def _role_candidates() -> list[tuple[str, Path]]:
    """(role name, its folder) of every role (a folder with a ``tasks/main.yml``), highest priority first."""
    return [(t.parent.parent.name, t.parent.parent) for r in role_roots() for t in sorted(r.glob("*/tasks/main.yml"))]


def role_folders() -> dict[str, Path]:
    """Role name -> its folder, from every roles folder (:func:`role_roots`): the user's first, so a user's role of
    a shipped role's name overrides it and every other shipped role stays."""
    out: dict[str, Path] = {}
    for name, folder in _role_candidates():
        out.setdefault(name, folder)
    return out


def overridden_roles() -> dict[str, tuple[Path, Path]]:
    """Each role a user's folder overrides: name -> (the folder used, the shipped one it hides)."""
    out: dict[str, tuple[Path, Path]] = {}
    used = role_folders()
    for name, folder in _role_candidates():
        if folder != used[name] and name not in out:
            out[name] = (used[name], folder)
    return out


def roles_dir() -> Path:
    """One folder holding every role :func:`role_folders` finds (what ``ANSIBLE_ROLES_PATH`` and the set-up's
    content address read): the shipped folder itself when no other adds to it, else a folder of links, one per
    role, under the state home (named by what it links to)."""
    folders = role_folders()
    if not folders:
        raise TestbedError("no playbooks/roles folder found", where="playbooks/",
                           fix=f"reinstall testbed ({install_command(reinstall=True)}) or run from a checkout "
                               "that has playbooks/roles")
    parents = {p.parent for p in folders.values()}
    if len(parents) == 1:
        return parents.pop()
    key = hashlib.sha256(json.dumps({k: str(v) for k, v in sorted(folders.items())}).encode()).hexdigest()[:16]
    base = paths.home() / "ansible" / "roles"
    farm = base / key
    if not farm.is_dir():
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".roles-", dir=base))
        for name, folder in folders.items():
            os.symlink(folder, tmp / name)
        try:
            tmp.rename(farm)
        except OSError:  # another set-up made the same folder meanwhile: it links the same roles
            shutil.rmtree(tmp, ignore_errors=True)
    return farm


def available_roles() -> list[str]:
    """Role names: every folder under any playbooks/roles with a tasks/main.yml."""
    return sorted(role_folders())


PROFILE_FILE = "profile.yml"
"""A suite folder's own profile, named by the folder: ``experiments/<name>/profile.yml`` is profile ``<name>``."""


def available_profiles() -> dict[str, Path]:
    """Profile name -> file: ``playbooks/profiles/<name>.yml`` and each suite folder's ``profile.yml`` (named by
    its folder); the working folder's (and a suite named by its path) override the shipped ones."""
    found: dict[str, Path] = {}
    for root in reversed(paths.resource_roots()):
        for p in sorted((root / "experiments").glob(f"*/{PROFILE_FILE}")):
            found[p.parent.name] = p
        for p in sorted((root / "playbooks" / "profiles").glob("*.yml")):
            found[p.stem] = p
    for folder in reversed(paths.named_suite_folders()):
        if (folder / PROFILE_FILE).is_file():
            found[folder.name] = folder / PROFILE_FILE
    return dict(sorted(found.items()))


def closest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'? " if close else ""


def _load_yaml(path: Path) -> Any:
    from ruamel.yaml import YAML

    text = read_text(path)  # a regular UTF-8 file of bounded size, never a FIFO or a device
    try:
        return YAML(typ="safe").load(text)
    except Exception as e:  # ruamel raises many types; all mean "bad YAML"
        raise UsageError(f"cannot read {path.name}: {e}", where=str(path), fix="fix the YAML syntax") from None


def _check_role(role: str, where: Where) -> None:
    known = available_roles()
    if role not in known:
        raise UsageError(f"unknown role '{role}'", where=where(()) if callable(where) else where,
                         fix=f"{closest(role, known)}known roles: {', '.join(known)}")


# --- role arguments (meta/argument_specs.yml) ---------------------------------------------------------------
CLOSE = 0.85  # how alike a name must be to a role's variable to be refused as its misspelling


def _role_dir(role: str) -> Path | None:
    """The folder of ``role`` that Ansible uses (the user's first: :func:`role_folders`)."""
    return role_folders().get(role)


@functools.cache
def _read_spec(path: Path, mtime: float) -> dict[str, dict[str, Any]]:
    """The options of ``main`` in one argument_specs.yml, checked enough to walk (a malformed one is refused)."""
    opts: Any = _load_yaml(path)
    for key in ("argument_specs", "main", "options"):
        opts = opts.get(key) if isinstance(opts, dict) else None
    if not isinstance(opts, dict) or not all(isinstance(o, dict) for o in opts.values()):
        raise TestbedError(f"{path.name} has no argument_specs.main.options mapping", where=str(path),
                           fix="write argument_specs: {main: {options: {VAR: {type: ..., description: ...}}}} "
                               "(Ansible's role argument format)")
    return opts


def role_spec(role: str) -> dict[str, dict[str, Any]]:
    """A role's variables and their specs (type, elements, choices, required, options) from its
    meta/argument_specs.yml; a role without one gets its defaults/main.yml keys, untyped (``raw``)."""
    d = _role_dir(role)
    if d is None:
        return {}
    f = d / "meta" / "argument_specs.yml"
    if f.is_file():
        return _read_spec(f, f.stat().st_mtime)
    defaults = d / "defaults" / "main.yml"
    data = _load_yaml(defaults) if defaults.is_file() else None
    return {k: {"type": "raw"} for k in data} if isinstance(data, dict) else {}


def role_variables(role: str) -> frozenset[str]:
    """The variables a role takes (its argument spec's options)."""
    return frozenset(role_spec(role))


def _derived(role: str) -> set[str]:
    """Names a role computes itself (vars/main.yml): not settings."""
    d = _role_dir(role)
    data = _load_yaml(d / "vars" / "main.yml") if d and (d / "vars" / "main.yml").is_file() else None
    return set(data) if isinstance(data, dict) else set()


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


_KINDS = {"str": "a string", "path": "a path", "int": "a whole number", "float": "a number", "bool": "true or false",
          "list": "a list", "dict": "a mapping"}
_PLURALS = {"str": "strings", "path": "paths", "int": "whole numbers", "float": "numbers", "bool": "booleans",
            "list": "lists", "dict": "mappings"}
_GOT = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean", "list": "a list",
        "dict": "a mapping"}


def _kind(type_name: str) -> str:
    return _KINDS.get(type_name, type_name)


def _label(loc: Loc) -> str:
    """``('dataset_items', 0, 'url')`` -> ``dataset_items[0].url``."""
    return str(loc[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])


def _about(opt: dict[str, Any]) -> str:
    """An option's description as one plain line (Ansible's C(...) markup dropped)."""
    text = opt.get("description") or ""
    text = " ".join(map(str, text)) if isinstance(text, list) else str(text)
    return re.sub(r"\b[A-Z]\(([^)]*)\)", r"\1", text).strip().rstrip(".")


def _check_value(role: str, name: str, value: Any, opt: dict[str, Any], loc: Loc,
                 where: Callable[[Loc], str]) -> None:
    """Refuse ``value`` where Ansible's role argument validation would (its own type converters decide; a Jinja
    template is left to Ansible, which checks it at role start once it has a value)."""
    from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

    if _is_template(value) or (value is None and not opt.get("required") and opt.get("default") is None):
        return  # (Ansible lets a null through only where the option has no default)
    spec_file = f"playbooks/roles/{role}/meta/argument_specs.yml"
    label, about = _label(loc), _about(opt)
    wanted = str(opt.get("type") or "str")
    convert = DEFAULT_TYPE_VALIDATORS.get(wanted, DEFAULT_TYPE_VALIDATORS["raw"])
    try:
        value = convert(value)
        if isinstance(value, float) and not math.isfinite(value):  # 'nan' and 'inf' convert; no role wants one
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        of = f" of {_PLURALS.get(opt['elements'], opt['elements'])}" if opt.get("elements") else ""
        kind = type(value).__name__
        got = "empty (nothing after its colon)" if value is None else f"{_GOT.get(kind, kind)} ({value!r})"
        raise UsageError(f"role '{role}': {label} must be {_kind(wanted)}{of}, not {got}", where=where(loc),
                         fix=f"give {label} {_kind(wanted)}{of}{f' ({about})' if about else ''}; see {spec_file}"
                         ) from None
    if isinstance(value, list) and opt.get("elements"):
        sub = {k: v for k, v in opt.items() if k not in ("type", "elements", "choices", "required")}
        sub["type"] = opt["elements"]
        for i, item in enumerate(value):
            _check_value(role, name, item, sub, (*loc, i), where)
        value = [v for v in value if not _is_template(v)]
    choices = opt.get("choices")
    if choices:
        if isinstance(value, list):  # a list takes one or more of the choices
            bad = [v for v in value if v not in choices]
        else:
            bad = [] if value in choices or (value in ("True", "False") and _bool_choice(value, choices)) else [value]
        if bad:
            shown = ", ".join(map(str, choices))
            raise UsageError(f"role '{role}': {label} is {bad[0]!r}, not one of {shown}", where=where(loc),
                             fix=f"{closest(str(bad[0]), [str(c) for c in choices])}write one of {shown} "
                                 f"(see {spec_file})")
    if isinstance(opt.get("options"), dict) and isinstance(value, dict):
        _check_options(role, value, opt["options"], loc, where)


def _bool_choice(value: str, choices: list[Any]) -> bool:
    """Ansible maps 'True'/'False' (a YAML boolean made a string) onto the one choice spelling that boolean."""
    from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE

    spellings = BOOLEANS_TRUE if value == "True" else BOOLEANS_FALSE
    return len(spellings.intersection(choices)) == 1


def _check_options(role: str, given: dict[str, Any], options: dict[str, dict[str, Any]], loc: Loc,
                   where: Callable[[Loc], str]) -> None:
    """A mapping with declared keys (a dict option's ``options``): unknown keys, missing required ones, values."""
    spec_file = f"playbooks/roles/{role}/meta/argument_specs.yml"
    label = _label(loc)
    for k in given:
        if k not in options:
            raise UsageError(f"role '{role}': {label} has no key '{k}'", where=where((*loc, k)),
                             fix=f"{closest(str(k), list(options))}keys: {', '.join(options)} (see {spec_file})")
    missing = [k for k, o in options.items() if o.get("required") and k not in given]
    if missing:
        raise UsageError(f"role '{role}': {label} lacks {', '.join(missing)}", where=where(loc),
                         fix=f"add {', '.join(k + ': ...' for k in missing)} (see {spec_file})")
    for k, v in given.items():
        _check_value(role, str(k), v, options[k], (*loc, k), where)


def check_role_vars(given: Mapping[str, Any] | Iterable[str], roles: list[str], where: Where) -> None:
    """Refuse variables given to ``roles`` that the roles would not take, before any host is touched.

    ``given`` is a mapping of variables (or bare names). A name a role declares is checked against its argument
    spec (type, elements, choices, keys of its items); a name that is no role's but is one role's prefix
    (``<role>_...``) or close to a role's variable is refused as a typo that Ansible would silently ignore (the role
    would run with its default). ``where`` names the place, or maps a path inside ``given`` to one (file:line).
    """
    at: Callable[[Loc], str] = where if callable(where) else (lambda _loc: str(where))
    values = given if isinstance(given, Mapping) else dict.fromkeys(given)
    for name in values:
        if not isinstance(name, str) or not VAR_RE.fullmatch(name):
            raise UsageError(f"{str(name)!r} is not a variable name" if str(name).strip() else
                             "a variable has an empty name", where=at((name,)),
                             fix="name it with letters, digits and _, not starting with a digit (as Ansible does)")
        bad = _non_finite(values[name], (name,)) if isinstance(given, Mapping) else None
        if bad is not None:
            raise UsageError(f"{_label(bad[0])} is {bad[1]}: not a number a role can use", where=at(bad[0]),
                             fix=f"give {_label(bad[0])} a finite number")
    specs = {r: role_spec(r) for r in sorted(set(roles))}
    close = {m: r for r, spec in specs.items() for m in spec}
    for name in sorted(values, key=str):
        n = str(name)
        owners = [r for r, spec in specs.items() if n in spec]
        for r in owners if isinstance(given, Mapping) else ():
            _check_value(r, n, values[name], specs[r][n], (n,), at)
        if owners:
            continue
        prefixed = sorted((r for r in specs if n.startswith(r + "_")), key=len)
        alike = difflib.get_close_matches(n, list(close), n=1, cutoff=CLOSE)
        role = prefixed[-1] if prefixed else close[alike[0]] if alike else None
        if role is None:
            continue
        spec_file = f"playbooks/roles/{role}/meta/argument_specs.yml"
        if n in _derived(role):
            raise UsageError(f"role '{role}' has no variable '{n}': it is derived by the role (vars/main.yml), "
                             "not a setting", where=at((n,)),
                             fix=f"set the variables it is derived from instead (see {spec_file})")
        raise UsageError(f"role '{role}' has no variable '{n}'", where=at((n,)),
                         fix=f"{closest(n, sorted(specs[role]))}see {spec_file}")


def _non_finite(value: Any, loc: Loc) -> tuple[Loc, float] | None:
    """Where in ``value`` a number is NaN or infinite (YAML's .nan, .inf), and that number; None if nowhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return loc, value
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _non_finite(v, (*loc, k))
        if found is not None:
            return found
    return None


def check_plan(plan: SetupPlan, given: Iterable[str] = ()) -> None:
    """Refuse a plan with a role whose required variable nothing sets: not the role entry, the profile's vars, nor
    ``given`` (the spec's vars and extra variables)."""
    have = set(plan.vars) | set(given)
    for step in plan.steps:
        spec = role_spec(step.role)
        missing = [n for n, o in spec.items() if o.get("required") and n not in have and n not in step.vars]
        if missing:
            raise UsageError(f"role '{step.role}' needs {', '.join(missing)}, which nothing sets",
                             where=step.where(),
                             fix=f"set {', '.join(missing)} in the role entry's vars:, the testbed spec's vars: or "
                                 f"with --var ({missing[0]}: {_about(spec[missing[0]])})")


def _locator(path: Path, base: Loc) -> Callable[[Loc], str]:
    """A ``where`` for values under ``base`` in the YAML file ``path``: file:line (the file is parsed only then)."""
    def where(loc: Loc) -> str:
        from ruamel.yaml import YAML

        try:
            line = Located(YAML(typ="rt").load(path.read_text())).line((*base, *loc))
        except Exception:  # the file was read once already; a line number is a nicety
            line = None
        return f"{path}:{line}" if line else str(path)
    return where


def load_profile(name: str, _seen: tuple[str, ...] = ()) -> SetupPlan:
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
    own = data.get("vars") or {}
    includes, entries = data.get("include") or [], data.get("roles") or []
    if not isinstance(own, dict) or not isinstance(entries, list) or not isinstance(includes, list):
        raise UsageError(f"profile '{name}': vars: must be a mapping, include: and roles: lists", where=str(path),
                         fix="write 'include: [base]', 'vars: {name: value}' and 'roles: [- role: NAME]'")
    steps: list[RoleStep] = []
    pvars: dict[str, Any] = {}
    for inc in includes:
        sub = load_profile(str(inc), (*_seen, name))
        steps += sub.steps
        pvars.update(sub.vars)
    check_role_vars(own, available_roles(), _locator(path, ("vars",)))
    pvars.update(own)
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"role": entry}
        at = _locator(path, ("roles", i))
        if not isinstance(entry, dict) or "role" not in entry:
            raise UsageError(f"profile '{name}': roles[{i}] needs a 'role:' key", where=at(()),
                             fix="write '- role: <name>' with optional 'vars:' and 'when:'")
        extra = set(entry) - {"role", "vars", "when"}
        if extra or not isinstance(entry.get("vars") or {}, dict) or not isinstance(entry.get("when", ""), str):
            raise UsageError(f"profile '{name}': roles[{i}] ({entry['role']}) has unknown keys or bad values",
                             where=at(()), fix="a role entry has role:, vars: (a mapping) and when: (a condition "
                                               "string) only" + (f"; remove {', '.join(sorted(extra))}" if extra
                                                                 else ""))
        _check_role(str(entry["role"]), at)
        check_role_vars(entry.get("vars") or {}, [str(entry["role"])], _locator(path, ("roles", i, "vars")))
        steps.append(RoleStep(str(entry["role"]), dict(entry.get("vars") or {}), entry.get("when") or None,
                              str(path), i))
    return SetupPlan(name=name, steps=steps, vars=pvars, description=str(data.get("description", "")))


def suite_profile(suite: str) -> str:
    """The profile a suite names (``profile:`` in its suite.yml); the suite's own name otherwise."""
    p = paths.find_suite(suite)
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
                 default_profile: str | None = "base", only: list[str] | None = None) -> SetupPlan:
    """Turn the command line's choice into a checked plan (UsageError before any host is touched). ``only``: of the
    profile chosen, just these roles (what a suite's point needs: its ``setup_roles``), with the profile's vars."""
    plan = _resolve_plan(profile=profile, suite=suite, roles=roles, default_profile=default_profile)
    if not only:
        return plan
    if roles:
        raise UsageError("'only' picks roles of a profile, not of --role", where="command line",
                         fix="give the roles with --role alone")
    unknown = [r for r in only if r not in plan.roles]
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not a role of profile '{plan.name}'", where="setup_roles",
                         fix=f"its roles: {', '.join(plan.roles)}")
    return SetupPlan(name=f"{plan.name} (roles {', '.join(r for r in plan.roles if r in only)})",
                     steps=[s for s in plan.steps if s.role in only], vars=plan.vars, description=plan.description)


def _resolve_plan(*, profile: str | None, suite: str | None, roles: list[str] | None,
                  default_profile: str | None) -> SetupPlan:
    chosen = [x for x in (profile, suite, roles) if x]
    if len(chosen) > 1:
        raise UsageError(by_door("choose one of --profile, --suite and --role",
                                 "choose one of profile, suite and roles"),
                         where=by_door("command line", "setup"),
                         fix=by_door("--profile P, or --suite S, or one or more --role R",
                                     "setup('P'), setup(suite='S') or setup(roles=['R', ...])"))
    if roles:
        for i, r in enumerate(roles):
            _check_role(r, "--role")
            if r in roles[:i]:
                raise UsageError(f"--role {r} is given twice", where="--role", fix="name each role once")
        base = None
        if default_profile and default_profile in available_profiles():
            base = load_profile(default_profile)
        steps: list[RoleStep] = []
        for r in roles:
            matches = [s for s in (base.steps if base else []) if s.role == r]
            steps += matches or [RoleStep(r, source=f"--role {r}")]
        return SetupPlan(name="roles: " + ", ".join(roles), steps=steps, vars=base.vars if base else {})
    if suite:
        return load_profile(suite_profile(suite))
    return load_profile(profile or default_profile or "base")


def build_playbook(plan: SetupPlan) -> list[dict[str, Any]]:
    """One play over all hosts applying the plan's roles in order, then :data:`~testbed.setup.events.FINISHED_TASK`
    (after the roles' handlers): only a host that reached it is recorded as set up."""
    roles = [{"role": s.role, **({"vars": s.vars} if s.vars else {}), **({"when": s.when} if s.when else {})}
             for s in plan.steps]
    return [{
        "name": f"testbed set-up: {plan.name}",
        "hosts": "all",
        "gather_facts": True,
        "gather_subset": ["!all"],
        "vars": plan.vars,
        "roles": roles,
        "post_tasks": [{"name": FINISHED_TASK, "ansible.builtin.debug": {"msg": "finished"}}],
    }]


def check_vars(spec: TestbedSpec) -> None:
    """Refuse a misspelt or ill-typed role variable in the spec's ``vars:`` (file:line), before any host is touched.

    Called by the commands that hand ``vars`` to set-up (provision, setup), not on every spec load: it reads
    every role's argument spec, which the CLI's quick commands need not pay for.
    """
    if not spec.vars:
        return
    located = yamlfile.load(Path(spec.source))[1] if spec.source and Path(spec.source).is_file() else None
    def where(loc: Loc) -> str:
        line = located.line(("vars", *loc)) if located else None
        return f"{spec.source}:{line}" if line else f"{spec.source or spec.name}: vars"

    check_role_vars(spec.vars, available_roles(), where)
