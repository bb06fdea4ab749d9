"""``build_report``: open a run folder, dispatch to the suite's reporter, render and write everything."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from testbed.errors import TestbedError, UsageError
from testbed.paths import write_atomic
from testbed.report import own, render, tidy_csv
from testbed.report.declared import add_own_tables, add_table_checks, locate_suite, parser_table, unmade_tables
from testbed.report.model import Check, Report, Table
from testbed.report.own import Registered, call_reporter
from testbed.report.rundir import REPORT_DIR, RunDir
from testbed.report.suites import get_reporter
from testbed.report.summary import add_summary, generic
from testbed.report.verdicts import Verdict, add_verdicts
from testbed.suite import resolve_params

if TYPE_CHECKING:
    from testbed.results import SuiteResults
    from testbed.suite import Suite

S = TypeVar("S")  # what a reporter reads: a run folder or a campaign

FORMATS = ("md", "html")


@dataclass
class ReportResult:
    """What ``build_report`` wrote, and what it found."""

    path: Path
    figures: list[Path] = field(default_factory=list)
    csvs: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    suite: str = ""
    runs: list[str] = field(default_factory=list)  # the run ids of a campaign report
    cause: dict[str, Any] | None = None  # a failed run's report: why it failed (testbed.report.cause.Cause)
    failed_runs: list[dict[str, Any]] = field(default_factory=list)  # runs that did not succeed or are missing
    verdicts: list[Verdict] = field(default_factory=list)  # each of the suite's references against ours
    tables: list[Table] = field(default_factory=list, repr=False)  # the report's tables (data, as built)
    run_id: str | None = None  # a run's report: the run, and its status as the manifest records it
    status: str | None = None
    not_run: str | None = None  # why the suite's report.py was not run (testbed.report.own.missing_note)

    @property
    def passed(self) -> bool:
        """No check failed (checks that could not be evaluated do not count)."""
        return all(p is not False for _, p, _ in self.checks)


def _point(run: RunDir, suite: Suite | None) -> dict[str, Any] | None:
    """The run's parameter point as its suite reads it (None: not known, or it no longer resolves)."""
    if suite is None:
        return None
    try:
        return resolve_params(suite, {k: v for k, v in run.params.items() if k in suite.parameters})
    except TestbedError:
        return None


def build_report(run_dir: Path, fmt: str = "md") -> ReportResult:
    """Write ``run_dir/report/report.<md|html>`` with figures and CSVs; return what was written."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r}", where="--format", fix="use one of: md, html")
    run = RunDir.open(Path(run_dir))
    empty = run.empty()
    if empty is not None:
        raise UsageError(f"{run.path} is not a run to report: {empty}", where=str(run.path),
                         fix="collect the run (`testbed collect RUN`); a run that cannot be collected any more has "
                             "nothing to report: remove its folder")
    out_dir = run.path / REPORT_DIR
    try:
        out_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the report folder: {exc.strerror}", where=str(out_dir),
                         fix="check the run folder's permissions") from exc
    suite, why = locate_suite(run)
    choice = own.choose(suite, run)  # the suite's report.py, never one from a results folder
    rep = Report(out_dir, f"{run.suite} run {run.run_id}")
    add_summary(run, rep)
    registered: Registered | None = None
    parsed: dict[str, own.ParserOut] = {}
    if choice.path is not None:  # run in a bounded child: a broken file is one error naming its line
        try:
            registered, rep, parsed = own.bounded(choice.path, _own_job, run, rep, what=f"reporting {run.run_id}")
        except own.Stopped as exc:
            own.stopped(rep, exc)
    builtin = get_reporter(run.suite) if registered is None or registered.reporter is None else None
    if builtin is not None:
        call_reporter(builtin, run, rep, f"{run.suite} reporter")
    elif registered is None or registered.reporter is None:
        generic(run, rep, own_tables=bool(suite is not None and suite.tables) or bool(parsed))
    add_own_tables(run, rep, suite, parsed)
    not_run = own.missing_note(suite, choice.refused, unmade_tables(suite)) \
        if choice.refused is not None and suite is not None else None
    rep.skip([not_run] if not_run else [])
    add_table_checks(rep, suite, _point(run, suite))
    add_verdicts(rep, run.suite, run.host_records(), (suite, why))
    res = write_report(rep, out_dir, fmt, run.suite)
    res.run_id, res.status, res.not_run = run.run_id, rep.status, not_run
    if rep.cause is not None:
        res.cause = rep.cause.to_json()
        res.failed_runs = [{"run_id": run.run_id, "status": rep.cause.status, "cause": rep.cause.summary()}]
    return res


def _own_job(res: SuiteResults, run: RunDir, rep: Report) -> tuple[Registered, Report, dict[str, own.ParserOut]]:
    """In the report.py's child: its run reporter (if any) over ``rep``, and each parser's table of ``run``."""
    if res.reporter is not None:
        call_reporter(res.reporter.fn, run, rep, f"{run.suite} reporter")
    return own.plain(res), rep, {name: parser_table(run, p) for name, p in res.parsers.items()}


def write_report(rep: Report, out_dir: Path, fmt: str, suite: str) -> ReportResult:
    """Render ``rep`` into ``out_dir/report.<fmt>`` with its tidy CSVs; what was written."""
    rep.promote_key_figure()
    csvs = tidy_csv.write_all(rep)
    path = out_dir / f"report.{fmt}"
    write_atomic(path, render.to_html(rep) if fmt == "html" else render.to_markdown(rep))  # whole, or the last one
    return ReportResult(path, [f.path for f in rep.figures], csvs, list(rep.skipped), list(rep.checks), suite,
                        verdicts=list(rep.verdicts), tables=list(rep.tables))
