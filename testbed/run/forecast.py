"""``testbed plan``: how long a run or a campaign will take on a testbed, what it costs and whether it fits.

Not the commands (``testbed run --dry-run`` renders those, from :mod:`testbed.run.plan`): this stage only
estimates. Per point, its wall time comes from earlier succeeded runs of the same point (same suite, same
parameters) recorded in state, else from the suite's ``estimate:``. State, not the collected manifests: a run's
row holds when it was created (before its sources and prepare steps) and when it ended, for every run of this
state home whether collected or not, while a manifest's ``started`` is the launch of the ranks, after the prepare
steps, and would make a run look shorter than the testbed time it took.

The total is the campaign's wall time as :func:`testbed.run.campaign.drive` dispatches it (matrix order, a point
starting when enough hosts are free); its cost is that time on the whole testbed at the price table's rate
(Chameleon SUs, TPU dollars; local and lab hosts free unless the table prices them). A campaign that already
exists (same suite, testbed, points and faults) counts its finished points as spent, not again.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from testbed import estimate as est
from testbed import expiry, paths
from testbed.errors import TestbedError, UsageError
from testbed.records import ACTIVE, ENDED
from testbed.resolved import Resolved
from testbed.run import bookkeeping as rs
from testbed.run.plan import build_plan, testbed_info
from testbed.run.runner import refusals
from testbed.spec import DEFAULT_TESTBED
from testbed.suite import expand_matrix, load_suite, point_reads, resolve_params
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.state import Store
    from testbed.suite import Suite

HISTORY = 5
"""The newest succeeded runs of a point whose median is its estimate."""


@dataclass
class PointForecast:
    """One point: its parameters, hosts, estimated seconds and where that estimate came from."""

    params: dict[str, Any]
    label: str  # the parameters that tell points apart (the matrix's), k=v
    hosts: int
    seconds: float | None
    source: str
    status: str = "todo"  # todo, running, or the status of its finished run
    run_id: str | None = None
    spent: float | None = None  # seconds its run took (or has taken so far)
    reads: list[str] = field(default_factory=list)  # the points it reads (after:), 'name: N (label)', 1 first


@dataclass
class Forecast:
    """A run or campaign before (or while) it goes: per point, the total, the cost and the fit."""

    suite: str
    testbed: str
    provider: str
    hosts: int
    points: list[PointForecast]
    total_seconds: float | None  # wall time of what is left (None: a point has no estimate)
    spent_seconds: float  # testbed time the campaign's runs already took
    rate: est.Rate
    campaign: str | None = None  # the campaign these points resume, when one exists
    fit: dict[str, Any] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # points with no estimate
    notes: list[str] = field(default_factory=list)  # what the numbers assume

    @property
    def cost(self) -> float | None:
        return None if self.total_seconds is None else self.rate.cost(self.total_seconds)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "testbed": self.testbed, "provider": self.provider, "hosts": self.hosts,
                "campaign": self.campaign, "points": [asdict(p) for p in self.points],
                "total_seconds": _r(self.total_seconds), "spent_seconds": _r(self.spent_seconds),
                "rate": asdict(self.rate), "cost": self.cost, "spent_cost": self.rate.cost(self.spent_seconds),
                "unit": self.rate.unit, "fit": self.fit, "unknown": self.unknown,
                "notes": self.notes}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


# --- estimates per point -----------------------------------------------------------------------------------------
def point_key(suite: Suite, params: dict[str, Any]) -> str:
    """What makes two runs the same point: the parameters, less those left at a template default (rendered per
    testbed, e.g. the hosts' python), as canonical JSON."""
    keep = {k: v for k, v in params.items()
            if not (k in suite.parameters and isinstance(suite.parameters[k].default, str)
                    and "{{" in suite.parameters[k].default)}
    return json.dumps(keep, sort_keys=True, default=str)


def _matches(suite: Suite, point: dict[str, Any], run_params: dict[str, Any]) -> bool:
    want = json.loads(point_key(suite, point))
    return all(json.dumps(run_params.get(k), default=str) == json.dumps(v, default=str) for k, v in want.items())


class Estimator:
    """Seconds per point: the median of the newest earlier succeeded runs of the point (on this testbed first,
    else on any), else the suite's ``estimate:``."""

    def __init__(self, suite: Suite, testbed: str, store: Store) -> None:
        self.suite, self.testbed = suite, testbed
        self.runs = [r for r in store.runs_of(suite.name, "succeeded")
                     if r.ended and r.info.rehearsal is None and r.ended > r.created]
        raw = suite.estimate.model_dump() if suite.estimate is not None and not isinstance(suite.estimate, str) \
            else suite.estimate
        self.declared = est.declared(raw) if raw is not None else None

    def __call__(self, params: dict[str, Any]) -> tuple[float | None, str]:
        same = [r for r in self.runs if _matches(self.suite, params, r.params)]
        for pool, where in (([r for r in same if r.testbed == self.testbed], f"on {self.testbed}"), (same, None)):
            if pool:
                ds = [float(r.ended or 0) - r.created for r in pool[:HISTORY]]
                where = where or "on " + ", ".join(sorted({r.testbed for r in pool[:HISTORY]}))
                what = "the earlier run" if len(ds) == 1 else f"median of the {plural(len(ds), 'earlier run')}"
                return statistics.median(ds), f"{what} {where} ({pool[0].id})"
        if self.declared is not None:
            at = self.suite.at("estimate")
            try:
                chosen = self.declared.pick(params)
                key = next((k for k, v in self.declared.cases.items() if v is chosen), None)
                deeper = ("cases", key) if key is not None else ("other",) if self.declared.by else ()
                if deeper and ":" in self.suite.at("estimate", *deeper).rsplit("/", 1)[-1]:
                    at = self.suite.at("estimate", *deeper)
                return chosen.seconds(params), f"the suite's estimate '{chosen.text}' ({_short(at)})"
            except est.EstimateTooLarge as e:
                raise UsageError(f"{self.suite.name}: estimate: {e}", where=at,
                                 fix="give the parameters smaller values (-p), or correct the estimate") from None
            except ValueError as e:
                raise UsageError(f"{self.suite.name}: estimate: {e}", where=at,
                                 fix="give the parameter a value (-p), write '(name or N)' in the estimate, or add "
                                     "a case (or 'other')") from None
        return None, "none: no earlier run of this point, and the suite declares no estimate"


def _short(at: str) -> str:
    """``file:line`` relative to the working folder when the file is under it."""
    import os

    rel = os.path.relpath(at)
    return at if rel.startswith("..") else rel


def _label(points: list[dict[str, Any]], p: dict[str, Any]) -> str:
    """The parameters that tell this point from the others (the matrix's axes), as k=v."""
    varying = [k for k in p if len({json.dumps(q.get(k), default=str) for q in points}) > 1]
    # a value this point leaves unset (None) or to a template of the others is not what tells it apart
    shown = [k for k in varying if p[k] is not None and "{{" not in str(p[k])]
    return ", ".join(f"{k}={p[k]}" for k in shown) or "defaults"


# --- the testbed: price and time left ----------------------------------------------------------------------------
def testbed_rate(name: str, hosts: int, store: Store) -> tuple[str, est.Rate]:
    """(provider kind, price per hour of the whole testbed) from its spec and state and the price table."""
    try:
        tb = Resolved.open(name, store, recorded_ok=True)
    except TestbedError:
        return "none", est.Rate(None, None, f"testbed '{name}' has no spec here: no price")
    table = expiry.prices(paths.state_home())
    table["_override_path"] = str(paths.state_home() / expiry.PRICES_FILE)
    return tb.kind, est.Rate.of(tb.provider().planned_cost(table, hosts),
                                f"free: the price table has no price for {tb.kind}")


def time_left(name: str, store: Store, now: float) -> tuple[float | None, str]:
    """Seconds until the testbed goes (its expiry, or its provider's lease end), and what says so; None: no end
    known. A testbed not provisioned yet: the length its spec asks for."""
    try:
        tb = Resolved.open(name, store, recorded_ok=True)
    except TestbedError:
        return None, "no spec"
    ends: list[tuple[float, str]] = []
    if tb.record:
        e = expiry.Expiry.from_info(tb.info)
        if e is not None and e.expire_at is not None:
            ends.append((e.expire_at - now, f"its expiry at {expiry.iso(e.expire_at)}"))
    elif tb.spec is not None and tb.spec.expire:
        ends.append((expiry.parse_duration(tb.spec.expire), f"its spec's expire: {tb.spec.expire} (not provisioned "
                                                           "yet)"))
    lease, why = tb.provider().lease_left(now)
    if lease is not None:
        ends.append((lease, why))
    return min(ends) if ends else (None, "no lease end or expiry")


# --- the stage ---------------------------------------------------------------------------------------------------
def forecast(suite: Suite | str, testbed: str | None, given: dict[str, Any], *, matrix: bool,
             faults: list[str] | None = None, store: Store, now: float | None = None) -> Forecast:
    """Estimate every point of ``suite`` (its matrix, or the one run ``given`` names) on ``testbed``."""
    now = now or time.time()
    s = load_suite(suite) if isinstance(suite, str) else suite
    name = testbed or s.testbed or DEFAULT_TESTBED
    points = expand_matrix(s, given) if matrix else [resolve_params(s, given)]
    info = testbed_info(name, dry_run=True, min_hosts=s.requires.hosts, store=store)
    refused = refusals(s, info, [resolve_params(s, p) for p in points], faults)
    if refused:  # never a price for a testbed the suite cannot run on
        raise UsageError(refused[0].what, where=refused[0].where, fix=refused[0].fix)
    needs = [len(build_plan(s, info, resolve_params(s, p), faults=faults, overrides={}).hosts) for p in points]
    hosts = max([len(info.hosts), *needs]) if info.elastic else len(info.hosts)
    estimator = Estimator(s, name, store)
    row = store.campaign(rs.campaign_id(s.name, name, points, faults)) if matrix else None
    done = {point_key(s, p.params): p for p in row.points} if row else {}
    out: list[PointForecast] = []
    busy: list[tuple[float, int]] = []
    left_d: list[float] = []
    left_n: list[int] = []
    unknown: list[str] = []
    edges = point_reads(s, points)
    for p, n, reads in zip(points, needs, edges, strict=True):
        secs, source = estimator(p)
        pf = PointForecast(params=p, label=_label(points, p), hosts=n, seconds=_r(secs), source=source,
                           reads=[f"{k}: {j + 1} ({_label(points, points[j])})" for k, j in reads.items()
                                  if j is not None])
        cp = done.get(point_key(s, p))
        run = store.run(cp.run_id) if cp is not None and cp.run_id else None
        if cp is not None and run is not None and (cp.status in ENDED or run.status in ACTIVE):
            pf.status, pf.run_id = run.status, run.id
            pf.spent = _r((run.ended or now) - run.created)
            if run.status in ACTIVE:
                busy.append((max((secs or 0.0) - (now - run.created), 0.0), n))
            out.append(pf)
            continue
        if secs is None:
            unknown.append(pf.label)
        left_d.append(secs or 0.0)
        left_n.append(n)
        out.append(pf)
    total = None if unknown else est.makespan(left_d, left_n, hosts, busy)[0]
    kind, rate = testbed_rate(name, hosts, store)
    spent = spent_seconds(store, row.id, now) if row else 0.0
    fc = Forecast(suite=s.name, testbed=name, provider=kind, hosts=hosts, points=out, total_seconds=total,
                  spent_seconds=spent, rate=rate, campaign=row.id if row else None, unknown=unknown)
    if info.elastic:
        fc.notes.append(f"'{name}' is not provisioned and its spec leaves the hosts to the cloud: planned with the "
                        f"{plural(hosts, 'host')} the suite asks for (the spec's provider.count must give them)")
    left, why = time_left(name, store, now)
    fc.fit = {"left_seconds": _r(left), "basis": why, "fits": None if left is None or total is None
              else total <= left, "short_by_seconds": None if left is None or total is None
              else _r(max(total - left, 0.0))}
    return fc


def spent_seconds(store: Store, cid: str, now: float | None = None) -> float:
    """Testbed time the campaign's runs took: from each run's creation to its end (or now, while it goes), runs
    that overlapped counted once. Actual times, from state."""
    now = now or time.time()
    return est.union_seconds([(r.created, r.ended or (now if r.status in ACTIVE else r.created))
                              for r in store.campaign_runs(cid)])
