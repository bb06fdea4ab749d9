"""Suite + testbed + parameters -> a plan: every command of a run, rendered, per host and rank, in order.

A plan is a ``testbed.records.RunPlan``, stored as JSON next to the run's state, so the detached supervisor,
``--dry-run`` and the tests all see exactly the same commands. Hosts come from state; for a dry run of a testbed
that is not provisioned they come from its spec (lab) or are placeholders ``host0``, ``host1``, ...
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed import fault_kinds, points, ssh
from testbed import sources as sources_mod
from testbed.errors import TestbedError, UsageError, by_door, provision_fix
from testbed.providers import PROVIDERS, provider_class
from testbed.records import (
    Check,
    CheckpointPlan,
    FaultPlan,
    PlanHost,
    PlanStep,
    PlanTimeouts,
    Rank,
    RelaunchStep,
    RepairStep,
    RunPlan,
    RunStep,
)
from testbed.resolved import Resolved
from testbed.setup.profiles import load_profile
from testbed.spec import CAPABILITIES, Hardware
from testbed.suite import (
    ENV_RE,
    MAX_RANKS,
    Raw,
    Step,
    Suite,
    is_template,
    output_pattern_problem,
    point_label,
    reads_of,
    render,
    resolve_params,
    selector_parts,
    shell_quote,
)
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.records import Override
    from testbed.state import Store
    from testbed.yamlfile import Loc

RUNS_ROOT = "~/.testbed-runs"
"""Run directories on the hosts: ``~/.testbed-runs/<run-id>/`` (logs, pid, exit code, timestamps, outputs)."""


MAX_RANK_COMMANDS = 65536
"""The most rank commands one plan may hold: the launch's, and each relaunch's for every attempt it plans."""


def run_dir(run_id: str) -> str:
    return f"{RUNS_ROOT}/{run_id}"


def new_run_id(suite: str) -> str:
    return f"{suite}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class HostInfo:
    name: str
    address: str
    groups: list[str]
    facts: dict[str, Any]


@dataclass
class TestbedInfo:
    """What a plan needs to know about the testbed."""

    __test__ = False

    name: str
    provider: str
    hosts: list[HostInfo]
    context: dict[str, Any]  # {{ testbed.* }}: name, provider, subnet, ssh_config, vars
    placeholder: bool = False
    elastic: bool = False  # generic placeholders (no spec to name hosts): as many as the suite asks for
    lost_after: float | None = None  # the spec's: the least bound over which a run must find a host lost


NO_TESTBED = "TESTBED"
"""The testbed a dry run with none names (no --on, none in the suite): a placeholder in the commands it shows
(``testbed setup TESTBED ...``), never a testbed's name."""


TESTBED_CONTEXT: dict[str, str] = {
    "name": "the testbed's name (TESTBED in a dry run with none)",
    "provider": "its provider kind (local, lab, chameleon, gcp-tpu, slurm; none in a dry run with no spec)",
    "subnet": "the hosts' subnet (0.0.0.0/0 when it is not known)",
    "ssh_config": "the ssh_config file that reaches its hosts from the controller",
    "hardware": "what its spec's hardware: says of every host: shared_home, interface, gpu_model, gpus, "
                "login_shell, tools, sudo",
    "spec_known": "whether the testbed's spec was read (a fault's needs are judged against its hardware only then)",
    "hardware_of": "per host name, that host's hardware (only when the spec has hardware.hosts)",
    "gpu_declared": "the hosts whose spec says for itself whether it has GPUs (only with hardware.hosts)",
}
"""``{{ testbed.* }}``: the keys of :attr:`TestbedInfo.context`, beside the spec's own ``vars:`` (by their
names)."""


def testbed_info(name: str | None, *, dry_run: bool, min_hosts: int = 1, store: Store | None = None) -> TestbedInfo:
    """Hosts and template context of testbed ``name`` (state first; spec or placeholders for a dry run)."""
    # a dry run reads the testbed as a real run does (an unknown testbed, a spec that does not load: the same
    # refusal); only the hosts may be placeholders, when it is not provisioned
    tb = Resolved.open(name, store) if name is not None else None
    spec, rec = (tb.spec, tb.record) if tb else (None, None)
    # addresses in a plan are for the hosts among themselves (MASTER_ADDR, hostfiles): private IPs on clouds
    hosts = [HostInfo(h.name, h.mesh_address, h.groups, h.facts) for h in tb.hosts] if tb and rec else []
    ctx: dict[str, Any] = {**(dict(spec.vars) if spec else {}), "name": name or NO_TESTBED,
                           "provider": tb.kind if tb and tb.kind else "none"}
    subnet = tb.subnet if tb else None
    ctx["subnet"] = str(subnet) if subnet else "0.0.0.0/0"
    ctx["ssh_config"] = str(ssh.ssh_config_path(name)) if name and rec else "~/.ssh/config"
    ctx["hardware"] = spec.hardware.context() if spec else Hardware().context()
    ctx["spec_known"] = spec is not None  # what a fault needs is judged against a spec's hardware only
    if spec is not None and spec.hardware.hosts:  # per host where they differ: {{ hardware }} in its commands
        ctx["hardware_of"] = {h: spec.hardware.context(h) for h in (spec.host_names() or spec.hardware.hosts)}
        ctx["gpu_declared"] = [h for h in spec.hardware.hosts if spec.hardware.gpu_declared(h)]
    if hosts:
        return TestbedInfo(name or "", ctx["provider"], hosts, ctx, lost_after=spec.lost_after if spec else None)
    if not dry_run:
        raise TestbedError(f"testbed '{name}' is not provisioned", where="state",
                           fix=by_door(f"testbed provision {name} (or use --dry-run to see the commands)",
                                       f"provision it first: {provision_fix(name or 'NAME')}"))
    names = spec.host_names() if spec else None
    if names:
        addr = spec.provider.planned_addresses() if spec else {}
        hs = [HostInfo(n, addr.get(n, n), spec.groups_for(n, i) if spec else [], {}) for i, n in enumerate(names)]
    else:
        hs = [HostInfo(f"host{i}", f"host{i}", ["master"] if i == 0 else ["workers"], {})
              for i in range(max(min_hosts, 1))]
    return TestbedInfo(name or NO_TESTBED, ctx["provider"], hs, ctx, placeholder=True, elastic=not names,
                       lost_after=spec.lost_after if spec else None)


def _select(on: str, hosts: list[HostInfo], ranks: list[Rank], where: str, at: str | None = None,
            testbed: list[HostInfo] | None = None, *, empty_ok: bool = False) -> list[str]:
    """Host names of ``on``: all, master, workers, rank:K, group or host names (comma-separated). A selection
    that names nothing, or a name that is no host or group of the run, is refused (``at``: its file:line); a group
    with no host in the run selects no host (a step then runs nowhere: ``empty_ok``, a one-host point's step on
    'workers') or is refused (what must run somewhere: the launch, a fault, a check) -- it never widens to other
    hosts. ``testbed``: all the testbed's hosts (whose groups are known even if not in the run)."""
    import difflib

    names = [h.name for h in hosts]
    declared = {g for h in testbed or hosts for g in h.groups}
    out: list[str] = []
    parts = selector_parts(on)
    if not parts:
        raise UsageError(f"{where}: {on!r} selects no host", where=at or where,
                         fix="name all, master, workers, a group, a host or rank:K")
    for part in parts:
        if part == "all":
            picked = names
        elif part == "master":
            picked = names[:1]
        elif part == "workers":  # the testbed's group 'workers', else every host but the master
            picked = [h.name for h in hosts if "workers" in h.groups] if "workers" in declared else names[1:]
        elif m := re.fullmatch(r"rank:(\d+)", part):
            picked = [r.host for r in ranks if r.rank == int(m.group(1))]
            if not picked:
                raise UsageError(f"{where}: there is no rank {m.group(1)} (world size {len(ranks)})", where=where,
                                 fix="use a rank below the world size")
        else:
            picked = [h.name for h in hosts if part == h.name or part in h.groups]
            if not picked and part in declared:
                picked = []
            elif not picked:
                groups = sorted({g for h in hosts for g in h.groups})
                close = difflib.get_close_matches(part, [*names, *groups, "all", "master", "workers"], n=1,
                                                  cutoff=0.5)
                raise UsageError(f"{where}: '{part}' is no host or group of this run", where=at or where,
                                 fix=(f"did you mean '{close[0]}'? " if close else "")
                                 + f"hosts: {', '.join(names)}; or all, master, workers, rank:K")
        if not picked and not part.startswith("rank:") and not empty_ok:
            members = sorted(h.name for h in testbed or hosts if part in h.groups)
            raise UsageError(f"{where}: '{part}' has no host in this run"
                             + (f" (its hosts {', '.join(members)} are not among the run's)" if members else ""),
                             where=at or where, fix=f"the run's hosts: {', '.join(names)}; groups: "
                             f"{', '.join(sorted({g for h in hosts for g in h.groups})) or 'none'}; aim the step at "
                             "one of them (all, master), or run on more hosts")
        out += [p for p in picked if p not in out]
    return out


def _render_int(raw: int | str, ctx: dict[str, Any], what: str, where: str) -> int:
    """A whole number given as one or as a template (``{{ world_size - 1 }}``); anything else is refused."""
    txt = render(raw, ctx, shell=False, where=what, at=where) if isinstance(raw, str) else raw
    try:
        return int(txt)
    except (TypeError, ValueError):
        raise UsageError(f"{what} rendered to {txt!r}, not a whole number", where=where,
                         fix=f"make {what.rsplit(': ', 1)[-1]} a whole number (or a template giving one)") from None


def _pick_hosts(suite: Suite, tb: TestbedInfo, ctx: dict[str, Any], only: list[str] | None) -> list[HostInfo]:
    pool = [h for h in tb.hosts if only is None or h.name in only]
    want: int | None = None
    if suite.placement.hosts is not None:
        want = _render_int(suite.placement.hosts, ctx, f"{suite.name}: placement.hosts",
                           suite.at("placement", "hosts"))
        if want < 1:
            raise UsageError(f"{suite.name}: placement.hosts rendered to {want}: a run needs at least one host",
                             where=suite.at("placement", "hosts"), fix="give the host count parameter a value >= 1")
    need = max(want or 0, suite.requires.hosts)
    if need > MAX_RANKS:  # counted before a host is listed: placeholders are made for as many as asked
        at = suite.at("placement", "hosts") if want and want >= suite.requires.hosts else suite.at("requires", "hosts")
        raise UsageError(f"suite '{suite.name}' asks for {need:,} hosts; a run has at most {MAX_RANKS:,}", where=at,
                         fix=f"ask for at most {MAX_RANKS:,} hosts (placement.hosts, requires.hosts)")
    if tb.elastic and only is None and len(pool) < need:  # a dry run with no spec: stand-ins for what it asks
        pool += [HostInfo(f"host{i}", f"host{i}", ["workers"], {}) for i in range(len(pool), need)]
    if len(pool) < need:
        raise UsageError(f"suite '{suite.name}' needs {plural(need, 'host')}; testbed '{tb.name}' has {len(pool)}",
                         where=f"testbed {tb.name}", fix="use a larger testbed or lower the host count parameter")
    master = suite.placement.master
    if master:
        at = suite.at("placement", "master")
        master = render(master, ctx, shell=False, where=f"{suite.name}: placement.master", at=at)
        first = next((h for h in pool if h.name == master or master in h.groups), None)
        if first is None:
            import difflib

            choices = [*(h.name for h in pool), *sorted({g for h in pool for g in h.groups})]
            close = difflib.get_close_matches(master, choices, n=1, cutoff=0.5)
            raise UsageError(f"{suite.name}: placement.master '{master}' is no host or group of '{tb.name}'",
                             where=at, fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"hosts: {', '.join(h.name for h in pool)}")
    else:
        first = next((h for h in pool if "master" in h.groups), pool[0])
    ordered = [first] + [h for h in pool if h is not first]
    return ordered[: want or len(ordered)]


def _env_names(env: dict[str, Any], what: str, at: str) -> None:
    """Refuse an environment variable name a shell cannot export (it would break, or inject into, the command)."""
    for k in env:
        if not re.fullmatch(ENV_RE, k):
            raise UsageError(f"{what}: '{k}' is not an environment variable name", where=at,
                             fix="use letters, digits and _, not starting with a digit (e.g. MY_VAR)")


def _env_lines(env: dict[str, str], at: str = "env") -> list[str]:
    _env_names(env, "env", at)
    return [f"export {k}={shell_quote(v)}" for k, v in env.items()]


class FaultNeedsError(UsageError):
    """A fault needs what the testbed lacks (a rehearsal skips the point instead)."""


def lacks(needs: list[str], hardware: dict[str, Any], provider: str) -> list[str]:
    """Which of ``needs`` (capabilities or commands) a testbed lacks: GPUs, CUDA and the NVIDIA driver from its
    declared GPUs, a TPU from its provider kind, the network unless the kind's hosts have no route out, commands
    from ``hardware.tools`` (or this machine's, where the kind's hosts run this machine's files)."""
    import shutil

    cls = provider_class(provider) if provider in PROVIDERS else None
    gpus = int(hardware.get("gpus") or 0)
    tools = set(hardware.get("tools") or [])
    out = []
    for n in needs:
        if n in ("gpu", "cuda", "nvidia-driver"):
            ok = gpus > 0
        elif n in ("tpu",):
            ok = cls is not None and cls.accelerator == n
        elif n == "network":
            ok = cls is not None and not cls.offline_hosts
        else:
            ok = n in tools or (cls is not None and cls.shares_controller_files and shutil.which(n) is not None)
        if not ok:
            out.append(n)
    return out


def check_fault_needs(suite: Suite, fname: str, tb: TestbedInfo, host: str | None = None) -> None:
    """Refuse fault ``fname`` when it needs what testbed ``tb`` lacks (known from its spec: hardware, provider,
    tools); a testbed known by no spec (a dry run without one) is not judged."""
    fault = suite.faults[fname]
    hardware = tb.context.get("hardware")
    if not fault.needs or not tb.context.get("spec_known") or not isinstance(hardware, dict):
        return
    if host is not None:  # the host it fires on, where the spec says per host
        hardware = (tb.context.get("hardware_of") or {}).get(host, hardware)
    missing = lacks(fault.needs, hardware, tb.provider)
    if missing:
        tools = [m for m in missing if m not in CAPABILITIES]
        it = "them" if len(tools) > 1 else "it"
        fix = (f"add {', '.join(tools)} to hardware.tools of testbed '{tb.name}' if its hosts have {it} (or have "
               f"its profile install {it})" if tools else
               f"declare it under hardware: of testbed '{tb.name}' if its hosts have it") \
            + ", or choose another fault"
        on = f"host {host} of testbed" if host and host in (tb.context.get("hardware_of") or {}) else "testbed"
        raise FaultNeedsError(f"fault '{fname}' of suite '{suite.name}' needs {', '.join(missing)}, which {on} "
                              f"'{tb.name}' ({tb.provider}) lacks", where=suite.at("faults", fname, "needs")
                              or f"{suite.name}: faults.{fname}.needs", fix=fix)


def able_kinds(capability: str) -> list[str]:
    """The provider kinds that implement ``capability`` (read from their classes, never listed here)."""
    return [k for k in PROVIDERS if provider_class(k).can(capability)]


def fault_refusals(suite: Suite, tb: TestbedInfo, chosen: list[str]) -> list[UsageError]:
    """Why testbed ``tb``'s provider cannot fire the ``chosen`` faults of ``suite`` (a kind that needs a provider
    ``Capability`` it lacks), one error each at the fault's ``action:`` file:line; none for a testbed of no known
    provider kind (a dry run with no spec). Names not among the suite's faults are left to the plan to refuse."""
    if tb.provider not in PROVIDERS:
        return []
    cls, out = provider_class(tb.provider), []
    for fname in dict.fromkeys(chosen):
        fault = suite.faults.get(fname)
        cap = fault_kinds.get(fault.action).capability if fault is not None else None
        why = cls.lacks(cap) if cap else None
        if fault is None or not why:
            continue
        can = able_kinds(cap or "")
        out.append(UsageError(
            f"fault '{fname}' of suite '{suite.name}' ({fault.action}) cannot fire on testbed '{tb.name}': its "
            f"{tb.provider} provider cannot {(cap or '').replace('-', ' ')}: {why}",
            where=suite.at("faults", fname, "action") or f"{suite.name}: faults.{fname}.action",
            fix=(f"run it on a testbed whose provider can ({', '.join(can)})" if can else "drop it")
            + ", leave it out (another --fault, -p fault=... where a parameter picks it, or --no-faults), or make "
              "it a 'command' fault that does the same on the host"))
    return out


def gpu_refusal(suite: Suite, tb: TestbedInfo, params: list[dict[str, Any]] | None = None) -> UsageError | None:
    """The suite's ranks need a GPU (``steps.launch.needs`` at a point of ``params``, default the default point;
    else ``requires.accelerator``) and testbed ``tb``'s spec declares none on any host (``hardware.gpu``): refused
    at the need's file:line. Not judged without a spec."""
    launch = suite.steps.launch
    hardware = tb.context.get("hardware")
    if not tb.context.get("spec_known") or not isinstance(hardware, dict):
        return None
    per_host = tb.context.get("hardware_of") or {}
    if int(hardware.get("gpus") or 0) > 0 or any(int(h.get("gpus") or 0) > 0 for h in per_host.values()):
        return None
    for p in params if params is not None else [resolve_params(suite, {})]:
        gpu = [n for n in points.launch_needs(suite, p) if n in ("gpu", "cuda", "nvidia-driver")]
        if gpu:
            break
    else:
        return None
    key = ("steps", "launch", "needs") if launch.needs is not None else ("requires", "accelerator")
    at = f" at point {point_label(suite, p)}" if points.varies(launch.needs) else ""
    return UsageError(f"the ranks of suite '{suite.name}' need {', '.join(gpu)} ({'.'.join(key)}){at}, which testbed "
                      f"'{tb.name}' ({tb.provider}) lacks: its spec declares no GPU on any host",
                      where=suite.at(*key),
                      fix="run it on a testbed whose spec declares its GPUs (hardware.gpu), or declare them in the "
                          f"spec of testbed '{tb.name}' if its hosts have them")


@dataclass
class _Scope:
    """What every section of a plan is rendered with: the suite, the testbed, the template context, the run's
    hosts (master first) and, once rendered, its ranks."""

    suite: Suite
    tb: TestbedInfo
    base: dict[str, Any]  # the template context every command starts from
    params: dict[str, Any]  # the suite's parameters, template defaults rendered
    hosts: list[HostInfo]
    rank_slots: list[tuple[str, int]]  # (host, local rank) of each rank, in rank order
    launch_needs: list[str]
    ranks: list[Rank] = field(default_factory=list)

    @property
    def addr(self) -> dict[str, str]:
        return {h.name: h.address for h in self.hosts}

    @property
    def shared_home(self) -> bool:
        return bool(self.tb.context.get("hardware", {}).get("shared_home"))

    def host_hardware(self, h: str) -> Any:
        """{{ host_hardware }}: this host's hardware (the spec's hardware.hosts.<h> over the testbed's)."""
        return (self.tb.context.get("hardware_of") or {}).get(h, self.tb.context.get("hardware") or {})

    def select(self, on: str, where: str, at: str | None = None, *, empty_ok: bool = False) -> list[str]:
        return _select(on, self.hosts, self.ranks, where, at, self.tb.hosts, empty_ok=empty_ok)

    def environment(self, ctx: dict[str, Any]) -> str | None:
        """The suite's ``environment:`` (a command's wrapper) rendered in ``ctx``; None without one."""
        if not self.suite.environment:
            return None
        return render(self.suite.environment, ctx, shell=False, where=f"{self.suite.name}: environment",
                      at=self.suite.at("environment")) or None


@dataclass
class _Sources:
    """The plan's source checkouts: their steps, what the manifest records of each, and the bundles to ship."""

    steps: list[RunStep]
    info: dict[str, dict[str, Any]]
    files: dict[str, str]  # name in the run folder -> path on the controller


def chosen_faults(suite: Suite, params: dict[str, Any], faults: list[str] | None) -> list[str]:
    """The faults this run fires: ``faults``, else a 'fault' parameter's value, else the suite's defaults."""
    if faults is None and "fault" in suite.parameters and "fault" in params:  # a 'fault' parameter picks it
        faults = [] if params["fault"] in ("", "none", None) else [str(params["fault"])]
    return list(dict.fromkeys(suite.default_faults if faults is None else faults))


TEMPLATE_VARIABLES: dict[str, str] = {
    "params": "every parameter of the point by name, their template defaults rendered (``{{ params.epochs }}``; "
              "each is also a name of its own)",
    "testbed": "the testbed: its name, provider, subnet, ssh_config, hardware and its spec's vars (below)",
    "suite": "the suite's name",
    "run_id": "the run's id (``<suite>-<date>-<time>-<hex>``)",
    "run_dir": "the run folder on the hosts (``~/.testbed-runs/<run id>``), where every step and rank starts; "
               "never quoted",
    "hostfile": "the MPI hostfile in the run folder (a line ``<host> slots=<placement.slots>`` per host)",
    "attempt": "the launch attempt: 0 at the first launch, 1, 2, ... in a recovery's relaunch and steps",
    "recovering": "true in a recovery's relaunch and steps (attempt > 0), else false",
    "testbed_hosts": "how many hosts the testbed has (the run may use fewer: placement.hosts)",
    "faults": "the names of the faults this run fires (--fault, a 'fault' parameter, or default_faults)",
    "hosts": "the run's host names, rank 0's host first (not in parameter defaults or placement)",
    "addresses": "the run's host addresses, in the order of 'hosts' (the hosts' own network)",
    "num_hosts": "how many hosts the run uses",
    "master": "the name of rank 0's host (placement.master)",
    "master_addr": "the address of rank 0's host, as the hosts reach it (MASTER_ADDR)",
    "world_size": "how many ranks the launch starts (its hosts x ranks_per_host; not in vars)",
    "rank": "the rank's number, 0 to world_size - 1 (the launch's command, env and cwd; in a fault's "
            "templates its target rank, or none)",
    "local_rank": "the rank's number on its host, 0 to ranks_per_host - 1 (the launch only)",
    "host": "the host the command runs on (a step's or rank's command; a fault's target host)",
    "address": "that host's address",
    "host_hardware": "that host's hardware, as testbed.hardware but the spec's hardware.hosts.<host> over it "
                     "(a step's or rank's command)",
    "reads": "per after: entry that applies to the point, the run folder on the hosts of the point it reads "
             "(``{{ reads.trained }}/out/model.pt``; never quoted); empty for a point that reads none",
}
"""Every name testbed gives a suite's templates beside its parameters and vars, and what it holds: the base
context of :func:`_scope` (what parameter defaults and placement see, then hosts, vars and world size), and per
rank, step and fault (:func:`_ranks`, :func:`_run_step`, :func:`_fault_plan`). docs/suite-reference.md is
generated from it (testbed.run.suite_reference)."""


def _scope(suite: Suite, tb: TestbedInfo, params: dict[str, Any], rid: str, chosen: list[str],
           only_hosts: list[str] | None) -> _Scope:
    """The template context (parameters, their template defaults rendered, hosts, the suite's vars) and the run's
    hosts and rank slots."""
    base: dict[str, Any] = {**params, "params": params, "testbed": tb.context, "suite": suite.name, "run_id": rid,
                            "run_dir": Raw(run_dir(rid)), "hostfile": "hostfile", "attempt": 0, "recovering": False,
                            "testbed_hosts": len(tb.hosts), "faults": chosen}
    params = dict(params)
    for k, v in params.items():  # a default may be a template (``{{ testbed.python | default('python3') }}``)
        if isinstance(v, str) and "{{" in v and k in suite.parameters and suite.parameters[k].default == v:
            params[k] = base[k] = render(v, base, shell=False, where=f"{suite.name}: parameters.{k}.default",
                                         at=suite.at("parameters", k, "default"))
    base["params"] = params
    hosts = _pick_hosts(suite, tb, base, only_hosts)
    base.update(hosts=[h.name for h in hosts], addresses=[h.address for h in hosts], num_hosts=len(hosts),
                master=hosts[0].name, master_addr=hosts[0].address)
    for k, tmpl in suite.vars.items():
        base[k] = render(tmpl, base, shell=False, where=f"{suite.name}: vars.{k}", at=suite.at("vars", k))
    launch = suite.steps.launch
    launch_hosts = _select(launch.on, hosts, [], f"{suite.name}: steps.launch.on", suite.at("steps", "launch", "on"),
                           tb.hosts)
    world = len(launch_hosts) * launch.ranks_per_host
    if world > MAX_RANKS:  # counted before a rank is planned
        raise UsageError(f"suite '{suite.name}' would start {world:,} ranks ({len(launch_hosts):,} hosts x "
                         f"{launch.ranks_per_host} per host); a run has at most {MAX_RANKS:,}",
                         where=suite.at("steps", "launch", "ranks_per_host"),
                         fix="lower ranks_per_host or the number of hosts (placement.hosts, steps.launch.on)")
    rank_slots = [(h, i) for h in launch_hosts for i in range(launch.ranks_per_host)]
    base["world_size"] = len(rank_slots)
    launch_needs = points.launch_needs(suite, params)
    return _Scope(suite, tb, base, params, hosts, rank_slots, launch_needs)


def _check_rank_commands(sc: _Scope, chosen: list[str]) -> None:
    """Refuse, before any is rendered, a plan of more than ``MAX_RANK_COMMANDS`` rank commands: the launch's and
    every relaunch's, for each attempt of a host-loss recovery and of each chosen fault's."""
    def relaunches(items: list[Step] | None) -> int:
        return sum(1 for s in items or [] if s.relaunch not in (None, False))

    suite = sc.suite
    repairs = max((x.attempts for x in suite.steps.recovery if x.repair), default=0)
    per_fault = [relaunches(suite.faults[f].recovery if f in suite.faults and suite.faults[f].recovery is not None
                            else suite.steps.recovery) for f in chosen]
    launches = 1 + repairs * relaunches(suite.steps.recovery) + len(chosen) * sum(per_fault)
    total = len(sc.rank_slots) * launches
    if total > MAX_RANK_COMMANDS:
        raise UsageError(f"suite '{suite.name}' would plan {total:,} rank commands ({len(sc.rank_slots):,} ranks x "
                         f"{launches:,} launches and relaunches); a plan holds at most {MAX_RANK_COMMANDS:,}",
                         where=suite.at("steps", "recovery"),
                         fix="fire fewer faults at once, lower the repair attempts, or run fewer ranks")


def _ranks(sc: _Scope, attempt: int, command: str, command_at: str) -> list[Rank]:
    """Every rank of the launch (``command`` rendered per rank) for ``attempt`` (0: the first launch)."""
    suite, launch, addr = sc.suite, sc.suite.steps.launch, sc.addr
    out = []
    for k, (h, local) in enumerate(sc.rank_slots):
        ctx = {**sc.base, "rank": k, "local_rank": local, "host": h, "address": addr[h], "attempt": attempt,
               "recovering": attempt > 0, "host_hardware": sc.host_hardware(h)}
        env = {key: render(v, ctx, shell=False, where=f"{suite.name}: steps.launch.env.{key}",
                           at=suite.at("steps", "launch", "env", key)) for key, v in launch.env.items()}
        out.append(Rank(rank=k, host=h, address=addr[h], attempt=attempt,
                        command=render(command, ctx, where=f"{suite.name}: steps.launch.command", at=command_at),
                        env=env, cwd=render(launch.cwd, ctx, where=f"{suite.name}: steps.launch.cwd",
                                            at=suite.at("steps", "launch", "cwd")) if launch.cwd else None,
                        environment=sc.environment(ctx), needs=sc.launch_needs))
    return out


def _check_gpu_ranks(sc: _Scope) -> None:
    """Refuse a rank that needs a GPU on a host the spec itself says has none."""
    gpu_needs = sorted(set(sc.launch_needs) & {"gpu", "cuda", "nvidia-driver"})
    declared = sc.tb.context.get("gpu_declared") or []
    for r in sc.ranks:
        if gpu_needs and r.host in declared and not sc.host_hardware(r.host).get("gpus"):
            raise UsageError(f"rank {r.rank} of suite '{sc.suite.name}' needs {', '.join(gpu_needs)}, but host "
                             f"{r.host} of testbed '{sc.tb.name}' has no GPU (hardware.hosts.{r.host})",
                             where=sc.suite.at("steps", "launch", "on") or f"{sc.suite.name}: steps.launch.on",
                             fix="place the ranks on the GPU hosts (steps.launch.on: a group of them, or "
                                 "placement.hosts), or correct hardware.hosts in the testbed's spec")


def _steps(sc: _Scope, items: list[Step], phase: str, attempt: int = 0,
           loc: Loc | None = None) -> list[PlanStep]:
    """The steps of ``phase`` (prepare, recovery, post) rendered for ``attempt``; ``loc``: where in the suite
    they are written (default ``steps.<phase>``)."""
    out: list[PlanStep] = []
    loc = loc or ("steps", phase)
    for i, s in enumerate(items):
        name = s.name or f"{phase}-{i + 1}"
        where = f"{sc.suite.name}: {'.'.join(map(str, loc))}[{i}]"
        if s.relaunch not in (None, False):
            out.append(_relaunch_step(sc, s, name, phase, attempt, loc, i))
        elif s.repair:
            if phase != "recovery":
                raise UsageError(f"{where}: 'repair' brings back a lost host during a run: a recovery step only",
                                 where=sc.suite.at(*loc, i), fix="move the step to steps.recovery")
            out.append(RepairStep(name=name, setup=s.setup, attempts=s.attempts, timeout=s.timeout))
        else:
            out.append(_run_step(sc, s, name, attempt, loc, i))
    return out


def _relaunch_step(sc: _Scope, s: Step, name: str, phase: str, attempt: int, loc: Loc,
                   i: int) -> RelaunchStep:
    """A recovery step restarting the ranks (the launch command, or the step's own)."""
    if phase != "recovery":  # the ranks are not running yet (prepare) or have ended (post)
        raise UsageError(f"{sc.suite.name}: {'.'.join(map(str, loc))}[{i}]: 'relaunch' restarts the ranks after a "
                         f"fault: a recovery step only", where=sc.suite.at(*loc, i),
                         fix="move the step to steps.recovery (or a fault's recovery), or give it 'run:'")
    launch = sc.suite.steps.launch
    cmd = launch.command if s.relaunch is True else str(s.relaunch)
    at = sc.suite.at(*(("steps", "launch", "command") if s.relaunch is True else (*loc, i, "relaunch")))
    return RelaunchStep(name=name, ranks=_ranks(sc, attempt, cmd, at))


def _run_step(sc: _Scope, s: Step, name: str, attempt: int, loc: Loc, i: int) -> RunStep:
    """A step of commands, rendered per host it runs on."""
    suite, addr = sc.suite, sc.addr
    ctx = {**sc.base, "attempt": attempt, "recovering": attempt > 0}
    where = f"{suite.name}: {'.'.join(map(str, loc))}[{i}]"
    assert s.run is not None
    sel = sc.select(s.on, f"{where}.on", suite.at(*loc, i, "on"), empty_ok=True)  # a one-host point's 'workers'
    if s.per == "home" and sc.shared_home:  # one home for all: the step's writes happen once
        sel = sel[:1]
    return RunStep(name=name, hosts=sel, timeout=s.timeout,
                   cwd=render(s.cwd, ctx, where=f"{where}.cwd", at=suite.at(*loc, i, "cwd")) if s.cwd else None,
                   commands={h: render(s.run, {**ctx, "host": h, "address": addr[h],
                                               "host_hardware": sc.host_hardware(h)}, where=where,
                                       at=suite.at(*loc, i, "run")) for h in sel},
                   environments={h: sc.environment({**ctx, "host": h, "address": addr[h]}) for h in sel},
                   needs=points.needs(suite, s.needs, sc.params, (*loc, i, "needs")))


def _run_steps(sc: _Scope, items: list[Step], phase: str) -> list[RunStep]:
    return [x for x in _steps(sc, items, phase) if isinstance(x, RunStep)]  # relaunch is refused outside recovery


def _fault_plans(sc: _Scope, chosen: list[str]) -> list[FaultPlan]:
    """The faults to fire, in order, each with its target, trigger and recovery; an unknown one is refused."""
    suite = sc.suite
    for f in chosen:
        if f not in suite.faults:
            import difflib

            close = difflib.get_close_matches(f, list(suite.faults), n=1)
            raise UsageError(f"suite '{suite.name}' has no fault '{f}'", where="--fault",
                             fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"faults: {', '.join(suite.faults) or 'none'}")
    return [_fault_plan(sc, fname, n, len(chosen)) for n, fname in enumerate(chosen)]


def _fault_target(sc: _Scope, fname: str) -> tuple[int | None, str]:
    """(rank, host) a fault fires on: its rank (checked), its host, else the rank's host or the master."""
    fault, ranks = sc.suite.faults[fname], sc.ranks
    where = f"{sc.suite.name}: faults.{fname}"
    rank = _render_int(fault.rank, sc.base, f"{where}.rank", sc.suite.at("faults", fname, "rank")) \
        if fault.rank is not None else None
    if rank is not None and not 0 <= rank < len(ranks):
        raise UsageError(f"{where}: rank {rank} does not exist (world size {len(ranks)})",
                         where=sc.suite.at("faults", fname, "rank"), fix="choose a rank below the world size")
    if fault.host is not None:
        host_at = sc.suite.at("faults", fname, "host")
        on = render(fault.host, sc.base, shell=False, where=f"{where}.host", at=host_at)
        picked = sc.select(on, f"{where}.host", host_at)
        if len(picked) > 1:  # a fault fires on one host: never cut to the first without a word
            raise UsageError(f"{where}.host '{on}' selects {plural(len(picked), 'host')} ({', '.join(picked)}); a "
                             f"{fault.action} fault fires on one host", where=host_at or f"{where}.host",
                             fix=f"name one host ({picked[-1]}, master, rank:K or a group of one), or write one "
                                 "fault per host and fire them together (--fault A --fault B)")
        host = picked[0]
    else:
        host = ranks[rank].host if rank is not None else sc.hosts[0].name
    return rank, host


def _fault_plan(sc: _Scope, fname: str, order: int, count: int) -> FaultPlan:
    """Fault ``fname`` rendered: target, trigger, command and restore, and its recovery for each attempt."""
    suite, ranks = sc.suite, sc.ranks
    fault = suite.faults[fname]
    where = f"{suite.name}: faults.{fname}"
    rank, host = _fault_target(sc, fname)
    check_fault_needs(suite, fname, sc.tb, host)
    watch = fault.watch_rank if fault.watch_rank is not None else (rank if rank is not None else 0)
    fctx = {**sc.base, "rank": rank, "host": host, "address": sc.addr[host]}

    def text(raw: str | None, key: str, shell: bool = True) -> str | None:
        return render(raw, fctx, shell=shell, where=f"{where}.{key}", at=suite.at("faults", fname, key)) \
            if raw else None

    own = fault.recovery is not None
    return FaultPlan(
        name=fname, description=fault.description, action=fault.action, signal=fault.signal,
        rank=rank, host=host, at=fault.at, watch_rank=watch, when=text(fault.when, "when", shell=False),
        watch_host=ranks[watch].host if watch < len(ranks) else host,
        command=text(fault.command, "command"), restore=text(fault.restore, "restore"),
        recovery={str(a): _steps(sc, fault.recovery if fault.recovery is not None else suite.steps.recovery,
                                 "recovery", a, ("faults", fname, "recovery") if own else None)
                  for a in range(1, count + 1)},
        order=order, needs=list(fault.needs),
    )


def _host_loss_recovery(sc: _Scope) -> dict[str, list[PlanStep]]:
    """A host lost with no fault fired (a real failure) is recovered only by a suite whose recovery repairs
    hosts: its recovery steps, per attempt."""
    repairs = max((x.attempts for x in sc.suite.steps.recovery if x.repair), default=0)
    return {str(a): _steps(sc, sc.suite.steps.recovery, "recovery", a) for a in range(1, repairs + 1)}


def _checkpoint(sc: _Scope) -> CheckpointPlan | None:
    ck, suite = sc.suite.checkpoint, sc.suite
    if ck is None:
        return None
    plan = CheckpointPlan(file=ck.file, hosts=sc.select(ck.on, f"{suite.name}: checkpoint.on",
                                                        suite.at("checkpoint", "on")),
                          rank=ck.rank, saved=ck.saved, progress=ck.progress)
    if ck.rank >= len(sc.ranks):
        raise UsageError(f"{suite.name}: checkpoint.rank {ck.rank} does not exist (world size {len(sc.ranks)})",
                         where=suite.source or suite.name, fix="choose a rank below the world size")
    return plan


def _outputs(sc: _Scope) -> dict[str, list[str]]:
    """host -> the globs collected from its run folder (the suite's, and every rank's logs)."""
    suite = sc.suite
    outs = suite.outputs if isinstance(suite.outputs, dict) else {"all": suite.outputs}
    outputs: dict[str, list[str]] = {h.name: [] for h in sc.hosts}
    for on, globs in outs.items():
        rendered = [_output_glob(sc, g, suite.at("outputs", on)) for g in globs]
        for h in sc.select(on, f"{suite.name}: outputs", suite.at("outputs", on), empty_ok=True):
            outputs[h] += [g for g in rendered if g and g not in outputs[h]]
    for h in outputs:
        outputs[h] += ["rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end"]
    return outputs


def _setup_roles(sc: _Scope) -> list[str] | None:
    """The profile's roles this point needs (the suite's ``setup_roles`` rendered with the point's values), each one
    a role of the profile; None: the whole profile."""
    suite = sc.suite
    if not suite.setup_roles:
        return None
    at = suite.at("setup_roles")
    where = f"{suite.name}: setup_roles"
    if not suite.profile:
        raise UsageError(f"{where}: it picks the roles of a profile, but the suite names none", where=at,
                         fix="add 'profile:', or remove setup_roles")
    text = render(suite.setup_roles, sc.base, shell=False, where=where, at=at) \
        if is_template(suite.setup_roles) else suite.setup_roles
    names = [n for n in re.split(r"[\s,]+", text) if n]
    if not names:
        return None
    known = load_profile(suite.profile).roles
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"{where}: {', '.join(repr(n) for n in unknown)} is not a role of profile "
                         f"'{suite.profile}' (rendered: {text!r})", where=at, fix=f"its roles: {', '.join(known)}")
    return [r for r in known if r in names]  # in the profile's order, once each


def _output_glob(sc: _Scope, glob: str, at: str) -> str:
    """An output glob as this point collects it: a template (``{% if task == 'train' %}log/**{% endif %}``) is
    rendered with the point's values, empty when the point makes no such file, and checked once rendered."""
    if not is_template(glob):
        return glob
    out = render(glob, sc.base, shell=False, where=f"{sc.suite.name}: outputs", at=at)
    problem = output_pattern_problem(out) if out else None
    if problem:
        raise UsageError(f"{sc.suite.name}: output pattern {out!r} (rendered from {glob!r}) cannot be collected: "
                         f"{problem}", where=at, fix="render a glob relative to the run folder, ~/ or absolute")
    return out


def _checks(sc: _Scope) -> list[Check]:
    """The file checks that apply at this point (their ``when:``), ``file`` and ``contains`` rendered."""
    suite = sc.suite
    return [Check(name=c.name, file=c.file, contains=c.contains,
                  hosts=sc.select(c.on, f"{suite.name}: checks.{c.name}", suite.at("checks", i, "on")))
            for i, c in points.checks(suite, sc.params) if c.file is not None]  # a table check: in the report


def _sources(sc: _Scope, overrides: dict[str, Override]) -> _Sources:
    """A checkout step per suite source: the override's bundle, or a clone of its (or the override's) repo."""
    out = _Sources([], {}, {})
    for s in sc.suite.sources:
        path = shell_quote(s.path)
        o = overrides.get(s.name)
        out.info[s.name] = {"repo": s.repo, "ref": s.ref, "path": s.path}
        if o is not None and o.kind == "path":
            assert o.bundle, "a path override is bundled when it is resolved"
            out.files[f"src-{s.name}.bundle"] = o.bundle
            cmd = sources_mod.checkout_command(path, o, shlex.quote(f"src-{s.name}.bundle"))
            out.info[s.name] = {"repo": o.location, "ref": o.ref or o.commit, "path": s.path,
                                "override": o.given, "commit": o.commit, "uncommitted_changes": o.dirty}
        else:
            repo, ref = (o.location, o.ref) if o is not None else (s.repo, s.ref)
            if o is not None:
                out.info[s.name] = {"repo": repo, "ref": ref, "path": s.path, "override": o.given}
            cmd = _clone_command(path, repo, ref, s.submodules)
        # a checkout under a home every host shares is made once, by the first host (not by all at once)
        where_to = [h.name for h in sc.hosts][:1 if sc.shared_home and s.path.startswith("~") else None]
        out.steps.append(RunStep(name=s.name, hosts=where_to, commands=dict.fromkeys(where_to, cmd)))
    return out


def _clone_command(path: str, repo: str, ref: str | None, submodules: bool) -> str:
    """Shell: ``repo`` at ``ref`` checked out at ``path`` (shell words) on a host."""
    # a folder set-up (or another source) already filled is taken over in place, not cloned into (git
    # refuses a non-empty folder); --force: a tree an earlier run modified is put back at the ref
    cmd = (f"if [ -d {path}/.git ]; then git -C {path} remote set-url origin {shlex.quote(repo)} && "
           f"git -C {path} fetch --quiet origin; elif [ -n \"$(ls -A {path} 2>/dev/null)\" ]; then "
           f"git -C {path} init --quiet && git -C {path} remote add origin {shlex.quote(repo)} && "
           f"git -C {path} fetch --quiet origin && git -C {path} checkout --quiet --force "
           f"\"$(git -C {path} symbolic-ref --short refs/remotes/origin/HEAD 2>/dev/null || echo FETCH_HEAD)\"; "
           f"else git clone --quiet {shlex.quote(repo)} {path}; fi")
    if ref:  # a branch is taken as the remote has it now (a local branch left from an earlier run is stale)
        cmd += (f" && tb_ref={shlex.quote(ref)} && {{ git -C {path} rev-parse -q --verify "
                f'"refs/remotes/origin/$tb_ref" >/dev/null && tb_ref="origin/$tb_ref"; true; }} '
                f'&& git -C {path} -c advice.detachedHead=false checkout --quiet --force "$tb_ref"')
    if submodules:
        cmd += (f" && git -C {path} -c url.https://github.com/.insteadOf=git@github.com: "
                "submodule update --init --recursive --quiet")  # ssh submodule URLs need no key
    return cmd


def _suite_files(suite: Suite, files: dict[str, str]) -> None:
    """Add the suite's ``files:`` to ``files`` (name -> path); one outside its folder, missing, or named like
    another file of the run folder is refused."""
    home = suite.dir.resolve()
    for rel in suite.files:
        p = (suite.dir / rel).resolve()  # links followed: a link out of the folder is outside too
        if not p.is_relative_to(home):
            raise UsageError(f"{suite.name}: file '{rel}' is outside the suite's folder ({p}); a suite ships only "
                             f"files from its own folder", where=f"{suite.source or suite.name}: files",
                             fix=f"copy the file into {home} and name it relative to it")
        if not p.is_file():
            raise UsageError(f"{suite.name}: file '{rel}' not found next to the suite", where=str(p),
                             fix="fix 'files:' or add the file")
        if p.name in files or p.name in ("hostfile", "tb-rank.sh"):
            raise UsageError(f"{suite.name}: two files would be named '{p.name}' in the run folder",
                             where=f"{suite.source or suite.name}: files",
                             fix="rename one of them (files land by their name)")
        files[p.name] = str(p)


def build_plan(suite: Suite, tb: TestbedInfo, params: dict[str, Any], *, run_id: str | None = None,
               faults: list[str] | None = None, only_hosts: list[str] | None = None,
               overrides: dict[str, Override] | None = None, reads: dict[str, str] | None = None) -> RunPlan:
    """Render every command of one run. Raises UsageError (bad template, unknown fault) before any host.

    ``overrides``: resolved source overrides (``testbed.sources.Override`` by name); ``reads``: the run folder of
    each point this point reads (``after:`` name -> folder; None: placeholders naming the point).
    """
    overrides = overrides or {}
    rid = run_id or new_run_id(suite.name)
    chosen = chosen_faults(suite, params, faults)
    sc = _scope(suite, tb, params, rid, chosen, only_hosts)
    sc.base["reads"] = read_folders(suite, params, reads)
    _check_rank_commands(sc, chosen)
    env_lines = _env_lines(suite.env, suite.at("env"))
    launch = suite.steps.launch
    _env_names(launch.env, f"{suite.name}: steps.launch.env", suite.at("steps", "launch", "env"))
    sc.ranks = _ranks(sc, 0, launch.command, suite.at("steps", "launch", "command"))
    _check_gpu_ranks(sc)
    fplans = _fault_plans(sc, chosen)
    recovery = _host_loss_recovery(sc)
    checkpoint = _checkpoint(sc)
    outputs = _outputs(sc)
    checks = _checks(sc)
    srcs = _sources(sc, overrides)
    files = dict(srcs.files)
    _suite_files(suite, files)
    hosts = sc.hosts
    return RunPlan(
        run_id=rid, suite=suite.name, testbed=tb.name, provider=tb.provider, params=sc.params,
        profile=suite.profile, setup_roles=_setup_roles(sc), placeholder_hosts=tb.placeholder, run_dir=run_dir(rid),
        hosts=[PlanHost(name=h.name, address=h.address) for h in hosts], master=hosts[0].name,
        files=files, generated={"hostfile": "".join(f"{h.name} slots={suite.placement.slots}\n" for h in hosts)},
        env=env_lines, sources=srcs.steps, source_info=srcs.info,
        prepare=_run_steps(sc, suite.steps.prepare, "prepare"),
        ranks=sc.ranks, source_overrides=dict(overrides),
        faults=fplans, recovery=recovery, checkpoint=checkpoint, post=_run_steps(sc, suite.steps.post, "post"),
        progress=suite.progress or (suite.checkpoint.progress if suite.checkpoint else None),
        checks=checks, outputs=outputs,
        timeouts=PlanTimeouts.model_validate({**suite.timeouts.model_dump(),
                                              "unreachable": max(suite.timeouts.unreachable, tb.lost_after or 0)}),
    )


def read_folders(suite: Suite, params: dict[str, Any], given: dict[str, str] | None) -> dict[str, Raw]:
    """``{{ reads }}``: the run folder on the hosts of each point the point reads (``given``), else a placeholder
    naming that point."""
    out = {}
    for name, point in reads_of(suite, params).items():
        folder = (given or {}).get(name) or f"{RUNS_ROOT}/<the run of {point_label(suite, point)}>"
        out[name] = Raw(folder)
    return out


def dry_run_lines(plan: RunPlan) -> list[dict[str, Any]]:
    """Every command of the plan in execution order: {phase, step, host, rank, command, cwd} (``cwd``: the folder
    a step or rank runs in; None for testbed's own commands)."""
    out: list[dict[str, Any]] = []

    def add(phase: str, step: str, host: str, command: str, rank: int | None = None, cwd: str | None = None) -> None:
        out.append({"phase": phase, "step": step, "host": host, "rank": rank, "command": command, "cwd": cwd})

    hosts = plan.host_names
    if plan.profile:
        for h in hosts:
            add("setup", "profile", h, f"testbed setup {plan.testbed} --profile {plan.profile}")
    for h in hosts:
        add("upload", "files", h, f"mkdir -p {plan.run_dir} && copy {' '.join([*plan.files, 'hostfile'])}")
    for phase, phase_steps in (("sources", plan.sources), ("prepare", plan.prepare)):
        for s in phase_steps:
            for h in s.hosts:
                add(phase, s.name, h, s.commands[h], cwd=s.cwd or plan.run_dir)
    for r in plan.ranks:
        env = " ".join(f"{k}={shell_quote(v)}" for k, v in r.env.items())
        add("launch", f"rank {r.rank}", r.host, (env + " " if env else "") + r.command, r.rank,
            cwd=r.cwd or plan.run_dir)
    for f in plan.faults:
        trig = f"at {f.at:g} s" if f.at is not None else f"when rank {f.watch_rank} logs /{f.when}/"
        add("fault", f"{f.name} ({trig})", f.host, fault_kinds.get(f.action).describe(f), f.rank)
        if f.restore:
            add("restore", f.name, f.host, f.restore)
        for step in f.recovery.get("1", []):
            if isinstance(step, RelaunchStep):
                for r in step.ranks:
                    add("recovery", step.name, r.host, r.command, r.rank)
            elif isinstance(step, RepairStep):
                add("recovery", step.name, f.host, f"testbed provision {plan.testbed} --repair <each lost host>"
                    + ("" if step.setup else " --no-setup"))
            else:
                for h in step.hosts:
                    add("recovery", step.name, h, step.commands[h])
    for s in plan.post:
        for h in s.hosts:
            add("post", s.name, h, s.commands[h], cwd=s.cwd or plan.run_dir)
    return out
