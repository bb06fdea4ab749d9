"""``testbed rehearse``: a suite run end to end on local hosts made in the shape of its real testbed.

The replica has the real testbed's host count, names, login user and shell, a home shared by every host when the
spec says so, and the interface name and GPU model it declares (``hardware:``). The suite's profile is applied as
far as these hosts allow; every step then runs for real, in order. A step that needs what the replica lacks (a
GPU, CUDA, a TPU, the network) is skipped with the reason; ranks that need it still start through their real
launcher with their real argv, environment and folder, and only the program is replaced by the probe
(``testbed/scripts/probe.py``), which checks what it needs from the host and then stays alive a few seconds
(``probe_stay``), so the point's faults fire on it through the real supervisor and its recovery relaunches; a
compiled program under ``mpirun`` is replaced by an MPI stand-in (``scripts/mpi_stand_in.c``) in the real mpirun
line. Collect and report then run on what the rehearsal produced, marked as a rehearsal: never counted as results.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from testbed import fault_kinds, lint, paths, points, proof, remote, services
from testbed import sources as sources_mod
from testbed.collect import collect_runs
from testbed.collect.listing import LOG_PATTERNS
from testbed.drafting import todo_comments
from testbed.errors import TestbedError, UsageError
from testbed.paths import RESULTS
from testbed.providers.local.provider import free_subnet
from testbed.providers.local.settings import local_replica
from testbed.records import RunStep
from testbed.report.build import build_report
from testbed.report.declared import unknown_tables
from testbed.resolved import Resolved
from testbed.run import bookkeeping as rs
from testbed.run import hometrace, runner
from testbed.run import plan as plan_mod
from testbed.run.plan import lacks
from testbed.run.supervisor import step_log_name
from testbed.scripts.probe import READY
from testbed.setup import _controller_site_packages
from testbed.spec import CAPABILITIES, load_testbed, stand_ins
from testbed.suite import expand_matrix, load_suite, path_word, point_reads, render, resolve_params
from testbed.textfmt import plural
from testbed.yamlfile import read_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from testbed.collect.transfer import HostCollect
    from testbed.records import Override, RunEvent, RunPlan, RunRecord
    from testbed.resolved import Resolved
    from testbed.run.plan import TestbedInfo
    from testbed.spec import TestbedSpec
    from testbed.suite import Suite

LACKS = ("gpu", "tpu", "cuda", "nvidia-driver", "network", "torch-fork")
"""What a local replica never has: its hosts are CPU namespaces on one machine with no route out (so no fork of
PyTorch built from its repository either: the stock torch at most)."""
PROBE = Path(__file__).with_name("scripts") / "probe.py"
DEFAULT_SUBNET = "10.219.0.0/24"


@dataclass
class StepOutcome:
    phase: str
    name: str
    status: str  # ran, failed, skipped, not reached
    hosts: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class Probe:
    host: str
    script: str
    argv: list[str]
    cwd: str
    parsed_by: str
    problems: list[str]
    args: dict[str, Any] = field(default_factory=dict)  # argv as its parser read it


@dataclass
class PointResult:
    params: dict[str, Any]
    run_id: str
    status: str  # the run's status
    reason: str | None
    steps: list[StepOutcome]
    ranks: str  # ran, probed, skipped, or not reached
    probes: list[Probe]
    not_rehearsed: list[str]  # faults and recoveries the probe stands in for, outputs it does not make
    folder: str | None = None
    failures: list[str] = field(default_factory=list)  # what the point failed to prove, one line each
    produced: dict[str, list[str]] = field(default_factory=dict)  # each declared output -> the hosts it matched on
    faults: list[str] = field(default_factory=list)  # each rehearsed fault: fired, detected, relaunched (or why not)

    @property
    def ok(self) -> bool:
        """Rehearsed with nothing found, or skipped because the real testbed would refuse it too."""
        return self.status == "skipped" or (self.status == "succeeded" and not self.failures
                                            and not any(p.problems for p in self.probes))


@dataclass
class RehearsalResult:
    suite: str
    like: str
    replica: str
    shape: dict[str, Any]
    setup: dict[str, Any]
    points: list[PointResult] = field(default_factory=list)
    kept: bool = False
    findings: list[str] = field(default_factory=list)  # static checks (testbed.lint) failed: no host was made

    @property
    def ok(self) -> bool:
        return not self.findings and bool(self.setup.get("ok", True)) and \
            any(p.status != "skipped" for p in self.points) and all(p.ok for p in self.points)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "points": [{**asdict(p), "ok": p.ok} for p in self.points]}


# --- the replica ------------------------------------------------------------------------------------------------
def replica_name(like: str) -> str:
    return f"rehearse-{like}"[:31].rstrip("-")


def _hosts_needed(suite: Suite, points: list[dict[str, Any]]) -> int:
    need = suite.requires.hosts
    for p in points:
        raw = suite.placement.hosts
        try:
            need = max(need, int(render(raw, p, shell=False)) if isinstance(raw, str) else int(raw or 0))
        except (UsageError, ValueError):
            continue
    return need


def replica_spec(target: TestbedSpec, suite: Suite, points: list[dict[str, Any]], subnet: str) -> dict[str, Any]:
    """A local testbed spec in the shape of ``target``: names, count, user, shell, home, interface, GPUs."""
    names = target.host_names()
    if names is None:
        count = int(getattr(target.provider, "count", 0) or 0)
        names = [f"node{i}" for i in range(max(count, _hosts_needed(suite, points), 1))]
    groups = {g: m for g, m in target.groups.items() if all(x in names for x in m)}
    return {"name": replica_name(target.name),
            "description": f"a local replica of {target.name} for testbed rehearse",
            "provider": local_replica(names, subnet),
            # the suite's profile: --role picks roles out of it, with its variables
            "user": target.user, "profile": suite.profile or target.profile, "groups": groups,
            "vars": dict(target.vars), "sources": dict(target.sources),
            "hardware": target.hardware.model_dump(mode="json")}


def _offline_sources(suite: Suite, overrides: dict[str, Override], like: str,
                     note: Callable[[str], None]) -> dict[str, Override]:
    """A replica has no route out: every source must come from this machine. One that --source and the spec's
    mirrors leave out comes from the user's mirror cache, fetched on this machine first when it lacks the ref."""
    out = dict(overrides)
    why: dict[str, str] = {}
    for s in suite.sources:
        if (o := out.get(s.name)) is not None and o.kind == "path":
            continue
        got = sources_mod.from_mirror(s.name, s.repo, s.ref, fetch=True, say=note)
        if isinstance(got, str):
            why[s.name] = got
            continue
        note(f"source '{s.name}': {s.repo} at {s.ref or 'HEAD'} from this machine's copy {got.location}")
        out[s.name] = got
    covered = sources_mod.setup_vars(out, suite).get("testbed_source_overrides", {})
    for name, (repo, version) in sources_mod.profile_build_refs(suite.profile).items():
        if name in covered:
            continue
        got = sources_mod.from_mirror(name, repo, version, fetch=False)
        if isinstance(got, str):  # only where the set-up builds it: said, not refused
            note(f"the profile's build '{name}' clones {repo} on the hosts, which the replica cannot reach: give "
                 f"--source {name}=PATH if this set-up builds it")
        else:
            note(f"the profile's build '{name}': {repo} at {version or 'HEAD'} from this machine's copy "
                 f"{got.location}")
            out[name] = got
    if why:
        first = next(x for x in suite.sources if x.name in why)
        raise UsageError(f"source '{first.name}' of suite '{suite.name}' is cloned from {first.repo}, which the "
                         f"replica cannot reach (its hosts have no route out), and {why[first.name]}",
                         where="--source", fix=" ".join(f"--source {n}=PATH" for n in why) + " (a local checkout), "
                         f"or a path under 'sources:' in inventories/{like}.yml")
    return out


# --- one point per step shape ----------------------------------------------------------------------------------
_SEP = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "then", "else", "do", "!"}


def programs(command: str) -> list[str]:
    """The programs a shell command runs, in order: the first word of each simple command (past VAR=value), and
    every script it names (``*.py``, ``*.sh``, ``./x``), so ``cgexec ... python a.py`` gives cgexec and a.py."""
    command = re.sub(r"\d*[<>]{1,2}&\d+|&>", " ", command)  # 2>&1, &>: redirections, not a background '&'
    try:
        lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unbalanced quote (a here-document's body): words as they are
        words = command.replace("\n", " ; ").split()
    out, start = [], True
    for w in words:
        if w in _SEP:
            start = True
            continue
        if start and "=" in w and not w.startswith("="):
            continue  # an assignment before the command
        if start or w.endswith((".py", ".sh")) or w.startswith("./"):
            out.append(w.rsplit("/", 1)[-1])
        start = False
    return out


def plan_shape(plan: RunPlan) -> tuple[object, ...]:
    """What tells two points' runs apart beyond their values: the programs each step and rank runs."""
    steps = tuple((phase, s.name, tuple(programs(next(iter(s.commands.values()), ""))))
                  for phase, items in (("sources", plan.sources), ("prepare", plan.prepare), ("post", plan.post))
                  for s in items)
    ranks = tuple((r.rank, tuple(programs(r.command))) for r in plan.ranks)
    return steps, ranks, tuple(f.name for f in plan.faults)


def in_container(command: str) -> bool:
    """Whether a shell command runs its program inside a container (``docker run``, ``podman run``)."""
    return re.search(r"(?<![\w-])(docker|podman)(\s+-\S+(\s+[^\s;&|-]\S*)?)*\s+(run|exec)\b", command) is not None


# --- the plan, rehearsed ----------------------------------------------------------------------------------------
def lacks_here(needs: list[str], kind: str) -> list[str]:
    """The commands among ``needs`` that this machine (whose commands a replica's hosts of provider ``kind`` run)
    does not have."""
    return lacks([n for n in needs if n not in CAPABILITIES], {}, kind)


def rehearsal_plan(plan: RunPlan, suite: Suite, like: str, *, set_up: bool = True) -> RunPlan:
    """``plan`` as the replica runs it: steps whose needs it lacks skipped, ranks that need them probed
    (``set_up``: the replica was set up, so mpirun reaches its hosts over the set-up's ssh mesh)."""
    lacks = set(LACKS)
    skipped: dict[str, str] = {}
    texts: dict[str, str] = {}  # what each skipped step would have run: a file a probe misses may be made there
    for steps in (plan.sources, plan.prepare, plan.post):
        for s in steps:
            miss = sorted(set(s.needs) & lacks)
            if miss:
                why = f"needs {', '.join(miss)}, which the replica lacks"
                skipped[s.name] = why
                texts[s.name] = "\n".join(dict.fromkeys(s.commands.values()))
                s.commands = {h: "echo " + shlex.quote(f"testbed rehearse: skipped: {why}") for h in s.hosts}
    probed = sorted({r.rank for r in plan.ranks if set(r.needs) & lacks})
    not_rehearsed: list[str] = []
    skipped_ranks: dict[int, str] = {}
    stand_ins: dict[int, list[str]] = {}
    programs = points.probes(suite, plan.params)  # per point: templates and {when, probe} entries
    compiled = [p for p in programs if not p.endswith(".py")]
    for r in plan.ranks:  # the probe stands in for Python programs only: a compiled one the suite names is skipped
        found = [p for p in compiled if p in r.command]
        if in_container(r.command):
            skipped_ranks[r.rank] = ("runs its program inside `docker run`, which the probe cannot reach (the "
                                     "container's own interpreter never reads the replica's hook) and the replica "
                                     "cannot run (no image, no route to a registry)")
            r.command = "echo " + shlex.quote(f"testbed rehearse: rank {r.rank} skipped: {skipped_ranks[r.rank]}")
        elif r.rank in probed and found and under_mpirun(r.command) and not set_up and not own_ssh(r.command):
            skipped_ranks[r.rank] = (f"runs {', '.join(found)} under mpirun, which reaches the other hosts over the "
                                     "ssh mesh the profile's set-up makes, and the replica was not set up "
                                     "(--no-setup): the MPI stand-in runs on a replica set up")
            r.command = "echo " + shlex.quote(f"testbed rehearse: rank {r.rank} skipped: {skipped_ranks[r.rank]}")
        elif r.rank in probed and found and under_mpirun(r.command):
            r.command = mpi_stand_in(r.command, found, f"{plan.run_dir}/{MPI_STAND_IN}")
            stand_ins[r.rank] = found
            not_rehearsed.append(f"rank {r.rank}: {', '.join(found)} stood in by an MPI program under the real "
                                 "mpirun line (needs " + ", ".join(sorted(set(r.needs) & lacks)) + ")")
        elif r.rank in probed and found:
            why = (f"needs {', '.join(sorted(set(r.needs) & lacks))}, which the replica lacks, and runs "
                   f"{', '.join(found)}, a compiled program the probe cannot stand in for (not under mpirun)")
            skipped_ranks[r.rank] = why
            r.command = "echo " + shlex.quote(f"testbed rehearse: rank {r.rank} skipped: {why}")
    stood_in = set(probed) | set(skipped_ranks)
    not_rehearsed += _rehearsed_faults(plan, lacks, set(probed) - set(skipped_ranks), skipped_ranks)
    if stood_in:  # post steps and checks work on what the ranks made, and a probe makes none of it
        for s in plan.post:
            if s.name not in skipped:
                why = "works on the outputs of the probed ranks, which a probe does not make"
                skipped[s.name] = why
                s.commands = {h: "echo " + shlex.quote(f"testbed rehearse: skipped: {why}") for h in s.hosts}
        not_rehearsed += [f"check {c.name}: reads {c.file}, which the probed or skipped ranks do not write"
                          for c in plan.checks]
        plan.checks = []
    if stand_ins:
        _compile_stand_in(plan)
    if probed:
        _arm_probe(plan, suite, programs, texts)
    plan.rehearsal = {"like": like, "skipped": skipped, "probed_ranks": [r for r in probed if r not in skipped_ranks],
                      "skipped_ranks": {str(k): v for k, v in skipped_ranks.items()}, "not_rehearsed": not_rehearsed,
                      "lacks": sorted(lacks)}
    return plan


def trace_shared_home(plan: RunPlan, shared_home: bool) -> None:
    """On a shared home, each step on two or more hosts runs under strace on each (testbed.run.hometrace); the
    traced steps are kept in ``plan.rehearsal`` for the point's verdict."""
    traced = hometrace.wrap(plan, shared_home)
    if traced:
        plan.rehearsal = {**(plan.rehearsal or {}), "hometrace": traced}


MPI_STAND_IN = "testbed_mpi_stand_in"
MPI_SOURCE = Path(__file__).with_name("scripts") / "mpi_stand_in.c"


def under_mpirun(command: str) -> bool:
    """Whether a rank's shell command starts its program through ``mpirun`` (or ``mpiexec``)."""
    return any(p in ("mpirun", "mpiexec") for p in programs(command))


def own_ssh(command: str) -> bool:
    """Whether an mpirun line brings its own ssh options (``plm_rsh_args``/``plm_rsh_agent``: a config file), so it
    needs no ssh mesh from the set-up."""
    return re.search(r"plm_rsh_(args|agent)", command) is not None


def mpi_stand_in(command: str, compiled: list[str], path: str) -> str:
    """``command`` with each word that runs one of ``compiled`` (the program, or a path ending in it, with its
    arguments kept) replaced by the stand-in at ``path``: the mpirun line and its options stay as written."""
    names = {p.rsplit("/", 1)[-1] for p in compiled}

    def swap(m: re.Match[str]) -> str:
        word = m.group(0)
        return path if word in compiled or (word.rsplit("/", 1)[-1] in names and not word.startswith("-")) else word

    command = re.sub(r"[^\s'\";&|()=]+", swap, command)
    return command


def _compile_stand_in(plan: RunPlan) -> None:
    """A prepare step that builds the MPI stand-in in the run folder of every host (``mpicc``; where mpicc is
    missing, a script that runs ``hostname``), in each host's environment (its mpicc, as the ranks' mpirun)."""
    plan.files[f"{MPI_STAND_IN}.c"] = str(MPI_SOURCE)
    cmd = (f"if command -v mpicc >/dev/null 2>&1; then mpicc -O1 -o {MPI_STAND_IN} {MPI_STAND_IN}.c; else "
           f"echo 'testbed rehearse: no mpicc here: the MPI stand-in is hostname under mpirun'; "
           f"printf '#!/bin/sh\\nexec hostname\\n' > {MPI_STAND_IN} && chmod +x {MPI_STAND_IN}; fi")
    envs = {r.host: r.environment for r in plan.ranks}
    plan.prepare.append(RunStep(name="rehearse: build the MPI stand-in", hosts=plan.host_names,
                                commands={h: cmd for h in plan.host_names},
                                environments={h: envs.get(h) for h in plan.host_names}))


PROBE_STAY_MIN = 5.0
"""Seconds a probed rank stays alive after its checks passed (or 4 polls of the supervisor when longer), at most
the point's ``timeouts.run`` and the probe's own cap (``probe.STAY_MAX``), or until it is signalled."""


def probe_stay(plan: RunPlan) -> float:
    """How long a probed rank stays alive: ``PROBE_STAY_MIN``, or 4 polls when longer, within timeouts.run."""
    return min(max(PROBE_STAY_MIN, 4 * plan.timeouts.poll), plan.timeouts.run)


def _rehearsed_faults(plan: RunPlan, lacks: set[str], probed: set[int], skipped_ranks: dict[int, str]) -> list[str]:
    """Keep the faults the replica can fire (through the real supervisor, probed ranks too); one not-rehearsed
    line per fault dropped or retimed. A fault on a probed rank fires when that rank's probe is ready (its checks
    passed, ``probe.READY``): a probe prints none of the program's lines that a ``when:`` waits for, and an ``at:``
    may fall after its stay."""
    kept, lines = [], []
    for f in plan.faults:
        miss = sorted(set(f.needs) & lacks) or lacks_here(f.needs, plan.provider)
        if miss:
            lines.append(f"fault {f.name}: needs {', '.join(miss)}, which the replica lacks")
            continue
        on = f.rank if f.rank is not None else f.watch_rank
        if on in skipped_ranks or (f.when is not None and f.watch_rank in skipped_ranks):
            lines.append(f"fault {f.name}: rank {on} is skipped")
            continue
        if on in probed or (f.when is not None and f.watch_rank in probed):
            trigger = f"/{f.when}/ in rank {f.watch_rank}'s log" if f.when is not None else f"{f.at:g} s"
            target = plan.rank(on)
            f.when, f.at, f.watch_rank, f.watch_host = READY, None, target.rank, target.host
            lines.append(f"fault {f.name}: fired when rank {on}'s probe was ready, not at {trigger} (a probe "
                         "prints no progress)")
        kept.append(f)
    plan.faults = kept
    if probed and plan.checkpoint is not None:
        lines.append(f"checkpoint {plan.checkpoint.file}: a probe writes none; the relaunch resumes from nothing")
        plan.checkpoint = None
    return lines


def _arm_probe(plan: RunPlan, suite: Suite, programs: list[str], skipped: dict[str, str]) -> None:
    """Arm the probe on every host before the ranks start, disarm it after; its findings are collected."""
    config = {"run_dir": plan.run_dir, "roots": [s.path for s in suite.sources], "programs": programs,
              "stay": probe_stay(plan), "skipped": skipped}
    envs = {r.host: r.environment for r in plan.ranks}
    plan.files["testbed_probe.py"] = str(PROBE)
    arm = "python3 testbed_probe.py arm " + shlex.quote(json.dumps(config))
    plan.prepare.append(RunStep(name="rehearse: arm the probe", hosts=plan.host_names,
                                commands={h: arm for h in plan.host_names},
                                environments={h: envs.get(h) for h in plan.host_names}))
    plan.post.insert(0, RunStep(name="rehearse: disarm the probe", hosts=plan.host_names,
                                commands={h: "python3 testbed_probe.py disarm" for h in plan.host_names},
                                environments={h: envs.get(h) for h in plan.host_names}))
    for h in plan.outputs:
        plan.outputs[h].append("probe-*.json")


def stand_in_environments(tb: Resolved, plan: RunPlan, site: str | None = None) -> list[str]:
    """Where the suite's environment is missing on a host (its profile did not make it here), a stand-in venv
    that sees ``site`` (default: the controller's packages; local hosts share its files); the hosts it was made
    on."""
    by_host: dict[str, str] = {}
    for r in plan.ranks:
        if r.environment:
            by_host.setdefault(r.host, r.environment)
    for s in plan.prepare + plan.post:
        for h, env in (s.environments or {}).items():
            if env:
                by_host.setdefault(h, env)
    site = site or _controller_site_packages()
    commands = {}
    for host, env in by_host.items():
        w = path_word(env.rstrip("/"))
        dest = f'"$(ls -d {w}/lib/python3*/site-packages)"/tb-controller.pth'
        pth = f" && printf '%s\\n' {shlex.quote(site)} > {dest}" if site else ""
        commands[host] = (f"if [ -x {w}/bin/python ] || [ -x {w}/bin/python3 ]; then echo present; else "
                          f"python3 -m venv --without-pip {w}{pth} && echo made; fi")
    results = remote.run_each(tb.name, {h: remote.sh(c) for h, c in commands.items()}, timeout=120) if commands else []
    for res in results:
        if not res.ok:
            raise TestbedError(f"could not make a stand-in for the environment {by_host[res.host]} on {res.host}: "
                               f"{(res.error or res.stderr).strip()[-300:]}", where=f"replica {tb.name}",
                               fix="apply the suite's profile (drop --no-setup), or check python3 -m venv there")
    return sorted(r.host for r in results if r.stdout.strip().endswith("made"))


# --- the whole rehearsal ----------------------------------------------------------------------------------------
class RehearseOptions(TypedDict, total=False):
    """The options of :func:`rehearse` beside the suite, its parameters, ``like`` and ``say``."""

    matrix: bool
    shapes: bool
    sources: dict[str, str] | None
    setup: bool
    roles: list[str] | None
    keep: bool
    to: Path
    subnet: str | None
    faults: list[str] | None
    timeout: float | None
    site: str | None


def rehearse(suite_name: str, given: dict[str, str], *, like: str | None = None,
             say: Callable[[str], None] | None = None, **options: Unpack[RehearseOptions]) -> RehearsalResult:
    """``_rehearse`` with the real testbed's declared variables that are not set (its ``env:``, such as a lab's
    account name) standing in with their examples: a replica needs a value of the right shape, not yours. Each is
    said."""
    like = like or load_suite(suite_name).testbed
    if not like:
        return _rehearse(suite_name, given, like=like, say=say, **options)
    with stand_ins(like) as made:
        for k, v in made.items():
            if say:
                say(f"{k} is not set: the replica uses {v!r}, the example in {like}'s spec (export {k}=... to "
                    "rehearse as yourself)")
        return _rehearse(suite_name, given, like=like, say=say, **options)


def _rehearse(suite_name: str, given: dict[str, str], *, like: str | None = None, matrix: bool = False,
              shapes: bool = False, sources: dict[str, str] | None = None, setup: bool = True,
              roles: list[str] | None = None, keep: bool = False, to: Path = Path(RESULTS),
              subnet: str | None = None, faults: list[str] | None = None,
              timeout: float | None = None, site: str | None = None, say: Callable[[str], None] | None = None
              ) -> RehearsalResult:
    """Rehearse ``suite_name`` (every point of its matrix with ``matrix``; with ``shapes`` too, the first point of
    each distinct step shape: ``plan_shape``) on a replica of ``like``.

    Everything is checked before a host is made (suite, parameters, testbed spec, offline sources); the replica is
    destroyed at the end unless ``keep``. ``subnet``: the replica's; by default the first free /24 from
    10.219.0.0/24 (a kept replica keeps its own). ``faults``: the faults each point fires, as ``run --fault`` names
    them (None: the suite's defaults; []: none). ``site``: the site-packages a stand-in environment sees. ``say``: a
    callable taking one line of progress."""
    if site is not None and not Path(site).is_dir():
        raise UsageError(f"no folder {site}", where="--site", fix="give the site-packages folder of a virtualenv")
    def note(msg: str) -> None:
        if say:
            say(msg)

    if shapes and not matrix:
        raise UsageError("--shapes picks points of the matrix", where="--shapes", fix="add --matrix")
    s = load_suite(suite_name)
    points = expand_matrix(s, given) if matrix else [resolve_params(s, given)]
    found = [f.line() for f in lint.lint_suite(s, points)]
    found += [f"{e.where}: {e.what}" for e in unknown_tables(s)]  # a metric nothing would measure
    found += _left_to_fill_in(s)  # a draft of testbed new: each TODO comment, with its line
    if found:  # what the files show already: no replica is made
        for f in found:
            note(f"static check: {f}")
        return RehearsalResult(suite=s.name, like=like or s.testbed or "", replica="", shape={},
                               setup={"applied": None, "ok": False, "why": "static checks failed before any host"},
                               findings=found)
    like = like or s.testbed
    if not like:
        raise UsageError(f"suite '{s.name}' names no testbed to rehearse on a replica of", where="--like",
                         fix="give --like TESTBED (a spec in inventories/)")
    target = load_testbed(like)
    subnet = subnet or _free_subnet(replica_name(target.name), len(target.provider.planned_hosts() or []))
    spec, spec_path = _write_replica_spec(target, s, points, subnet)
    overrides = sources_mod.for_suite(s, like, sources)
    overrides = _offline_sources(s, overrides, like, note)
    points, refused, needed = _pick_points(s, target, like, _draft_info(target, spec, subnet), points,
                                           overrides, shapes=shapes, faults=faults)
    tb = Resolved.open(str(spec_path))
    edges = point_reads(s, points)  # in the order expand_matrix gives: a point after those it reads
    result = RehearsalResult(suite=s.name, like=like, replica=tb.name, setup={},
                             shape={"hosts": spec["provider"]["names"], "user": spec["user"],
                                    **target.hardware.context()}, kept=keep)
    try:
        note(f"replica {tb.name}: {plural(len(spec['provider']['names']), 'local host')} shaped like {like}")
        services.provision(tb)
        result.setup = _setup(tb, s, overrides, setup, roles, note, only=None if roles else needed)
        if not result.setup.get("ok", True):
            return result
        for i, p in enumerate(points):
            shown = ", ".join(f"{k}={v}" for k, v in p.items() if k in given or matrix)
            if i in refused:
                note(f"point {shown}: skipped ({refused[i]})")
                result.points.append(PointResult(params=p, run_id="", status="skipped", reason=refused[i], steps=[],
                                                 ranks="not reached", probes=[], not_rehearsed=[]))
                continue
            reads = {n: f"{plan_mod.RUNS_ROOT}/{result.points[j].run_id}" for n, j in edges[i].items()
                     if j is not None and result.points[j].run_id}  # after: the folder of the point it reads
            result.points.append(_run_point(tb, s, p, shown, like, overrides, result, timeout=timeout, site=site,
                                            to=to, note=note, reads=reads, faults=faults))
        return result
    finally:
        if not keep:
            try:
                services.destroy(tb)
            except TestbedError as e:
                note(f"could not destroy the replica {tb.name}: {e.what} ({e.fix})")


def _left_to_fill_in(s: Suite) -> list[str]:
    """The TODO comments of the suite's file (what testbed new left to fill in), as static findings."""
    if not s.source:
        return []
    return [f"{s.source}:{n}: left to fill in: {text}" for n, text in todo_comments(read_text(Path(s.source)))]


def _free_subnet(name: str, hosts: int = 0) -> str:
    """A subnet that holds ``hosts`` and no route of this machine uses; the one a kept replica of this name was made
    with, while it is."""
    try:
        prev = json.loads((paths.home() / "rehearse" / f"{name}.yml").read_text())["provider"]["subnet"]
    except (OSError, ValueError, KeyError, TypeError):
        prev = None
    return free_subnet(DEFAULT_SUBNET, prefer=prev if isinstance(prev, str) else None, hosts=hosts)


def _write_replica_spec(target: TestbedSpec, s: Suite, points: list[dict[str, Any]],
                        subnet: str) -> tuple[dict[str, Any], Path]:
    """The replica's spec, written under the state home and checked before anything is made."""
    spec = replica_spec(target, s, points, subnet)
    folder = paths.home() / "rehearse"
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / f"{spec['name']}.yml"
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")  # JSON is YAML
    load_testbed(str(spec_path))  # the replica's own spec is valid before anything is made
    return spec, spec_path


def _draft_info(target: TestbedSpec, spec: dict[str, Any], subnet: str) -> TestbedInfo:
    """The replica as a plan sees it before it exists: its hosts, and the real testbed's hardware and vars."""
    kind, names = str(spec["provider"]["kind"]), spec["provider"]["names"]
    per_host = {"hardware_of": {h: target.hardware.context(h) for h in names},
                "gpu_declared": [h for h in target.hardware.hosts if target.hardware.gpu_declared(h)]} \
        if target.hardware.hosts else {}
    return plan_mod.TestbedInfo(spec["name"], kind, [plan_mod.HostInfo(n, n, [], {}) for n in names],
                                {"hardware": target.hardware.context(), "subnet": subnet, "name": spec["name"],
                                 "provider": kind, "ssh_config": "~/.ssh/config", **target.vars, **per_host})


def _pick_points(s: Suite, target: TestbedSpec, like: str, info: TestbedInfo, points: list[dict[str, Any]],
                 overrides: dict[str, Override], *, shapes: bool, faults: list[str] | None = None
                 ) -> tuple[list[dict[str, Any]], dict[int, str], list[str] | None]:
    """The points to rehearse (with ``shapes``: the first of each step shape), each rendered before a host is
    made (a template, a fault, a host count), why a run on the real testbed would refuse some (by index), and the
    profile's roles the others need (None: all of them)."""
    refused: dict[int, str] = {}
    seen: set[tuple[object, ...]] = set()
    picked: list[dict[str, Any]] = []
    drafts: list[RunPlan] = []
    for p in points:
        draft = plan_mod.build_plan(s, info, p, overrides=overrides, faults=faults)
        if shapes:
            shape = plan_shape(draft)
            if shape in seen:
                continue
            seen.add(shape)
        i = len(picked)
        picked.append(p)
        for f in draft.faults:
            miss = lacks(f.needs, target.hardware.context(f.host), target.kind)
            if miss:  # judged against the real testbed: a run there would be refused
                refused[i] = f"fault {f.name} needs {', '.join(miss)}, which testbed {like} lacks"
        if i not in refused:
            drafts.append(draft)
    if len(refused) == len(picked):
        raise UsageError(f"nothing to rehearse: {refused[0]}" + (f" (and {plural(len(picked) - 1, 'more point')})"
                                                                 if len(picked) > 1 else ""),
                         where=f"suite {s.name}", fix="choose a fault the testbed has what it needs for, or --like "
                         "a testbed that declares it (hardware:)")
    return picked, refused, services.needed_roles(drafts)


def _run_point(tb: Resolved, s: Suite, p: dict[str, Any], shown: str, like: str, overrides: dict[str, Override],
               result: RehearsalResult, *, timeout: float | None, site: str | None, to: Path,
               note: Callable[[str], None], reads: dict[str, str] | None = None, faults: list[str] | None = None
               ) -> PointResult:
    """One point run for real on the replica (its plan made a rehearsal), waited for, collected and judged;
    ``reads``: the run folders of the points it reads (``after:``), rehearsed before it."""
    rinfo = plan_mod.testbed_info(tb.name, dry_run=False, store=tb.store)
    rinfo.context["spec_known"] = False  # faults were judged against the real testbed already
    plan = plan_mod.build_plan(s, rinfo, p, overrides=overrides, reads=reads, faults=faults)
    lacking = interfaces_lacking(tb, plan)  # before a rank's command is replaced by a stand-in
    if lacking:
        note(f"point {shown}: not started: {lacking[0]}")
        return PointResult(params=plan.params, run_id=plan.run_id, status="not started", reason=lacking[0],
                           steps=[], ranks="not reached", probes=[], not_rehearsed=[], failures=lacking)
    set_up = result.setup.get("applied") is not None
    absent = fault_commands_missing(tb, plan, installs="" if set_up else set_up_names(s.profile))
    if absent:  # a fault that would fail to fire on the real testbed
        note(f"point {shown}: not started: {absent[0]}")
        return PointResult(params=plan.params, run_id=plan.run_id, status="not started", reason=absent[0],
                           steps=[], ranks="not reached", probes=[], not_rehearsed=[], failures=absent)
    plan = rehearsal_plan(plan, s, like, set_up=set_up or not s.profile)
    trace_shared_home(plan, bool(rinfo.context.get("hardware", {}).get("shared_home")))
    made = stand_in_environments(tb, plan, site)
    if made:
        result.setup.setdefault("stand_in_environment", sorted(set(made)))
    note(f"run {plan.run_id}: {shown}" + "".join(f"; reads {n}: {d}" for n, d in (reads or {}).items()))
    run_id = runner.start_run(plan, store=tb.store)
    limit = timeout or plan.timeouts.prepare * 2 + plan.timeouts.run + plan.timeouts.post + 60
    try:
        rec = runner.wait(run_id, limit, store=tb.store)
    except TestbedError:  # past every timeout of the suite and more: stopped, and said so
        runner.stop_run(run_id, store=tb.store)
        rec = rs.require(tb.store, run_id)
    return _point(tb, s, plan, rec, to, note, set_up=set_up)


def _setup(tb: Resolved, s: Suite, overrides: dict[str, Override], setup: bool, roles: list[str] | None,
           note: Callable[[str], None], *, only: list[str] | None = None) -> dict[str, Any]:
    """Apply the suite's profile to the replica: ``roles`` (--role) alone, else the roles its points need
    (``only``; None: all)."""
    if not setup or not s.profile:
        return {"applied": None, "ok": True, "why": "--no-setup" if s.profile else "the suite has no profile"}
    extra = sources_mod.setup_vars(overrides, s)
    picked = roles or only
    note(f"set-up: profile {s.profile}" + (f", roles {', '.join(picked)}" if picked else "")
         + (" (what the points need: setup_roles)" if only and not roles else ""))
    t0 = time.monotonic()
    res = services.setup(tb, profile=s.profile if not roles else None, roles=roles, extra_vars=extra or None,
                         only=None if roles else only).result
    out: dict[str, Any] = {"applied": s.profile, "roles": roles or only or res.roles, "ok": res.ok,
                           "seconds": round(time.monotonic() - t0, 1)}
    if not res.ok:
        bad = {n: (h.error or "failed") for n, h in res.hosts.items() if h.failed or h.unreachable}
        out["failed"] = bad
        out["error"] = res.error
    return out


def _point(tb: Resolved, s: Suite, plan: RunPlan, rec: RunRecord, to: Path, note: Callable[[str], None], *,
           set_up: bool = True) -> PointResult:
    events = tb.store.events(plan.run_id)
    seen = {(e.detail.get("phase"), e.detail.get("step")): e for e in events if e.kind == "step"}
    skipped = (plan.rehearsal or {}).get("skipped", {})
    steps = []
    for phase, items in (("sources", plan.sources), ("prepare", plan.prepare), ("post", plan.post)):
        for st in items:
            ev = seen.get((phase, st.name))
            status = "not reached" if ev is None else "skipped" if st.name in skipped else \
                "ran" if ev.detail.get("ok") else "failed"
            steps.append(StepOutcome(phase, st.name, status, list(st.hosts), skipped.get(st.name, "")))
    collected = collect_runs([plan.run_id], to, store=tb.store)[0]
    folder = (Path(to) / plan.suite / plan.run_id).absolute()
    probes, not_made = [], []
    for f in sorted(folder.glob("*/probe-*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        not_made += [str(n) for n in d.get("not_judged", []) if str(n) not in not_made]
        probes.append(Probe(host=d.get("host", f.parent.name), script=d.get("script", ""), argv=d.get("argv", []),
                            cwd=d.get("cwd", ""), parsed_by=str(d.get("parsed_by", "")),
                            problems=list(d.get("problems", [])),
                            args=d["args"] if isinstance(d.get("args"), dict) else {}))
    launched = any(e.kind == "started" for e in events) or rec.info.launched_at
    skipped_ranks = (plan.rehearsal or {}).get("skipped_ranks") or {}
    ranks = "not reached" if not launched else "probed" if probes else \
        "skipped" if len(skipped_ranks) == len(plan.ranks) else "ran"
    if collected.ok:
        try:
            build_report(folder)
        except TestbedError as e:
            note(f"report of {plan.run_id}: {e.what}")
    not_rehearsed = list((plan.rehearsal or {}).get("not_rehearsed", []))
    not_rehearsed += [f"rank {k}: {why}" for k, why in skipped_ranks.items()]
    produced, unmade, unjudged = outputs_made(plan, collected.hosts)
    found, absent = log_signatures(plan, steps, folder, set_up=set_up,
                                   installs="" if set_up else set_up_names(s.profile))
    told, unfired = fault_outcomes(plan, events)
    raced, unchecked = hometrace.check(tb.name, plan)
    failures = (unmade + edits_undeclared(tb, s, plan) + found + unfired + grace_against_probes(s, plan, probes)
                + raced)
    return PointResult(params=plan.params, run_id=plan.run_id, status=rec.status, reason=rec.reason, steps=steps,
                       ranks=ranks, probes=probes,
                       not_rehearsed=not_rehearsed + unjudged + absent + not_made + unchecked,
                       folder=str(folder), failures=failures, produced=produced, faults=told)


# --- faults, fired through the supervisor -----------------------------------------------------------------------
def fault_outcomes(plan: RunPlan, events: list[RunEvent]) -> tuple[list[str], list[str]]:
    """(one line per rehearsed fault: fired, detected and relaunched, or the reason why not; one failure per fault
    that did not fire or whose recovery did not relaunch), read from the run's events."""
    lines, failures = [], []
    by_kind: dict[str, list[Any]] = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e)
    for f in plan.faults:
        fired = next((e for e in by_kind.get("fault", []) if e.detail.get("fault") == f.name), None)
        if fired is None:
            missed = next((e for e in by_kind.get("fault-missed", []) if e.detail.get("fault") == f.name), None)
            why = missed.detail.get("reason") if missed is not None else "the run ended before it was due"
            failures.append(f"fault {f.name} did not fire: {why}")
            lines.append(f"fault {f.name}: not fired ({why})")
            continue
        info = fired.detail
        if info.get("ok") is False:
            failures.append(f"fault {f.name} failed to fire: {info.get('error', 'no reason given')}")
            lines.append(f"fault {f.name}: failed to fire ({info.get('error', '')})")
            continue
        line = f"fault {f.name}: fired ({f.action} on {f.host}" + (f" rank {f.rank})" if f.rank is not None else ")")
        failed = next((e for e in by_kind.get("failed", []) if e.ts >= fired.ts), None)
        line += f", detected {failed.ts - fired.ts:.1f} s later ({failed.detail.get('reason', '')})" if failed \
            else ", not detected (no rank failed after it)"
        relaunched = next((e for e in by_kind.get("relaunched", []) if e.ts >= fired.ts), None)
        if relaunched is not None:
            line += f", ranks relaunched (attempt {relaunched.detail.get('attempt')})"
        elif plan.recovery or f.recovery:
            line += ", not relaunched"
            failures.append(f"fault {f.name}: fired, but its recovery did not relaunch the ranks")
        else:
            line += ", no recovery declared"
        lines.append(line)
    return lines, failures


def grace_against_probes(s: Suite, plan: RunPlan, probes: list[Probe]) -> list[str]:
    """One failure per timeout a probed program keeps (an argument whose name holds ``timeout``, as its own parser
    read this argv, defaults included) that the suite's grace cannot cover plus a checkpoint interval, where a
    fault fires or a recovery runs: the static check (``lint.fault_timing``) reads only what the suite writes."""
    if not (plan.faults or plan.recovery):
        return []
    ckpt = lint.checkpoint_interval(s, plan.params)
    allow = ckpt[1] if ckpt else 0.0
    grace = plan.timeouts.grace
    out: dict[tuple[str, str], str] = {}
    for pr in probes:
        for k, v in pr.args.items():
            t = lint.seconds(k, v) if "timeout" in k.lower() else None
            if t is None or grace > t + allow or (pr.script, k) in out:
                continue
            plus = f" plus a checkpoint interval of {allow:g} s ({ckpt[0]})" if ckpt else " plus a checkpoint"
            out[(pr.script, k)] = (
                f"timeouts.grace {grace:g} s cannot cover {pr.script}'s own {k} {t:g} s (as its parser reads this "
                f"argv, on {pr.host}){plus}: after one rank fails, the others are stopped before their own timeout "
                f"lets them notice, checkpoint and end (raise grace above {t + allow:g} s)")
    return list(out.values())


# --- what a point proves it produced ----------------------------------------------------------------------------
def interfaces_lacking(tb: Resolved, plan: RunPlan) -> list[str]:
    """One line per interface a rank's launcher or environment names that a replica host lacks (``ip -o link``
    on each host of the run), judged before anything starts."""
    given = [g for r in plan.ranks for g in proof.interfaces_given(r.command, r.env)]
    given += [g for line in plan.env for g in proof.interfaces_given(line)]
    given = list(dict.fromkeys(given))
    if not given:
        return []
    have: dict[str, list[str]] = {}
    for res in remote.run_each(tb.name, {h: "ip -o link" for h in plan.host_names}, timeout=60):
        if not res.ok:
            raise TestbedError(f"could not list the interfaces of {res.host}: {(res.error or res.stderr).strip()}",
                               where=f"replica {tb.name}", fix="check the replica's hosts (testbed status)")
        have[res.host] = proof.link_names(res.stdout)
    return proof.missing_interfaces(given, have)


def outputs_made(plan: RunPlan, hosts: list[HostCollect]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """(each declared output -> the hosts it matched on, one failure per output that matched on none of the hosts
    it is declared for, one not-rehearsed line per such output where the probe stood in for what writes it).

    Read from collect's per-host notes (``no file matches 'GLOB'``: the listing's @NOMATCH)."""
    import ast

    missed: dict[str, set[str]] = {}
    for hc in hosts:
        for n in hc.notes:
            if n.startswith("no file matches "):
                missed.setdefault(hc.host, set()).add(ast.literal_eval(n[len("no file matches "):]))
    produced: dict[str, list[str]] = {}
    for host, globs in plan.outputs.items():
        for g in globs:
            if g not in LOG_PATTERNS and g != "probe-*.json":
                produced.setdefault(g, [])
                if g not in missed.get(host, ()):
                    produced[g].append(host)
    stood_in = bool((plan.rehearsal or {}).get("probed_ranks") or (plan.rehearsal or {}).get("skipped_ranks")
                    or (plan.rehearsal or {}).get("skipped"))
    failed, unjudged = [], []
    for g, made in produced.items():
        if made:
            continue
        on = ", ".join(h for h, globs in plan.outputs.items() if g in globs)
        if stood_in:
            unjudged.append(f"output {g}: matched no file on {on}, but what would write it was probed or skipped")
        else:
            failed.append(f"output {g} matched no file on {on}: the point did not produce it")
    return produced, failed, unjudged


def edits_undeclared(tb: Resolved, s: Suite, plan: RunPlan) -> list[str]:
    """One line per source checkout whose tracked files the run changed beyond the suite's ``edits:``
    (``git status --porcelain --untracked-files=no`` on each host of the run)."""
    out = []
    for src in s.sources:
        w = path_word(src.path.rstrip("/"))
        cmd = f"if [ -e {w}/.git ]; then git -C {w} status --porcelain --untracked-files=no; fi"
        changed: dict[str, list[str]] = {}
        for res in remote.run_each(tb.name, {h: remote.sh(cmd) for h in plan.host_names}, timeout=60):
            for path in proof.undeclared_edits(proof.changed_tracked(res.stdout if res.ok else ""), src.edits):
                changed.setdefault(path, []).append(res.host)
        if changed:
            files = sorted(changed)
            shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
            hosts = sorted({h for hs in changed.values() for h in hs})
            out.append(f"source {src.name}: the run changed tracked files of {src.path} that the suite does not "
                       f"declare it edits: {shown} (on {', '.join(hosts)}; declare them in the source's edits: if "
                       "meant)")
    return out


PROVIDES = {"pciutils": ("lspci", "setpci"), "procps": ("ps", "pgrep", "pkill", "free", "sysctl", "watch"),
            "psmisc": ("killall", "fuser", "pstree"), "iproute2": ("ip", "tc", "ss", "bridge"),
            "iptables": ("iptables", "ip6tables"), "stress-ng": ("stress-ng",), "stress": ("stress",),
            "util-linux": ("taskset", "setsid", "flock", "ionice"), "nvidia-driver": ("nvidia-smi",),
            "gpu": ("nvidia-smi",), "cuda": ("nvidia-smi", "nvcc")}
"""Package (or capability a fault's needs: declares) -> the commands it brings: a command a fault calls is
installed by the set-up that names its package, or declared by the fault that needs its capability."""


def _names(word: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", text) is not None


def fault_command_excused(prog: str, needs: list[str], installs: str) -> str | None:
    """Why a command a fault calls may be absent from a replica host (None: it may not): the fault's needs:
    declare it or a capability that brings it, or the profile's set-up (``installs``: its text, on a replica not
    set up) names it or its package."""
    for n in needs:
        if n == prog or prog in PROVIDES.get(n, ()):
            return f"the fault's needs: declare {n}"
    if installs and (_names(prog, installs) or any(prog in cmds and _names(pkg, installs)
                                                    for pkg, cmds in PROVIDES.items())):
        return "the profile's set-up installs it (the replica was not set up)"
    return None


def fault_commands_missing(tb: Resolved, plan: RunPlan, *, installs: str = "") -> list[str]:
    """One line per command a fault of the point runs (its command and restore) that its target host lacks
    (``command -v`` over ssh on the replica), unless the fault's needs: or the profile's set-up account for it.
    Only a kind that ``runs_command`` runs the suite's commands there (a signal fault runs testbed's own script,
    the shell's kill; host faults act from the provider)."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for f in plan.faults:
        if not fault_kinds.get(f.action).runs_command:
            continue
        for text in (f.command or "", f.restore or ""):
            for prog in proof.commands_called(text):
                if fault_command_excused(prog, f.needs, installs) is None and (f.name, prog) not in \
                        wanted.get(f.host, []):
                    wanted.setdefault(f.host, []).append((f.name, prog))
    if not wanted:
        return []
    commands = {h: remote.sh("for c in " + " ".join(shlex.quote(p) for _, p in pairs) +
                             '; do command -v "$c" >/dev/null 2>&1 || echo "$c"; done') for h, pairs in wanted.items()}
    out = []
    for res in remote.run_each(tb.name, commands, timeout=60):
        if not res.ok:
            raise TestbedError(f"could not look for the faults' commands on {res.host}: "
                               f"{(res.error or res.stderr).strip()}", where=f"replica {tb.name}",
                               fix="check the replica's hosts (testbed status)")
        absent = set(res.stdout.split())
        for fault, prog in wanted[res.host]:
            if prog in absent:
                out.append(f"fault {fault}: {prog} is not found on {res.host} (command -v), and neither the fault's "
                           "needs: nor the profile's set-up installs it: the fault would fail to fire (install it "
                           "in the profile, or declare it in the fault's needs: and the testbed's hardware.tools)")
    return out


NOT_SET_UP = "a command not found"
"""The signature that a replica which was not set up (--no-setup) shows for what its set-up would install (conda,
a built tool): noted as not rehearsed there when the profile names that command, a failure otherwise."""


def set_up_names(profile: str | None) -> str:
    """The text of what the profile's set-up would do (``testbed.lint.set_up_text``): a command it names is one it
    may install."""
    return lint.set_up_text(profile)


def _missing_command(line: str) -> str | None:
    """The command a 'command not found' line names (bash's ``x: command not found``, dash's ``x: not found``)."""
    m = re.search(r"([A-Za-z0-9_.+-]+): (?:command )?not found\s*$", line)
    return m.group(1) if m else None


def log_signatures(plan: RunPlan, steps: list[StepOutcome], folder: Path, *, set_up: bool = True,
                   installs: str = "") -> tuple[list[str], list[str]]:
    """(failures, notes): one line per failure signature (``testbed.proof.SIGNATURES``) in the ranks' collected
    logs and the output of each step that ran, quoting the line. On a replica that was not set up, a command not
    found that the profile's set-up names (``installs``: its text) is a note, not a failure: what set-up installs is
    absent there; any other (a misspelt command) is a failure all the same."""
    found: list[tuple[str, proof.Finding]] = []
    for f in sorted(folder.glob("*/rank*.out")) + sorted(folder.glob("*/rank*.err")):
        found += [(f"{f.parent.name}/{f.name}", x) for x in proof.scan(_read(f))]
    logs = rs.run_home(plan.run_id)
    for st in steps:
        if st.status in ("ran", "failed") and not st.name.startswith("rehearse:"):
            for h in st.hosts:
                text = _read(logs / step_log_name(st.phase, st.name, h))
                found += [(f"{st.phase} step '{st.name}' on {h}", x) for x in proof.scan(text)]
    def absent(x: proof.Finding) -> bool:
        cmd = _missing_command(x.line) if x.signature == NOT_SET_UP and not set_up else None
        return cmd is not None and re.search(rf"(?<![\w.-]){re.escape(cmd)}(?![\w-])", installs) is not None

    failures = [x.verdict(where) for where, x in found if not absent(x)]
    notes = [x.verdict(where) + ": the replica was not set up (--no-setup), and its set-up is what installs it"
             for where, x in found if absent(x)]
    return failures, notes


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
