"""Reports across runs: one report per suite folder or campaign, and the index of a whole results folder.

A folder is a run only when it holds the ``manifest.json`` that collect writes (a JSON object naming the suite
or the run id). Everything else met while looking for runs (the ``report/`` folders testbed writes, an
artifact's committed ``log/`` folder copied next to the runs, stray folders) is skipped with its reason.

- ``results/<suite>/`` -> ``results/<suite>/report/report.<fmt>``: the suite's campaign reporter over every run
  (its report.py's ``results.campaign_reporter``, or one built in; a generic table of runs otherwise).
- ``results/ --campaign ID`` -> ``results/<suite>/campaign-<ID>/report.<fmt>``: the runs of one campaign, known
  from the manifest's ``campaign`` or from the state's record of the campaign.
- ``results/`` -> ``results/index.md`` and ``index.html``: every run (its report built) and campaign.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from testbed import paths
from testbed.errors import UsageError, by_door
from testbed.paths import MANIFEST, write_atomic
from testbed.records import Manifest
from testbed.report import own, render
from testbed.report.build import ReportResult, build_report, write_report
from testbed.report.cause import failed, run_cause
from testbed.report.declared import locate_suite, unmade_tables
from testbed.report.model import Link, Report
from testbed.report.own import call_reporter
from testbed.report.rundir import REPORT_DIR, Campaign, RunDir
from testbed.report.suites import get_campaign_reporter
from testbed.report.summary import _scalar
from testbed.report.trust import duplicated, manifest_problems
from testbed.report.verdicts import Verdict, across_runs, add_verdicts
from testbed.report.verdicts import summary as verdict_summary
from testbed.state import Store
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.results import SuiteResults

CAMPAIGN_PREFIX = "campaign-"
INDEX = "index"


@dataclass
class Expected:
    """A point of a campaign as this machine's state records it (its run may be missing from the results)."""

    campaign: str
    params: dict[str, Any]
    run_id: str | None
    status: str


@dataclass
class Scan:
    """What a results folder holds: runs, unreadable manifests, and every other folder skipped."""

    root: Path
    runs: list[RunDir] = field(default_factory=list)
    bad: list[tuple[Path, str]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


@dataclass
class IndexResult:
    """What ``build_index`` wrote."""

    paths: list[Path]
    runs: list[dict[str, Any]] = field(default_factory=list)
    campaigns: list[ReportResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failed_runs(self) -> list[dict[str, Any]]:
        """Runs that did not succeed, then campaign points whose run is missing (each once)."""
        out = [{"run_id": r["run_id"], "status": r["status"], "cause": r.get("cause") or ""}
               for r in self.runs if failed(r["status"])]
        seen = {(b["run_id"], b["status"], "") for b in out}
        for c in self.campaigns:
            for b in c.failed_runs:
                key = (b["run_id"], b["status"], params_text(b.get("params") or {}) if not b["run_id"] else "")
                if key not in seen:
                    seen.add(key)
                    out.append(b)
        return out


# --- discovery -------------------------------------------------------------------------------------------------
def read_run(path: Path) -> tuple[RunDir | None, str | None]:
    """(run, None) when ``path`` holds a run manifest; (None, why) when it holds an unusable one."""
    mpath = path / MANIFEST
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"{MANIFEST} unreadable: {exc.strerror or exc}"
    except (ValueError, RecursionError) as exc:  # a manifest nested past Python's depth is no manifest
        return None, f"{MANIFEST} is not JSON ({exc})"
    if not isinstance(data, dict) or not (data.get("suite") or data.get("run_id")):
        return None, f"{MANIFEST} is not a run manifest (no suite or run_id)"
    problems = manifest_problems(data)
    if problems:
        return None, (f"{MANIFEST} is damaged or forged: {'; '.join(problems[:3])}"
                      + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
                      + "; collect the run again, or move the folder out of the results")
    return RunDir(path, cast(Manifest, data)), None


def _why_not(path: Path) -> str:
    if path.name == REPORT_DIR or path.name.startswith(CAMPAIGN_PREFIX):
        return "a report folder written by testbed"
    if path.name.startswith("."):
        return "hidden folder"
    return f"no {MANIFEST}: not a run, and no run folder inside"


def scan(root: Path) -> Scan:
    """Runs directly under ``root`` (a suite folder) and one level deeper (a results folder), never deeper."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"no results folder at {root}", where=str(root),
                         fix="pass a run folder, results/<suite>/ or results/ (see `testbed collect --to`)")
    found = Scan(root)

    def subdirs(path: Path) -> list[Path]:
        try:
            return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}", where=str(path),
                             fix="check the folder's permissions") from exc

    def visit(path: Path, depth: int) -> bool:
        """Whether ``path`` is a run or holds runs; a non-run folder beside runs is recorded as skipped."""
        if (path / MANIFEST).is_file():
            run, why = read_run(path)
            if run is None:
                found.bad.append((path, why or "unusable manifest"))
            elif (empty := run.empty()) is not None:  # a folder without files is never a run
                found.skipped.append((path, f"not a run: {empty}"))
            else:
                found.runs.append(run)
            return True
        if depth == 0 or path.name == REPORT_DIR or path.name.startswith((CAMPAIGN_PREFIX, ".")):
            return False
        seen = [(p, visit(p, depth - 1)) for p in subdirs(path)]
        if not any(ok for _, ok in seen):
            return False
        found.skipped += [(p, _why_not(p)) for p, ok in seen if not ok]
        return True

    if (root / MANIFEST).is_file():  # a run folder itself: its host folders are never looked into
        visit(root, 0)
        return found
    for child in subdirs(root):
        if not visit(child, 1):
            found.skipped.append((child, _why_not(child)))
    _set_aside_copies(found)
    return found


def _set_aside_copies(found: Scan) -> None:
    """Two folders claiming one run id (a folder copied): none of them is reported as a run, each is named."""
    twice = duplicated((r.run_id, r) for r in found.runs)
    for run_id, runs in twice.items():
        where = ", ".join(str(r.path) for r in runs)
        for r in runs:
            found.runs.remove(r)
            found.bad.append((r.path, f"run id {run_id} is claimed by {len(runs)} folders ({where}): a copy of a "
                                      "run is not another run; keep the folder collect wrote (results/<suite>/"
                                      "<run-id>) and move the others out of the results"))


def _refuse_bad(found: Scan) -> None:
    if found.bad:
        path, why = found.bad[0]
        more = f" (and {len(found.bad) - 1} more)" if len(found.bad) > 1 else ""
        raise UsageError(f"unreadable run manifest: {why}{more}", where=str(path / MANIFEST),
                         fix="collect the run again (`testbed collect RUN`) or move the folder out of the results")


def _no_runs(found: Scan) -> UsageError:
    why = "; ".join(f"{p.name}/: {w}" for p, w in found.skipped[:5])
    return UsageError(f"no collected runs under {found.root}" + (f" (skipped {why})" if why else ""),
                      where=str(found.root),
                      fix="pass results/<suite>/<run-id>, results/<suite>/ or results/ of `testbed collect --to`")


# --- campaign ids ------------------------------------------------------------------------------------------------
def campaign_of(run: RunDir, recorded: dict[str, str]) -> str | None:
    """The run's campaign id: the manifest's ``campaign``, else the state's record of the run."""
    cid = run.manifest.get("campaign")
    return str(cid) if cid else recorded.get(run.run_id)


def recorded_campaigns() -> dict[str, str]:
    """run id -> campaign id from this machine's state (empty when there is no state)."""
    try:
        st = Store.open_existing()  # read-only; a folder without state stays without
    except Exception:  # a state this version cannot open: campaigns are then only known from manifests
        return {}
    try:
        return st.campaign_of_runs()
    finally:
        st.close()


def recorded_points(cids: Iterable[str]) -> list[Expected]:
    """Every point of these campaigns as this machine's state records it (none without a state: read only)."""
    wanted = sorted(set(cids))
    db = paths.home() / "state.db"
    if not wanted or not db.is_file():
        return []
    try:
        st = Store(db)
    except Exception:  # a state this version cannot open: the campaigns' points are then unknown
        return []
    try:
        out = []
        for cid in wanted:
            row = st.campaign(cid)
            for p in row.points if row is not None else []:
                out.append(Expected(cid, dict(p.params), p.run_id, p.status))
        return out
    finally:
        st.close()


# --- reports -------------------------------------------------------------------------------------------------------
def _check_fmt(fmt: str) -> None:
    if fmt not in ("md", "html"):
        raise UsageError(f"unknown report format {fmt!r}", where="--format", fix="use one of: md, html")


def build_campaign_report(runs: list[RunDir], out_dir: Path, fmt: str = "md", name: str = "",
                          expected: list[Expected] | None = None,
                          run_verdicts: dict[str, list[Verdict]] | None = None) -> ReportResult:
    """One report over ``runs`` (all of one suite) written to ``out_dir/report.<fmt>``.

    ``expected``: the points of the runs' campaigns as state records them; a point whose run is not among
    ``runs`` is a missing run (listed, and the campaign fails). ``run_verdicts``: each run's own verdicts (run
    id -> verdicts) where its report is built already; the others' reports are built here when a metric is not
    measured by the campaign's own tables (the verdicts then count what the runs measured).
    """
    _check_fmt(fmt)
    suites = sorted({r.suite for r in runs})
    if len(suites) != 1:
        raise UsageError(f"runs of {plural(len(suites), 'suite')} ({', '.join(suites) or 'none'}) in one campaign "
                         "report",
                         where=str(out_dir.parent),
                         fix=by_door("pass results/<suite>/ or --campaign ID", "pass results/<suite>/ or campaign=ID"))
    runs = sorted(runs, key=lambda r: (str(r.manifest.get("started") or ""), r.run_id))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the report folder: {exc.strerror}", where=str(out_dir),
                         fix="check the results folder's permissions") from exc
    camp = Campaign(suites[0], runs, out_dir, name)
    title = f"{camp.suite} campaign {name}: {plural(len(runs), 'run')}" if name else \
        f"{camp.suite}: {plural(len(runs), 'run')}"
    rep = Report(out_dir, title)
    bad = run_table(camp, rep, fmt, expected or [])
    located = locate_suite(runs[0]) if runs else None
    suite = located[0] if located else None
    choice = own.choose(suite, runs[0] if runs else None)  # never a report.py from a results folder
    registered = own.registered(choice.path) if choice.path is not None else None
    builtin = get_campaign_reporter(camp.suite)
    if registered is not None and registered.campaign is not None and choice.path is not None:
        try:
            rep = own.bounded(choice.path, _campaign_job, camp, rep, what=f"reporting campaign {camp.suite}")
        except own.Stopped as exc:
            own.stopped(rep, exc)
    elif builtin is not None:
        call_reporter(builtin, camp, rep, f"{camp.suite} campaign reporter")
    else:
        rep.text(f"No campaign reporter is registered for suite {camp.suite!r}: the runs are listed above; "
                 "each run's own report has its results.")
    not_run = own.missing_note(suite, choice.refused, unmade_tables(suite)) \
        if choice.refused is not None and suite is not None else None
    rep.skip([not_run] if not_run else [])
    add_verdicts(rep, camp.suite, [h for r in runs for h in r.host_records()], located)
    if any(v.within is None for v in rep.verdicts):
        rep.verdicts = across_runs(rep.verdicts, _run_verdicts(runs, fmt, run_verdicts or {}))
    res = write_report(rep, out_dir, fmt, camp.suite)
    res.runs = [r.run_id for r in runs]
    res.failed_runs, res.not_run = bad, not_run
    return res


def _campaign_job(res: SuiteResults, camp: Campaign, rep: Report) -> Report:
    """In the report.py's child: its campaign reporter over ``rep``."""
    if res.campaign is not None:
        call_reporter(res.campaign.fn, camp, rep, f"{camp.suite} campaign reporter")
    return rep


def _run_verdicts(runs: list[RunDir], fmt: str, known: dict[str, list[Verdict]]) -> dict[str, list[Verdict]]:
    """Each run's own verdicts: ``known`` ones, else from its report, built now (a run whose report cannot be
    built has none)."""
    out: dict[str, list[Verdict]] = {}
    for run in runs:
        if run.run_id in known:
            out[run.run_id] = known[run.run_id]
            continue
        try:
            out[run.run_id] = build_report(run.path, fmt).verdicts
        except UsageError:
            out[run.run_id] = []
    return out


def run_table(camp: Campaign, rep: Report, fmt: str = "md", expected: list[Expected] | None = None
              ) -> list[dict[str, Any]]:
    """The runs: id (linked to its report when built), parameters, status, testbed and, for a run that did not
    succeed, its cause; then the points state expects whose run is not here. A check says whether every run
    succeeded. Returns the runs that did not (and the missing ones): run id, status, cause."""
    rep.heading("Runs")
    rows: list[list[Any]] = []
    bad: list[dict[str, Any]] = []
    for run in camp.runs:
        own = run.path / REPORT_DIR / f"report.{fmt}"
        rid: Any = Link(run.run_id, os.path.relpath(own, camp.out_dir)) if own.is_file() else run.run_id
        status = run.manifest.get("status")
        cause = run_cause(run)
        text = cause.summary() if cause is not None else ""
        rows.append([rid, params_text(run.params), status, testbed_of(run), text])
        if failed(status):
            bad.append({"run_id": run.run_id, "status": status, "cause": text})
    here = {r.run_id for r in camp.runs}
    for p in expected or []:
        if p.run_id in here:
            continue
        why = (f"not collected (state: {p.status}); collect it: testbed collect {p.run_id}" if p.run_id
               else f"never started (campaign {p.campaign}); run the campaign's command again to resume it")
        rows.append([p.run_id or "-", params_text(p.params), "missing", None, why])
        bad.append({"run_id": p.run_id, "status": "missing", "cause": why, "params": p.params})
    rep.table("runs", ["run", "parameters", "status", "testbed", "cause"], rows)
    total = len(camp.runs) + sum(1 for p in expected or [] if p.run_id not in here)
    if bad:
        detail = f"{len(bad)} of {plural(total, 'run')} did not succeed: " + "; ".join(
            f"{b['run_id'] or params_text(dict(b.get('params') or {}))} {b['status']}"
            + (f" ({b['cause']})" if b["cause"] else "") for b in bad[:5]) + ("; ..." if len(bad) > 5 else "")
    else:
        detail = "the run succeeded" if total == 1 else f"all {plural(total, 'run')} succeeded"
    rep.check("every run succeeded", not bad, detail)
    return bad


def params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_scalar(v)}" for k, v in sorted(params.items()))


def testbed_of(run: RunDir) -> str | None:
    tb = run.manifest.get("testbed")
    return str(tb.get("name")) if isinstance(tb, dict) and tb.get("name") else None


def report_suite_folder(folder: Path, fmt: str = "md") -> ReportResult:
    """``results/<suite>/`` -> ``results/<suite>/report/``."""
    found = scan(folder)
    _refuse_bad(found)
    if not found.runs:
        raise _no_runs(found)
    recorded = recorded_campaigns()
    expected = recorded_points(c for r in found.runs if (c := campaign_of(r, recorded)))
    res = build_campaign_report(found.runs, Path(folder) / REPORT_DIR, fmt, expected=expected)
    res.skipped = [f"{p.name}/: {w}" for p, w in found.skipped] + res.skipped
    return res


def report_campaign(root: Path, cid: str, fmt: str = "md") -> ReportResult:
    """The runs of campaign ``cid`` found under ``root`` -> ``<suite folder>/campaign-<cid>/``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", cid):
        raise UsageError(f"not a campaign id: {cid!r}", where=by_door("--campaign", "campaign="),
                         fix="use an id a campaign's run printed, like my-suite-1a2b3c4d")
    found = scan(root)
    _refuse_bad(found)
    recorded = recorded_campaigns()
    runs = [r for r in found.runs if campaign_of(r, recorded) == cid]
    if not runs:
        known = sorted({c for r in found.runs if (c := campaign_of(r, recorded))})
        raise UsageError(f"no collected run of campaign {cid!r} under {root}", where=str(root),
                         fix=(f"known campaigns here: {', '.join(known)}" if known else
                              "collect the campaign's runs first (`testbed collect --all`), or pass results/<suite>/"))
    parent = runs[0].path.parent
    return build_campaign_report(runs, parent / f"{CAMPAIGN_PREFIX}{cid}", fmt, name=cid,
                                 expected=recorded_points([cid]))


def build_index(root: Path, fmt: str = "md") -> IndexResult:
    """Every run's report, one campaign report per suite folder and per campaign id, and ``index.md``/``.html``."""
    _check_fmt(fmt)
    root = Path(root)
    found = scan(root)
    if not found.runs and not found.bad:
        raise _no_runs(found)
    recorded = recorded_campaigns()
    skipped = [(_rel(p, root), w) for p, w in found.skipped] + [(_rel(p, root), w) for p, w in found.bad]
    rows: list[dict[str, Any]] = []
    for run in sorted(found.runs, key=lambda r: (r.suite, str(r.manifest.get("started") or ""), r.run_id)):
        row: dict[str, Any] = {"run": run, "campaign": campaign_of(run, recorded), "report": None, "checks": None}
        try:
            rr = build_report(run.path, fmt)
        except UsageError as exc:
            row["error"] = exc.what
        else:
            row["report"], row["checks"], row["not_run"] = rr.path, rr.checks, rr.not_run
            row["cause"] = rr.cause["summary"] if rr.cause else None
            row["verdicts"] = verdict_summary(rr.verdicts) if rr.verdicts else None
            row["verdict_list"] = rr.verdicts
            row["outside"] = sum(v.within is False for v in rr.verdicts)
            row["all_within"] = bool(rr.verdicts) and all(v.within for v in rr.verdicts)
        rows.append(row)
    campaigns: list[tuple[str, ReportResult]] = []
    by_folder: dict[Path, list[RunDir]] = {}
    for run in found.runs:
        by_folder.setdefault(run.path.parent, []).append(run)
    points = recorded_points(r["campaign"] for r in rows if r["campaign"])
    built = {r["run"].run_id: r["verdict_list"] for r in rows if "verdict_list" in r}  # each report built once
    for folder, runs in sorted(by_folder.items()):
        if folder == root or len({r.suite for r in runs}) != 1:
            continue
        cids = {campaign_of(r, recorded) for r in runs}
        campaigns.append((f"{folder.name}/ (all runs)", build_campaign_report(
            runs, folder / REPORT_DIR, fmt, expected=[p for p in points if p.campaign in cids],
            run_verdicts=built)))
    by_cid: dict[str, list[RunDir]] = {}
    for row in rows:
        if row["campaign"]:
            by_cid.setdefault(row["campaign"], []).append(row["run"])
    for cid, runs in sorted(by_cid.items()):
        if len({r.suite for r in runs}) == 1:
            out = runs[0].path.parent / f"{CAMPAIGN_PREFIX}{cid}"
            campaigns.append((cid, build_campaign_report(runs, out, fmt, name=cid,
                                                         expected=[p for p in points if p.campaign == cid],
                                                         run_verdicts=built)))
    paths = []
    for ext in ("md", "html"):
        rep = index_report(root, rows, campaigns, skipped, ext)
        path = root / f"{INDEX}.{ext}"
        write_atomic(path, render.to_html(rep) if ext == "html" else render.to_markdown(rep))
        paths.append(path)
    out_rows = [{"run_id": r["run"].run_id, "suite": r["run"].suite, "campaign": r["campaign"],
                 "status": r["run"].manifest.get("status"), "report": str(r["report"]) if r["report"] else None,
                 "passed": _passed(r["checks"]), "error": r.get("error"), "cause": r.get("cause"),
                 "verdicts": r.get("verdicts"), "outside": r.get("outside", 0),
                 "all_within": r.get("all_within", False), "not_run": r.get("not_run")} for r in rows]
    return IndexResult(paths, out_rows, [c for _, c in campaigns], skipped)


def index_report(root: Path, rows: list[dict[str, Any]], campaigns: list[tuple[str, ReportResult]],
                 skipped: list[tuple[str, str]], fmt: str) -> Report:
    """The index as a Report (rendered like any other): runs, campaigns, skipped folders."""
    rep = Report(root, f"Results in {root.name or root}", fold=False)

    def link(text: str, path: Path | None) -> Link | str:
        return Link(text, os.path.relpath(path, root)) if path is not None else text

    rep.heading("Runs")
    rep.table("index_runs", ["suite", "run", "testbed", "parameters", "status", "checks", "campaign", "cause"], [
        [r["run"].suite, link(r["run"].run_id, r["report"]), testbed_of(r["run"]), params_text(r["run"].params),
         r["run"].manifest.get("status"), r.get("error") or _checks_text(r["checks"]), r["campaign"],
         r.get("cause") or ""]
        for r in rows])
    if campaigns:
        rep.heading("Campaigns")
        rep.table("index_campaigns", ["campaign", "suite", "runs", "checks"],
                  [[link(name, c.path), c.suite, len(c.runs), _checks_text(c.checks)] for name, c in campaigns])
    rep.heading("Skipped")
    if skipped:
        rep.table("index_skipped", ["folder", "why"], [[p, w] for p, w in skipped])
    else:
        rep.text("Nothing was skipped: every folder holds runs.")
    return rep


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) + "/"
    except ValueError:
        return str(path)


def _passed(checks: Iterable[tuple[str, bool | None, str]] | None) -> bool | None:
    if checks is None:
        return None
    return all(p is not False for _, p, _ in checks)


def _checks_text(checks: list[tuple[str, bool | None, str]] | None) -> str:
    if checks is None:
        return ""
    if not checks:
        return "none"
    fail = sum(1 for _, p, _ in checks if p is False)
    ok = sum(1 for _, p, _ in checks if p)
    na = len(checks) - fail - ok
    return f"{ok} pass, {fail} FAIL" + (f", {na} n/a" if na else "") if fail else \
        f"{ok} pass" + (f", {na} n/a" if na else "")


def report_path(path: Path, fmt: str = "md", campaign: str | None = None) -> ReportResult | IndexResult:
    """What ``testbed report PATH [--campaign ID]`` does: a run, a suite folder, a campaign or the index."""
    path = Path(path)
    _check_fmt(fmt)
    if campaign is not None:  # an empty id is refused there, not read as "no campaign" (every run)
        return report_campaign(path, campaign, fmt)
    if not path.is_dir():
        raise UsageError(f"no run or results folder at {str(path)!r}", where=str(path),
                         fix="pass results/<suite>/<run-id>, results/<suite>/ or results/ (see `testbed collect`)")
    if (path / MANIFEST).is_file():
        run, why = read_run(path)
        if run is None:
            raise UsageError(f"unreadable run manifest: {why}", where=str(path / MANIFEST),
                             fix="collect the run again (`testbed collect RUN`)")
        return build_report(path, fmt)
    found = scan(path)
    holders = {p.parent for p in [r.path for r in found.runs] + [b for b, _ in found.bad]}
    if holders == {path}:
        return report_suite_folder(path, fmt)
    if holders:
        return build_index(path, fmt)
    raise _no_runs(found)
