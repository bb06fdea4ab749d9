"""CLI commands for suites and runs: run, logs, stop, show and ``list suites``.

``register(app, list_app)`` adds them to the main Typer app. Only typer is imported here at module level so
``testbed --help`` stays fast; the work lives in runner, campaign and suite.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, escape, existing_store, json_wanted, print_json, store
from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.paths import RESULTS
from testbed.resolved import Resolved
from testbed.textfmt import iso, plural

T = TypeVar("T")

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console, Group
    from rich.spinner import Spinner
    from rich.text import Text

    from testbed.collect import CollectResult
    from testbed.estimate import Budget
    from testbed.records import RunPlan, RunRecord
    from testbed.rehearse import RehearsalResult
    from testbed.run.forecast import Forecast
    from testbed.run.runner import RankLine
    from testbed.setup.events import EventHandler
    from testbed.state import Store
    from testbed.suite import Suite


# the suite and its parameters, as `run` and `rehearse` take them
SuiteArg = Annotated[str, typer.Argument(help="Suite name (experiments/NAME/suite.yml), a suite folder or a .yml path.",
                                         autocompletion=complete.suites)]
ParamOpt = Annotated[list[str] | None, typer.Option("--param", "-p", help="key=value, repeatable.")]


def run(
    suite: SuiteArg,
    on: Annotated[str | None, typer.Option("--on", help="Testbed (default: the suite's, else local).",
                                                  autocompletion=complete.testbeds)] = None,
    param: ParamOpt = None,
    matrix: Annotated[bool, typer.Option("--matrix", help="Run every point of the suite's matrix (a campaign; "
                                                          "-p values filter the points).")] = False,
    fault: Annotated[list[str] | None, typer.Option("--fault", help="Fault to inject (repeatable); default: the "
                                                                    "suite's default_faults.",
                                                    autocompletion=complete.faults)] = None,
    no_faults: Annotated[bool, typer.Option("--no-faults", help="Inject no fault at all.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Start and return; follow with status/logs.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every command per host, in order; touch "
                                                            "nothing. Exit 2, after the commands, with the refusal "
                                                            "when the real run would be refused on this testbed.")
                       ] = False,
    collect: Annotated[bool, typer.Option("--collect", help="Collect outputs into results/ afterwards.")] = False,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="Skip applying the suite's profile.")] = False,
    source: Annotated[list[str] | None, typer.Option("--source", help="NAME=PATH|URL[@REF]: run a suite source or "
                                                                      "profile build from a local checkout, a fork "
                                                                      "or a mirror (repeatable).")] = None,
    budget: Annotated[str | None, typer.Option("--budget", help="With --matrix: stop starting points once the next "
                                                                "one's estimate would pass this: hours (40h), "
                                                                "SUs (500 SU) or dollars ($120); rerun to resume "
                                                                "(testbed plan shows the estimates).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a suite on a testbed: setup, prepare, launch detached ranks, faults, recovery, post.

    Ctrl-C detaches (the run goes on); testbed status RUN and testbed logs RUN -f reattach.

    Example: testbed run my-suite --on local
    """
    # lazy: testbed --help and completion load every command module
    from testbed import services
    from testbed import sources as sources_mod
    from testbed import suite as suite_mod
    from testbed.records import OUTCOMES
    from testbed.spec import DEFAULT_TESTBED

    bud = _parse_budget(budget, matrix)
    s = _warn_todos(suite_mod.load_suite(suite))
    given = suite_mod.parse_assignments(param or [])
    src = sources_mod.parse(source or [])
    faults = _faults(fault, no_faults)
    tb = on or s.testbed or DEFAULT_TESTBED
    if matrix:
        return _campaign(s, tb, given, faults, detach, dry_run, no_setup, collect, json_out, src, bud)
    if dry_run:
        refuse_unknown_tables(s)
        _lint_warnings(s, [suite_mod.resolve_params(s, given)])
        plan = services.plan(s, on, given, faults=faults, dry_run=True, sources=src, store=existing_store())
        _show_dry_run(plan, json_out)  # a dry run creates nothing
        return _warn_refused(plan)
    st = store()
    target = Resolved.open(tb, st)
    plan = _with_setup_view(target, s, no_setup, lambda on_event: services.start(
        target, s, given, faults=faults, with_setup=not no_setup, sources=src, on_event=on_event)).plan
    run_id = plan.run_id
    c = console(stderr=True)
    c.print(f"run [bold]{run_id}[/bold] on {plan.testbed} "
            f"({plural(len(plan.ranks), 'rank')} on {', '.join(plan.host_names)})")
    if detach:
        if json_out:
            print_json({"run_id": run_id, "status": "pending"})
        else:
            c.print(f"detached: testbed status {run_id} | testbed logs {run_id} -f")
        return
    try:
        row = follow(run_id, c, st)
    except KeyboardInterrupt:
        raise typer.Exit(Exit.INTERRUPTED) from None
    collected = _collect([run_id]) if collect else []
    if json_out:
        print_json(row.to_json())
    if row.status != "succeeded":
        raise TestbedError(f"run {run_id} {row.status}: {row.reason or 'no reason recorded'}",
                           where=f"testbed status {run_id}", fix=f"testbed logs {run_id}",
                           code=OUTCOMES.get(row.status, 1))
    c.print(run_line(run_id, collected[0].path if collected else None, c, f"{s.name}/{run_id}" * bool(s.references)))


def run_line(run_id: str, folder: Path | None, c: Console, pending: str | None = None) -> str:
    """The one line after a run that succeeded: with its folder collected (``--collect``), its report is built and
    the line says the status and the verdicts side by side (``succeeded, but 1 of 4 verdicts outside tolerance``,
    red), never a bare green "succeeded" over an outside tolerance; else the status, and (``pending``: the suite
    has references, its results folder ``suite/run``) that its verdicts are not judged yet and how to get them."""
    if folder is None:
        return f"[green]run {run_id} succeeded[/green]" + (
            f"; verdicts not judged yet: testbed collect {run_id} && testbed report results/{escape(pending)}"
            if pending else "")
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError
    from testbed.report.build import build_report
    from testbed.report.verdicts import headline, headline_tone

    c.print(f"[dim]…[/dim] reporting {escape(run_id)} (its verdicts)")
    try:
        rr = build_report(folder)
    except UsageError as e:
        return f"[green]run {run_id} succeeded[/green] (no report: {escape(e.what)})"
    colour = {"good": "green", "bad": "red", "unsure": "yellow"}[headline_tone("succeeded", rr.verdicts)]
    return (f"[{colour}]run {run_id} {escape(str(headline('succeeded', rr.verdicts)))}[/{colour}] "
            f"(report: {escape(str(rr.path))})")


def _faults(given: list[str] | None, none: bool) -> list[str] | None:
    """--fault and --no-faults as the plan takes them: [] for none, None for the suite's defaults."""
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError

    if none and given:  # two answers to one question: refused before anything is planned or built
        raise UsageError(f"--fault {given[0]} and --no-faults ask for opposite things", where="command line",
                         fix="give --fault NAME to fire that fault, or --no-faults to fire none")
    twice = next((f for i, f in enumerate(given or []) if f in (given or [])[:i]), None)
    if twice is not None:
        raise UsageError(f"--fault {twice} is given twice", where="--fault", fix="name each fault once")
    return [] if none else (given or None)


def _parse_budget(text: str | None, matrix: bool) -> Budget | None:
    """``--budget`` read strictly (a testbed.estimate.Budget), before anything else; None when not given."""
    if text is None:
        return None
    # lazy: testbed --help and completion load every command module
    from testbed import estimate
    from testbed.errors import UsageError

    if not matrix:
        raise UsageError("--budget limits a campaign: it needs --matrix", where="--budget",
                         fix="add --matrix (one run is not cut short by a budget: see testbed plan SUITE)")
    try:
        return estimate.parse_budget(text)
    except ValueError as e:
        raise UsageError(str(e), where="--budget", fix=f"write {estimate.BUDGET_RULE}") from None


def _with_setup_view(tb: Resolved, s: Suite, no_setup: bool, work: Callable[[EventHandler | None], T]) -> T:
    """``work`` under the live view of the suite's set-up (none with --no-setup or no profile), its summary
    printed after, a failed one's too."""
    if no_setup or not s.profile:
        return work(None)
    # lazy: testbed --help and completion load every command module
    from testbed.cli import setup_view
    from testbed.errors import HostsFailed
    from testbed.setup.events import SetupResult

    err = console(stderr=True)
    try:
        with setup_view.live([h.name for h in tb.hosts], f"setup {tb.name}", err) as on_event:
            out = work(on_event)
    except HostsFailed as e:
        if isinstance(e.results, SetupResult):
            err.print(setup_view.render_summary(e.results))
        raise
    done = getattr(out, "setup", None)
    if isinstance(done, SetupResult):
        err.print(setup_view.render_summary(done))
    return out


def _collect(run_ids: list[str]) -> list[CollectResult]:
    """``run --collect``: the run's outputs into results/ as soon as it ended; problems are one error. What each
    run's collect did (its folder in ``path``)."""
    from pathlib import Path

    # lazy: testbed --help and completion load every command module
    from testbed import collect, services

    results = services.collect(run_ids, Path(RESULTS))
    for r in results:
        console(stderr=True).print(f"collected {r.run_id} -> {r.path} ({plural(r.files_sent, 'file')} sent)")
    problem = collect.format_problems(results)
    if problem is not None:
        raise problem
    return list(results)


def _warn_refused(plan: RunPlan) -> None:
    """A dry run the real run would refuse (the suite's provider or accelerator): after the commands, the same
    refusal as one error, exit 2, as the real run would end (before touching a host)."""
    if not plan.refused:
        return
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError

    r = plan.refused[0]
    more = f" (and {len(plan.refused) - 1} more)" if len(plan.refused) > 1 else ""
    raise UsageError(f"dry run shown above, but the real run would be refused: {r['what']}{more}",
                     where=r.get("where"), fix=r.get("fix"))


def refuse_unknown_tables(s: Suite) -> None:
    """A reference or check naming a table that no parser, declared table or report.py makes (or a broken
    report.py) is one error naming the suite's file:line (testbed.report.declared.unknown_tables)."""
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError
    from testbed.report.declared import unknown_tables

    errors = unknown_tables(s)
    if errors:
        e = errors[0]
        more = f" (and {plural(len(errors) - 1, 'more such name')})" if len(errors) > 1 else ""
        raise UsageError(e.what + more, where=e.where, fix=e.fix)


def _lint_warnings(s: Suite, points: list[dict[str, Any]] | None = None) -> None:
    """The suite's static findings (testbed.lint), one warning line each on stderr: what would break on the
    rented machine and can be read from the files already."""
    # lazy: testbed --help and completion load every command module
    from testbed import lint

    c = console(stderr=True)
    for f in lint.lint_suite(s, points):
        c.print(f"[yellow]warning[/yellow]: {escape(f.line())}")


def _show_dry_run(plan: RunPlan, json_out: bool) -> None:
    from rich.markup import escape

    # lazy: testbed --help and completion load every command module
    from testbed.run.plan import dry_run_lines

    lines = dry_run_lines(plan)
    if json_out:
        print_json({"run_id": plan.run_id, "testbed": plan.testbed, "params": plan.params,
                    "hosts": [h.model_dump() for h in plan.hosts], "commands": lines, "refused": plan.refused})
        return
    c = console()
    note = " (placeholder hosts: the testbed is not provisioned)" if plan.placeholder_hosts else ""
    c.print(f"[bold]dry run[/bold] of {plan.suite} on {plan.testbed}{note}; run dir {plan.run_dir}")
    c.print("params: " + escape(", ".join(f"{k}={v}" for k, v in plan.params.items())))
    for h in plan.hosts:
        c.print(f"\n[bold]{h.name}[/bold] ({h.address})")
        for i, ln in enumerate(x for x in lines if x["host"] == h.name):
            rank = f" rank {ln['rank']}" if ln["rank"] is not None and ln["phase"] != "launch" else ""
            where = f" [dim](in {escape(ln['cwd'])})[/dim]" if ln["cwd"] and ln["cwd"] != plan.run_dir else ""
            c.print(f"  {i + 1:>2}. [cyan]{ln['phase']}[/cyan] {escape(ln['step'])}{rank}{where}: ", end="")
            c.out(ln["command"], highlight=False)


def _campaign(s: Suite, tb: str, given: dict[str, str], faults: list[str] | None, detach: bool, dry_run: bool,
              no_setup: bool, collect: bool, json_out: bool, src: dict[str, str] | None = None,
              budget: Budget | None = None) -> None:
    # lazy: testbed --help and completion load every command module
    from testbed import services
    from testbed import suite as suite_mod
    from testbed.expiry import span

    points = suite_mod.expand_matrix(s, given)
    st = existing_store() if dry_run else store()
    if dry_run:
        refuse_unknown_tables(s)
        _lint_warnings(s, points)
        plans, order = services.campaign_dry_run(s, tb, points, faults=faults, sources=src, store=st)
        if json_out:
            # lazy: testbed --help and completion load every command module
            from testbed.run.plan import dry_run_lines

            print_json([{"params": p.params, "reads": o["reads"], "commands": dry_run_lines(p), "refused": p.refused}
                        for p, o in zip(plans, order, strict=True)])
        else:
            _show_order(order)
            for p in plans:
                _show_dry_run(p, False)
        return _warn_refused(next((p for p in plans if p.refused), plans[0])) if plans else None
    target = Resolved.open(tb, st)
    started = _with_setup_view(target, s, no_setup, lambda on_event: services.start_campaign(
        target, s, given, faults=faults, sources=src, budget=budget, with_setup=not no_setup, on_event=on_event))
    cid = started.campaign_id
    c = console(stderr=True)
    c.print(f"campaign [bold]{cid}[/bold]: {plural(len(points), 'run')} of {s.name} on {tb}"
            + (f"; budget {escape(budget.given)} ({span(started.budget_seconds)} of this testbed)"
               if budget and started.budget_seconds is not None else ""))
    if detach:
        services.detach_campaign(cid)
        if json_out:
            print_json({"campaign": cid, "status": "running", "points": len(points)})
        else:
            c.print(f"detached: testbed list runs; rerun the same command to follow or resume {cid}")
        return
    try:
        row = services.drive_campaign(cid, progress=lambda line: c.print(line), store=st)
    except KeyboardInterrupt:
        c.print(f"[yellow]detached[/yellow]: started runs go on; rerun the same command to resume {cid}")
        raise typer.Exit(Exit.INTERRUPTED) from None
    ids = [p.run_id for p in row.points if p.run_id]
    if collect:
        _collect(ids)
    if json_out:
        print_json(row.to_json())
    if row.status == "paused" and row.info.stopped:
        _paused(c, cid, row.info.stopped)
        raise typer.Exit(Exit.STOPPED)
    ok = sum(p.status == "succeeded" for p in row.points)
    colour = "green" if ok == len(row.points) else "red"
    c.print(f"campaign {cid} [{colour}]{escape(row.status)}[/{colour}]: {ok}/{plural(len(row.points), 'run')} "
            "succeeded")
    for pt in row.points:
        if pt.status != "succeeded":
            run = st.run(pt.run_id) if pt.run_id else None
            c.print(f"  {escape(pt.run_id or '-')} {escape(pt.status)}"
                    + (f": {escape(run.reason)}" if run is not None and run.reason else "")
                    + (f" (testbed logs {pt.run_id})" if pt.run_id else ""))
    if ok != len(row.points):
        raise typer.Exit(Exit.FAILED)


def _kv(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _show_order(order: list[dict[str, Any]]) -> None:
    """The campaign's order, where a point reads another's output (``after:``): each point, and what it reads."""
    if not any(o["reads"] for o in order):
        return
    c = console()
    c.print("[bold]order[/bold] (a point runs after the points it reads):")
    for i, o in enumerate(order, 1):
        reads = "; ".join(f"reads {n}: point {r['point']} ({r['label']})" for n, r in o["reads"].items())
        c.print(f"  {i}. {escape(o['label'])}" + (f"  <- {escape(reads)}" if reads else ""))


def plan_cmd(
    suite: SuiteArg,
    on: Annotated[str | None, typer.Option("--on", help="Testbed (default: the suite's, else local).",
                                           autocompletion=complete.testbeds)] = None,
    param: ParamOpt = None,
    matrix: Annotated[bool, typer.Option("--matrix", help="Every point of the suite's matrix (-p values filter "
                                                          "the points).")] = False,
    fault: Annotated[list[str] | None, typer.Option("--fault", help="Faults, as run takes them (they name the "
                                                                    "campaign).", autocompletion=complete.faults)]
    = None,
    no_faults: Annotated[bool, typer.Option("--no-faults", help="As run --no-faults.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Time and cost of a run or campaign before it starts: each point's estimated wall time and where it comes
    from (earlier runs of the point, else the suite's estimate), the total, its cost in the provider's unit, and
    whether it fits in the testbed's lease or expiry. Points a campaign already finished are not counted again.
    Touches no host (the commands themselves: run --dry-run).

    Example: testbed plan my-suite --matrix --on local
    """
    # lazy: testbed --help and completion load every command module
    from testbed import suite as suite_mod
    from testbed.run import forecast

    given = suite_mod.parse_assignments(param or [])
    fc = forecast.forecast(suite, on, given, matrix=matrix, faults=_faults(fault, no_faults),
                           store=existing_store())
    if json_out:
        print_json(fc.to_json())
        return
    _show_forecast(fc)


def _show_forecast(fc: Forecast) -> None:
    from rich.table import Table

    # lazy: testbed --help and completion load every command module
    from testbed.expiry import span

    c = console()
    r = fc.rate
    price = f"{r.per_hour:g} {r.unit}/h: {r.basis}" if r.per_hour is not None else r.basis
    c.print(f"[bold]plan[/bold] of {escape(fc.suite)} on {escape(fc.testbed)} ({escape(fc.provider)}, "
            f"{plural(fc.hosts, 'host')}; {escape(price)})"
            + (f"; resumes campaign {escape(fc.campaign)}" if fc.campaign else ""))
    t = Table(title_justify="left")
    after = any(p.reads for p in fc.points)  # the order matters: number the points, say what each reads
    for col in ("#", "point", "reads", "hosts", "estimate", "status", "from"):
        if col in ("#", "reads") and not after:
            continue
        t.add_column(col, no_wrap=col in ("hosts", "estimate"), ratio=2 if col in ("point", "from") else None)
    for i, p in enumerate(fc.points, 1):
        status = p.status if p.status == "todo" else f"{p.status} ({span(p.spent or 0)})"
        t.add_row(*([str(i)] if after else []), escape(p.label), *([escape("; ".join(p.reads))] if after else []),
                  str(p.hosts), span(p.seconds) if p.seconds is not None else "?", escape(status), escape(p.source))
    c.print(t)
    for note in fc.notes:
        c.print(f"[yellow]note[/yellow]: {escape(note)}")
    unit = r.unit or ""
    if fc.spent_seconds:
        spent_cost = r.cost(fc.spent_seconds)
        c.print(f"spent: {span(fc.spent_seconds)} (the campaign's runs so far)"
                + (f" ({spent_cost:g} {unit})" if spent_cost else ""))
    if fc.total_seconds is None:
        c.print(f"[yellow]total: unknown[/yellow]: no estimate for {escape(', '.join(fc.unknown))} (add "
                "'estimate:' to the suite, or run the point once)")
        return
    cost = fc.cost
    c.print(f"total: [bold]{span(fc.total_seconds)}[/bold] of wall time left"
            + (f", cost [bold]{cost:g} {unit}[/bold]" if cost is not None and r.per_hour else ", free"))
    fit = fc.fit
    if fit["fits"] is None:
        c.print(f"fits: no end to fit in ({escape(fit['basis'])})")
    elif fit["fits"]:
        c.print(f"fits: [green]yes[/green], {span(fit['left_seconds'])} left ({escape(fit['basis'])})")
    else:
        c.print(f"fits: [red]no[/red], short by {span(fit['short_by_seconds'])}: {span(fit['left_seconds'])} left "
                f"({escape(fit['basis'])}); extend it (testbed extend), or plan fewer points (-p)")


def _paused(c: Console, cid: str, stopped: dict[str, Any]) -> None:
    """A campaign its budget stopped: what it spent (actual run times), what is left, how to resume."""
    unit = stopped["unit"]

    def amt(x: float | None) -> str:
        return "?" if x is None else f"{x:.4g} h" if unit == "hours" else f"{x:.4g} {unit}"

    c.print(f"campaign {cid} [yellow]paused[/yellow] by its budget ({escape(stopped['budget']['given'])}): spent "
            f"{amt(stopped['spent'])} ({stopped['spent_seconds']:.0f} s of runs), {amt(stopped['left'])} left; "
            f"{plural(stopped['not_started'], 'point')} not started (the next estimated at "
            f"{stopped['next_estimate_seconds'] or 0:.0f} s)")
    c.print("resume: the same command again, with a larger --budget or none")


def logs(
    run_id: Annotated[str, typer.Argument(help="Run id.", autocompletion=complete.runs)],
    host: Annotated[str | None, typer.Option("--host", "-H", help="Only this host's ranks.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the run ends (reattaches).")] = False,
) -> None:
    """Print the ranks' stdout and stderr from the hosts' run dirs (prefixed host:rank).

    Example: testbed logs my-suite-20250101-120000-ab12 -f
    """
    import sys

    # lazy: testbed --help and completion load every command module
    from testbed.run import bookkeeping as state
    from testbed.run import runner

    st = existing_store(readonly=False)  # --follow may restart the run's supervisor; no state is created
    try:
        for ln in runner.logs(run_id, host=host, follow=follow, store=st):
            if ln.stream == "error":
                sys.stderr.write(f"[{ln.host} rank {ln.rank}] {ln.text}\n")
            elif ln.stream == "note":  # the output shown is right, but not all of it: said on stderr, exit 0
                sys.stderr.write(f"note: [{ln.host} rank {ln.rank}] output truncated: {ln.text}\n")
            else:
                out = sys.stdout if ln.stream == "out" else sys.stderr
                out.write(f"[{ln.host}:{ln.rank}] {ln.text}\n")
                out.flush()
    except KeyboardInterrupt:
        sys.stderr.write(f"detached from the logs; run {run_id} goes on\n")
        return
    if follow:
        row = state.require(st, run_id)
        sys.stderr.write(f"run {run_id} {row.status}" + (f": {row.reason}" if row.reason else "") + "\n")


def stop(run_id: Annotated[str, typer.Argument(help="Run id.", autocompletion=complete.runs)]) -> None:
    """Stop a running run: every rank's processes get TERM, then KILL; status becomes stopped.

    Example: testbed stop my-suite-20250101-120000-ab12
    """
    # lazy: testbed --help and completion load every command module
    from testbed import services

    row = services.stop(run_id, store=existing_store(readonly=False))  # an unknown run: refused, nothing created
    console().print(f"run {run_id}: {row.status}" + (f" ({row.reason})" if row.reason else ""))


def follow(run_id: str, c: Console, st: Store) -> RunRecord:
    """Print the run's events until it ends; Ctrl-C detaches (the run goes on). The run as it ended.

    On a terminal, a live status line sits under the events: the run's state and time so far, and what each rank
    last printed (the suite's ``progress`` lines, else each rank's last line), read every few seconds."""
    # lazy: testbed --help and completion load every command module
    from testbed.run import bookkeeping as state
    from testbed.run import runner

    live = _LiveRun(run_id, state.load_plan(run_id)) if c.is_terminal else None
    try:
        with live.shown(c) if live else contextlib.nullcontext():
            for ev in runner.watch(run_id, store=st):
                c.print(f"[dim]{runner.clock(ev.ts)}[/dim] {escape(runner.describe_event(ev))}")
                if live:
                    live.status = runner.describe_event(ev)
    except KeyboardInterrupt:
        c.print(f"[yellow]detached[/yellow]: run {run_id} goes on. Reattach: testbed status {run_id} | "
                f"testbed logs {run_id} -f | stop: testbed stop {run_id}")
        raise
    return state.require(st, run_id)


def progress_view(run_id: str, last: str, elapsed: float, lines: list[RankLine], most: int = 8) -> Group:
    """The live status line of a followed run: its id, time so far and last event, then each rank's last line
    (host, rank, text), one row each, cut at the terminal's width rather than wrapped."""
    from rich.console import Group
    from rich.spinner import Spinner
    from rich.text import Text

    m, sec = divmod(int(elapsed), 60)
    head = Text.assemble((f"run {run_id}", "bold"), f"  {m}m{sec:02d}s  ", (last, "dim"), "  (Ctrl-C detaches)",
                         no_wrap=True, overflow="ellipsis")
    rows: list[Spinner | Text] = [Spinner("dots", head)]
    for ln in lines[:most]:
        rows.append(Text.assemble((f"  {ln.host} r{ln.rank}  ", "cyan"), ln.text, no_wrap=True, overflow="ellipsis"))
    if len(lines) > most:
        rows.append(Text(f"  … {plural(len(lines) - most, 'more rank')}: testbed logs {run_id} -f", style="dim"))
    return Group(*rows)


class _LiveRun:
    """The live status line under a followed run's events, and the thread that reads the ranks' last lines."""

    every = 3.0  # seconds between two reads of the ranks' last lines
    most = 8  # ranks shown; the rest counted

    def __init__(self, run_id: str, plan: RunPlan) -> None:
        import time

        self.run_id, self.plan, self.t0 = run_id, plan, time.monotonic()
        self.status = "starting"
        self.lines: list[RankLine] = []

    def render(self) -> Group:
        import time

        return progress_view(self.run_id, self.status, time.monotonic() - self.t0, self.lines, self.most)

    @contextlib.contextmanager
    def shown(self, c: Console) -> Iterator[None]:
        import threading

        from rich.live import Live

        # lazy: testbed --help and completion load every command module
        from testbed.errors import TestbedError
        from testbed.run import runner

        done = threading.Event()

        def read() -> None:
            while not done.wait(self.every):
                try:
                    self.lines = runner.rank_lines(self.plan)
                except TestbedError:
                    continue  # the hosts may be between a repair and a relaunch: the next read tells

        reader = threading.Thread(target=read, name="rank-lines", daemon=True)
        with Live(get_renderable=self.render, console=c, refresh_per_second=2, transient=True):
            reader.start()
            try:
                yield
            finally:
                done.set()
                reader.join(timeout=15)


def show_run_status(run_id: str, json_out: bool) -> None:
    """``testbed status RUN``: the run, each rank's status and exit, and its fault/recovery events."""
    import time

    from rich.table import Table

    # lazy: testbed --help and completion load every command module
    from testbed.run import runner

    rs = runner.run_status(run_id, store=existing_store(readonly=False))
    if json_out:
        return print_json(rs.to_json())
    run, clock = rs.run, runner.clock
    c = console()
    color = {"succeeded": "green", "failed": "red", "timed-out": "red", "running": "cyan",
             "stopped": "yellow"}.get(run.status, "white")
    c.print(f"run [bold]{run_id}[/bold]  suite {run.suite}  testbed {run.testbed}  [{color}]{run.status}[/{color}]"
            + (f": {escape(run.reason)}" if run.reason else ""))
    if run.params:
        c.print("params: " + escape(", ".join(f"{k}={v}" for k, v in run.params.items())))
    if run.started:
        end = run.ended or time.time()
        c.print(f"started {iso(run.started)}, {'ended ' + str(iso(run.ended)) if run.ended else 'running'}"
                f" ({end - run.started:.1f} s)")
    t = Table(title_justify="left")
    for col in ("rank", "host", "status", "exit", "reason"):
        t.add_column(col)
    for r in rs.ranks:
        t.add_row(str(r.rank), r.host, r.status, "" if r.exit_code is None else str(r.exit_code),
                  escape(r.reason or ""))
    c.print(t)
    for e in rs.events:
        if e.kind in ("fault", "fault-missed", "failed", "recovery", "relaunched", "restore", "stopping"):
            c.print(f"[dim]{clock(e.ts)}[/dim] {escape(runner.describe_event(e))}")
    if rs.restarted:
        c.print("[yellow]its supervisor had stopped; restarted it (monitoring resumes)[/yellow]")
    c.print(f"run dir on each host: {run.info.run_dir}")
    return None


def show(suite: Annotated[str, typer.Argument(help="Suite name or .yml path.",
                                              autocompletion=complete.suites)],
         on: Annotated[str | None, typer.Option("--on", help="Judge the suite against this testbed: exit 2 when a "
                                                             "run there would be refused (its provider, GPUs, a "
                                                             "default fault it cannot fire).",
                                                autocompletion=complete.testbeds)] = None,
         json_out: JsonOpt = False) -> None:
    """Describe a suite: requirements, profile, parameters, matrix, steps and faults; its static findings
    (what would break on the rented machine, read from the files) as warnings on stderr.

    Example: testbed show my-suite --on local
    """
    from rich.markup import escape

    # lazy: testbed --help and completion load every command module
    from testbed import suite as suite_mod

    s = suite_mod.load_suite(suite)
    refuse_unknown_tables(s)
    _lint_warnings(s)
    _judge_on(s, on)
    todos = to_fill_in(s)
    if json_out:
        print_json({**s.model_dump(mode="json"), "source": s.source,
                    "to_fill_in": [{"where": w, "todo": t} for w, t in todos]})
        return
    c = console()
    c.print(f"[bold]{s.name}[/bold]: {escape(s.description.strip())}")
    c.print(f"file: {s.source}")
    r = s.requires
    c.print(f"requires: {r.hosts}+ hosts" + (f", providers {', '.join(r.providers)}" if r.providers else "")
            + (f", accelerator {r.accelerator}" if r.accelerator else "")
            + (f"; default testbed {s.testbed}" if s.testbed else "") + (f"; profile {s.profile}" if s.profile else ""))
    rendered = _rendered(s, on)  # templates shown as the default testbed renders them, never as raw Jinja
    if s.parameters:
        c.print("parameters:")
        for k, p in s.parameters.items():
            extra = f" one of {p.choices}" if p.choices else ""
            value = f"{p.default!r}"
            if isinstance(p.default, str) and suite_mod.is_template(p.default):
                value = (f"{rendered.params[k]!r} on {rendered.testbed} (rendered per testbed)"
                         if rendered is not None and k in rendered.params else "(a template, rendered per testbed)")
            c.print(f"  {k} ({p.type}) = {escape(value)}{extra}  {escape(p.help)}")
    if s.matrix:
        n = len(s.matrix) if isinstance(s.matrix, list) else len(suite_mod.expand_matrix(s, {}))
        c.print(f"matrix: {plural(n, 'point')} (testbed run {s.name} --matrix)" + "".join(
            f"; {escape(_kv(a.point) or 'every point')} reads {escape(_kv(a.reads))} ({{{{ reads.{a.name} }}}})"
            for a in s.after))
    c.print(f"steps: prepare {len(s.steps.prepare)}, launch on {s.steps.launch.on} "
            f"({s.steps.launch.ranks_per_host}/host), recovery {len(s.steps.recovery)}, post {len(s.steps.post)}")
    whens = {fp.name: fp.when for fp in rendered.faults} if rendered is not None else {}
    for name, f in s.faults.items():
        when = whens.get(name) or f.when
        if when and suite_mod.is_template(when):
            when = "a pattern rendered per point"
        trig = f"at {f.at:g} s" if f.at is not None else f"when /{when}/"
        dflt = " (default)" if name in s.default_faults else ""
        c.print(f"fault {name}{dflt}: {f.action} {trig}  {escape(f.description)}")
    if todos:
        c.print(f"to fill in: {plural(len(todos), 'TODO')}")
        for where, text in todos:
            c.print(f"  {escape(where)}: {escape(text)}", emoji=False)


def _warn_todos(s: Suite) -> Suite:
    """Say on stderr that suite ``s`` still has TODO comments (a draft of testbed new), and where the first is;
    return ``s``."""
    todos = to_fill_in(s)
    if todos:
        console(stderr=True).print(f"[yellow]warning[/yellow]: {plural(len(todos), 'TODO')} left to fill in, the "
                                   f"first at {escape(todos[0][0])}: {escape(todos[0][1])} (testbed show "
                                   f"{escape(s.name)} lists them)", emoji=False)
    return s


def to_fill_in(s: Suite) -> list[tuple[str, str]]:
    """The TODO comments of the suite's file, as (file:line, comment): what a drafted suite still lacks."""
    from pathlib import Path

    # lazy: testbed --help and completion load every command module
    from testbed.drafting import todo_comments
    from testbed.yamlfile import read_text

    if not s.source:
        return []
    return [(f"{s.source}:{n}", text) for n, text in todo_comments(read_text(Path(s.source)))]


def _judge_on(s: Suite, on: str | None) -> None:
    """Judge the suite against testbed ``on`` (else its own ``testbed:``): each fault that could not fire there is
    a warning; with ``on``, what refuses a default run there is an error (exit 2), else a warning too."""
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError
    from testbed.run.runner import testbed_refusals

    name = on or s.testbed
    if not name:
        return
    refused, others = testbed_refusals(s, name, store=existing_store())
    c = console(stderr=True)
    for e in others + ([] if on else refused):
        c.print(f"[yellow]warning[/yellow]: {escape(e.what)} ({escape(str(e.where))}); fix: {escape(str(e.fix))}")
    if on and refused:
        more = f" (and {plural(len(refused) - 1, 'more refusal')})" if len(refused) > 1 else ""
        raise UsageError(refused[0].what + more, where=refused[0].where, fix=refused[0].fix)


def _rendered(s: Suite, on: str | None = None) -> RunPlan | None:
    """The suite's dry-run plan on its default testbed with every fault, whose values ``show`` prints for the
    templates; None when it cannot be planned there (the templates are then said to be rendered per testbed)."""
    # lazy: testbed --help and completion load every command module
    from testbed import services
    from testbed.errors import TestbedError
    from testbed.run.plan import NO_TESTBED

    try:
        plan = services.plan(s, on, dry_run=True, faults=list(s.faults), store=existing_store())  # read-only
    except TestbedError:
        return None
    return plan if plan.testbed != NO_TESTBED else None  # no testbed to render them for


def list_suites(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Suites found in experiments/ (this folder's first, then the shipped ones) and those fetched from git into
    the state home, each with where it comes from. Example: testbed list suites"""
    # lazy: testbed --help and completion load every command module
    from testbed import suite as suite_mod
    from testbed import suite_fetch
    from testbed.errors import TestbedError

    json_out = json_wanted(ctx, json_out)
    rows: list[dict[str, Any]] = []
    found = [*suite_mod.list_suites().items(), *((None, p) for p in suite_fetch.fetched_suites())]
    for name, path in found:
        origin = suite_fetch.origin(path)
        try:
            s = suite_mod.load_suite(str(path))
            rows.append({"name": s.name, "description": s.description.strip().splitlines()[0] if s.description
                         else "", "testbed": s.testbed or "", "matrix": bool(s.matrix), "path": str(path),
                         "origin": origin})
        except TestbedError as e:
            rows.append({"name": name or path.parent.name, "description": f"INVALID: {e.what}", "testbed": "",
                         "matrix": False, "path": str(path), "origin": origin})
    if json_out:
        print_json(rows)
        return
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="suites", title_justify="left")
    for col in ("name", "from", "testbed", "matrix", "description"):
        t.add_column(col, no_wrap=col in ("name", "testbed"))  # names are never cut in two
    for r in rows:
        where = suite_fetch.origin_text(r["origin"])
        where = r["path"] if where == "path" else where
        t.add_row(str(r["name"]), escape(where), str(r["testbed"]), "yes" if r["matrix"] else "",
                  escape(str(r["description"])))
    console().print(t)


def rehearse(
    suite: SuiteArg,
    like: Annotated[str | None, typer.Option("--like", help="The real testbed to replicate (default: the suite's).",
                                             autocompletion=complete.testbeds)] = None,
    param: ParamOpt = None,
    matrix: Annotated[bool, typer.Option("--matrix", help="Rehearse every point of the suite's matrix.")] = False,
    shapes: Annotated[bool, typer.Option("--shapes", help="With --matrix: only the first point of each distinct "
                                                          "step shape (the programs its steps and ranks run).")
                      ] = False,
    source: Annotated[list[str] | None, typer.Option("--source", help="NAME=PATH: a local checkout of a suite "
                                                                      "source (the replica has no network).")] = None,
    fault: Annotated[list[str] | None, typer.Option("--fault", help="Fault to fire on each point, as run takes it "
                                                    "(repeatable); default: the suite's default_faults.",
                                                    autocompletion=complete.faults)] = None,
    no_faults: Annotated[bool, typer.Option("--no-faults", help="Fire no fault at all.")] = False,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="Do not apply the suite's profile.")] = False,
    role: Annotated[list[str] | None, typer.Option("--role", help="Apply only these roles of the profile "
                                                                  "(repeatable).")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the replica afterwards (testbed destroy NAME).")] = False,
    to: Annotated[str, typer.Option("--to", help="Where the rehearsal's outputs and reports go.")] = RESULTS,
    subnet: Annotated[str | None, typer.Option("--subnet", help="The replica's private subnet (default: the first "
                                                                   "free /24 from 10.219.0.0/24).")] = None,
    site: Annotated[str | None, typer.Option("--site", help="site-packages a stand-in for the suite's environment "
                                                            "sees, where the profile did not make it (default: "
                                                            "testbed's own when it holds torch).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Rehearse a suite end to end on local hosts shaped like its real testbed, before renting it.

    Same host count, names, user, login shell, shared home and interface names; the suite's profile applied as far
    as these hosts allow; every step run for real. Steps that need a GPU, CUDA, a TPU or the network are skipped
    with the reason; ranks that need one start through their real launcher and the program is replaced by a probe
    that checks its folder, files, argv (against its own parser) and environment. Outputs are collected and
    reported, marked as a rehearsal. Exit 0 when the rehearsal found nothing the real run would trip on.

    Example: testbed rehearse my-suite -p gpus=2 --source app=~/src/my-app
    """
    from pathlib import Path

    # lazy: testbed --help and completion load every command module
    from testbed import rehearse as rehearse_mod
    from testbed import sources as sources_mod
    from testbed import suite as suite_mod
    from testbed.cli.output import waiting

    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError
    from testbed.providers.local.settings import subnet_problem

    if subnet is not None and (why := subnet_problem(subnet)) is not None:  # the user's flag, not a generated file
        raise UsageError(f"--subnet {subnet}: {why}", where="--subnet", fix="give a free private subnet, such as "
                                                                             "--subnet 10.219.7.0/24")
    c = console(stderr=True)
    with waiting(f"rehearsing {suite}"):
        res = rehearse_mod.rehearse(suite, suite_mod.parse_assignments(param or []), like=like, matrix=matrix,
                                    shapes=shapes, sources=sources_mod.parse(source or []), setup=not no_setup,
                                    roles=role, keep=keep, to=Path(to), subnet=subnet, site=site,
                                    faults=_faults(fault, no_faults), say=lambda m: c.print(escape(m)))
    if json_out:
        print_json(res.to_json())
    else:
        _show_rehearsal(res)
    if not res.ok:
        raise typer.Exit(Exit.FAILED)


def _show_rehearsal(res: RehearsalResult) -> None:
    out = console()
    if res.findings:  # the static checks failed: no replica was made
        out.print(f"[bold]rehearsal of {escape(res.suite)}[/bold] [red]would fail[/red] before any host: "
                  + plural(len(res.findings), "static finding"))
        for f in res.findings:
            out.print(f"  [red]{escape(f)}[/red]")
        return
    shape = res.shape
    out.print(f"[bold]rehearsal of {escape(res.suite)}[/bold] on {escape(res.replica)}, a replica of "
              f"{escape(res.like)}: {plural(len(shape['hosts']), 'host')} ({escape(', '.join(shape['hosts']))}), user "
              f"{escape(shape['user'])}" + (", shared home" if shape.get("shared_home") else "")
              + (f", interface {escape(str(shape['interface']))}" if shape.get("interface") else "")
              + (f", GPU {escape(str(shape['gpu_model']))} (declared, not present)" if shape.get("gpu_model") else ""))
    st = res.setup
    if st.get("applied"):
        out.print(f"set-up: {escape(st['applied'])} " + ("ok" if st.get("ok") else "[red]failed[/red]")
                  + (f" in {st['seconds']} s" if "seconds" in st else ""))
        for host, err in (st.get("failed") or {}).items():
            out.print(f"  {escape(host)}: {escape(str(err))}")
    else:
        out.print(f"set-up: not applied ({escape(str(st.get('why', '')))})")
    if st.get("stand_in_environment"):
        out.print("environment: a stand-in venv on " + escape(", ".join(st["stand_in_environment"]))
                  + " (the profile did not make the suite's environment here)")
    for p in res.points:
        verdict = "[green]rehearsed[/green]" if p.ok else "[red]would fail[/red]"
        proved = bool(p.failures) and p.status == "succeeded"  # it ran, but did not prove what it produced
        cause = p.failures[0] if proved else p.reason
        out.print(f"\n[bold]{escape(p.run_id)}[/bold] {verdict}: run {escape(p.status)}"
                  + ((f", but {escape(cause)}" if proved else f" ({escape(cause)})") if cause else ""))
        for f in p.failures[1:] if p.failures and cause == p.failures[0] else p.failures:
            out.print(f"  [red]{escape(f)}[/red]")
        for s in p.steps:
            out.print(f"  {s.phase:8} {escape(s.name)}: {s.status}" + (f" ({escape(s.reason)})" if s.reason else ""))
        out.print(f"  ranks: {p.ranks}")
        for pr in p.probes:
            out.print(f"    {escape(pr.host)}: {escape(pr.script)} checked by {escape(pr.parsed_by)}: "
                      + ("ok" if not pr.problems else plural(len(pr.problems), "problem")))
            for prob in pr.problems:
                out.print(f"      [red]{escape(prob)}[/red]")
        for line in p.faults:
            out.print(f"  {escape(line)}")
        for glob, hosts in p.produced.items():  # (one that matched nothing is a failure or not rehearsed)
            if hosts:
                out.print(f"  output {escape(glob)}: made on {escape(', '.join(hosts))}")
        for n in p.not_rehearsed:
            out.print(f"  not rehearsed: {escape(n)}")
        if p.folder:
            out.print(f"  outputs and report (a rehearsal, not results): {escape(p.folder)}")


def register(app: typer.Typer, list_app: typer.Typer) -> None:
    """Add run, rehearse, plan, logs, stop, show to ``app`` and ``suites`` to ``list_app``."""
    app.command()(run)
    app.command()(rehearse)
    app.command("plan")(plan_cmd)
    app.command()(logs)
    app.command()(stop)
    app.command()(show)
    list_app.command("suites")(list_suites)


def standalone() -> typer.Typer:
    """An app with only these commands (tests and ``python -m testbed.cli.runs``)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)
    list_app = typer.Typer()
    register(app, list_app)

    @app.command("status")
    def status(run_id: str, json_out: JsonOpt = False) -> None:
        """Status of a run. Example: testbed status RUN"""

        show_run_status(run_id, json_out)

    app.add_typer(list_app, name="list")
    return app


def main() -> None:
    import sys

    # lazy: testbed --help and completion load every command module
    from testbed.errors import TestbedError, front_door
    from testbed.paths import one_command

    try:
        with front_door("cli"), one_command():  # a command line: fixes name its commands and flags
            standalone()()
    except TestbedError as e:
        sys.stderr.write("error: " + e.render() + "\n")
        sys.exit(e.code)


if __name__ == "__main__":
    main()
