"""CLI verbs ``collect`` and ``report``; ``register(app)`` adds them to the ``testbed`` Typer app.

Only typer is imported at module level: collect, Rich and the report code load inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from testbed.collect import CollectResult
    from testbed.report.build import ReportResult
    from testbed.report.folders import IndexResult

from testbed.cli import complete
from testbed.cli.common import JsonOpt, print_json
from testbed.exitcodes import Exit
from testbed.paths import RESULTS
from testbed.textfmt import plural, size


def collect_cmd(
    runs: Annotated[list[str] | None, typer.Argument(help="Run ids (see `testbed list runs`).",
                                                     autocompletion=complete.runs)] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Collect every recorded run.")] = False,
    to: Annotated[Path, typer.Option("--to", help="Results folder: writes <to>/<suite>/<run-id>/.")] = Path(RESULTS),
    json_out: JsonOpt = False,
) -> None:
    """Fetch runs' outputs and logs from every host into results/, verified by sha256, with a manifest.

    Incremental (unchanged files are not sent again) and resumable; never overwrites a collected file with
    different content. A run whose hosts are gone (its testbed destroyed, or provisioned again, since it ran) is
    never retried: what was collected before is kept, and a run never collected is named as one that cannot be
    collected any more (with --all, the others are collected and the exit status is 0).

    Example: testbed collect --all --to results/
    """
    import threading

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    # lazy: testbed --help and completion load every command module
    from testbed import services
    from testbed.collect import format_problems

    err = Console(stderr=True, highlight=False)
    bar = Progress(TextColumn("collect: listing and fetching"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeElapsedColumn(), console=err,
                   transient=True, disable=json_out or not err.is_terminal)
    task = bar.add_task("collect", total=0)
    lock = threading.Lock()
    grand = [0]

    def progress(_host: str, advance: int, total: int) -> None:  # called from the per-host threads
        with lock:
            if total:
                grand[0] += total
                bar.update(task, total=grand[0])
            if advance:
                bar.advance(task, advance)

    with bar:
        results = services.collect(runs or None, to, all_runs=all_runs, progress=progress)
    if json_out:
        print_json([r.to_dict() for r in results])
    else:
        _print_collect(results)
    problem = format_problems(results)
    if problem is not None:
        raise problem


def _print_collect(results: list[CollectResult]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # lazy: testbed --help and completion load every command module
    from testbed.collect import lost_line

    c = Console(highlight=False, soft_wrap=True)
    if not results:
        c.print("no run to collect")
        return
    for r in results:
        if r.lost and not r.named:  # (a run named is in the error that follows)
            c.print(f"[yellow]{escape(lost_line(r))}[/yellow]")
        for note in r.notes:
            c.print(f"[dim]note ({escape(r.run_id)}): {escape(note)}[/dim]")
        if not r.hosts:
            continue
        t = Table(title=f"{r.run_id} -> {r.path}", title_justify="left")
        for col in ("host", "method", "files", "sent", "bytes", "unchanged", "seconds", "status"):
            t.add_column(col, no_wrap=col == "host")
        for h in r.hosts:
            status = "[green]ok[/green]" if h.error is None else "[red]failed[/red]"
            t.add_row(h.host, h.method or "-", str(h.files), str(h.sent), size(h.bytes_sent), str(h.unchanged),
                      f"{h.seconds:.2f}", status)
        c.print(t)
        for h in r.hosts:
            for note in h.notes:
                c.print(f"[dim]note ({h.host}): {escape(note)}[/dim]")
        if r.manifest:
            c.print(f"manifest: {escape(str(r.manifest))}")


def report_cmd(
    path: Annotated[Path, typer.Argument(help="A run (results/<suite>/<run-id>), a suite folder (results/<suite>/: "
                                               "one report across its runs) or results/ (an index of everything).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="md or html.")] = "md",
    campaign: Annotated[str | None, typer.Option("--campaign", help="Report the runs of this campaign id found "
                                                                    "under PATH.")] = None,
    suite: Annotated[Path | None, typer.Option("--suite", help="The suite folder (or .yml) whose report.py makes "
                                                                "its tables: yours, never one inside a results "
                                                                "folder.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write reports (Markdown or HTML, PNG figures, tidy CSVs): of a run into <run>/report/, across the runs of a
    suite folder into results/<suite>/report/, of one campaign into results/<suite>/campaign-<ID>/; for results/,
    every run's report and results/index.md and index.html.

    A failed run's report shows why: the failing rank and the last lines of its stderr (secrets masked). Exit 1
    when a run of the report failed, timed out or was stopped, or a run of its campaign is missing (the report
    is written all the same); 0 otherwise.

    Results are data: a report.py inside a results folder (a .suite/ copy, a link, a path its manifest names) is
    never run. The suite's own report.py runs from a suite folder you have (./experiments/<name>/, a shipped one,
    or --suite PATH), in a child process bounded in time and memory.

    Example: testbed report results/my-suite/my-suite-20240501-120000-ab12 --format html
    """
    # lazy: testbed --help and completion load every command module
    from testbed.cli.output import waiting
    from testbed.report.folders import IndexResult, report_path

    if suite is not None:  # named by its path: its report.py may run (testbed.report.own.choose)
        # lazy: testbed --help and completion load every command module
        from testbed.suite import load_suite

        load_suite(str(suite))
    with waiting(f"writing the reports of {path}"):
        res = report_path(path, fmt, campaign)
    if isinstance(res, IndexResult):
        if json_out:
            print_json({"index": [str(p) for p in res.paths], "runs": res.runs,
                         "campaigns": [_report_dict(c) for c in res.campaigns],
                         "skipped": [{"folder": f, "why": w} for f, w in res.skipped],
                         "failed_runs": res.failed_runs})
        else:
            _print_index(res)
    elif json_out:
        print_json(_report_dict(res))
    else:
        _print_report(res)
    if res.failed_runs:
        raise typer.Exit(Exit.FAILED)


def _report_dict(rr: ReportResult) -> dict[str, Any]:
    return {"suite": rr.suite, "path": str(rr.path), "figures": [str(f) for f in rr.figures],
            "csvs": [str(c) for c in rr.csvs], "passed": rr.passed, "runs": rr.runs,
            "checks": [{"name": n, "passed": p, "detail": d} for n, p, d in rr.checks], "skipped": rr.skipped,
            "cause": rr.cause, "failed_runs": rr.failed_runs, "verdicts": [v.to_json() for v in rr.verdicts],
            "not_run": rr.not_run}


def _print_report(rr: ReportResult) -> None:
    from rich.console import Console
    from rich.markup import escape

    c = Console(highlight=False, soft_wrap=True)
    if rr.run_id is not None:  # the run's status and its verdicts in one line: neither reads alone
        # lazy: testbed --help and completion load every command module
        from testbed.report.verdicts import headline, headline_tone

        colour = {"good": "green", "bad": "red", "unsure": "yellow"}[headline_tone(rr.status, rr.verdicts)]
        said = headline(rr.status or "of unknown status", rr.verdicts)
        c.print(f"[{colour}]run {escape(rr.run_id)} {escape(str(said))}[/{colour}]")
    c.print(f"report: {escape(str(rr.path))}" + (f" ({plural(len(rr.runs), 'run')})" if rr.runs else ""))
    if rr.verdicts:
        # lazy: testbed --help and completion load every command module
        from testbed.cli.verdict_view import print_verdicts

        print_verdicts(c, rr.verdicts)
    for f in rr.figures:
        c.print(f"figure: {escape(str(f))}")
    for n, p, d in rr.checks:
        mark = "[green]pass[/green]" if p else ("[red]FAIL[/red]" if p is False else "[yellow]n/a[/yellow]")
        c.print(f"check {mark} {escape(n)}{': ' + escape(d) if d else ''}")
    cause = rr.cause
    if cause:
        where = f"{cause['host']} rank {cause['rank']}" if cause.get("rank") is not None else cause.get("host")
        c.print(f"[red]why it failed[/red]: {escape(str(where or cause['status']))}"
                + (f" ({escape(cause['reason'])})" if cause.get("reason") else ""))
        if cause.get("tail"):
            c.print(f"  last lines of {escape(str(cause['file']))} ({cause['stream']}):")
            for line in cause["tail"]:
                c.print(f"  | {escape(line)}")
        elif cause.get("note"):
            c.print(f"  {escape(cause['note'])}")
    elif rr.failed_runs:
        for b in rr.failed_runs:
            c.print(f"[red]{escape(str(b['status']))}[/red] {escape(str(b['run_id'] or '-'))}"
                    + (f": {escape(b['cause'])}" if b.get("cause") else ""))
    for s in rr.skipped:
        c.print(f"[dim]skipped: {escape(s)}[/dim]")


def _print_index(res: IndexResult) -> None:
    from rich.console import Console
    from rich.markup import escape

    c = Console(highlight=False, soft_wrap=True)
    for p in res.paths:
        c.print(f"index: {escape(str(p))}")
    for r in res.runs:  # the checks' mark beside the verdicts': never a bare "pass" over an outside tolerance
        mark = "[red]error[/red]" if r["error"] else ("[green]checks pass[/green]" if r["passed"]
                                                       else "[red]checks FAIL[/red]")
        if r.get("verdicts"):
            colour = "red" if r.get("outside") else "green" if r.get("all_within") else "yellow"
            mark += f", [{colour}]{escape(r['verdicts'])}[/{colour}]"
        why = f"\n  why: {escape(r['cause'])}" if r.get("cause") else ""
        c.print(f"run {escape(str(r.get('status') or '?'))} ({mark}) {escape(r['run_id'])}: "
                f"{escape(str(r['report'] or r['error']))}{why}")
    for rr in res.campaigns:  # as a run's line: the checks' mark and the verdicts' count side by side
        # lazy: testbed --help and completion load every command module
        from testbed.report.verdicts import summary

        mark = "[green]checks pass[/green]" if rr.passed else "[red]checks FAIL[/red]"
        if rr.verdicts:
            outside = any(v.within is False for v in rr.verdicts)
            colour = "red" if outside else "green" if all(v.within for v in rr.verdicts) else "yellow"
            mark += f", [{colour}]{escape(summary(rr.verdicts))}[/{colour}]"
        c.print(f"campaign {escape(rr.suite)} ({plural(len(rr.runs), 'run')}; {mark}): {escape(str(rr.path))}")
    for note in dict.fromkeys([r["not_run"] for r in res.runs if r.get("not_run")] +
                              [rr.not_run for rr in res.campaigns if rr.not_run]):
        c.print(f"[yellow]not run: {escape(note)}[/yellow]")
    for b in res.failed_runs:
        if b["status"] == "missing":
            c.print(f"[red]missing[/red] {escape(str(b['run_id'] or '-'))}: {escape(b['cause'])}")
    for folder, why in res.skipped:
        c.print(f"[dim]skipped: {escape(folder)}: {escape(why)}[/dim]")


def register(app: typer.Typer) -> None:
    """Add ``collect`` and ``report`` to ``app``.

    Example: cli_collect.register(app)
    """
    app.command("collect")(collect_cmd)
    app.command("report")(report_cmd)
