"""Set-up: apply Ansible roles (a profile, a suite's profile, or single roles) to a testbed's hosts.

``apply()`` drives ``ansible-runner`` against an inventory generated from state, turns its events into
per-host counts (``events``) and returns a ``SetupResult``; ``profiles`` resolves what is applied; the live
view is the CLI's (``testbed.cli.setup_view``).
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
import json
import os
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import paths
from testbed.errors import TestbedError, UsageError, by_door, provision_fix
from testbed.hosts import Host

if TYPE_CHECKING:
    from ansible_runner import Runner  # untyped: what mypy knows of it is Any

    from testbed.resolved import Resolved

from testbed import remote, ssh
from testbed.providers import PROVIDERS, provider_class
from testbed.resolved import Resolved
from testbed.setup import address, direct, reach
from testbed.setup.events import (
    DOWNLOAD_EVENT,
    KEPT_EVENTS,
    EventAggregator,
    EventHandler,
    HostSetupResult,
    SetupResult,
    read_copies,
    read_download,
)
from testbed.setup.profiles import (
    SetupPlan,
    available_profiles,
    available_roles,
    build_playbook,
    check_plan,
    check_role_vars,
    check_vars,
    closest,
    load_profile,
    overridden_roles,
    resolve_plan,
    role_folders,
    role_spec,
    role_variables,
    roles_dir,
    suite_profile,
)

__all__ = ["EventAggregator", "HostSetupResult", "SetupPlan", "SetupResult", "ansible_dir", "ansible_env", "apply",
           "available_profiles", "available_roles", "build_inventory", "build_playbook", "check_plan",
           "check_role_vars", "load_profile", "resolve_plan", "role_spec", "role_variables", "roles_dir",
           "scrub_env", "suite_profile"]


# --- inventory, playbook, environment --------------------------------------------------------------------

HOME_WRITER = ("{{ not (testbed_hardware | default({})).shared_home | default(false) | bool or inventory_hostname == "
               "(ansible_play_hosts_all | map('extract', hostvars) | selectattr('testbed_home_target', 'defined') "
               "| selectattr('testbed_home_target', 'equalto', testbed_home_target | default('')) "
               "| map(attribute='inventory_hostname') | first | default(ansible_play_hosts_all[0])) }}")
"""``testbed_home_writer``, as every set-up hands it to the roles (templated per host by Ansible): on a home every
host shares, the one host that writes a path under it. A role sets ``testbed_home_target`` (the path it writes,
e.g. an environment's prefix) on every host first; the writer is the first host of the play as it started with the
same target (hosts that make different environments, emu and ori, each write their own), and a failure of it
leaves that path unwritten rather than handing it to a second host halfway (``ansible_play_hosts`` drops failed
hosts)."""

def build_inventory(testbed: str, hosts: list[Host], variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The testbed's one inventory (:func:`testbed.ssh.inventory`), its ssh_config written first if missing."""
    if not ssh.ssh_config_path(testbed).exists():
        ssh.write_ssh_config(testbed, hosts)
    return ssh.inventory(testbed, hosts, variables)


def ansible_dir() -> Path:
    p = paths.home() / "ansible"
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def ansible_control_dir(testbed: str) -> Path:
    """Where Ansible's SSH control sockets go: ``ansible/`` in the testbed's control folder, which destroy removes
    with every master connection in it (:func:`testbed.ssh.control_dir`)."""
    d = ssh.control_dir(testbed) / "ansible"
    d.mkdir(exist_ok=True, mode=0o700)
    return d


def ansible_env(testbed: str, forks: int) -> dict[str, str]:
    """Environment of ansible-playbook: every controller-side path under the testbed home."""
    base = ansible_dir()
    tmp = base / "tmp"
    tmp.mkdir(exist_ok=True, mode=0o700)
    facts = base / "facts" / testbed
    facts.mkdir(parents=True, exist_ok=True, mode=0o700)
    venv_bin = os.path.dirname(sys.executable)
    roles = str(roles_dir())
    if os.pathsep in roles:  # ANSIBLE_ROLES_PATH is a list of folders
        raise TestbedError(f"the roles folder {roles} holds '{os.pathsep}', which ANSIBLE_ROLES_PATH reads as two "
                           "folders", where=roles, fix="run testbed from a folder whose path has no "
                                                       f"'{os.pathsep}'")
    return {
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
        "ANSIBLE_HOME": str(base),
        "ANSIBLE_LOCAL_TEMP": str(tmp),
        "ANSIBLE_ROLES_PATH": roles,
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(ansible_control_dir(testbed)),
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
def _check_limit(limit: list[str] | None, names: list[str]) -> list[str] | None:
    """The host names of ``limit`` (items may hold commas); None: every host. A limit that names no host (``[]``,
    ``','``) is refused: it would otherwise widen to every host."""
    if limit is None:
        return None
    out: list[str] = []
    for item in limit:
        for n in (x.strip() for x in item.split(",")):
            if not n:
                continue
            if n in out:
                continue
            if n not in names:
                raise UsageError(f"--limit names unknown host '{n}'", where="--limit",
                                 fix=f"{closest(n, names)}hosts: {', '.join(names)}")
            out.append(n)
    if not out:
        raise UsageError(f"--limit {','.join(limit)!r} names no host", where="--limit",
                         fix=by_door(f"name hosts (--limit {','.join(names[:2])}), or leave --limit out for every "
                                     "host", f"name hosts (limit={names[:2]!r}), or leave limit out for every host"))
    return out


def _verified(verify: bool | Collection[str], names: list[str], targets: list[str]) -> set[str]:
    """The targets that run whatever their record says: all (``True``), none (``False``) or those named."""
    if isinstance(verify, bool):
        return set(targets) if verify else set()
    wanted = [verify] if isinstance(verify, str) else list(verify)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise UsageError(f"verify names unknown host '{unknown[0]}'", where="verify",
                         fix=f"{closest(unknown[0], names)}hosts: {', '.join(names)}")
    return set(wanted) & set(targets)


def _controller_site_packages() -> str | None:
    """The site-packages folder that holds torch where testbed's own Python finds it (what the local suites need):
    the env's own, or another one its path reaches (a system or user site, a ``.pth`` file's folder)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)


@dataclass
class Prepared:
    """What one set-up applies, checked, before any host: the plan, its play-wide and extra variables."""

    plan: SetupPlan
    variables: dict[str, Any]  # play-wide variables testbed derives (the inventory's all.vars)
    extravars: dict[str, Any]  # the spec's vars and --var
    base_image: str  # what the hosts booted from (Provider.base_image)

    def image(self) -> tuple[str, dict[str, str]]:
        """The key and parts of an image of this set-up (:func:`testbed.setup.address.image_parts`)."""
        refs = address.source_refs(self.plan.vars, [(st.role, st.vars) for st in self.plan.steps], self.extravars)
        common = address.common_parts(playbook=build_playbook(self.plan), roles=self.plan.roles,
                                      roles_dir=roles_dir(), variables=self.extravars, inventory={},
                                      sources=address.source_commits(refs))
        parts = address.image_parts(common, self.variables, self.base_image)
        return address.image_key(parts), parts


def prepare(tb: Resolved, *, profile: str | None = None, suite: str | None = None, roles: list[str] | None = None,
            extra_vars: dict[str, Any] | None = None, only: list[str] | None = None) -> Prepared:
    """The plan and variables of a set-up of ``tb`` (checked: a bad profile, role or variable is refused here);
    ``only``: just these roles of the profile."""
    spec = tb.spec
    default_profile = (spec.profile if spec is not None else None) or "base"
    plan = resolve_plan(profile=profile, suite=suite, roles=roles, default_profile=default_profile, only=only)
    # downloads on the controller (wheels, datasets, source builds) are keyed by content and kept once per user,
    # shared by every state home (paths.user_cache)
    variables: dict[str, Any] = {"testbed_cache_dir": str(paths.user_cache()),
                                 # where a role's downloads on the controller write pip's progress (shown live)
                                 "testbed_progress_file": str(ansible_dir() / "runs" / tb.name / "progress.log")}
    if tb.subnet:
        variables["testbed_subnet"] = tb.subnet
    provider = tb.kind
    variables["testbed_provider"] = provider
    if spec is not None:  # what the real machines are like (interface, GPUs, shared home): roles derive from it
        variables["testbed_hardware"] = spec.hardware.context()
    # the one host of the play that writes what lands under a home every host shares (python_env, source_build,
    # dataset): the first host of the play where the home is shared (NFS), every host on homes of their own
    variables["testbed_home_writer"] = HOME_WRITER
    cls = provider_class(provider) if provider in PROVIDERS else None
    variables["testbed_offline"] = bool(cls and cls.offline_hosts)  # no route out: install from the controller
    # root: the provider gives it (not a Slurm cluster's nodes), and the spec's login user is root or has sudo
    no_sudo = spec is not None and not spec.hardware.sudo and spec.user != "root"
    variables["testbed_root"] = not (cls and not cls.root_on_hosts) and not no_sudo
    if not variables["testbed_root"]:  # no root: the mesh's names go in ~/.ssh/config
        variables["ssh_mesh_etc_hosts"] = False
    shared = _controller_site_packages() if cls and cls.shares_controller_files else None
    if shared:  # the hosts see this machine's files: they can use the controller's env as a shared one
        variables["testbed_controller_site_packages"] = shared
    extravars = {**(dict(spec.vars) if spec is not None else {}), **(extra_vars or {})}
    all_roles = available_roles()
    if spec is not None:  # before any host: a misspelt role variable would silently leave the default
        check_vars(spec)
    check_role_vars(extra_vars or {}, all_roles, "extra variables (--var)")
    check_plan(plan, extravars)  # every role's required variables are set by someone
    if variables["testbed_offline"]:  # a user's role that downloads would wait on a mirror it cannot reach
        reach.refuse_offline(plan.roles, role_folders(), tb.name)
    base_image = cls.base_image(spec) if cls is not None and spec is not None else provider
    return Prepared(plan, variables, extravars, base_image)


@dataclass
class _Job:
    """One set-up under way: the testbed, what it applies on which hosts, and what the probe found."""

    tb: Resolved
    prep: Prepared
    roles: list[str] | None  # as asked (what state remembers)
    check: bool
    inventory: dict[str, Any]
    playbook: list[dict[str, Any]]
    targets: list[str]
    verified: set[str]
    probe: _Probe
    start: float
    partial_roles: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.tb.name

    @property
    def to_run(self) -> list[str]:
        return [n for n in self.targets if n not in self.probe.unchanged]

    def result(self, **kw: Any) -> SetupResult:
        """The set-up's result (remembered in state when it succeeded); ``kw``: what this outcome sets."""
        plan, probe = self.prep.plan, self.probe
        res = SetupResult(**{"testbed": self.name, "plan": plan.name, "roles": plan.roles, "check": self.check,
                             "elapsed": time.monotonic() - self.start, "verify": self.verified >= set(self.targets),
                             "unchanged": probe.unchanged, "reasons": probe.reasons,
                             "unfinished": [n for n in probe.unfinished if n in self.targets],
                             "probe_seconds": probe.seconds,
                             "overrides": {r: str(used) for r, (used, _) in overridden_roles().items()
                                           if r in plan.roles}, **kw})
        return _remember(self.tb, self.roles, res)


def apply(testbed: str | Resolved, *, profile: str | None = None, suite: str | None = None,
          roles: list[str] | None = None, check: bool = False, limit: list[str] | None = None,
          extra_vars: dict[str, Any] | None = None, on_event: EventHandler | None = None,
          forks: int | None = None, verify: bool | Collection[str] = False,
          only: list[str] | None = None) -> SetupResult:
    """Apply a profile (or a suite's profile, or single roles) to a testbed; a failed host does not stop others.

    Everything is checked (profile, roles, hosts, --limit) before any host is touched. ``testbed``: the resolved
    testbed, or its name (resolved here). A host whose recorded set-up address (:mod:`testbed.setup.address`)
    matches is skipped after one round trip; Ansible runs on the others only, and the address is recorded on each
    host whose play ran to its end without a failure (a host whose play a failure elsewhere ended is ``stopped``;
    until recorded, a host holds a pending mark, and the next set-up lists it in ``unfinished``). ``verify``: run
    Ansible on every host anyway (or, given host names, on those hosts anyway, the others skipped as usual); a host
    whose record matched yet had changes is reported in ``drift``. ``check``: Ansible's check mode, no record read or
    written (with ``verify``: records are read, not removed, and drift is what check mode would change).
    A host that holds the work already (booted from this set-up's image, :mod:`testbed.setup.images`, or whose
    record differs only in the testbed's hosts) is ``partial``: when every host to set up is, only the roles that
    depend on the other hosts run (``partial_roles``; none: the address is recorded without Ansible).
    """
    tb = testbed if isinstance(testbed, Resolved) else Resolved.open(testbed, need_spec=False)
    if not tb.hosts:
        raise UsageError(f"testbed '{tb.name}' has no hosts", where="state",
                         fix=f"provision it first: {provision_fix(tb.name)}")
    prep = prepare(tb, profile=profile, suite=suite, roles=roles, extra_vars=extra_vars, only=only)
    names = [h.name for h in tb.hosts]
    lim = _check_limit(limit, names)
    base = ansible_dir()
    (base / "runs" / tb.name).mkdir(parents=True, exist_ok=True, mode=0o700)
    (base / "ansible.cfg").write_text("# generated by testbed; settings come from the environment\n[defaults]\n")
    inventory = _inventory(tb, prep.variables)
    playbook = build_playbook(prep.plan)
    targets = [n for n in names if not lim or n in lim]
    verified = _verified(verify, names, targets)
    start = time.monotonic()
    probe = _probe(tb.name, prep, playbook, inventory, targets, check=check, verify=verified)
    job = _Job(tb, prep, roles, check, inventory, playbook, targets, verified, probe, start)
    if job.to_run and not check and all(n in probe.partial for n in job.to_run):
        done = _apply_partial(job)
        if done is not None:
            return done
    if not job.to_run:  # every host already has exactly this set-up: nothing for Ansible to do
        return job.result(rc=0, status="skipped", hosts={n: HostSetupResult(n, unchanged=True) for n in targets},
                          ran=False, reasons={})
    if probe.unchanged:  # Ansible runs on the hosts that differ only
        lim = [n for n in (lim or job.to_run) if n in job.to_run]
    return _run_ansible(job, lim, forks, on_event)


def _inventory(tb: Resolved, variables: dict[str, Any]) -> dict[str, Any]:
    """The play's inventory; a host whose hardware differs (the spec's hardware.hosts) gets its own
    ``testbed_hardware``."""
    inventory = build_inventory(tb.name, tb.hosts, variables)
    spec = tb.spec
    if spec is not None and spec.hardware.hosts:
        for name, hv in inventory["all"]["hosts"].items():
            if name in spec.hardware.hosts:
                hv["testbed_hardware"] = spec.hardware.context(name)
    return inventory


def _apply_partial(job: _Job) -> SetupResult | None:
    """Every host to set up holds this set-up's work already (booted from its image, or only the testbed's hosts
    changed): only the roles that depend on the other hosts run, the rest is checked by the address. The result
    when done here (nothing to run, or the direct pass); None: Ansible runs ``job.partial_roles``."""
    plan, probe, to_run = job.prep.plan, job.probe, job.to_run
    job.partial_roles = address.per_testbed_roles(plan.roles, roles_dir())
    job.playbook = build_playbook(SetupPlan(plan.name, [st for st in plan.steps if st.role in job.partial_roles],
                                       plan.vars, plan.description))
    if not job.partial_roles:  # nothing depends on the other hosts: recording the address is all there is
        _record(job.name, plan.name, probe, to_run)
        return job.result(rc=0, status="skipped", ran=False, partial=probe.partial, partial_roles=[],
                          hosts={n: HostSetupResult(n, unchanged=n not in to_run) for n in job.targets})
    why = direct.why_not(job.partial_roles, plan.steps, plan.vars, job.prep.extravars, job.prep.variables)
    if why:
        return None
    # a few files naming the other hosts, and checks: testbed writes them over its SSH masters
    done = direct.apply(job.name, job.inventory, to_run, job.partial_roles, roles_dir())
    if done.fallback:
        return None
    if done.error is None:
        _record(job.name, plan.name, probe, to_run)
    for n in probe.unchanged:
        done.hosts[n] = HostSetupResult(n, unchanged=True)
    return job.result(rc=0 if done.error is None else 2, status="successful" if done.error is None else "failed",
                      hosts={n: done.hosts[n] for n in job.targets if n in done.hosts}, error=done.error,
                      partial={n: w for n, w in probe.partial.items() if n in to_run},
                      partial_roles=job.partial_roles, direct=True)


def _run_ansible(job: _Job, lim: list[str] | None, forks: int | None,
                 on_event: EventHandler | None) -> SetupResult:
    """Run the playbook on the hosts to set up (``lim``: Ansible's --limit) and tally what it did."""
    run_dir = ansible_dir() / "runs" / job.name
    inv_path = run_dir / "inventory.json"
    inv_path.write_text(json.dumps(job.inventory, indent=2))
    pb_path = run_dir / "playbook.json"
    pb_path.write_text(json.dumps(job.playbook, indent=2))
    nforks = forks or min(50, max(5, len(job.to_run)))
    env = ansible_env(job.name, nforks)
    agg = EventAggregator(job.to_run)

    def handler(ev: dict[str, Any]) -> bool:
        agg.handle(ev)
        if on_event is not None:
            with contextlib.suppress(Exception):  # a display bug must not break the set-up
                on_event(ev)
        return ev.get("event", "") in KEPT_EVENTS

    progress_file = run_dir / "progress.log"
    progress_file.write_bytes(b"")
    for old in run_dir.glob("progress.log.copy-*"):  # an earlier set-up's copies
        old.unlink(missing_ok=True)
    watch = _DownloadWatch(progress_file, on_event) if on_event is not None else None
    # ansible-runner turns SIGINT/SIGTERM into a flag that cancels the play (in init_runner), and never puts the
    # old handlers back: afterwards Ctrl-C would stop nothing in this process (a run's follow). Put them back.
    import signal

    from ansible_runner.interface import init_runner

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = init_runner(
            private_data_dir=str(run_dir), ident=time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}",
            playbook=str(pb_path), inventory=str(inv_path), extravars=job.prep.extravars,
            limit=",".join(lim) if lim else None, cmdline="--check --diff" if job.check else None, forks=nforks,
            envvars=env, event_handler=handler, quiet=True, suppress_env_files=True,
            rotate_artifacts=20, settings={"suppress_ansible_output": True},
        )
        # ansible-runner hands ansible-playbook this machine's whole environment and writes it into the run's
        # artifacts (artifacts/<id>/command): keep only what Ansible needs, never the user's cloud secrets
        r.config.env = scrub_env(r.config.env)
        r.config.command = [sys.executable, "-c", _DIE_WITH_PARENT, *r.config.command]
        if watch:
            watch.start()
        r.run()
    finally:
        if watch:
            watch.stop()
        if threading.current_thread() is threading.main_thread():
            for sig, previous in saved.items():
                signal.signal(sig, previous)
        if job.probe.addresses:  # the probe's connections predate what Ansible changed (login shell, limits, ...)
            _close_masters(job.name, job.to_run)
    if str(r.status) == "canceled":  # the user's Ctrl-C (or a TERM) reached the play: stop here as well
        raise KeyboardInterrupt
    return _ansible_result(job, r, agg)


def _ansible_result(job: _Job, r: Runner, agg: EventAggregator) -> SetupResult:
    """What the play did: per-host tallies, its first error, drift (--verify); the address is recorded on each
    host whose play ran to its end without a failure (one whose play stopped is ``stopped``: the next set-up
    runs it again)."""
    probe, to_run = job.probe, job.to_run
    hosts_res, _, _, _ = agg.snapshot()
    finished = agg.finished if agg.stats_seen else set()
    for n in to_run:
        h = hosts_res.get(n)
        if h is not None and n not in finished and not h.failed and not h.unreachable:
            h.stopped = True
    error = None
    rc = int(r.rc if r.rc is not None else 1)
    if rc != 0 and not agg.stats_seen:
        try:
            out = (r.stdout.read() if hasattr(r.stdout, "read") else str(r.stdout or "")).strip()
        except Exception:  # the runner's stdout handle may already be closed
            out = ""
        error = f"ansible-playbook failed before finishing (rc={rc}): " + " | ".join(out.splitlines()[-6:])
    if not job.check:  # only now, and only where the play ran to its end without a failure
        _record(job.name, job.prep.plan.name, probe, [n for n in to_run if n in hosts_res and n in finished
                                                      and not hosts_res[n].failed and not hosts_res[n].unreachable])
    for n in probe.unchanged:
        hosts_res[n] = HostSetupResult(n, unchanged=True)
    drift = {n: hosts_res[n].changed_tasks or [f"{hosts_res[n].changed} changed tasks"]
             for n in probe.matched if n in job.verified and n in hosts_res and hosts_res[n].changed}
    return job.result(
        rc=rc, status=str(r.status), hosts={n: hosts_res[n] for n in [*job.targets, *hosts_res] if n in hosts_res},
        artifact_dir=str(getattr(r.config, "artifact_dir", "") or ""), error=error, drift=drift,
        partial={n: w for n, w in probe.partial.items() if job.partial_roles and n in to_run},
        partial_roles=job.partial_roles)


class _DownloadWatch(threading.Thread):
    """Reads the progress file a role's download on the controller writes (pip's raw bar), and the push role's
    copies to the hosts (``<file>.copy-<host>``: rsync's progress), and hands each change to ``on_event`` as a
    :data:`~testbed.setup.events.DOWNLOAD_EVENT`; bounded by :meth:`stop`."""

    every = 1.0

    def __init__(self, path: Path, on_event: EventHandler):
        super().__init__(name="setup-downloads", daemon=True)
        self.path, self.on_event, self.done = path, on_event, threading.Event()

    def run(self) -> None:
        from dataclasses import asdict

        sizes: dict[str, int] = {}
        while not self.done.wait(self.every):
            texts: dict[str, str] = {}
            for p in [self.path, *sorted(self.path.parent.glob(f"{self.path.name}.copy-*"))[:4096]]:
                with contextlib.suppress(OSError):
                    texts[p.name] = p.read_text(errors="replace")
            changed = {k for k, v in texts.items() if sizes.get(k) != len(v)}
            sizes = {k: len(v) for k, v in texts.items()}
            copies = [v for k, v in texts.items() if k != self.path.name]
            d = (read_copies(copies) if changed - {self.path.name} else
                 read_download(texts.get(self.path.name, "")) if changed else None)
            if d is not None:
                d.at = time.monotonic()
                with contextlib.suppress(Exception):  # a display bug must not break the set-up
                    self.on_event({"event": DOWNLOAD_EVENT, "download": asdict(d)})

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)


def _remember(tb: Resolved, roles: list[str] | None, res: SetupResult) -> SetupResult:
    """Record in state what a successful set-up applied: what a repaired host gets again (never --var values)."""
    if res.ok and not res.check and tb.record is not None:
        tb.store.update_testbed_info(tb.name, setup={"roles": list(roles)} if roles else {"profile": res.plan})
    return res


# --- skip what is already applied (testbed.setup.address) -------------------------------------------------
@dataclass
class _Probe:
    """What the hosts' records said: who is skipped, who matched (for --verify), why the others run."""

    addresses: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    partial: dict[str, str] = field(default_factory=dict)  # hosts holding the work but for the per-testbed roles
    unfinished: list[str] = field(default_factory=list)  # hosts with a pending mark: an earlier set-up stopped there
    seconds: float = 0.0
    shared_home: bool = False  # one home for every host: each host's record is a file of its own there


def _probe(testbed: str, prep: Prepared, playbook: list[dict[str, Any]], inventory: dict[str, Any],
           targets: list[str], *, check: bool, verify: set[str]) -> _Probe:
    """One round trip per host: read its record, its pending mark (and the record of the image it booted from)
    and, unless it matches (or in check mode), replace it by a pending mark, so that a set-up that fails, stops or
    is interrupted from here on leaves no address behind, and the next one says so. ``verify``: hosts that run
    whatever their record says (one with no record that booted from this set-up's image holds its work: only the
    per-testbed roles run there). A host whose record differs only in the hosts it was for, or with no record but
    this set-up's image, is ``partial``."""
    plan = prep.plan
    out = _Probe()
    if check and not verify:
        out.reasons = dict.fromkeys(targets, "check mode")
        return out
    common, image_key = _common(testbed, prep, playbook, inventory)
    out.addresses = {n: address.host_address(common, inventory, n) for n in targets}
    # check mode never removes a record; a verified host's always goes; another's unless it matches
    out.shared_home = bool((inventory["all"]["vars"].get("testbed_hardware") or {}).get("shared_home"))
    image_cmd = "" if out.shared_home else \
        f'; printf "\\n%s\\n" {_IMAGE_MARK}; cat "$HOME/{address.IMAGE_RECORD}" 2>/dev/null; true'
    pending = address.pending(plan.name)
    commands = {n: address.probe_command(None if check else "" if n in verify else out.addresses[n][0], pending,
                                         host=n if out.shared_home else None) + image_cmd for n in targets}
    t0 = time.monotonic()
    found = remote.run_each(testbed, commands, timeout=60, connect_timeout=15, max_output=1 << 20)
    out.seconds = time.monotonic() - t0
    for res in found:
        addr, parts = out.addresses[res.host]
        mark, _, text = res.stdout.partition(f"\n{address.PENDING_MARK}\n") if res.ok else ("", "", "")
        text, _, image = text.partition(f"\n{_IMAGE_MARK}\n")
        v = address.compare(testbed, res.host, plan.name, addr, parts, text if res.ok else None,
                            None if res.ok else (res.error or res.stderr.strip()[-200:] or f"exit {res.exit_code}"),
                            mark=mark)
        if address.unfinished(mark):
            out.unfinished.append(res.host)
        if v.unchanged:
            out.matched.append(res.host)
            continue
        out.reasons[res.host] = v.reason
        if check or not res.ok:
            continue
        if res.host not in verify and address.only_testbed_parts_differ(text, parts):
            out.partial[res.host] = "only the testbed's hosts changed"
        elif (not text.strip() or v.reason.startswith("record of another host")) \
                and address.read_image_key(image.strip()) == image_key:  # a snapshot holds its source's record
            out.partial[res.host] = f"booted from image {image_key[:12]}"
            out.reasons[res.host] = out.partial[res.host]
    out.reasons.update(dict.fromkeys([n for n in out.matched if n in verify], "--verify"))
    out.unchanged = [n for n in out.matched if n not in verify]
    return out


_IMAGE_MARK = "--testbed-image-record--"


def _common(testbed: str, prep: Prepared, playbook: list[dict[str, Any]],
            inventory: dict[str, Any]) -> tuple[dict[str, str], str]:
    """The address parts every host of this set-up shares, and the key of an image of it."""
    plan = prep.plan
    refs = address.source_refs(plan.vars, [(st.role, st.vars) for st in plan.steps], prep.extravars)
    common = address.common_parts(playbook=playbook, roles=plan.roles, roles_dir=roles_dir(),
                                  variables=prep.extravars, inventory=inventory, sources=address.source_commits(refs),
                                  known_hosts=ssh.known_hosts_path(testbed))
    return common, address.image_key(address.image_parts(common, prep.variables, prep.base_image))


def applied(tb: Resolved, prep: Prepared, host: str) -> tuple[str, dict[str, str], str]:
    """Whether ``host`` holds exactly this set-up now: "" when its record matches (one round trip; nothing is
    removed), else why not; and the image key and parts of this set-up."""
    inventory = build_inventory(tb.name, tb.hosts, prep.variables)
    common, key = _common(tb.name, prep, build_playbook(prep.plan), inventory)
    addr, parts = address.host_address(common, inventory, host)
    shared = bool((inventory["all"]["vars"].get("testbed_hardware") or {}).get("shared_home"))
    res = remote.run_each(tb.name, {host: address.read_command(None, host=host if shared else None)}, timeout=60,
                          connect_timeout=15)[0]
    v = address.compare(tb.name, host, prep.plan.name, addr, parts, res.stdout if res.ok else None,
                        None if res.ok else (res.error or res.stderr.strip()[-200:] or f"exit {res.exit_code}"))
    return v.reason, address.image_parts(common, prep.variables, prep.base_image), key


def _close_masters(testbed: str, hosts: list[str]) -> None:
    """Stop testbed's multiplexed SSH masters to ``hosts``: sshd keeps a login's account data (its shell, its
    limits) for every session of one connection, so later sessions must log in anew to see the set-up's."""
    remote.each(lambda h: remote.control(testbed, h, "exit", timeout=10), hosts)


def _record(testbed: str, plan: str, probe: _Probe, hosts: list[str]) -> None:
    """Write each host's address (one round trip per host); a host that cannot be written simply runs next time."""
    cmds = {n: address.write_command(address.record(testbed, n, plan, *probe.addresses[n]),
                                     host=n if probe.shared_home else None) for n in hosts if n in probe.addresses}
    if cmds:
        remote.run_each(testbed, cmds, timeout=60, connect_timeout=15)
