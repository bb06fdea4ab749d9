"""``testbed reproduce RUN``: replay a recorded run from its manifest and compare the two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, escape, print_json, store


def reproduce_cmd(
    run: Annotated[Path, typer.Argument(help="The collected run to replay: results/<suite>/<run-id>.")],
    on: Annotated[str | None, typer.Option("--on", help="Testbed (default: the one the run was recorded on).",
                                           autocompletion=complete.testbeds)] = None,
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Replay despite this kind of difference "
                                                    "(repeatable): suite, commit, profile, testbed, hardware.")
                     ] = None,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="Skip applying the suite's profile.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a recorded run again: the same suite file (by hash), parameters and faults, its sources at the
    recorded commits, the same profile; then collect it beside the original and compare the two, metric by
    metric, with the suite's tolerances.

    Before any host is touched it lists what cannot be matched (a changed suite, a source without its commit,
    another testbed or other hardware) and refuses (exit 2) unless --allow names each kind. Exit 1 when the
    replay failed or a metric is outside tolerance; 0 otherwise.

    Example: testbed reproduce results/fault-drill/fault-drill-20240501-120000-ab12 --on local
    """
    from testbed import collect, services
    from testbed import reproduce as rp
    from testbed import sources as sources_mod
    from testbed.cli.runs import _with_setup_view, follow
    from testbed.cli.verdict_view import print_verdicts
    from testbed.records import RunInfo
    from testbed.resolved import Resolved

    st = store()
    replay = rp.prepare(run, on, allow, store=st)  # refuses before any host is touched
    c = console(stderr=True)
    for d in replay.differences:
        c.print(f"[yellow]allowed[/yellow] {d.kind}: {escape(d.what)}")
    target = Resolved.open(replay.testbed, st)
    plan = _with_setup_view(target, replay.suite, no_setup, lambda on_event: services.start(
        target, replay.suite, replay.params, faults=replay.faults, with_setup=not no_setup,
        sources=sources_mod.parse(replay.sources), on_event=on_event)).plan
    run_id = plan.run_id
    st.update_run(run_id, info=RunInfo(reproduces=replay.run_id))
    c.print(f"replay [bold]{run_id}[/bold] of {escape(replay.run_id)} on {plan.testbed}")
    try:
        row = follow(run_id, c, st)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    root = rp.results_root(run)
    results = collect.collect_runs([run_id], to=root)
    problem = collect.format_problems(results)
    if problem is not None:
        raise problem
    verdicts = rp.compare(run, root / replay.suite.name / run_id)
    if json_out:
        print_json({"original": replay.run_id, "replay": run_id, "status": row.status,
                    "differences": [{"kind": d.kind, "what": d.what} for d in replay.differences],
                    "verdicts": [v.to_json() for v in verdicts]})
    else:
        from rich.console import Console

        print_verdicts(Console(highlight=False, soft_wrap=True), verdicts,
                       title=f"{run_id} against {replay.run_id}")
    if row.status != "succeeded" or any(v.within is False for v in verdicts):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``reproduce`` to ``app``."""
    app.command("reproduce")(reproduce_cmd)
