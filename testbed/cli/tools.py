"""CLI commands about this machine and the whole loop: check (doctor) and demo."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

import typer

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, escape, print_json, store
from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.paths import RESULTS
from testbed.textfmt import plural

# check / doctor ---------------------------------------------------------------------------------------
Targets = Annotated[list[str] | None, typer.Argument(
    help="Provider kinds (local, lab, chameleon, gcp-tpu) or testbed names (checked with their spec's settings); "
         "none: every provider.", show_default=False, metavar="TARGET",
    autocompletion=complete.providers_or_testbeds)]


def check(targets: Targets = None, json_out: JsonOpt = False) -> None:
    """Whether each provider can be used from here: its extra installed, credentials found (and where) and
    accepted by the service, the project, site or zone in use, quotas where the API gives them; for the local
    provider root, its tools and namespaces. Exit 1 when a provider asked about (every one, when none is named)
    is not usable: name the providers you use (testbed check local lab) to check just those.

    Example: testbed check chameleon
    """
    # lazy: testbed --help and completion load every command module
    from testbed import check as checks

    data = checks.run(targets)
    if json_out:
        print_json(data)
    else:
        render_check(data)
    if not data["ok"]:
        if json_out:
            raise typer.Exit(Exit.FAILED)
        bad = [r["provider"] for r in data["providers"] if not r["usable"]]
        usable = [r["provider"] for r in data["providers"] if r["usable"]]
        raise TestbedError(f"not usable from here: {', '.join(bad) or 'this machine'}", where="testbed check",
                           fix="the fix lines above"
                           + (f"; 'testbed check {' '.join(usable)}' checks only the usable ones"
                              if bad and usable and not data["targets"] else ""))


def doctor(targets: Targets = None, json_out: JsonOpt = False) -> None:
    """The same as 'testbed check': this machine and every provider (or those named).

    Example: testbed doctor
    """
    check(targets, json_out)


def render_check(data: dict[str, Any]) -> None:
    """The check as one table (a row per thing checked), then per provider whether it is usable and, under it,
    how to fix each row that is not ok."""
    # lazy: testbed --help and completion load every command module
    from testbed.cli.output import Plain

    out = Plain()

    def mark(c: dict[str, Any]) -> str:
        if c["ok"] is None:
            return "not checked" if c["required"] else "-"
        return "yes" if c["ok"] else "no"

    reports = [data["machine"], *data["providers"]]
    rows = [[(rep["provider"] + (f"\n({rep['testbed']})" if rep.get("testbed") else "")) if i == 0 else "",
             c["check"], mark(c), c["detail"]] for rep in reports for i, c in enumerate(rep["checks"])]
    out.table("testbed check", ("provider", "check", "ok", "detail"), rows)
    for rep in reports:
        name = "this machine" if rep["provider"] == "machine" else rep["provider"]
        name += f" ({rep['testbed']})" if rep.get("testbed") else ""
        ctx = ", ".join(f"{k} {v}" for k, v in rep["context"].items() if k in ("auth", "site", "project", "zone"))
        state = out.paint("usable" if rep["provider"] != "machine" else "ready", "green") if rep["usable"] else \
            out.paint("not usable" if rep["provider"] != "machine" else "not ready", "red")
        out.write(f"{out.paint(name, 'bold')}: {state}" + (f" ({ctx})" if ctx and rep["usable"] else ""))
        for c in rep["checks"]:
            if c["fix"] and c["ok"] is False:
                out.write(f"  fix ({c['check']}): {c['fix']}")


def demo(ctx: typer.Context,
         keep: Annotated[bool, typer.Option("--keep", help="Leave the local testbed up afterwards.")] = False,
         results: Annotated[str, typer.Option("--to", help="Results folder.")] = RESULTS) -> None:
    """The whole loop on the local testbed: provision, exec, setup, run, collect, report (then destroy).

    Each step is the command a user would type, printed before it runs.
    Example: testbed demo --keep
    """
    from pathlib import Path

    from rich.rule import Rule

    # lazy: testbed --help and completion load every command module
    from testbed.spec import DEFAULT_TESTBED as tb

    c = console()
    profiles, run_lines = demo_runs(tb)
    steps: list[list[str]] = [
        ["provision", tb],
        ["exec", tb, "--", "echo $(hostname) $(hostname -I) boot $(cut -c1-8 /proc/sys/kernel/random/boot_id)"],
        *(["setup", tb, "--profile", p] for p in profiles),
        *run_lines,
        ["collect", "--all", "--to", results],
    ]
    t0 = time.monotonic()
    cmd = ctx.find_root().command  # the testbed command line itself: each step is parsed as a user's would be
    try:
        for args in steps:
            c.print(Rule(f"[bold]testbed {' '.join(args)}[/bold]", align="left"))
            rc = cmd.main(args, prog_name="testbed", standalone_mode=False)
            if isinstance(rc, int) and rc != 0:
                raise TestbedError(f"demo step 'testbed {' '.join(args)}' failed (exit {rc})", where="demo",
                                   fix="run that command by hand to see why (testbed doctor checks the machine)")
        # lazy: testbed --help and completion load every command module
        from testbed.report.folders import scan

        reports = []
        runs = scan(Path(results)).runs if Path(results).is_dir() else []  # folders with files only
        for d in sorted(str(r.path) for r in runs):
            c.print(Rule(f"[bold]testbed report {d}[/bold]", align="left"))
            cmd.main(["report", d], prog_name="testbed", standalone_mode=False)
            reports.append(d)
    finally:
        if not keep:
            c.print(Rule(f"[bold]testbed destroy {tb}[/bold]", align="left"))
            cmd.main(["destroy", tb, "--yes"], prog_name="testbed", standalone_mode=False)
    c.print(f"\n[bold green]demo done[/bold green] in {time.monotonic() - t0:.0f} s; results in {results}/ "
            f"({plural(len(reports), 'run')} with a manifest and a report)")
    # lazy: testbed --help and completion load every command module
    from testbed.run.recovery import outage_lines

    st = store()
    for run_id in st.run_ids(newest_first=True, limit=len(run_lines))[::-1]:  # a run that lost a host: its recovery
        for line in outage_lines(st.events(run_id)):
            c.print(f"host kill in {run_id}: {escape(line)}")


def demo_runs(tb: str) -> tuple[list[str], list[list[str]]]:
    """What ``testbed demo`` sets up and runs on ``tb``: the profiles of the suites that declare ``demo:`` runs
    (first named first), and each of those runs as a ``testbed run`` command line, the suites by name. The suites
    name themselves: the package names none."""
    # lazy: testbed --help and completion load every command module
    from testbed.suite import list_suites, load_suite
    from testbed.yamlfile import read_text

    seed = str(int(time.time()) % 97)  # {seed}: another host-kill step from one demo to the next
    profiles: list[str] = []
    runs: list[list[str]] = []
    for name, path in list_suites().items():
        # a regular UTF-8 file of bounded size, read without blocking (a FIFO is refused, naming it)
        if not re.search(r"^demo:", read_text(path), re.M):  # only those suites are loaded (and checked)
            continue
        suite = load_suite(name)
        if suite.profile and suite.profile not in profiles:
            profiles.append(suite.profile)
        runs += [["run", name, "--on", tb, "--no-setup", *(o.replace("{seed}", seed) for o in opts)]
                 for opts in suite.demo]
    if not runs:
        raise TestbedError("no suite declares a demo run", where="demo",
                           fix="add 'demo: [[]]' to a suite that runs on the default testbed (docs/suite-reference.md)")
    return profiles, runs


def register(app: typer.Typer) -> None:
    """Add check, doctor and demo to ``app``."""
    app.command()(check)
    app.command()(doctor)
    app.command()(demo)
