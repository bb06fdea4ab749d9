"""Runs: suite -> plan -> a detached supervisor on the controller -> ranks detached on the hosts.

``start_run`` records the run and starts its supervisor (``testbed.run.supervisor``) in its own session, so
the run goes on when the CLI exits or is killed; ``follow`` prints its events until it ends (Ctrl-C only
detaches). ``status_command``, ``logs_command`` and ``stop_run`` reattach through state and the run dirs on
the hosts (``~/.testbed-runs/<run-id>/``); a supervisor that died is restarted and resumes monitoring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.errors import TestbedError, UsageError
from testbed.run import state as rs
from testbed.run.models import Plan, RankRecord, RunEvent, RunInfo, RunRecord, SupervisorInfo
from testbed.run.plan import RUNS_ROOT, build_plan, dry_run_lines, testbed_info  # noqa: F401 (re-exported)
from testbed.spec import DEFAULT_TESTBED
from testbed.state import Store
from testbed.suite import Suite, load_suite, resolve_params

if TYPE_CHECKING:
    from testbed.sources import Override

__all__ = ["RUNS_ROOT", "follow", "logs_command", "plan_run", "start_run", "status_command", "stop_run",
           "wait"]


def plan_run(suite: Suite | str, testbed: str | None, params: dict[str, Any], *, faults: list[str] | None = None,
             dry_run: bool = False, only_hosts: list[str] | None = None, run_id: str | None = None,
             sources: dict[str, str] | None = None, overrides: dict[str, Override] | None = None) -> Plan:
    """Check the suite against the testbed and render the whole run (nothing touches a host).

    ``sources``: --source overrides (name -> PATH|URL[@REF]), resolved with the testbed spec's ``sources:``;
    ``overrides``: ones already resolved (a campaign resolves once for all its runs).
    """
    s = load_suite(suite) if isinstance(suite, str) else suite
    tb_name = testbed or s.testbed or (DEFAULT_TESTBED if not dry_run else None)
    tb = testbed_info(tb_name, dry_run=dry_run, min_hosts=s.requires.hosts)
    if not dry_run:
        req = s.requires
        if req.providers and tb.provider not in req.providers:
            raise UsageError(f"suite '{s.name}' runs on {', '.join(req.providers)} testbeds; '{tb.name}' is "
                             f"{tb.provider}", where=f"--on {tb.name}",
                             fix="pick a matching testbed, or use --dry-run to see the commands")
        accel = {h.facts.get("accelerator") for h in tb.hosts} - {None}
        if req.accelerator and accel and req.accelerator not in accel:
            raise UsageError(f"suite '{s.name}' needs {req.accelerator} hosts; '{tb.name}' has "
                             f"{', '.join(sorted(map(str, accel)))}", where=f"--on {tb.name}",
                             fix="use a testbed with that accelerator, or --dry-run")
    if overrides is None:
        from testbed import sources as sources_mod

        overrides = sources_mod.for_suite(s, tb_name, sources)
    return build_plan(s, tb, resolve_params(s, params), run_id=run_id, faults=faults, only_hosts=only_hosts,
                      overrides=overrides)


def start_supervisor(run_id: str) -> int:
    """Start the run's supervisor detached (own session, no terminal); returns its pid."""
    logf = open(rs.run_home(run_id) / "supervisor.out", "ab")  # noqa: SIM115
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pkg_parent, os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    p = subprocess.Popen([sys.executable, "-m", "testbed.run.supervisor", run_id], stdin=subprocess.DEVNULL,
                         stdout=logf, stderr=logf, start_new_session=True, close_fds=True, env=env,
                         cwd=os.getcwd())
    logf.close()
    st = Store.open_default()
    st.update_run(run_id, info=RunInfo(supervisor=SupervisorInfo(pid=p.pid, started=time.time())))
    st.close()
    return p.pid


def start_run(plan: Plan, campaign: str | None = None) -> str:
    """Record the run (pending) and start its supervisor; returns the run id."""
    st = Store.open_default()
    rs.create(st, plan, campaign)
    st.close()
    start_supervisor(plan.run_id)
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
    start_supervisor(run_id)
    return True


def wait(run_id: str, timeout: float = 3600, interval: float = 0.5) -> RunRecord:
    """Block until the run ends (supervisors restarted as needed); returns the run row."""
    st = Store.open_default()
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
def _ts(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 10)}" if t else ""


def describe_event(ev: RunEvent) -> str:
    d, k = ev.detail, ev.kind
    host = f" {ev.host}" if ev.host else ""
    if k == "started":
        return f"started {d.get('ranks')} ranks on {', '.join(d.get('hosts', []))}"
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
        return f"recovery after '{d.get('fault')}' (attempt {d.get('attempt')}): {', '.join(d.get('steps', []))}"
    if k == "relaunched":
        return f"relaunched ranks {d.get('ranks')} (attempt {d.get('attempt')})"
    if k == "ended":
        return f"ended: {d.get('status')}" + (f" ({d['reason']})" if d.get("reason") else "")
    if k == "stopping":
        return f"stopping ranks {d.get('ranks')} {d.get('reason', '')}"
    return f"{k}{host} {json.dumps(d)}"


def follow(run_id: str, console: Any = None, timeout: float = 24 * 3600) -> RunRecord:
    """Print the run's events until it ends; Ctrl-C detaches (the run goes on). Returns the run row."""
    from rich.console import Console
    from rich.markup import escape

    c = console or Console(stderr=True, highlight=False)
    st = Store.open_default()
    seq = 0
    deadline = time.monotonic() + timeout
    try:
        while True:
            for ev in rs.events(st, run_id, seq):
                seq = ev.seq
                c.print(f"[dim]{_ts(ev.ts)}[/dim] {escape(describe_event(ev))}")
            run = rs.require(st, run_id)
            if not run.active:
                for ev in rs.events(st, run_id, seq):
                    seq = ev.seq
                    c.print(f"[dim]{_ts(ev.ts)}[/dim] {escape(describe_event(ev))}")
                return run
            if time.monotonic() > deadline:
                return run
            ensure_supervisor(st, run_id)
            time.sleep(0.5)
    except KeyboardInterrupt:
        c.print(f"[yellow]detached[/yellow]: run {run_id} goes on. Reattach: testbed status {run_id} | "
                f"testbed logs {run_id} -f | stop: testbed stop {run_id}")
        raise


def _run_json(run: RunRecord, ranks: list[RankRecord], events: list[RunEvent]) -> dict[str, Any]:
    return {**run.to_json(), "ranks": [r.model_dump() for r in ranks],
            "events": [{"ts": e.ts, "kind": e.kind, "host": e.host, **e.detail} for e in events]}


def status_command(run_id: str, *, json_out: bool = False) -> None:
    """``testbed status RUN``: the run, each rank's status and exit, and its fault/recovery events."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    st = Store.open_default()
    restarted = ensure_supervisor(st, run_id)
    run = rs.require(st, run_id)
    ranks, events = st.run_ranks(run_id), st.events(run_id)
    if json_out:
        sys.stdout.write(json.dumps(_run_json(run, ranks, events), indent=2, default=str) + "\n")
        return
    c = Console(highlight=False)
    color = {"succeeded": "green", "failed": "red", "timed-out": "red", "running": "cyan",
             "stopped": "yellow"}.get(run.status, "")
    c.print(f"run [bold]{run_id}[/bold]  suite {run.suite}  testbed {run.testbed}  "
            f"[{color or 'white'}]{run.status}[/{color or 'white'}]"
            + (f": {escape(run.reason)}" if run.reason else ""))
    if run.params:
        c.print("params: " + escape(", ".join(f"{k}={v}" for k, v in run.params.items())))
    if run.started:
        end = run.ended or time.time()
        c.print(f"started {_ts(run.started)}, {'ended ' + _ts(run.ended) if run.ended else 'running'}"
                f" ({end - run.started:.1f} s)")
    t = Table(title_justify="left")
    for col in ("rank", "host", "status", "exit", "reason"):
        t.add_column(col)
    for r in ranks:
        t.add_row(str(r.rank), r.host, r.status, "" if r.exit_code is None else str(r.exit_code),
                  escape(r.reason or ""))
    c.print(t)
    for e in events:
        if e.kind in ("fault", "fault-missed", "failed", "recovery", "relaunched", "restore", "stopping"):
            c.print(f"[dim]{_ts(e.ts)}[/dim] {escape(describe_event(e))}")
    if restarted:
        c.print("[yellow]its supervisor had stopped; restarted it (monitoring resumes)[/yellow]")
    c.print(f"run dir on each host: {run.info.run_dir}")


def stop_run(run_id: str, grace: float = 3) -> RunRecord:
    """Stop an active run: status 'stopped', every rank's process group TERM then KILL."""
    from testbed.run import remote as run_remote

    st = Store.open_default()
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


def logs_command(run_id: str, *, host: str | None = None, follow_logs: bool = False,
                 rank: int | None = None) -> None:
    """Print each rank's stdout/stderr from the hosts; ``follow_logs`` streams until the run ends."""
    from testbed import remote
    from testbed.run import remote as run_remote

    st = Store.open_default()
    run = rs.require(st, run_id)
    plan = rs.load_plan(run_id)
    ranks = [r for r in plan.ranks if (host is None or r.host == host) and (rank is None or r.rank == rank)]
    if not ranks:
        raise UsageError(f"run {run_id} has no rank on '{host}'", where="--host",
                         fix=f"hosts: {', '.join(sorted({r.host for r in plan.ranks}))}")
    if not follow_logs:
        for r in ranks:
            res = remote.run(plan.testbed, [r.host], run_remote.sh(
                f"{run_remote.cd_run(plan.run_dir)} && cat rank{r.rank}.out; "
                f"cat rank{r.rank}.err >&2"), timeout=30)[0]
            if res.error:
                sys.stderr.write(f"[{r.host} rank {r.rank}] {res.error}\n")
                continue
            for stream, text in ((sys.stdout, res.stdout), (sys.stderr, res.stderr)):
                for ln in text.splitlines():
                    stream.write(f"[{r.host}:{r.rank}] {ln}\n")
        return
    offsets = {(r.rank, s): 0 for r in ranks for s in ("out", "err")}
    try:
        while True:
            ensure_supervisor(st, run_id)
            active = rs.require(st, run_id).active
            for r in ranks:
                k = r.rank
                o, e = offsets[(k, "out")], offsets[(k, "err")]
                res = remote.run(plan.testbed, [r.host], run_remote.sh(
                    f"{run_remote.cd_run(plan.run_dir)} 2>/dev/null || exit 0; "
                    f"tail -c +{o + 1} rank{k}.out 2>/dev/null; tail -c +{e + 1} rank{k}.err 2>/dev/null >&2"),
                    timeout=20)[0]
                if res.error:
                    continue
                for s, text, stream in (("out", res.stdout, sys.stdout), ("err", res.stderr, sys.stderr)):
                    complete = text[: text.rfind("\n") + 1] if active else text
                    offsets[(k, s)] += len(complete.encode())
                    for ln in complete.splitlines():
                        stream.write(f"[{r.host}:{k}] {ln}\n")
                    stream.flush()
            if not active:
                run = rs.require(st, run_id)
                sys.stderr.write(f"run {run_id} {run.status}" + (f": {run.reason}" if run.reason else "") + "\n")
                return
            time.sleep(1)
    except KeyboardInterrupt:
        sys.stderr.write(f"detached from the logs; run {run_id} goes on\n")
