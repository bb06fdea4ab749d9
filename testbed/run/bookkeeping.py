"""Runs in the state store, seen from the run stage: plan files, new run records, run lookups and events.

The SQL lives in ``testbed.state.Store`` (runs, run_hosts and events rows); this module adds the run home on the
controller (``plan.json``, the supervisor's log) and what the runner and supervisor say in one call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from testbed import paths
from testbed.errors import UsageError
from testbed.records import ACTIVE, ENDED, OUTCOMES, RankRecord, RunEvent, RunInfo, RunPlan, RunRecord
from testbed.state import Store

__all__ = ["ACTIVE", "ENDED", "OUTCOMES", "create", "describe_exit", "event", "events", "get", "load_plan",
           "pid_alive", "ranks", "require", "run_home", "save_plan"]


def run_home(run_id: str) -> Path:
    """Controller-side files of a run: plan.json, supervisor.log, step logs."""
    p = paths.home() / "runs" / run_id
    p.mkdir(parents=True, exist_ok=True)
    return p


def save_plan(plan: RunPlan) -> Path:
    import json

    p = run_home(plan.run_id) / "plan.json"
    p.write_text(json.dumps(plan.to_json(), indent=1))
    return p


def load_plan(run_id: str) -> RunPlan:
    p = paths.home() / "runs" / run_id / "plan.json"
    if not p.exists():
        raise UsageError(f"run '{run_id}' has no plan file", where=str(p), fix="it was made by another state home?")
    return RunPlan.load(p)


def create(st: Store, plan: RunPlan, campaign: str | None = None) -> None:
    """Record the run of ``plan`` (pending, every rank pending) and write its plan file."""
    info = RunInfo(outputs=plan.outputs, run_dir=plan.run_dir, hosts=plan.host_names,
                   faults=[f.name for f in plan.faults], world_size=len(plan.ranks), plan=str(save_plan(plan)),
                   attempt=0, fired=[], recovered=[], sources=plan.source_info)
    if plan.suite_sha256:
        info.suite_file, info.suite_sha256 = plan.suite_file, plan.suite_sha256
        info.suite_files = dict(plan.suite_files)
        info.report_sha256 = plan.report_sha256
        info.suite_git = dict(plan.suite_git) if plan.suite_git else None
    if plan.hardware:
        info.hardware = dict(plan.hardware)
    if plan.shared_home:
        info.shared_home = True
    if plan.profile:
        info.profile = plan.profile
    if plan.rehearsal is not None:
        info.rehearsal = plan.rehearsal
    env = next((r.environment for r in plan.ranks if r.environment), None)
    if env:
        info.python = env.rstrip("/") + "/bin/python"  # the manifest's pip freeze is of the run's environment
    run = RunRecord(id=plan.run_id, suite=plan.suite, testbed=plan.testbed, params=plan.params, status="pending",
                    campaign=campaign, created=time.time(), info=info)
    st.add_run(run, [(r.host, r.rank) for r in plan.ranks])


def get(st: Store, run_id: str) -> RunRecord | None:
    return st.run(run_id)


def require(st: Store, run_id: str) -> RunRecord:
    """The run, or a UsageError naming the closest recorded id."""
    r = st.run(run_id)
    if r is None:
        import difflib

        close = difflib.get_close_matches(run_id, st.run_ids(newest_first=True, limit=200), n=1, cutoff=0.4)
        raise UsageError(f"no run '{run_id}'", where="state",
                         fix=(f"did you mean '{close[0]}'? " if close else "") + "see: testbed list runs")
    return r


def ranks(st: Store, run_id: str) -> list[RankRecord]:
    return st.run_ranks(run_id)


def event(st: Store, run_id: str, kind: str, host: str | None = None, ts: float | None = None,
          info: dict[str, Any] | None = None, **more: object) -> None:
    """One events row; ``info`` and ``more`` form its detail JSON."""
    st.add_event(run_id, kind, host, ts or time.time(), {**(info or {}), **more})


def events(st: Store, run_id: str, after: int = 0) -> list[RunEvent]:
    return st.events(run_id, after)


def pid_alive(pid: int | None, token: str) -> bool:
    """Whether ``pid`` is alive and its command line mentions ``token`` (a run or campaign id)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ProcessLookupError):
        return False
    return token.encode() in cmd and stat.split(")")[-1].split()[0] != "Z"


def describe_exit(code: int) -> str:
    """``exit 3`` or ``signal 9 (SIGKILL)`` from a shell's exit status."""
    import signal

    if code > 128 and code - 128 < 65:
        try:
            return f"signal {code - 128} ({signal.Signals(code - 128).name})"
        except ValueError:
            return f"signal {code - 128}"
    if code == 96:
        return "exit 96 (the suite's environment does not exist on the host: apply its profile first)"
    if code == 97:
        return "exit 97 (the run folder or the step's working folder is missing on the host)"
    return f"exit {code}"


def campaign_id(suite: str, testbed: str, points: list[dict[str, Any]], faults: list[str] | None) -> str:
    """The id of a campaign: the suite and a digest of what it runs (same points, same id: a rerun resumes)."""
    import hashlib
    import json

    key = json.dumps([suite, testbed, points, faults], sort_keys=True, default=str)
    return f"{suite}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
