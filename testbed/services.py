"""The verbs, once, for every front door: the CLI parses and renders, the Python API raises or returns, both call
these.

Each verb takes a resolved testbed (:class:`testbed.resolved.Resolved`) or a run id, calls the stages in order and
returns data. What guards the bill lives here, so that a script gets it as the CLI does: a command on the hosts
restarts the testbed's idle clock (the dead-man's switch, :mod:`testbed.deadman`), a run refreshes it, a new
testbed is armed at provision (by its provider), ``extend`` moves the expiry and the lease together. Each verb is
one command (:func:`testbed.paths.one_command`): a suite folder a script's call names by its path counts for that
call, and within a CLI command for the whole command.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import deadman, paths, remote
from testbed.errors import HostsFailed, TestbedError, UsageError, by_door, provision_fix
from testbed.paths import RESULTS, one_command

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from testbed.collect import CollectResult
    from testbed.estimate import Budget
    from testbed.hosts import Host
    from testbed.providers.base import Progress
    from testbed.records import CampaignRecord, RunPlan, RunRecord
    from testbed.remote import HostResult
    from testbed.report.build import ReportResult
    from testbed.report.folders import IndexResult
    from testbed.resolved import Resolved
    from testbed.setup.events import EventHandler, SetupResult
    from testbed.setup.repair import Repair
    from testbed.state import Store
    from testbed.suite import Suite

__all__ = ["CampaignStarted", "Extended", "Provisioned", "Repair", "SetupDone", "Started", "collect", "destroy",
           "detach_campaign", "disarm", "drive_campaign", "exec_", "extend", "provision", "repair", "report", "setup",
           "start", "start_campaign", "stop", "wait"]


def __getattr__(name: str) -> Any:
    """``Repair`` (what :func:`repair` returns), imported on first use: ``exec`` and ``status`` need no set-up."""
    if name == "Repair":
        # lazy: start-up (testbed status and exec load this module)
        from testbed.setup.repair import Repair

        return Repair
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Provisioned:
    """What ``provision`` made: the hosts, how long it took, the image they booted from, when the switch fires."""

    hosts: list[Host]
    seconds: float
    image: Mapping[str, Any] | None = None
    release_at: float | None = None  # the dead-man's switch's next release (None: not armed)
    switch: str | None = None  # how it fires: agent (on the hosts), watchdog (on this machine), lease, ...


@one_command()
def provision(tb: Resolved, *, expire: str | None = None, progress: Progress | None = None,
              for_suite: str | None = None) -> Provisioned:
    """Create (or find) the hosts and record them; idempotent. A new testbed whose set-up has an image boots from
    it; ``expire`` (8h, 2d) arms the dead-man's switch to release it then, even with no controller running;
    ``for_suite``: refused, before anything is created, when that suite cannot run on this testbed."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.setup import images
    from testbed.setup.profiles import check_vars

    if for_suite is not None:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.run.runner import refuse_before_renting
        from testbed.suite import load_suite

        refuse_before_renting(load_suite(for_suite), tb.name, store=tb.store,
                              fix=f"or provision without --for {for_suite}", where=f"--for {for_suite}")
    p = tb.provider(progress)
    p.expire = expire
    if p.spec is not None:
        check_vars(p.spec)  # set-up variables are refused before any host is made
    t0 = time.monotonic()
    image = images.for_provision(p)
    try:
        hosts = p.provision()
    except KeyboardInterrupt:
        raise TestbedError(f"provisioning of '{tb.name}' was interrupted; every resource created so far is recorded",
                           where=f"testbed {tb.name}", fix=f"run 'testbed destroy {tb.name}' to release them, "
                           f"or 'testbed provision {tb.name}' to finish") from None
    tb.record = tb.store.testbed(tb.name)
    e = deadman.recorded(tb.store, tb.name)
    armed = e is not None and e.active
    return Provisioned(hosts, round(time.monotonic() - t0, 2), image, e.release_at() if e and armed else None,
                       e.switch if e and armed else None)


@one_command()
def repair(tb: Resolved, host: str, *, setup: bool = True, profile: str | None = None,
           progress: Progress | None = None) -> Repair:
    """Bring one failed host back without touching the others and set it up again (:mod:`testbed.setup.repair`);
    the idle clock restarts."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.setup.repair import repair as repair_host

    if tb.record is None:
        raise UsageError(f"testbed '{tb.name}' is not provisioned: there is no host to repair", where="state",
                         fix=provision_fix(tb.name))
    deadman.touch(tb.name, tb.store)
    return repair_host(tb, host, setup=setup, profile=profile, progress=progress)


@one_command()
def destroy(tb: Resolved, progress: Progress | None = None) -> float:
    """Release every resource of the testbed and forget it (safe to repeat); the seconds it took."""
    t0 = time.monotonic()
    try:
        tb.provider(progress).destroy()
    except KeyboardInterrupt:
        raise TestbedError(f"destroy of '{tb.name}' was interrupted; what is left is still recorded",
                           where=f"testbed {tb.name}", fix=f"run 'testbed destroy {tb.name}' again") from None
    tb.record = None
    return round(time.monotonic() - t0, 2)


@dataclass
class Extended:
    """What ``extend`` moved: the lease's new end (None: no lease moved), the new expiry, hosts not told."""

    lease_end: str | None = None
    expire_at: float | None = None
    missed: list[str] = field(default_factory=list)  # hosts whose agent kept its old deadline


@one_command()
def extend(tb: Resolved, *, hours: float | None = None, expire: str | None = None) -> Extended:
    """Move the testbed's expiry by ``hours`` or to ``expire`` from now, and its lease (Chameleon) with it."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import expiry
    from testbed.capabilities import Capability, Extends

    if hours is None and expire is None:
        raise UsageError(by_door("give --hours or --expire", "give hours or expire"),
                         where=by_door("command line", f"testbed {tb.name}: extend"),
                         fix=by_door(f"testbed extend {tb.name} --hours 4", "extend(4) or extend(expire='8h')"))
    if hours is not None and not (0 < hours <= expiry.MAX_SECONDS / 3600):  # NaN fails both comparisons
        raise UsageError(f"cannot extend by {hours} hours", where="--hours",
                         fix=f"give a positive number of hours, at most {expiry.MAX_SECONDS // 3600}")
    if expire is not None:
        check_duration(expire, "--expire")
    _require_record(tb)
    p = tb.provider()
    e = deadman.recorded(tb.store, tb.name)
    out = Extended()
    if e is not None and e.expire_at is not None:
        out.expire_at = time.time() + expiry.parse_duration(expire) if expire else e.expire_at + (hours or 0) * 3600
    elif expire:
        raise UsageError(f"testbed '{tb.name}' has no expiry to move", where=f"testbed {tb.name}",
                         fix=by_door(f"set one with 'testbed provision {tb.name} --expire {expire}'",
                                     f"set one with provision(expire={expire!r})"))
    lease_hours = hours
    if p.can(Capability.EXTEND) and expire and out.expire_at is not None:
        lease_hours = p.hours_short_of(out.expire_at)
    if lease_hours and isinstance(p, Extends):
        out.lease_end = p.extend(lease_hours)
    elif hours and out.expire_at is None:
        raise UsageError(f"testbed '{tb.name}' ({p.kind}) has no lease and no expiry to extend: "
                         f"{p.lacks(Capability.EXTEND) or 'no lease is recorded'}", where=f"testbed {tb.name}",
                         fix="extend applies to testbeds with a reservation or an expiry ("
                             + by_door("provision --expire", "provision(expire=...)") + ")")
    if e is not None and out.expire_at is not None:
        e.expire_at = out.expire_at
        out.missed = deadman.refresh(tb.store, tb.name, moved=e)
    return out


@one_command()
def disarm(tb: Resolved) -> None:
    """Turn the dead-man's switch off: no expiry, no idle limit (a lease still ends at its end)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.capabilities import Expires

    _require_record(tb)
    p = tb.provider()
    if isinstance(p, Expires):  # a provider without a switch has none to turn off
        p.disarm_switch()
    tb.store.update_testbed_info(tb.name, expiry=None)


def check_duration(value: str, option: str) -> None:
    """Refuse a duration that does not read as one (8h, 90m, 2d), naming the option."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.expiry import parse_duration

    try:
        parse_duration(value)
    except ValueError as err:
        raise UsageError(f"bad {option}: {err}", where=option, fix=f"e.g. {option} 8h (s, m, h or d)") from None


@dataclass
class SetupDone:
    """A set-up's result, and the image baked from it (``bake``)."""

    result: SetupResult
    image: dict[str, Any] | None = None
    note: str | None = None  # one line on an image: what a bake would give, or why none was baked


@one_command()
def setup(tb: Resolved, *, profile: str | None = None, suite: str | None = None,
          roles: list[str] | None = None, check: bool = False, verify: bool = False, limit: list[str] | None = None,
          extra_vars: dict[str, Any] | None = None, sources: list[str] | None = None, bake: bool | None = None,
          on_event: EventHandler | None = None, only: list[str] | None = None,
          progress: Progress | None = None) -> SetupDone:
    """Apply a profile, a suite's profile or single roles (``only``: just these roles of the profile); hosts whose
    recorded set-up matches are skipped unless ``verify``. ``sources`` (``--source`` items) and the spec's
    ``sources:`` build the profile's sources from a checkout, fork or mirror. ``bake``: once it passed, an image of
    a host keyed by its content address (a provider that cannot bake is refused before the set-up runs); None (by
    default): a provider whose images cost nothing bakes one by itself, another's ``note`` says what a bake
    would give (:func:`testbed.setup.images.offer`, saying so to ``progress`` first); False: neither. The idle
    clock restarts."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import setup as setup_mod
    from testbed import sources as sources_mod
    from testbed.setup import images
    from testbed.suite import load_suite

    if bake and (roles or check or only):
        raise UsageError(f"--bake goes with a profile or a suite, not with {'--role' if roles else '--check'}",
                         where="--bake", fix=f"testbed setup {tb.name} --profile local-suites --bake")
    if bake:
        images.refuse_bake(tb, profile=profile, suite=suite)
    s = load_suite(suite) if suite else None
    suite_sources = {x.name: x.repo for x in s.sources} if s is not None else {}
    builds = sources_mod.profile_builds((s.profile if s is not None else profile)
                                        or (tb.spec.profile if tb.spec else None))
    given = sources_mod.parse(sources or [])
    overrides = sources_mod.overrides_for(sources_mod.spec_sources(tb.name), given,
                                          suite_sources, builds)
    extra = {**(extra_vars or {}), **sources_mod.setup_vars(overrides, s, builds)}
    deadman.touch(tb.name, tb.store)
    res = setup_mod.apply(tb, profile=profile, suite=suite, roles=roles, check=check, verify=verify, limit=limit,
                          extra_vars=extra or None, on_event=on_event, only=only)
    image, note = None, None
    if bake and res.ok and not res.error:
        image = images.bake(tb, profile=profile, suite=suite, extra_vars=extra or None)
    elif bake is None and res.ok and not res.error and not (roles or check or only or limit):
        image, note = images.offer(tb, profile=profile, suite=suite, extra_vars=extra or None, progress=progress)
    return SetupDone(res, image, note)


def setup_failed(name: str, res: SetupResult, more: str) -> HostsFailed:
    """The error of a set-up that failed: each host that failed or did not answer, with why (at most 10)."""
    bad = {n: h for n, h in res.hosts.items() if h.failed or h.unreachable}
    why = [f"{n}: {h.status}" + (f" at {h.error_task}" if h.error_task else "") + (f": {h.error}" if h.error else "")
           for n, h in bad.items()]
    stopped = [n for n, h in res.hosts.items() if h.status == "stopped"]
    what = f"setup of '{name}' ({res.plan}) failed" + (
        f" on {len(bad)} host{'s' if len(bad) != 1 else ''}:\n  " + "\n  ".join(why[:10]) if why
        else f": {res.error or f'ansible-playbook exit {res.rc}'}") + (
        f"\n  stopped on {', '.join(stopped)} (the play ended there before it finished: not set up)" if stopped else "")
    return HostsFailed(what, results=res, failed=bad, where=res.artifact_dir or f"testbed {name}",
                       fix=f"fix the failing task and run it again (testbed setup {name} shows it live); {more}")


@one_command()
def exec_(st: Store, name: str, command: str, hosts: str | Sequence[str] | None = None, *,
          timeout: float | None = None) -> list[HostResult]:
    """Run a shell command on testbed ``name``'s recorded hosts (names, groups, globs; all by default) in parallel;
    each host's result. The idle clock restarts. Needs no spec: the state's hosts are enough."""
    if not command.strip():
        raise UsageError("no command given", where=by_door("command line", f"testbed {name}: exec"),
                         fix=by_door(f"testbed exec {name} -- hostname", "exec('hostname')"))
    names = select(name, st.hosts(name), hosts)
    results = remote.run(name, names, command, timeout=timeout)
    deadman.touch(name, st)
    return results


def select(name: str, known: list[Host], hosts: str | Sequence[str] | None) -> list[str]:
    """Host names from a pattern (names, groups, globs) or a list; all by default. An unknown one is refused."""
    if not known:
        raise UsageError(f"testbed '{name}' has no hosts", where="state", fix=provision_fix(name))
    pattern = hosts if isinstance(hosts, str) or hosts is None else ",".join(hosts)
    if pattern is not None:
        remote.selection(pattern)
    picked = [h.name for h in remote.select_hosts(known, pattern)]
    if not picked:
        raise UsageError(f"no host of '{name}' matches {pattern!r}", where="hosts",
                         fix=f"hosts: {', '.join(h.name for h in known)}; groups work too (master, workers)")
    return picked


@dataclass
class Started:
    """A run started: its plan (hosts, ranks) and id; the set-up applied first, if any."""

    plan: RunPlan
    setup: SetupResult | None = None

    @property
    def run_id(self) -> str:
        return self.plan.run_id


@one_command()
def plan(suite: str | Suite, on: str | None, params: dict[str, Any] | None = None, *,
         faults: list[str] | None = None, sources: list[str] | dict[str, str] | None = None,
         dry_run: bool = False, store: Store | None = None) -> RunPlan:
    """The whole run rendered, checked against the testbed (nothing touches a host)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import sources as sources_mod
    from testbed.run import runner

    src = sources_mod.parse(sources) if isinstance(sources, list) else sources
    return runner.plan_run(suite, on, dict(params or {}), faults=faults, dry_run=dry_run, sources=src, store=store)


@one_command()
def start(tb: Resolved, suite: str | Suite, params: dict[str, Any] | None = None, *,
          faults: list[str] | None = None, with_setup: bool = True,
          sources: list[str] | dict[str, str] | None = None, on_event: EventHandler | None = None) -> Started:
    """Plan the run, apply the suite's profile (with the run's source overrides) unless ``with_setup`` is False,
    then start it detached on the hosts (its supervisor survives this process). A failed set-up raises."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import runner
    from testbed.suite import load_suite

    s = load_suite(suite) if isinstance(suite, str) else suite
    p = plan(s, tb.name, params, faults=faults, sources=sources, store=tb.store)
    done = suite_setup(tb, s, p, on_event) if with_setup and s.profile else None
    runner.start_run(p, store=tb.store)  # records the run and refreshes the idle clock
    return Started(p, done)


@dataclass
class CampaignStarted:
    """A campaign created (or found again, to resume): its id, its points, the set-up applied first, and its
    budget in seconds of the testbed (None: no budget)."""

    campaign_id: str
    suite: str
    testbed: str
    points: list[dict[str, Any]]
    setup: SetupResult | None = None
    budget: Budget | None = None
    budget_seconds: float | None = None


@one_command()
def start_campaign(tb: Resolved, suite: str | Suite, given: dict[str, Any] | None = None, *,
                   faults: list[str] | None = None, sources: dict[str, str] | None = None,
                   budget: Budget | None = None, with_setup: bool = True,
                   on_event: EventHandler | None = None) -> CampaignStarted:
    """Every point of the suite's matrix (``given`` filters them) as one campaign on ``tb``: the first point
    planned (checking its overrides before any host), the budget read against every estimate, the suite's profile
    applied with the roles any point needs (unless ``with_setup`` is False), then the campaign recorded (one of the
    same points found unfinished is resumed). :func:`drive_campaign` runs it."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import campaign
    from testbed.suite import expand_matrix, load_suite

    s = load_suite(suite) if isinstance(suite, str) else suite
    points = expand_matrix(s, dict(given or {}))
    limit = campaign.Limit(s, tb.name, points, budget, tb.store) if budget else None  # every estimate
    refuse_overrun(s, tb, dict(given or {}), faults, limit.seconds if limit else None)
    first = plan(s, tb.name, points[0], faults=faults, sources=sources, store=tb.store)
    # a suite whose points need different roles of its profile (setup_roles): the roles any point needs
    more = [plan(s, tb.name, p, faults=faults, dry_run=True, sources=sources, store=tb.store) for p in points[1:]] \
        if s.setup_roles else []
    done = suite_setup(tb, s, first, on_event, more) if with_setup and s.profile else None
    found = paths.find_suite(s.name)
    own = found is not None and s.source is not None and found.resolve() == Path(s.source).resolve()
    cid = campaign.create_or_resume(s.name, tb.name, points, faults, sources, store=tb.store, budget=budget,
                                    suite_file=None if own or not s.source else str(Path(s.source).resolve()))
    return CampaignStarted(cid, s.name, tb.name, points, done, budget, limit.seconds if limit else None)


@one_command()
def campaign_dry_run(s: Suite, on: str | None, points: list[dict[str, Any]], *, faults: list[str] | None = None,
                     sources: dict[str, str] | None = None, store: Store | None = None
                     ) -> tuple[list[RunPlan], list[dict[str, Any]]]:
    """Every point of a campaign planned in its order (``points``, as expand_matrix orders them), a point that reads
    another's output (``after:``) given that point's planned run folder; and the order: per point its label and
    what it reads (``after:`` name -> {point: its number, 1 first; label; folder})."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import runner
    from testbed.suite import point_label, point_reads

    plans: list[RunPlan] = []
    order: list[dict[str, Any]] = []
    for p, reads in zip(points, point_reads(s, points), strict=True):
        folders = {n: plans[j].run_dir for n, j in reads.items() if j is not None}
        plans.append(runner.plan_run(s, on, p, faults=faults, dry_run=True, sources=sources, store=store,
                                     reads=folders))
        order.append({"label": point_label(s, p), "reads": {
            n: {"point": j + 1, "label": point_label(s, points[j]), "folder": plans[j].run_dir}
            for n, j in reads.items() if j is not None}})
    return plans, order


def refuse_overrun(s: Suite, tb: Resolved, given: dict[str, Any], faults: list[str] | None,
                   budget_seconds: float | None) -> None:
    """Refuse, before any set-up or point, a campaign whose estimate is longer than the testbed has left (its
    expiry, its lease, or its spec's length when not provisioned yet), unless a budget keeps it within."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.exitcodes import Exit
    from testbed.expiry import span
    from testbed.run import forecast

    fc = forecast.forecast(s, tb.name, given, matrix=True, faults=faults, store=tb.store)
    left, total = fc.fit.get("left_seconds"), fc.total_seconds
    if left is None or total is None or total <= left or (budget_seconds is not None and budget_seconds <= left):
        return
    fits = f"{max(int(left // 60), 0)}m"  # a budget that parses, within what is left
    raise TestbedError(
        f"the campaign of {s.name} would outlive testbed '{tb.name}': its points are estimated at {span(total)}, "
        f"and the testbed has {span(max(left, 0))} left ({fc.fit.get('basis')})", where=f"testbed {tb.name}",
        fix=by_door(f"testbed extend {tb.name} --hours N, run fewer points (-p), or --budget {fits} to run what "
                    f"fits (testbed plan {s.name} --matrix --on {tb.name} shows each estimate)",
                    f"tb.extend(hours=N), fewer points (params), or budget='{fits}' to run what fits (testbed plan "
                    f"{s.name} --matrix --on {tb.name} shows each estimate)"),
        code=Exit.USAGE)


@one_command()
def drive_campaign(campaign_id: str, *, progress: Callable[[str], None] | None = None,
                   store: Store | None = None) -> CampaignRecord:
    """Run the campaign's points one after the other until each ended or its budget is spent (then it is left
    ``paused``: start it again to resume); its record at the end. ``progress``: one line per step."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import campaign

    return campaign.drive(campaign_id, progress=progress or (lambda _: None), store=store)


@one_command()
def detach_campaign(campaign_id: str) -> Path:
    """Drive the campaign in a process of its own that outlives this one; the file its output goes to."""
    import subprocess
    import sys

    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import bookkeeping as run_state

    out = run_state.run_home(campaign_id) / "campaign.out"
    with open(out, "ab") as log:
        subprocess.Popen([sys.executable, "-m", "testbed.run.campaign", campaign_id], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True, close_fds=True)
    return out


def suite_setup(tb: Resolved, s: Suite, p: RunPlan, on_event: EventHandler | None = None,
                more: Sequence[RunPlan] = ()) -> SetupResult:
    """Apply the suite's profile with the run's (or campaign's first run's) source overrides, just the roles the
    run's point needs (with ``more``, the other points of its campaign: the roles any of them needs); raises when
    it fails on a host."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import sources as sources_mod

    extra = sources_mod.setup_vars(p.source_overrides, s)
    done = setup(tb, profile=s.profile, extra_vars=extra or None, on_event=on_event,
                 only=needed_roles([p, *more])).result
    if not done.ok or done.error:
        raise setup_failed(tb.name, done, "or run without its set-up (--no-setup)")
    return done


def needed_roles(plans: Sequence[RunPlan]) -> list[str] | None:
    """The profile's roles these points need together (each plan's ``setup_roles``); None: one needs them all."""
    if not plans or any(p.setup_roles is None for p in plans):
        return None
    return list(dict.fromkeys(r for p in plans for r in p.setup_roles or []))


@one_command()
def wait(run_id: str, timeout: float = 3600, *, store: Store | None = None) -> RunRecord:
    """The run's record once it ended (or when ``timeout`` passed)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import runner

    return runner.wait(run_id, timeout, store=store)


@one_command()
def stop(run_id: str, *, store: Store | None = None) -> RunRecord:
    """Stop an active run: every rank's process group TERM then KILL; its record."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.run import runner

    return runner.stop_run(run_id, store=store)


@one_command()
def collect(run_ids: list[str] | None, to: str | Path = RESULTS, *, all_runs: bool = False,
            store: Store | None = None, progress: Callable[[str, int, int], None] | None = None
            ) -> list[CollectResult]:
    """Fetch runs' outputs into ``to/<suite>/<run id>/`` with checksums and a manifest."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.collect import collect_runs

    return collect_runs(run_ids, Path(to), all_runs=all_runs, progress=progress, store=store)


@one_command()
def report(target: str | Path, fmt: str = "md", *, campaign: str | None = None) -> ReportResult | IndexResult:
    """Reports of a results path: a run folder, a suite folder or ``results/`` (an index of everything)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.report.folders import report_path

    return report_path(Path(target), fmt, campaign)


def _require_record(tb: Resolved) -> None:
    if tb.record is None:
        raise UsageError(f"testbed '{tb.name}' is not provisioned here", where="state",
                         fix=provision_fix(tb.name))
