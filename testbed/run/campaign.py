"""Campaigns: a suite's matrix expanded into runs, dispatched across the testbed's hosts as they free up.

A campaign ends ``succeeded`` when every run succeeded and ``failed`` otherwise; ``testbed run --matrix`` (and
its detached driver) then exits 1.

Progress lives in the ``campaigns`` table (each point: its parameters, run id and status), written before each
run starts, so a campaign that was interrupted resumes where it stopped: finished runs are not repeated and
runs still going are waited for, not restarted. The campaign id is derived from the suite, testbed, points and
faults, so running the same ``testbed run SUITE --matrix`` again resumes it.

A budget (``--budget 40h``, ``500 SU``, ``$120``; kept in the campaign's info for the session that gave it) stops
launching points once the next one's estimate (:class:`testbed.run.forecast.Estimator`) would take the campaign's
spending past it. Spending is the testbed time its runs actually took (:func:`testbed.run.forecast.spent_seconds`,
every session counted), at the price table's rate for SUs and dollars. The campaign then waits for its started runs
and ends ``paused`` (``info.stopped`` says what was spent and what is left); running it again resumes it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed import estimate as est
from testbed import sources as sources_mod
from testbed.errors import UsageError
from testbed.exitcodes import Exit
from testbed.paths import one_command
from testbed.records import ACTIVE, CampaignInfo, CampaignPoint, CampaignRecord
from testbed.run import bookkeeping as rs
from testbed.run import forecast, runner
from testbed.run.plan import run_dir
from testbed.state import Store
from testbed.suite import load_suite, point_reads
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.suite import Suite

DONE = rs.ENDED


def create_or_resume(suite: str, testbed: str, points: list[dict[str, Any]], faults: list[str] | None,
                     sources: dict[str, str] | None = None, *, store: Store | None = None,
                     budget: est.Budget | None = None, suite_file: str | None = None) -> str:
    """The campaign for these points: a new one, or the unfinished one with the same id (resumed).

    ``sources``: --source overrides, applied to every run (a different override is a different campaign).
    ``budget``: this session's limit (None: none; a resumed campaign's earlier budget is not kept).
    ``suite_file``: the suite's file where its name does not find it (a suite folder named by its path): the
    campaign, driven later or in a process of its own, loads the suite from there.
    """
    cid = rs.campaign_id(suite, testbed, points, faults) if not sources else \
        rs.campaign_id(suite, testbed, [*points, {"__sources__": sources}], faults)
    st = store or Store.open_default()
    row = st.campaign(cid)
    if row is None:
        st.add_campaign(CampaignRecord(id=cid, suite=suite, testbed=testbed,
                                       points=[CampaignPoint(params=p) for p in points], status="running",
                                       created=time.time(), info=CampaignInfo(
                                           faults=faults, sources=sources or {}, suite_file=suite_file,
                                           budget=budget.to_json() if budget else None)))
        return cid
    if row.status != "running":
        st.save_campaign(cid, row.points, "running")
    st.set_campaign_info(cid, row.info.model_copy(update={"budget": budget.to_json() if budget else None,
                                                          "stopped": None, "suite_file": suite_file}))
    return cid


class Limit:
    """A campaign's budget as testbed seconds, with the estimates that decide whether the next point fits."""

    def __init__(self, suite: str | Suite, testbed: str, points: list[dict[str, Any]], budget: est.Budget,
                 st: Store, cid: str = "") -> None:
        """Refuses (UsageError, before any host) a budget in a unit the testbed is not priced in, and a point
        with no estimate."""
        self.budget, self.cid, self.st = budget, cid, st
        self.suite = load_suite(suite) if isinstance(suite, str) else suite
        self.rate = forecast.testbed_rate(testbed, len(st.hosts(testbed)), st)[1]
        self.seconds = est.budget_hours(budget, self.rate) * 3600
        estimator = forecast.Estimator(self.suite, testbed, st)
        self.estimates: list[float] = []
        for p in points:
            secs, _ = estimator(p)
            if secs is None:
                raise UsageError(f"--budget needs an estimate for every point; {self.suite.name} has none for "
                                 + ", ".join(f"{k}={v}" for k, v in p.items()),
                                 where=self.suite.source or self.suite.name,
                                 fix="add 'estimate:' to the suite (e.g. estimate: 10m), or run the point once "
                                     "without --budget: later estimates use its recorded time")
            self.estimates.append(secs)

    @classmethod
    def of(cls, row: CampaignRecord, st: Store) -> Limit | None:
        """The limit of the campaign's current session (None: no budget)."""
        b = row.info.budget
        if not b:
            return None
        return cls(row.info.suite_file or row.suite, row.testbed, [p.params for p in row.points],
                   est.Budget(float(b["amount"]), str(b["unit"]), str(b["given"])), st, row.id)

    def spent(self, now: float | None = None) -> float:
        return forecast.spent_seconds(self.st, self.cid, now)

    def allows(self, i: int, points: list[CampaignPoint]) -> bool:
        """Whether point ``i`` may start now: the time spent, plus what the runs going and this one still need
        (at their estimates), stays within the budget."""
        now = time.time()
        going = 0.0
        for j, p in enumerate(points):
            if p.run_id and p.status not in DONE:
                run = self.st.run(p.run_id)
                if run is not None:
                    going = max(going, self.estimates[j] - (now - run.created))
        return self.spent(now) + max(going, self.estimates[i]) <= self.seconds

    def summary(self, points: list[CampaignPoint], stopped_at: int | None) -> dict[str, Any]:
        """What was spent (actual run times), the limit, what is left, and the points not started."""
        spent = self.spent()
        unit = self.budget.unit
        amount = (lambda secs: round(secs / 3600, 4)) if unit == "hours" else \
            (lambda secs: self.rate.cost(secs))
        return {"budget": self.budget.to_json(), "unit": unit, "spent": amount(spent),
                "left": amount(max(self.seconds - spent, 0.0)), "spent_seconds": round(spent, 1),
                "limit_seconds": round(self.seconds, 1), "not_started": sum(p.status == "todo" for p in points),
                "next_estimate_seconds": None if stopped_at is None else round(self.estimates[stopped_at], 1)}


def drive(cid: str, progress: Callable[[str], None] = lambda s: None, poll: float = 1.0,
          timeout: float = 7 * 24 * 3600, *, store: Store | None = None) -> CampaignRecord:
    """Dispatch the campaign's remaining points as hosts free up; wait for all; returns the campaign row."""
    st = store or Store.open_default()
    row = st.campaign(cid)
    if row is None:
        raise UsageError(f"no campaign '{cid}'", where="state", fix="testbed run SUITE --matrix")
    points, suite, testbed = row.points, row.suite, row.testbed
    faults = row.info.faults
    limit = Limit.of(row, st)
    stopped_at: int | None = None
    # resolved once: every run of the campaign gets the same snapshot (and a URL is asked once, not per point)
    s = load_suite(row.info.suite_file or suite)  # its file where its name does not find it
    overrides = sources_mod.for_suite(s, testbed, row.info.sources or None)
    all_hosts = [h.name for h in st.hosts(testbed)]
    needs = []
    for p in points:  # every point checked up front (bad templates, too few hosts) before anything starts
        needs.append(len(runner.plan_run(s, testbed, p.params, faults=faults, overrides=overrides,
                                         store=st, reads={}).hosts))
    reads = point_reads(s, [p.params for p in points])
    skipped = sum(1 for p in points if p.status in DONE)
    if skipped:
        progress(f"campaign {cid}: resuming; {skipped}/{plural(len(points), 'run')} already finished (not repeated)")
    deadline = time.monotonic() + timeout
    while True:
        busy, changed = _refresh(points, st, progress)
        for i, p in enumerate(points):
            if p.status != "todo" or stopped_at is not None:
                continue
            read = _read(points, reads[i], st)
            if read is None:
                break  # keep the matrix order: wait for the points it reads
            if read.failed:
                p.status, changed = "failed", True
                progress(f"campaign {cid}: point {_label(p)} not run: the point it reads ({read.failed}) did not "
                         "succeed")
                continue
            free = read.where([h for h in all_hosts if h not in busy], needs[i])
            if free is None:
                break  # keep the matrix order: wait for hosts (those of the point it reads, where it runs there)
            if limit is not None and not limit.allows(i, points):  # judged when it could start, not before
                stopped_at = i
                progress(f"campaign {cid}: budget {limit.budget.given} reached; no new point is started "
                         f"(the next, {', '.join(f'{k}={v}' for k, v in p.params.items())}, is estimated at "
                         f"{limit.estimates[i]:.0f} s)")
                break
            plan = runner.plan_run(s, testbed, p.params, faults=faults, only_hosts=free, overrides=overrides,
                                   store=st, reads=read.folders)
            p.run_id, p.status = plan.run_id, "pending"
            st.save_campaign(cid, points)
            runner.start_run(plan, campaign=cid, store=st)
            busy |= set(plan.host_names)
            progress(f"{plan.run_id}: started on {', '.join(plan.host_names)} ({_label(p)})"
                     + "".join(f"; reads {n}: {d}" for n, d in read.folders.items()))
            changed = True
        if changed:
            st.save_campaign(cid, points)
        if all(p.status in DONE for p in points):
            st.save_campaign(cid, points, outcome(points))
            return st.campaign(cid) or row
        if limit is not None and stopped_at is not None and all(p.status in DONE or p.status == "todo"
                                                                for p in points):
            st.save_campaign(cid, points, "paused")
            st.set_campaign_info(cid, row.info.model_copy(update={"stopped": limit.summary(points, stopped_at)}))
            return st.campaign(cid) or row
        if time.monotonic() > deadline:
            return st.campaign(cid) or row
        time.sleep(poll)


def _refresh(points: list[CampaignPoint], st: Store, progress: Callable[[str], None]) -> tuple[set[str], bool]:
    """Each started point's status from its run (a run never started is todo again): the hosts busy, and whether
    a point changed."""
    busy: set[str] = set()
    changed = False
    for p in points:
        if p.run_id and p.status not in DONE:
            run = st.run(p.run_id)
            if run is None:  # interrupted between recording the id and starting the run
                p.run_id, p.status = None, "todo"
                changed = True
                continue
            if run.status in ACTIVE:
                runner.ensure_supervisor(st, p.run_id)
                busy |= set(run.info.hosts)
            if run.status != p.status:
                p.status = run.status
                changed = True
                if run.status in DONE:
                    progress(f"{p.run_id}: {run.status}" + (f" ({run.reason})" if run.reason else ""))
    return busy, changed


def _label(p: CampaignPoint) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.params.items())


@dataclass
class _Reads:
    """What a point reads, once every point it reads ended: their run folders by ``after:`` name, the hosts of
    the first (where it runs), and the first that did not succeed (its label)."""

    folders: dict[str, str] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    failed: str | None = None

    def where(self, free: list[str], need: int) -> list[str] | None:
        """The hosts the point may start on now: the free ones; where it reads a point that ran on enough hosts,
        those (all free). None: not enough yet."""
        if self.hosts and len(self.hosts) >= need:
            free = [h for h in free if h in self.hosts]
            return free if len(free) == len(self.hosts) else None
        return free if len(free) >= need else None


def _read(points: list[CampaignPoint], reads: dict[str, int | None], st: Store) -> _Reads | None:
    """The folders a point reads (``reads``: ``after:`` name -> index of the point read); None while one of those
    points has not ended."""
    out = _Reads()
    for name, j in reads.items():
        q = points[j] if j is not None else None
        if q is None:
            continue
        if q.status not in DONE:
            return None
        if q.status != "succeeded" or not q.run_id:
            out.failed = out.failed or _label(q)
            continue
        out.folders[name] = run_dir(q.run_id)
        run = st.run(q.run_id)
        if not out.hosts and run is not None:
            out.hosts = list(run.info.hosts)
    return out


def outcome(points: list[CampaignPoint]) -> str:
    """A finished campaign's status: succeeded when every run did, else failed (a run failed, timed out or was
    stopped)."""
    return "succeeded" if all(p.status == "succeeded" for p in points) else "failed"


def main(argv: list[str]) -> int:
    """``python -m testbed.run.campaign CID``: drive a campaign detached (``testbed run --matrix --detach``)."""
    with one_command():
        row = drive(argv[0], progress=lambda s: print(s, flush=True))
    if row.status == "paused":
        return Exit.STOPPED
    return 0 if all(p.status == "succeeded" for p in row.points) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
