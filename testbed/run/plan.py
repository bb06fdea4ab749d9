"""Suite + testbed + parameters -> a plan: every command of a run, rendered, per host and rank, in order.

A plan is a ``testbed.records.Plan``, stored as JSON next to the run's state, so the detached supervisor,
``--dry-run`` and the tests all see exactly the same commands. Hosts come from state; for a dry run of a testbed
that is not provisioned they come from its spec (lab) or are placeholders ``host0``, ``host1``, ...
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testbed.errors import TestbedError, UsageError
from testbed.records import (
    Check,
    CheckpointPlan,
    FaultPlan,
    Plan,
    PlanHost,
    PlanStep,
    PlanTimeouts,
    Rank,
    RelaunchStep,
    RepairStep,
    RunStep,
)
from testbed.spec import CAPABILITIES, Hardware
from testbed.suite import ENV_RE, Raw, Step, Suite, render, selector_parts, shell_quote
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.sources import Override
    from testbed.state import Store

RUNS_ROOT = "~/.testbed-runs"
"""Run directories on the hosts: ``~/.testbed-runs/<run-id>/`` (logs, pid, exit code, timestamps, outputs)."""


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


def testbed_info(name: str | None, *, dry_run: bool, min_hosts: int = 1, store: Store | None = None) -> TestbedInfo:
    """Hosts and template context of testbed ``name`` (state first; spec or placeholders for a dry run)."""
    from testbed import ssh
    from testbed.resolved import Resolved

    tb = None
    if name is not None:
        try:
            tb = Resolved.open(name, store, need_spec=not dry_run)
        except TestbedError:
            if not dry_run:
                raise
    spec, rec = (tb.spec, tb.record) if tb else (None, None)
    # addresses in a plan are for the hosts among themselves (MASTER_ADDR, hostfiles): private IPs on clouds
    hosts = [HostInfo(h.name, h.mesh_address, h.groups, h.facts) for h in tb.hosts] if tb and rec else []
    ctx: dict[str, Any] = {**(dict(spec.vars) if spec else {}), "name": name or "dry-run",
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
                           fix=f"testbed provision {name} (or use --dry-run to see the commands)")
    names = spec.host_names() if spec else None
    if names:
        addr = spec.provider.planned_addresses() if spec else {}
        hs = [HostInfo(n, addr.get(n, n), spec.groups_for(n, i) if spec else [], {}) for i, n in enumerate(names)]
    else:
        hs = [HostInfo(f"host{i}", f"host{i}", ["master"] if i == 0 else ["workers"], {})
              for i in range(max(min_hosts, 1))]
    return TestbedInfo(name or "dry-run", ctx["provider"], hs, ctx, placeholder=True, elastic=not names,
                       lost_after=spec.lost_after if spec else None)


def _select(on: str, hosts: list[HostInfo], ranks: list[Rank], where: str, at: str | None = None) -> list[str]:
    """Host names of ``on``: all, master, workers, rank:K, group or host names (comma-separated). A selection
    that names nothing, or a name that is no host or group of the run, is refused (``at``: its file:line)."""
    import difflib

    names = [h.name for h in hosts]
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
        elif part == "workers":
            picked = [h.name for h in hosts if "workers" in h.groups] or names[1:]
        elif m := re.fullmatch(r"rank:(\d+)", part):
            picked = [r.host for r in ranks if r.rank == int(m.group(1))]
            if not picked:
                raise UsageError(f"{where}: there is no rank {m.group(1)} (world size {len(ranks)})", where=where,
                                 fix="use a rank below the world size")
        else:
            picked = [h.name for h in hosts if part == h.name or part in h.groups]
            if not picked:
                groups = sorted({g for h in hosts for g in h.groups})
                close = difflib.get_close_matches(part, [*names, *groups, "all", "master", "workers"], n=1,
                                                  cutoff=0.5)
                raise UsageError(f"{where}: '{part}' is no host or group of this run", where=at or where,
                                 fix=(f"did you mean '{close[0]}'? " if close else "")
                                 + f"hosts: {', '.join(names)}; or all, master, workers, rank:K")
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

    from testbed.providers import PROVIDERS, provider_class

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


def build_plan(suite: Suite, tb: TestbedInfo, params: dict[str, Any], *, run_id: str | None = None,
               faults: list[str] | None = None, only_hosts: list[str] | None = None,
               overrides: dict[str, Override] | None = None) -> Plan:
    """Render every command of one run. Raises UsageError (bad template, unknown fault) before any host.

    ``overrides``: resolved source overrides (``testbed.sources.Override`` by name).
    """
    from testbed import sources as sources_mod

    overrides = overrides or {}
    rid = run_id or new_run_id(suite.name)
    if faults is None and "fault" in suite.parameters and "fault" in params:  # a 'fault' parameter picks it
        faults = [] if params["fault"] in ("", "none", None) else [str(params["fault"])]
    chosen = list(dict.fromkeys(suite.default_faults if faults is None else faults))
    rdir = run_dir(rid)
    base: dict[str, Any] = {**params, "params": params, "testbed": tb.context, "suite": suite.name, "run_id": rid,
                            "run_dir": Raw(rdir), "hostfile": "hostfile", "attempt": 0, "recovering": False,
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
    launch_hosts = _select(launch.on, hosts, [], f"{suite.name}: steps.launch.on", suite.at("steps", "launch", "on"))
    rank_slots = [(h, i) for h in launch_hosts for i in range(launch.ranks_per_host)]
    base["world_size"] = len(rank_slots)
    launch_needs = list(launch.needs if launch.needs is not None else
                        [a for a in [suite.requires.accelerator] if a in ("gpu", "tpu")])
    addr = {h.name: h.address for h in hosts}
    shared_home = bool(tb.context.get("hardware", {}).get("shared_home"))
    env_lines = _env_lines(suite.env, suite.at("env"))
    _env_names(launch.env, f"{suite.name}: steps.launch.env", suite.at("steps", "launch", "env"))

    def host_hardware(h: str) -> Any:
        """{{ host_hardware }}: this host's hardware (the spec's hardware.hosts.<h> over the testbed's)."""
        return (tb.context.get("hardware_of") or {}).get(h, tb.context.get("hardware") or {})

    def environment(ctx: dict[str, Any]) -> str | None:
        if not suite.environment:
            return None
        return render(suite.environment, ctx, shell=False, where=f"{suite.name}: environment",
                      at=suite.at("environment")) or None

    def ranks_for(attempt: int, command: str, command_at: str) -> list[Rank]:
        out = []
        for k, (h, local) in enumerate(rank_slots):
            ctx = {**base, "rank": k, "local_rank": local, "host": h, "address": addr[h], "attempt": attempt,
                   "recovering": attempt > 0, "host_hardware": host_hardware(h)}
            env = {key: render(v, ctx, shell=False, where=f"{suite.name}: steps.launch.env.{key}",
                               at=suite.at("steps", "launch", "env", key)) for key, v in launch.env.items()}
            out.append(Rank(rank=k, host=h, address=addr[h], attempt=attempt,
                            command=render(command, ctx, where=f"{suite.name}: steps.launch.command", at=command_at),
                            env=env, cwd=render(launch.cwd, ctx, where=f"{suite.name}: steps.launch.cwd",
                                                at=suite.at("steps", "launch", "cwd")) if launch.cwd else None,
                            environment=environment(ctx), needs=launch_needs))
        return out

    ranks = ranks_for(0, launch.command, suite.at("steps", "launch", "command"))
    gpu_needs = sorted(set(launch_needs) & {"gpu", "cuda", "nvidia-driver"})
    for r in ranks:  # a rank that needs a GPU, on a host the spec itself says has none
        if gpu_needs and r.host in (tb.context.get("gpu_declared") or []) and not host_hardware(r.host).get("gpus"):
            raise UsageError(f"rank {r.rank} of suite '{suite.name}' needs {', '.join(gpu_needs)}, but host "
                             f"{r.host} of testbed '{tb.name}' has no GPU (hardware.hosts.{r.host})",
                             where=suite.at("steps", "launch", "on") or f"{suite.name}: steps.launch.on",
                             fix="place the ranks on the GPU hosts (steps.launch.on: a group of them, or "
                                 "placement.hosts), or correct hardware.hosts in the testbed's spec")

    def steps(items: list[Step], phase: str, attempt: int = 0, loc: tuple[Any, ...] | None = None) -> list[PlanStep]:
        out: list[PlanStep] = []
        loc = loc or ("steps", phase)
        for i, s in enumerate(items):
            name = s.name or f"{phase}-{i + 1}"
            ctx = {**base, "attempt": attempt, "recovering": attempt > 0}
            where = f"{suite.name}: {'.'.join(map(str, loc))}[{i}]"
            at = suite.at(*loc, i)
            if s.relaunch not in (None, False):
                if phase != "recovery":  # the ranks are not running yet (prepare) or have ended (post)
                    raise UsageError(f"{where}: 'relaunch' restarts the ranks after a fault: a recovery step only",
                                     where=at,
                                     fix="move the step to steps.recovery (or a fault's recovery), or give it 'run:'")
                cmd = launch.command if s.relaunch is True else str(s.relaunch)
                out.append(RelaunchStep(name=name, ranks=ranks_for(attempt, cmd, suite.at(
                    *(("steps", "launch", "command") if s.relaunch is True else (*loc, i, "relaunch"))))))
                continue
            if s.repair:
                if phase != "recovery":
                    raise UsageError(f"{where}: 'repair' brings back a lost host during a run: a recovery step only",
                                     where=at, fix="move the step to steps.recovery")
                out.append(RepairStep(name=name, setup=s.setup, attempts=s.attempts, timeout=s.timeout))
                continue
            assert s.run is not None
            sel = _select(s.on, hosts, ranks, f"{where}.on", suite.at(*loc, i, "on"))
            if s.per == "home" and shared_home:  # one home for all: the step's writes happen once
                sel = sel[:1]
            out.append(RunStep(name=name, hosts=sel, timeout=s.timeout,
                               cwd=render(s.cwd, ctx, where=f"{where}.cwd", at=suite.at(*loc, i, "cwd"))
                               if s.cwd else None,
                               commands={h: render(s.run, {**ctx, "host": h, "address": addr[h],
                                                           "host_hardware": host_hardware(h)}, where=where,
                                                   at=suite.at(*loc, i, "run")) for h in sel},
                               environments={h: environment({**ctx, "host": h, "address": addr[h]}) for h in sel},
                               needs=list(s.needs)))
        return out

    def run_steps(items: list[Step], phase: str) -> list[RunStep]:
        return [x for x in steps(items, phase) if isinstance(x, RunStep)]  # relaunch is refused outside recovery

    for f in chosen:
        if f not in suite.faults:
            import difflib

            close = difflib.get_close_matches(f, list(suite.faults), n=1)
            raise UsageError(f"suite '{suite.name}' has no fault '{f}'", where="--fault",
                             fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"faults: {', '.join(suite.faults) or 'none'}")
    fplans = []
    for n, fname in enumerate(chosen):
        fault = suite.faults[fname]
        where = f"{suite.name}: faults.{fname}"
        rank = _render_int(fault.rank, base, f"{where}.rank", suite.at("faults", fname, "rank")) \
            if fault.rank is not None else None
        if rank is not None and not 0 <= rank < len(ranks):
            raise UsageError(f"{where}: rank {rank} does not exist (world size {len(ranks)})",
                             where=suite.at("faults", fname, "rank"), fix="choose a rank below the world size")
        if fault.host is not None:
            host_at = suite.at("faults", fname, "host")
            sel = _select(render(fault.host, base, shell=False, where=f"{where}.host", at=host_at), hosts, ranks,
                          f"{where}.host", host_at)
            host = sel[0]
        else:
            host = ranks[rank].host if rank is not None else hosts[0].name
        check_fault_needs(suite, fname, tb, host)
        watch = fault.watch_rank if fault.watch_rank is not None else (rank if rank is not None else 0)
        fctx = {**base, "rank": rank, "host": host, "address": addr[host]}
        fplans.append(FaultPlan(
            name=fname, description=fault.description, action=fault.action, signal=fault.signal,
            rank=rank, host=host, at=fault.at, watch_rank=watch,
            when=render(fault.when, fctx, shell=False, where=f"{where}.when", at=suite.at("faults", fname, "when"))
            if fault.when else None,
            watch_host=ranks[watch].host if watch < len(ranks) else host,
            command=render(fault.command, fctx, where=f"{where}.command", at=suite.at("faults", fname, "command"))
            if fault.command else None,
            restore=render(fault.restore, fctx, where=f"{where}.restore", at=suite.at("faults", fname, "restore"))
            if fault.restore else None,
            recovery={str(a): steps(fault.recovery if fault.recovery is not None else suite.steps.recovery,
                                    "recovery", a, ("faults", fname, "recovery") if fault.recovery is not None
                                    else None) for a in range(1, len(chosen) + 1)},
            order=n, needs=list(fault.needs),
        ))
    # a host lost with no fault fired (a real failure) is recovered only by a suite whose recovery repairs hosts
    repairs = max((x.attempts for x in suite.steps.recovery if x.repair), default=0)
    recovery = {str(a): steps(suite.steps.recovery, "recovery", a) for a in range(1, repairs + 1)}
    ck = suite.checkpoint
    checkpoint = None if ck is None else CheckpointPlan(
        file=ck.file, hosts=_select(ck.on, hosts, ranks, f"{suite.name}: checkpoint.on", suite.at("checkpoint", "on")),
        rank=ck.rank,
        saved=ck.saved, progress=ck.progress)
    if ck is not None and ck.rank >= len(ranks):
        raise UsageError(f"{suite.name}: checkpoint.rank {ck.rank} does not exist (world size {len(ranks)})",
                         where=suite.source or suite.name, fix="choose a rank below the world size")
    outs = suite.outputs if isinstance(suite.outputs, dict) else {"all": suite.outputs}
    outputs: dict[str, list[str]] = {h.name: [] for h in hosts}
    for on, globs in outs.items():
        for h in _select(on, hosts, ranks, f"{suite.name}: outputs", suite.at("outputs", on)):
            outputs[h] += [g for g in globs if g not in outputs[h]]
    for h in outputs:
        outputs[h] += ["rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end"]
    checks = [Check(name=c.name, file=c.file, contains=c.contains,
                    hosts=_select(c.on, hosts, ranks, f"{suite.name}: checks.{c.name}", suite.at("checks", i, "on")))
              for i, c in enumerate(suite.checks)]
    sources: list[RunStep] = []
    files: dict[str, str] = {}

    def src_hosts(path: str) -> list[str]:
        """A checkout under a home every host shares is made once, by the first host (not by all at once)."""
        names = [h.name for h in hosts]
        return names[:1] if shared_home and path.startswith("~") else names

    source_info: dict[str, dict[str, Any]] = {}
    for s in suite.sources:
        path = shell_quote(s.path)
        o = overrides.get(s.name)
        source_info[s.name] = {"repo": s.repo, "ref": s.ref, "path": s.path}
        if o is not None and o.kind == "path":
            assert o.bundle, "a path override is bundled when it is resolved"
            files[f"src-{s.name}.bundle"] = o.bundle
            cmd = sources_mod.checkout_command(path, o, shlex.quote(f"src-{s.name}.bundle"))
            source_info[s.name] = {"repo": o.location, "ref": o.ref or o.commit, "path": s.path,
                                   "override": o.given, "commit": o.commit, "uncommitted_changes": o.dirty}
            where_to = src_hosts(s.path)
            sources.append(RunStep(name=s.name, hosts=where_to, commands=dict.fromkeys(where_to, cmd)))
            continue
        repo, ref = (o.location, o.ref) if o is not None else (s.repo, s.ref)
        if o is not None:
            source_info[s.name] = {"repo": repo, "ref": ref, "path": s.path, "override": o.given}
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
        if s.submodules:
            cmd += (f" && git -C {path} -c url.https://github.com/.insteadOf=git@github.com: "
                    "submodule update --init --recursive --quiet")  # ssh submodule URLs need no key
        where_to = src_hosts(s.path)
        sources.append(RunStep(name=s.name, hosts=where_to, commands=dict.fromkeys(where_to, cmd)))
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
    hostfile = "".join(f"{h.name} slots={suite.placement.slots}\n" for h in hosts)
    return Plan(
        run_id=rid, suite=suite.name, testbed=tb.name, provider=tb.provider, params=params,
        profile=suite.profile, placeholder_hosts=tb.placeholder, run_dir=rdir,
        hosts=[PlanHost(name=h.name, address=h.address) for h in hosts], master=hosts[0].name,
        files=files, generated={"hostfile": hostfile}, env=env_lines,
        sources=sources, source_info=source_info, prepare=run_steps(suite.steps.prepare, "prepare"),
        ranks=ranks, source_overrides={k: o.to_dict() for k, o in overrides.items()},
        faults=fplans, recovery=recovery, checkpoint=checkpoint, post=run_steps(suite.steps.post, "post"),
        progress=suite.progress or (suite.checkpoint.progress if suite.checkpoint else None),
        checks=checks, outputs=outputs,
        timeouts=PlanTimeouts.model_validate({**suite.timeouts.model_dump(),
                                              "unreachable": max(suite.timeouts.unreachable, tb.lost_after or 0)}),
    )


def dry_run_lines(plan: Plan) -> list[dict[str, Any]]:
    """Every command of the plan in execution order: {phase, step, host, rank, command}."""
    out: list[dict[str, Any]] = []

    def add(phase: str, step: str, host: str, command: str, rank: int | None = None) -> None:
        out.append({"phase": phase, "step": step, "host": host, "rank": rank, "command": command})

    hosts = plan.host_names
    if plan.profile:
        for h in hosts:
            add("setup", "profile", h, f"testbed setup {plan.testbed} --profile {plan.profile}")
    for h in hosts:
        add("upload", "files", h, f"mkdir -p {plan.run_dir} && copy {' '.join([*plan.files, 'hostfile'])}")
    for phase, phase_steps in (("sources", plan.sources), ("prepare", plan.prepare)):
        for s in phase_steps:
            for h in s.hosts:
                add(phase, s.name, h, s.commands[h])
    for r in plan.ranks:
        env = " ".join(f"{k}={shell_quote(v)}" for k, v in r.env.items())
        add("launch", f"rank {r.rank}", r.host, (env + " " if env else "") + r.command, r.rank)
    for f in plan.faults:
        trig = f"at {f.at:g} s" if f.at is not None else f"when rank {f.watch_rank} logs /{f.when}/"
        what = {"signal": f"kill -s {f.signal[3:]} <rank {f.rank} process group>",
                "in-workload": "injected by the workload itself (its command carries the flag)",
                "command": f.command or "", "kill-host": f"kill host {f.host}",
                "cut-network": f"cut the network of {f.host}"}[f.action]
        add("fault", f"{f.name} ({trig})", f.host, what, f.rank)
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
            add("post", s.name, h, s.commands[h])
    return out
