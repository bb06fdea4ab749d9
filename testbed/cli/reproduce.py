"""``testbed reproduce RUN``: replay a recorded run from its manifest and compare the two runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, escape, print_json, store
from testbed.exitcodes import Exit

if TYPE_CHECKING:
    from rich.console import Console

    from testbed.records import RunRecord
    from testbed.reproduce import Replay
    from testbed.state import Store


def reproduce_cmd(
    run: Annotated[Path, typer.Argument(help="The collected run to replay: results/<suite>/<run-id>.")],
    on: Annotated[str | None, typer.Option("--on", help="Testbed (default: the one the run was recorded on).",
                                           autocompletion=complete.testbeds)] = None,
    allow: Annotated[list[str] | None, typer.Option("--allow", help="Replay despite this kind of difference "
                                                    "(repeatable): suite, commit, profile, testbed, hardware.")
                     ] = None,
    suite: Annotated[Path | None, typer.Option("--suite", help="Replay this suite file instead of the copy "
                                               "collect kept in the run folder (compared with the run's hashes).")
                     ] = None,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="Skip applying the suite's profile.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a recorded run again: the suite collect copied into the run folder (or the one --suite names; never
    a file the manifest names outside the folder), the same parameters and faults, its sources at the recorded
    commits, the same profile; then collect it beside the original and compare the two, metric by metric, with
    the suite's tolerances.

    Before any host is touched it lists what cannot be matched (a changed suite, a source without its commit,
    another testbed or other hardware) and refuses (exit 2) unless --allow names each kind; bad input (no
    copy of the suite, a path leading out of the folder, no references) is exit 2 too. After the replay: exit 0
    when every metric is within tolerance, 1 when one is outside or the runs could not be compared (the replay
    failed or timed out, could not be collected, a metric is missing), with the reason.

    Example: testbed reproduce results/my-suite/my-suite-20240501-120000-ab12 --on local
    """
    # lazy: testbed --help and completion load every command module
    from testbed import reproduce as rp

    st = store()
    replay = rp.prepare(run, on, allow, store=st, suite_path=suite)  # refuses before any host is touched
    c = console(stderr=True)
    c.print(f"replaying suite {escape(replay.suite.name)} from {escape(replay.origin)}")
    for d in replay.differences:
        c.print(f"[yellow]allowed[/yellow] {d.kind}: {escape(d.what)}")
    run_id, row = _replay(replay, no_setup, st, c)
    out = rp.conclude(replay, run_id, row.status, row.reason)
    if json_out:
        print_json({"original": replay.run_id, "replay": run_id, "status": row.status, "suite": replay.origin,
                    "differences": [{"kind": d.kind, "what": d.what} for d in replay.differences],
                    "verdicts": [v.to_json() for v in out.verdicts], "problem": out.problem})
    elif out.verdicts:
        from rich.console import Console

        # lazy: testbed --help and completion load every command module
        from testbed.cli.verdict_view import print_verdicts

        print_verdicts(Console(highlight=False, soft_wrap=True), out.verdicts,
                       title=f"{run_id} against {replay.run_id}")
    if out.problem:
        c.print(f"[bold red]not reproduced:[/bold red] {escape(out.problem)}")
    raise typer.Exit(out.code)


def _replay(replay: Replay, no_setup: bool, st: Store, c: Console) -> tuple[str, RunRecord]:
    """Start the replay (its set-up first unless ``no_setup``) and follow it to its end: (run id, its row)."""
    # lazy: testbed --help and completion load every command module
    from testbed import services
    from testbed import sources as sources_mod
    from testbed.cli.runs import _with_setup_view, follow
    from testbed.records import RunInfo
    from testbed.resolved import Resolved

    target = Resolved.open(replay.testbed, st)
    plan = _with_setup_view(target, replay.suite, no_setup, lambda on_event: services.start(
        target, replay.suite, replay.params, faults=replay.faults, with_setup=not no_setup,
        sources=sources_mod.parse(replay.sources), on_event=on_event)).plan
    st.update_run(plan.run_id, info=RunInfo(reproduces=replay.run_id))
    c.print(f"replay [bold]{plan.run_id}[/bold] of {escape(replay.run_id)} on {plan.testbed}")
    try:
        return plan.run_id, follow(plan.run_id, c, st)
    except KeyboardInterrupt:
        raise typer.Exit(Exit.INTERRUPTED) from None


def register(app: typer.Typer) -> None:
    """Add ``reproduce`` to ``app``."""
    app.command("reproduce")(reproduce_cmd)
