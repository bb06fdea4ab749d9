"""Runs: suite -> plan -> a detached supervisor on the controller -> ranks detached on the hosts.

``start_run`` records the run and starts its supervisor (``testbed.run.supervisor``) in its own session, so the
run goes on when the CLI exits or is killed. ``watch``, ``run_status``, ``logs`` and ``stop_run`` reattach
through state and the run dirs on the hosts (``~/.testbed-runs/<run-id>/``); a supervisor that died is
restarted and resumes monitoring. They return data; the CLI renders it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import deadman, remote, scripts, suite_fetch
from testbed import rx as rx_mod
from testbed import sources as sources_mod
from testbed.errors import TestbedError, UsageError, by_door
from testbed.records import RankRecord, RunEvent, RunInfo, RunPlan, RunRecord, SupervisorInfo
from testbed.run import bookkeeping as rs
from testbed.run import ranks as run_remote
from testbed.run.plan import (  # noqa: F401 (re-exported)
    RUNS_ROOT,
    build_plan,
    chosen_faults,
    dry_run_lines,
    fault_refusals,
    gpu_refusal,
    testbed_info,
)
from testbed.spec import DEFAULT_TESTBED
from testbed.state import Store
from testbed.suite import Suite, load_suite, point_label, reads_of, resolve_params
from testbed.textfmt import clock as iso_clock
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.records import Override
    from testbed.run.plan import TestbedInfo

__all__ = ["RUNS_ROOT", "LogLine", "RankLine", "RunStatus", "logs", "plan_run", "rank_lines", "run_status",
           "start_run", "stop_run", "wait", "watch"]


def plan_run(suite: Suite | str, testbed: str | None, params: dict[str, Any], *, faults: list[str] | None = None,
             dry_run: bool = False, only_hosts: list[str] | None = None, run_id: str | None = None,
             sources: dict[str, str] | None = None, overrides: dict[str, Override] | None = None,
             store: Store | None = None, reads: dict[str, str] | None = None) -> RunPlan:
    """Check the suite against the testbed and render the whole run (nothing touches a host).

    ``sources``: --source overrides (name -> PATH|URL[@REF]), resolved with the testbed spec's ``sources:``;
    ``overrides``: ones already resolved (a campaign resolves once for all its runs); ``reads``: the run folder of
    each point this one reads (``after:``; a campaign gives them; None: placeholders, for a dry run only).
    """
    s = load_suite(suite) if isinstance(suite, str) else suite
    if reads is None and not dry_run:
        _refuse_lone_reader(s, resolve_params(s, params))
    tb_name = testbed or s.testbed or (DEFAULT_TESTBED if not dry_run else None)
    if not dry_run:  # a testbed the suite cannot run on is refused before anything else is asked of it (renting)
        refuse_before_renting(s, tb_name, store=store, points=[resolve_params(s, params)], faults=faults)
    tb = testbed_info(tb_name, dry_run=dry_run, min_hosts=s.requires.hosts, store=store)
    refused = refusals(s, tb, [resolve_params(s, params)], faults)
    if refused and not dry_run:
        first = refused[0]
        raise UsageError(first.what, where=first.where,
                         fix=by_door(f"{first.fix}, or use --dry-run to see the commands", str(first.fix)))
    if overrides is None:
        overrides = sources_mod.for_suite(s, tb_name, sources)
    plan = build_plan(s, tb, resolve_params(s, params), run_id=run_id, faults=faults, only_hosts=only_hosts,
                      overrides=overrides, reads=reads)
    plan.refused = [{"what": e.what, "where": e.where, "fix": e.fix} for e in refused]
    if s.source and Path(s.source).is_file() and not dry_run:  # what a collected run's manifest records
        plan.suite_file, plan.suite_sha256 = str(Path(s.source).resolve()), file_sha256(Path(s.source))
        plan.suite_files = {rel: file_sha256(s.dir / rel) for rel in s.files}  # build_plan found each one
        report = Path(s.source).parent / "report.py"
        plan.report_sha256 = file_sha256(report) if report.is_file() else None  # what testbed report may run
        plan.suite_git = suite_fetch.git_origin(Path(s.source))  # fetched from git: the URL and commit
    gpu = tb.context.get("hardware") or {}
    plan.shared_home = bool(gpu.get("shared_home"))
    if gpu.get("gpu_model"):
        plan.hardware = {"gpu_model": gpu["gpu_model"], "gpus": gpu.get("gpus")}
    return plan


def _refuse_lone_reader(s: Suite, params: dict[str, Any]) -> None:
    """A point that reads another point's output (``after:``) runs in its campaign, after that point."""
    read = reads_of(s, params)
    if read:
        name, point = next(iter(read.items()))
        e = next(i for i, a in enumerate(s.after) if a.name == name)
        raise UsageError(f"point {point_label(s, params)} of suite '{s.name}' reads the output of point "
                         f"{point_label(s, point)} (after: {name}): it runs in the suite's campaign, after that point",
                         where=s.at("after", e), fix=f"testbed run {s.name} --matrix (it orders the points)")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (a suite's YAML: what `testbed reproduce` checks is unchanged)."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def refuse_before_renting(s: Suite, testbed: str | None, *, store: Store | None = None,
                          fix: str = "", where: str | None = None, points: list[dict[str, Any]] | None = None,
                          faults: list[str] | None = None) -> None:
    """Raise the first reason the suite's ``requires`` refuses ``testbed`` as its spec describes it (its provider
    kind, its GPUs, the faults of ``points``), provisioned or not: checked before a lease, a plan's price or a run,
    so that nothing is rented for a suite that cannot run there. Nothing when the testbed has no spec or record to
    judge by (said elsewhere)."""
    try:
        tb = testbed_info(testbed, dry_run=True, min_hosts=s.requires.hosts, store=store)
    except TestbedError:
        return
    refused = refusals(s, tb, points, faults)
    if refused:
        first = refused[0]
        raise UsageError(first.what, where=where or first.where, fix=(first.fix or "") + (f"; {fix}" if fix else ""))


def refusals(s: Suite, tb: TestbedInfo, points: list[dict[str, Any]] | None = None,
             faults: list[str] | None = None) -> list[UsageError]:
    """Why the suite refuses this testbed: its ``requires`` (provider, the hosts' accelerator), ranks that need a
    GPU on a spec that declares none, and a fault of a point (``points``: resolved parameters, default the default
    point; ``faults``: as --fault) whose kind needs a capability the provider lacks. What a real run raises before
    anything is rented, and a dry run shows after its commands. None for a dry run with no testbed at all."""
    out = _requires_refusals(s, tb)
    pts = points if points is not None else [resolve_params(s, {})]
    gpu = gpu_refusal(s, tb, pts)
    out += [gpu] if gpu is not None else []
    chosen = [f for p in pts for f in chosen_faults(s, p, faults)]
    return out + fault_refusals(s, tb, chosen)


def testbed_refusals(s: Suite, testbed: str, *, store: Store | None = None
                     ) -> tuple[list[UsageError], list[UsageError]]:
    """What ``testbed show SUITE --on TESTBED`` says: (why a default run of the suite there is refused, every other
    fault of the suite that could not fire there); nothing for a testbed with no spec or record to judge by."""
    try:
        tb = testbed_info(testbed, dry_run=True, min_hosts=s.requires.hosts, store=store)
    except TestbedError:
        return [], []
    refused = refusals(s, tb)
    seen = {e.what for e in refused}
    return refused, [e for e in fault_refusals(s, tb, list(s.faults)) if e.what not in seen]


def _requires_refusals(s: Suite, tb: TestbedInfo) -> list[UsageError]:
    """Why the suite's ``requires`` refuses this testbed (its provider, its hosts' accelerator)."""
    req, out = s.requires, []
    if req.providers and tb.provider != "none" and tb.provider not in req.providers:
        out.append(UsageError(f"suite '{s.name}' runs on {', '.join(req.providers)} testbeds; '{tb.name}' is "
                              f"{tb.provider}", where=by_door(f"--on {tb.name}", f"testbed {tb.name}"),
                              fix=f"run it on a testbed of {', '.join(req.providers)} "
                                  + by_door("(--on NAME)", "(testbed.open(NAME).run_suite(...))")))
    accel = {h.facts.get("accelerator") for h in tb.hosts} - {None}
    if req.accelerator and accel and req.accelerator not in accel:
        out.append(UsageError(f"suite '{s.name}' needs {req.accelerator} hosts; '{tb.name}' has "
                              f"{', '.join(sorted(map(str, accel)))}", where=by_door(f"--on {tb.name}",
                                                                                      f"testbed {tb.name}"),
                              fix=f"run it on a testbed whose hosts have a {req.accelerator} "
                                  + by_door("(--on NAME)", "(testbed.open(NAME).run_suite(...))")))
    return out


def _store(store: Store | None) -> Store:
    """The caller's store (a command opens one where it starts); else this state home's."""
    return store if store is not None else Store.open_default()


def start_supervisor(run_id: str, store: Store | None = None) -> int:
    """Start the run's supervisor detached (own session, no terminal); returns its pid."""
    logf = open(rs.run_home(run_id) / "supervisor.out", "ab")  # noqa: SIM115
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    p = subprocess.Popen([sys.executable, "-m", "testbed.run.supervisor", run_id], stdin=subprocess.DEVNULL,
                         stdout=logf, stderr=logf, start_new_session=True, close_fds=True, env=env,
                         cwd=os.getcwd())
    logf.close()
    _store(store).update_run(run_id, info=RunInfo(supervisor=SupervisorInfo(pid=p.pid, started=time.time())))
    return p.pid


def start_run(plan: RunPlan, campaign: str | None = None, *, store: Store | None = None) -> str:
    """Record the run (pending) and start its supervisor; returns the run id."""
    st = _store(store)
    rs.create(st, plan, campaign)
    deadman.refresh(st, plan.testbed)  # a run: the expiry's idle clock restarts (the hosts' agents see the run)
    start_supervisor(plan.run_id, st)
    return plan.run_id


def ensure_supervisor(st: Store, run_id: str) -> bool:
    """Restart the supervisor of an active run whose supervisor died; True when one was started."""
    run = rs.require(st, run_id)
    if not run.active:
        return False
    sup = run.info.supervisor or SupervisorInfo()
    if rs.pid_alive(sup.pid, run_id):
        return False
    if time.time() - sup.started < 3:
        return False  # just started; its process may not have exec'd yet
    start_supervisor(run_id, st)
    return True


def wait(run_id: str, timeout: float = 3600, interval: float = 0.5, *, store: Store | None = None) -> RunRecord:
    """Block until the run ends (supervisors restarted as needed); returns the run row."""
    st = _store(store)
    deadline = time.monotonic() + timeout
    while True:
        run = rs.require(st, run_id)
        if not run.active:
            return run
        if time.monotonic() > deadline:
            raise TestbedError(f"run {run_id} still {run.status} after {timeout:g} s", where=run_id,
                               fix=f"testbed status {run_id}")
        ensure_supervisor(st, run_id)
        time.sleep(interval)


# --- rendering -----------------------------------------------------------------------------------------------
def clock(t: float | None) -> str:
    """The time of day of a timestamp (events as they stream): ISO 8601 UTC, ``12:00:01.2Z``."""
    return iso_clock(t)


def describe_event(ev: RunEvent) -> str:
    d, k = ev.detail, ev.kind
    host = f" {ev.host}" if ev.host else ""
    if k == "started":
        return f"started {plural(int(d.get('ranks') or 0), 'rank')} on {', '.join(d.get('hosts', []))}"
    if k == "step":
        return f"{d.get('phase')} '{d.get('step')}' on {', '.join(d.get('hosts', []))}: " \
               f"{'ok' if d.get('ok') else 'FAILED'} ({d.get('seconds')} s)"
    if k == "fault":
        what = d.get("signal") or d.get("command") or d.get("action")
        return f"fault '{d.get('fault')}' fired on{host}" + (f" rank {d['rank']}" if d.get("rank") is not None
                                                             else "") + f": {what}" + \
            ("" if d.get("ok", True) else f" (did not work: {d.get('error') or d.get('output', '')})")
    if k == "failed":
        return f"failure: {d.get('reason')}"
    if k == "fault-missed":
        return f"fault '{d.get('fault')}' never fired: {d.get('reason')}"
    if k == "recovery":
        after = f"'{d['fault']}'" if d.get("fault") else "a lost host"
        return f"recovery after {after} (attempt {d.get('attempt')}): {', '.join(d.get('steps', []))}"
    if k == "repairing":
        then = ", then its set-up" if d.get("setup") else ""
        why = d.get("why") or {}
        lost = "; ".join(f"{h}: {why[h]}" for h in d.get("hosts", []) if h in why)
        return f"repairing {', '.join(d.get('hosts', []))} (judged lost{': ' + lost if lost else ''}){then}"
    if k == "host-lost":
        return f"{ev.host} judged lost: {d.get('summary')}"
    if k == "host-slow":
        p = d.get("probe") or {}
        if p.get("ssh") == "refused":
            return f"{ev.host} refuses connections ({p.get('detail') or 'Connection refused'}); {d.get('note')}"
        return f"{ev.host} slow: no answer in {p.get('seconds')} s ({p.get('detail') or 'timed out'}); {d.get('note')}"
    if k == "host-back":
        return f"{ev.host} answers again after {d.get('seconds')} s without an answer: {d.get('summary')}"
    if k == "repaired":
        if not ev.host:
            return f"repair: {d.get('note') or 'nothing to repair'}"
        setup = f", set up again ({d['setup']}) in {d.get('setup_seconds')} s" if d.get("setup") else ""
        return f"repaired{host}: {d.get('how') or 'brought back'} in {d.get('repair_seconds')} s{setup}"
    if k == "resumed":
        ck = d.get("checkpoint")
        frm = (f"from {ck.get('file')} on {ck.get('host')} at step {d.get('resumed_step')}" if ck
               else f"from step {d.get('resumed_step', 0)}" + (f" ({d['why']})" if d.get("why") else ""))
        parts = [f"{name} {d[key]} s" for name, key in (("detected", "detect_seconds"), ("repair", "repair_seconds"),
                                                         ("set-up", "setup_seconds"), ("relaunch", "relaunch_seconds"))
                 if d.get(key) is not None]
        lost = f"; {plural(int(d['steps_lost']), 'step')} redone" if d.get("steps_lost") is not None else ""
        return f"resumed {frm}{lost}; {', '.join(parts)}; down {d.get('downtime_seconds')} s"
    if k == "goodput":
        ratio = f", {d['ratio']:.0%} of a fault-free run ({d.get('fault_free_seconds')} s)" if d.get("ratio") else ""
        return f"goodput: {plural(int(d.get('steps') or 0), 'step')} in {d.get('seconds')} s{ratio}"
    if k == "relaunched":
        return f"relaunched ranks {d.get('ranks')} (attempt {d.get('attempt')})"
    if k == "ended":
        return f"ended: {d.get('status')}" + (f" ({d['reason']})" if d.get("reason") else "")
    if k == "stopping":
        return f"stopping ranks {d.get('ranks')} {d.get('reason', '')}"
    return f"{k}{host} {json.dumps(d)}"


ENDED_SETTLE = 5.0  # seconds a watcher waits, once a run is no longer active, for its "ended" event


def watch(run_id: str, *, store: Store | None = None, timeout: float = 24 * 3600,
          interval: float = 0.5) -> Iterator[RunEvent]:
    """The run's events as they are recorded, until it ends (or ``timeout``); supervisors restarted as needed."""
    st = _store(store)
    seq = 0
    ended = False
    deadline = time.monotonic() + timeout
    while True:
        for ev in rs.events(st, run_id, seq):
            seq, ended = ev.seq, ended or ev.kind == "ended"
            yield ev
        if not rs.require(st, run_id).active:
            # what the run recorded while ending: the supervisor marks the run ended, then records its "ended"
            # event, so a watcher between the two waits a moment for that event (at most ENDED_SETTLE)
            settle = time.monotonic() + ENDED_SETTLE
            while True:
                for ev in rs.events(st, run_id, seq):
                    seq, ended = ev.seq, ended or ev.kind == "ended"
                    yield ev
                if ended or time.monotonic() > settle:
                    return
                time.sleep(0.05)
        if time.monotonic() > deadline:
            return
        ensure_supervisor(st, run_id)
        time.sleep(interval)


def _run_json(run: RunRecord, ranks: list[RankRecord], events: list[RunEvent]) -> dict[str, Any]:
    return {**run.to_json(), "ranks": [r.model_dump() for r in ranks],
            "events": [{"ts": e.ts, "kind": e.kind, "host": e.host, **e.detail} for e in events]}


@dataclass
class RunStatus:
    """A run as ``testbed status RUN`` shows it."""

    run: RunRecord
    ranks: list[RankRecord]
    events: list[RunEvent]
    restarted: bool  # its supervisor had died and was started again

    def to_json(self) -> dict[str, Any]:
        return _run_json(self.run, self.ranks, self.events)


def run_status(run_id: str, *, store: Store | None = None) -> RunStatus:
    """The run, each rank's status and exit, and its events (a dead supervisor is restarted first)."""
    st = _store(store)
    restarted = ensure_supervisor(st, run_id)
    return RunStatus(rs.require(st, run_id), st.run_ranks(run_id), st.events(run_id), restarted)


def stop_run(run_id: str, grace: float = 3, *, store: Store | None = None) -> RunRecord:
    """Stop an active run: status 'stopped', every rank's process group TERM then KILL."""
    st = _store(store)
    run = rs.require(st, run_id)
    if not run.active:
        return run
    st.update_run(run_id, status="stopped", reason="stopped by the user", ended=time.time(), only_active=True)
    plan = rs.load_plan(run_id)
    ranks = run.info.ranks or plan.ranks
    run_remote.signal_ranks(plan, ranks, "TERM")
    time.sleep(grace)
    run_remote.signal_ranks(plan, ranks, "KILL")
    st.end_active_ranks(run_id, "stopped", time.time(), "stopped by the user")
    rs.event(st, run_id, "ended", None, status="stopped", reason="stopped by the user")
    return rs.require(st, run_id)


@dataclass
class LogLine:
    """One line of a rank's output (``stream``: out or err), why it could not be read (``stream`` error), or a
    note on what was left out (``stream`` note: output longer than the transport keeps)."""

    host: str
    rank: int
    stream: str
    text: str


def logs(run_id: str, *, host: str | None = None, rank: int | None = None, follow: bool = False,
         store: Store | None = None) -> Iterator[LogLine]:
    """Each rank's stdout/stderr from the hosts; ``follow`` streams new lines until the run ends."""
    st = _store(store)
    rs.require(st, run_id)
    plan = rs.load_plan(run_id)
    ranks = [r for r in plan.ranks if (host is None or r.host == host) and (rank is None or r.rank == rank)]
    if not ranks:
        import difflib

        names = sorted({r.host for r in plan.ranks})
        close = difflib.get_close_matches(host or "", names, n=1, cutoff=0.5)
        raise UsageError(f"run {run_id} has no rank on '{host}'", where="--host",
                         fix=(f"did you mean '{close[0]}'? " if close else "") + f"hosts: {', '.join(names)}")
    if not follow:
        for r in ranks:
            res = remote.run(plan.testbed, [r.host], remote.sh(
                f"{run_remote.cd_run(plan.run_dir)} && cat rank{r.rank}.out; "
                f"cat rank{r.rank}.err >&2"), timeout=30)[0]
            if res.error:
                yield LogLine(r.host, r.rank, "error", res.error)
                continue
            for stream, text in (("out", res.stdout), ("err", res.stderr)):
                for ln in text.splitlines():
                    yield LogLine(r.host, r.rank, stream, ln)
            if res.truncated:  # only then is the size asked for: the usual call costs no second round trip
                sizes = remote.run(plan.testbed, [r.host], remote.sh(
                    f"{run_remote.cd_run(plan.run_dir)} && wc -c rank{r.rank}.out rank{r.rank}.err"), timeout=30)[0]
                yield from truncation_notes(r.host, r.rank, sizes.stdout, plan.run_dir, run_id, remote.MAX_OUTPUT)
        return
    offsets = {(r.rank, s): 0 for r in ranks for s in ("out", "err")}
    while True:
        ensure_supervisor(st, run_id)
        active = rs.require(st, run_id).active
        for r in ranks:
            k = r.rank
            o, e = offsets[(k, "out")], offsets[(k, "err")]
            res = remote.run(plan.testbed, [r.host], remote.sh(
                f"{run_remote.cd_run(plan.run_dir)} 2>/dev/null || exit 0; "
                f"tail -c +{o + 1} rank{k}.out 2>/dev/null; tail -c +{e + 1} rank{k}.err 2>/dev/null >&2"),
                timeout=20)[0]
            if res.error:
                continue
            for stream, text in (("out", res.stdout), ("err", res.stderr)):
                complete = text[: text.rfind("\n") + 1] if active else text
                offsets[(k, stream)] += len(complete.encode())
                for ln in complete.splitlines():
                    yield LogLine(r.host, k, stream, ln)
        if not active:
            return
        time.sleep(1)


def truncation_notes(host: str, rank: int, wc_out: str, run_dir: str, run_id: str, limit: int) -> Iterator[LogLine]:
    """A ``note`` line for each of the rank's files longer than ``limit`` (``wc -c`` output): what was shown, what
    was skipped, and where the whole file is."""
    for ln in wc_out.splitlines():
        size, _, name = ln.strip().partition(" ")
        if size.isdigit() and int(size) > limit and name.startswith(f"rank{rank}."):
            yield LogLine(host, rank, "note", f"{name} is {int(size):,} bytes: only its last {limit:,} are shown, the "
                          f"first {int(size) - limit:,} skipped; the whole file is {host}:{run_dir}/{name} "
                          f"(testbed collect {run_id} fetches it)")


TAIL_BYTES = 4096  # of each rank's stdout read for the live status line
_MARK = "@@testbed-rank "


@dataclass
class RankLine:
    """What a rank last printed that is worth showing while the run goes on."""

    host: str
    rank: int
    text: str


def last_line(text: str, pattern: str | None) -> str:
    """The last complete line of ``text`` matching ``pattern`` (any non-blank line without one); carriage-return
    progress bars count by their last state."""
    rx = rx_mod.compile(pattern) if pattern else None
    lines = [seg.rsplit("\r", 1)[-1].strip() for seg in text.splitlines()]
    for ln in reversed(lines):
        if ln and (rx is None or rx.search(ln)):
            return ln
    return ""


def parse_tails(stdout: str) -> dict[int, str]:
    """tails.sh's output: rank -> the end of its stdout (the first, possibly cut, line dropped)."""
    out: dict[int, str] = {}
    for chunk in stdout.split("\n" + _MARK)[1:]:
        head, _, body = chunk.partition("\n")
        if head.strip().isdigit():
            lines = body.split("\n")
            out[int(head)] = "\n".join(lines[1:] if len(body.encode()) >= TAIL_BYTES else lines)
    return out


def rank_lines(plan: RunPlan, timeout: float = 10) -> list[RankLine]:
    """Each rank's last line worth showing (the plan's ``progress`` pattern, else its last line): one SSH call per
    host over the open connections; a host that does not answer is left out."""
    by_host: dict[str, list[int]] = {}
    for r in plan.ranks:
        by_host.setdefault(r.host, []).append(r.rank)
    commands = {h: remote.sh(scripts.program("tails.sh", plan.run_dir, TAIL_BYTES, *ks))
                for h, ks in by_host.items()}
    found: list[RankLine] = []
    for res in remote.run_each(plan.testbed, commands, timeout=timeout):
        if res.error or res.exit_code != 0:
            continue
        for k, text in parse_tails(res.stdout).items():
            line = last_line(text, plan.progress)
            if line:
                found.append(RankLine(res.host, k, line))
    return sorted(found, key=lambda r: r.rank)
