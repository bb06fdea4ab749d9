"""Set-up: apply Ansible roles (a profile, a suite's profile, or single roles) to a testbed's hosts.

``apply()`` drives ``ansible-runner`` against an inventory generated from state, turns its events into
per-host counts (and, through ``SetupProgress``, a live Rich view), and returns a ``SetupResult``.
Everything Ansible writes on the controller lives under ``<testbed home>/ansible/``.

A **profile** is ``playbooks/profiles/<name>.yml``::

    description: what it sets up
    include: [base]            # profiles whose roles come first (optional)
    vars: {key: value}         # play-wide variables (optional)
    roles:
      - role: mpi
        vars: {mpi_slots: 1}
        when: "mpi_wanted | bool"  # an Ansible condition: the role's tasks are skipped when false (optional)

Variable precedence, lowest first: role defaults < profile ``vars`` < a role entry's ``vars`` <
the testbed spec's ``vars`` < ``extra_vars``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed import paths
from testbed.errors import TestbedError, UsageError
from testbed.hosts import Host

EventHandler = Callable[[dict[str, Any]], object]

_COUNTED = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped")
_KEEP = (*_COUNTED, "runner_on_start", "runner_on_async_poll", "runner_on_async_failed", "playbook_on_stats",
         "playbook_on_task_start", "playbook_on_play_start", "runner_item_on_failed")


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


def _closest(name: str, choices: list[str]) -> str:
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
                         fix=f"{_closest(role, known)}known roles: {', '.join(known)}")


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
                                 fix=f"{_closest(n, sorted(known))}see playbooks/roles/{role}/defaults/main.yml")


def load_profile(name: str, _seen: tuple[str, ...] = ()) -> Plan:
    """Read and check a profile (and the profiles it includes) into a plan."""
    profiles = available_profiles()
    if name not in profiles:
        raise UsageError(f"unknown profile '{name}'", where="playbooks/profiles/",
                         fix=f"{_closest(name, list(profiles))}known profiles: {', '.join(profiles) or 'none'}")
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


# --- results ---------------------------------------------------------------------------------------------
@dataclass
class HostResult:
    """Counts of one host's task results and its first error."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    error: str | None = None
    error_task: str | None = None

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "changed" if self.changed else "ok"


@dataclass
class SetupResult:
    """Outcome of one ``apply``: per-host counts, first errors, time and Ansible's exit code."""

    testbed: str
    plan: str
    roles: list[str]
    check: bool
    rc: int
    status: str
    elapsed: float
    hosts: dict[str, HostResult]
    artifact_dir: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and all(h.failed == 0 and h.unreachable == 0 for h in self.hosts.values())

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["changed_total"] = self.changed
        d["elapsed"] = round(self.elapsed, 2)
        for name, h in self.hosts.items():
            d["hosts"][name]["status"] = h.status
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# --- events ----------------------------------------------------------------------------------------------
def _first_line_error(res: dict[str, Any]) -> str:
    """A short human error from a task result (msg plus the tail of stderr)."""
    msg = str(res.get("msg") or "").strip()
    stderr = str(res.get("stderr") or res.get("module_stderr") or "").strip()
    stdout = str(res.get("stdout") or res.get("module_stdout") or "").strip()
    if (res.get("results") and not msg.strip(" .")) or msg.startswith("One or more items failed"):
        for item in res.get("results") or []:
            if isinstance(item, dict) and item.get("failed"):
                return _first_line_error(item)
    parts = [msg] if msg else []
    tail = stderr or (stdout if res.get("rc") not in (None, 0) else "")
    if tail:
        lines = tail.splitlines()
        parts.append(" | ".join(lines[-4:]))
    if res.get("rc") not in (None, 0) and "rc=" not in msg:
        parts.append(f"rc={res.get('rc')}")
    return "; ".join(parts)[:1500] or "failed"


class EventAggregator:
    """Folds ansible-runner events into per-host counts, current task and first error (thread-safe)."""

    def __init__(self, hosts: list[str]):
        self.lock = threading.Lock()
        self.hosts: dict[str, HostResult] = {h: HostResult(h) for h in hosts}
        self.current: dict[str, str] = {h: "waiting" for h in hosts}
        self.polls: dict[str, int] = {}
        self.task = ""
        self.play = ""
        self.tasks_started = 0
        self.stats_seen = False
        self.started = time.monotonic()

    def _host(self, name: str) -> HostResult:
        if name not in self.hosts:
            self.hosts[name] = HostResult(name)
            self.current[name] = "waiting"
        return self.hosts[name]

    def handle(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event", "")
        d = ev.get("event_data") or {}
        host = d.get("host") or d.get("remote_addr")
        task = str(d.get("task") or "").strip()
        with self.lock:
            if kind == "playbook_on_play_start":
                self.play = str(d.get("play") or "")
            elif kind == "playbook_on_task_start":
                self.task = task
                self.tasks_started += 1
            elif kind == "runner_on_start" and host:
                self._host(host)
                self.current[host] = task
                self.polls.pop(host, None)
            elif kind == "runner_on_async_poll" and host:
                self.polls[host] = self.polls.get(host, 0) + 1
            elif kind == "playbook_on_stats":
                self._stats(d)
            elif kind in _COUNTED and host and not self.stats_seen:
                h = self._host(host)
                res = d.get("res") or {}
                if kind == "runner_on_ok":
                    h.ok += 1
                    h.changed += bool(res.get("changed"))
                elif kind == "runner_on_skipped":
                    h.skipped += 1
                elif kind == "runner_on_unreachable":
                    h.unreachable += 1
                    h.error = h.error or _first_line_error(res)
                    h.error_task = h.error_task or task
                elif kind == "runner_on_failed":
                    if d.get("ignore_errors"):
                        h.ignored += 1
                    else:
                        h.failed += 1
                        h.error = h.error or _first_line_error(res)
                        h.error_task = h.error_task or task
                self.current[host] = task
            if kind == "runner_on_async_failed" and host:
                h = self._host(host)
                h.error = h.error or _first_line_error(d.get("res") or {})
                h.error_task = h.error_task or task

    def _stats(self, d: dict[str, Any]) -> None:
        """Ansible's own final counts replace the running ones."""
        self.stats_seen = True
        keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        seen: set[str] = set()
        for k in keys:
            seen |= set((d.get(k) or {}).keys())
        for name in seen:
            h = self._host(name)
            for src, dst in keys.items():
                setattr(h, dst, int((d.get(src) or {}).get(name, 0)))
        for name in self.hosts:
            self.current[name] = "done"

    def snapshot(self) -> tuple[dict[str, HostResult], dict[str, str], dict[str, int], str]:
        with self.lock:
            return ({k: HostResult(**asdict(v)) for k, v in self.hosts.items()}, dict(self.current),
                    dict(self.polls), self.task)


# --- progress display ------------------------------------------------------------------------------------
class SetupProgress:
    """A Rich renderable of the running set-up; pass ``handle`` as ``on_event`` and show it in a ``Live``."""

    def __init__(self, hosts: list[str], title: str = "setup", poll_seconds: float = 5):
        self.agg = EventAggregator(hosts)
        self.title = title
        self.poll_seconds = poll_seconds

    def handle(self, ev: dict[str, Any]) -> None:
        self.agg.handle(ev)

    def __rich__(self) -> Any:
        return render_progress(self)


def render_progress(view: SetupProgress) -> Any:
    """The live table: one row per host with its current task and running counts."""
    from rich.table import Table

    hosts, current, polls, task = view.agg.snapshot()
    elapsed = time.monotonic() - view.agg.started
    t = Table(title=f"{view.title}  ·  {task or 'starting'}  ·  {elapsed:.0f} s", title_justify="left",
              expand=False)
    t.add_column("host")
    t.add_column("task", overflow="ellipsis", max_width=60)
    for col in ("ok", "changed", "failed", "skipped"):
        t.add_column(col, justify="right")
    for name, h in hosts.items():
        now = current.get(name, "")
        if name in polls and now != "done":
            now = f"{now} (running {int(polls[name] * view.poll_seconds)} s)"
        style = "red" if h.failed or h.unreachable else ("yellow" if h.changed else "")
        if h.unreachable:
            now = f"UNREACHABLE: {h.error or ''}"
        elif h.failed:
            now = f"FAILED at {h.error_task}"
        t.add_row(name, now, str(h.ok), str(h.changed), str(h.failed), str(h.skipped), style=style)
    return t


def render_summary(result: SetupResult) -> Any:
    """The final table host x ok/changed/failed/unreachable, and each failed host's first error."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    verdict = "would change" if result.check else "changed"
    t = Table(title=f"setup {result.testbed}: {result.plan}  ({result.elapsed:.1f} s"
                    f"{', check mode' if result.check else ''})", title_justify="left")
    t.add_column("host")
    for col in ("ok", verdict, "failed", "unreachable", "skipped"):
        t.add_column(col, justify="right")
    t.add_column("status")
    for name, h in result.hosts.items():
        style = {"failed": "red", "unreachable": "red", "changed": "yellow"}.get(h.status, "green")
        t.add_row(name, str(h.ok), str(h.changed), str(h.failed), str(h.unreachable), str(h.skipped),
                  Text(h.status, style=style))
    parts: list[Any] = [t]
    for name, h in result.hosts.items():
        if h.error:
            parts.append(Text(f"{name}: {h.error_task or 'error'}: {h.error}", style="red"))
    if result.error:
        parts.append(Text(result.error, style="red"))
    return Group(*parts)


# --- inventory, playbook, environment --------------------------------------------------------------------
def build_inventory(testbed: str, hosts: list[Host], variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The testbed's one inventory (:func:`testbed.ssh.inventory`), its ssh_config written first if missing."""
    from testbed import ssh

    if not ssh.ssh_config_path(testbed).exists():
        ssh.write_ssh_config(testbed, hosts)
    return ssh.inventory(testbed, hosts, variables)


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


def ansible_dir() -> Path:
    p = paths.home() / "ansible"
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def _control_dir(base: Path) -> Path:
    """Where Ansible's SSH control sockets go: under the home unless that path is too long for a socket."""
    d = base / "cp"
    if len(str(d)) > 60:
        tag = hashlib.sha256(str(base).encode()).hexdigest()[:10]
        d = Path(f"/tmp/tbac-{os.getuid()}-{tag}")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def ansible_env(testbed: str, forks: int) -> dict[str, str]:
    """Environment of ansible-playbook: every controller-side path under the testbed home."""
    base = ansible_dir()
    tmp = base / "tmp"
    tmp.mkdir(exist_ok=True, mode=0o700)
    facts = base / "facts" / testbed
    facts.mkdir(parents=True, exist_ok=True, mode=0o700)
    venv_bin = os.path.dirname(sys.executable)
    return {
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
        "ANSIBLE_HOME": str(base),
        "ANSIBLE_LOCAL_TEMP": str(tmp),
        "ANSIBLE_ROLES_PATH": str(roles_dir()),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(_control_dir(base)),
        "ANSIBLE_SSH_RETRIES": "3",
        "ANSIBLE_TIMEOUT": "30",
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_GALAXY_CACHE_DIR": str(base / "galaxy_cache"),
        "ANSIBLE_PERSISTENT_CONTROL_PATH_DIR": str(base / "pc"),
        "ANSIBLE_CONFIG": str(base / "ansible.cfg"),
    }


_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "SHELL",
             "SSH_AUTH_SOCK", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
             "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "JOB_ID",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "XDG_CONFIG_HOME",
             "XDG_CACHE_HOME")
# PIP_*: the controller downloads wheels for offline hosts with the user's pip settings (index, constraints)
_ENV_KEEP_PREFIXES = ("ANSIBLE_", "AWX_", "RUNNER_", "LC_", "PROFILE_TASKS_", "PIP_")


# ansible-playbook is started through this: it gets SIGTERM when the testbed process dies, even by SIGKILL
# (Linux PR_SET_PDEATHSIG survives the exec), so a killed `testbed setup` leaves nothing working on the hosts
_DIE_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG\n"
                    "if os.getppid() == 1:\n    sys.exit(143)  # the parent is already gone\n"
                    "os.execvp(sys.argv[1], sys.argv[1:])\n")


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """The environment ansible-playbook gets: what it needs (locale, PATH, HOME, the SSH agent, proxies, its own
    ANSIBLE_*/runner settings), nothing else (OS_PASSWORD, application credentials, cloud tokens...)."""
    return {k: v for k, v in env.items() if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}


# --- apply -----------------------------------------------------------------------------------------------
def _load_spec(testbed: str) -> Any:
    from testbed.spec import load_testbed
    from testbed.state import Store

    store = Store.open_default()
    try:
        rec = store.testbed(testbed)
        hosts = store.hosts(testbed)
    finally:
        store.close()
    spec = None
    src = (rec or {}).get("spec_path")
    try:
        spec = load_testbed(src if src and Path(src).exists() else testbed)
    except UsageError:
        if rec is None:
            raise
    return rec, hosts, spec


def _check_limit(limit: list[str] | None, names: list[str]) -> list[str] | None:
    if not limit:
        return None
    out: list[str] = []
    for item in limit:
        for n in (x.strip() for x in item.split(",")):
            if not n:
                continue
            if n not in names:
                raise UsageError(f"--limit names unknown host '{n}'", where="--limit",
                                 fix=f"{_closest(n, names)}hosts: {', '.join(names)}")
            out.append(n)
    return out


def _controller_site_packages() -> str | None:
    """The site-packages of testbed's own env when it holds torch (what the local suites need)."""
    import importlib.util
    import sysconfig

    if importlib.util.find_spec("torch") is None:
        return None
    return sysconfig.get_paths()["purelib"]


def apply(testbed: str, *, profile: str | None = None, suite: str | None = None, roles: list[str] | None = None,
          check: bool = False, limit: list[str] | None = None, extra_vars: dict[str, Any] | None = None,
          on_event: EventHandler | None = None, forks: int | None = None) -> SetupResult:
    """Apply a profile (or a suite's profile, or single roles) to a testbed; a failed host does not stop others.

    Everything is checked (profile, roles, hosts, --limit) before any host is touched.
    """
    rec, hosts, spec = _load_spec(testbed)
    if not hosts:
        raise UsageError(f"testbed '{testbed}' has no hosts", where="state",
                         fix=f"provision it first: testbed provision {testbed}")
    default_profile = (spec.profile if spec is not None else None) or "base"
    plan = resolve_plan(profile=profile, suite=suite, roles=roles, default_profile=default_profile)
    names = [h.name for h in hosts]
    lim = _check_limit(limit, names)

    variables: dict[str, Any] = {"testbed_cache_dir": str(paths.home() / "cache")}
    subnet = ((rec or {}).get("info") or {}).get("subnet") or getattr(getattr(spec, "provider", None), "subnet", None)
    if subnet:
        variables["testbed_subnet"] = str(subnet)
    provider = (rec or {}).get("provider") or (spec.kind if spec is not None else "")
    variables["testbed_provider"] = provider
    from testbed.providers import PROVIDERS, provider_class

    cls = provider_class(provider) if provider in PROVIDERS else None
    variables["testbed_offline"] = bool(cls and cls.offline_hosts)  # no route out: install from the controller
    shared = _controller_site_packages() if cls and cls.shares_controller_files else None
    if shared:  # the hosts see this machine's files: they can use the controller's env as a shared one
        variables["testbed_controller_site_packages"] = shared
    extravars = {**(dict(spec.vars) if spec is not None else {}), **(extra_vars or {})}
    all_roles = available_roles()
    if spec is not None:  # before any host: a misspelt role variable would silently leave the default
        from testbed.spec import check_vars

        check_vars(spec)
    check_role_vars(set(extra_vars or {}), all_roles, "extra variables")
    check_role_vars(set(plan.vars), all_roles, f"profile {plan.name}: vars")

    base = ansible_dir()
    run_dir = base / "runs" / testbed
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (base / "ansible.cfg").write_text("# generated by testbed; settings come from the environment\n[defaults]\n")
    inv_path = run_dir / "inventory.json"
    inv_path.write_text(json.dumps(build_inventory(testbed, hosts, variables), indent=2))
    pb_path = run_dir / "playbook.json"
    pb_path.write_text(json.dumps(build_playbook(plan), indent=2))
    nforks = forks or min(50, max(5, len(hosts)))
    env = ansible_env(testbed, nforks)

    agg = EventAggregator([n for n in names if not lim or n in lim])

    def handler(ev: dict[str, Any]) -> bool:
        agg.handle(ev)
        if on_event is not None:
            with contextlib.suppress(Exception):  # a display bug must not break the set-up
                on_event(ev)
        return ev.get("event", "") in _KEEP


    cmdline = "--check --diff" if check else None
    ident = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    start = time.monotonic()
    from ansible_runner.interface import init_runner

    r = init_runner(
        private_data_dir=str(run_dir), ident=ident, playbook=str(pb_path), inventory=str(inv_path),
        extravars=extravars, limit=",".join(lim) if lim else None, cmdline=cmdline, forks=nforks,
        envvars=env, event_handler=handler, quiet=True, suppress_env_files=True, rotate_artifacts=20,
        settings={"suppress_ansible_output": True},
    )
    # ansible-runner hands ansible-playbook this machine's whole environment and writes it into the run's
    # artifacts (artifacts/<id>/command): keep only what Ansible needs, never the user's cloud secrets
    r.config.env = scrub_env(r.config.env)
    r.config.command = [sys.executable, "-c", _DIE_WITH_PARENT, *r.config.command]
    r.run()
    elapsed = time.monotonic() - start
    hosts_res, _, _, _ = agg.snapshot()
    error = None
    rc = int(r.rc if r.rc is not None else 1)
    if rc != 0 and not agg.stats_seen:
        try:
            out = (r.stdout.read() if hasattr(r.stdout, "read") else str(r.stdout or "")).strip()
        except Exception:  # the runner's stdout handle may already be closed
            out = ""
        error = f"ansible-playbook failed before finishing (rc={rc}): " + " | ".join(out.splitlines()[-6:])
    return SetupResult(testbed=testbed, plan=plan.name, roles=plan.roles, check=check, rc=rc,
                       status=str(r.status), elapsed=elapsed, hosts=hosts_res,
                       artifact_dir=str(getattr(r.config, "artifact_dir", "") or ""), error=error)


def apply_with_progress(testbed: str, console: Any = None, **kw: Any) -> SetupResult:
    """``apply`` with the live per-host view on ``console`` and the summary printed at the end (CLI helper)."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    _, hosts, _ = _load_spec(testbed)
    view = SetupProgress([h.name for h in hosts], title=f"setup {testbed}")
    user_cb = kw.pop("on_event", None)

    def both(ev: dict[str, Any]) -> None:
        view.handle(ev)
        if user_cb:
            user_cb(ev)

    with Live(view, console=console, refresh_per_second=4, transient=True):
        result = apply(testbed, on_event=both, **kw)
    console.print(render_summary(result))
    return result
