"""CLI commands about this machine and the whole loop: doctor and demo.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from testbed.errors import TestbedError

if TYPE_CHECKING:

    pass

from testbed.cli.common import JsonOpt, console, escape, print_json, store


# list / doctor ----------------------------------------------------------------------------------------
def doctor(json_out: JsonOpt = False) -> None:
    """Check this machine for what each provider needs and say how to install what is missing.

    Example: testbed doctor
    """
    import importlib.util
    import shutil

    from testbed.distribution import install_command
    from testbed.providers import chameleon_chi, gcp_tpu
    from testbed.providers.local import REQUIRED_TOOLS

    checks: list[dict[str, Any]] = []

    def add(what: str, ok: bool, fix: str, needed_by: str) -> None:
        checks.append({"check": what, "ok": ok, "fix": "" if ok else fix, "needed_by": needed_by})

    add("python >= 3.11", sys.version_info >= (3, 11), "install Python 3.11", "everything")
    add("running as root", os.geteuid() == 0, "run as root (sudo -E testbed ...)", "local provider")
    for tool, pkg in REQUIRED_TOOLS.items():
        add(f"{tool} on PATH", shutil.which(tool) is not None, f"apt-get install -y {pkg}", "local provider")
    add("sshd (/usr/sbin/sshd)", os.access("/usr/sbin/sshd", os.X_OK), "apt-get install -y openssh-server",
        "local provider")
    add("rsync on PATH", shutil.which("rsync") is not None, "apt-get install -y rsync", "collect")
    add("mpirun on PATH", shutil.which("mpirun") is not None, "apt-get install -y openmpi-bin libopenmpi-dev",
        "mpi suites")
    add("ansible-playbook next to python",
        os.path.exists(os.path.join(os.path.dirname(sys.executable), "ansible-playbook")),
        f"{install_command()} (ansible-core comes with it)", "setup")
    add("python-chi installed", importlib.util.find_spec("chi") is not None,
        install_command(chameleon_chi.EXTRA), "chameleon provider")
    add("python-blazarclient installed", importlib.util.find_spec("blazarclient") is not None,
        "pip install python-blazarclient (python-chi forgets it)", "chameleon provider")
    add("google-cloud-tpu installed", importlib.util.find_spec("google.cloud.tpu_v2") is not None
        if importlib.util.find_spec("google.cloud") else False, install_command(gcp_tpu.EXTRA), "gcp-tpu provider")
    ok = all(c["ok"] for c in checks if c["needed_by"] in ("everything", "local provider"))
    if json_out:
        print_json({"ok": ok, "checks": checks})
    else:
        from rich.table import Table

        t = Table(title="testbed doctor", title_justify="left")
        for col in ("check", "ok", "needed by", "fix"):
            t.add_column(col)
        for c in checks:
            t.add_row(c["check"], "[green]yes[/green]" if c["ok"] else "[red]no[/red]", c["needed_by"], c["fix"])
        console().print(t)
    if not ok:
        raise typer.Exit(1)


def demo(keep: Annotated[bool, typer.Option("--keep", help="Leave the local testbed up afterwards.")] = False,
         results: Annotated[str, typer.Option("--to", help="Results folder.")] = "results") -> None:
    """The whole loop on the local testbed: provision, exec, setup, run, collect, report (then destroy).

    Each step is the command a user would type, printed before it runs.
    Example: testbed demo --keep
    """
    import glob

    from rich.rule import Rule

    from testbed.spec import DEFAULT_TESTBED as tb

    c = console()
    steps: list[list[str]] = [
        ["provision", tb],
        ["exec", tb, "--", "echo $(hostname) $(hostname -I) boot $(cut -c1-8 /proc/sys/kernel/random/boot_id)"],
        ["setup", tb, "--profile", "local-suites"],
        ["run", "mpi-hello", "--on", tb, "--no-setup"],
        ["run", "fault-drill", "--on", tb, "--no-setup"],
        # a whole host dies mid-training: it is restarted, set up again, and the run resumes from its checkpoint
        ["run", "fault-drill", "--on", tb, "--no-setup", "--fault", "kill-host", "-p", f"seed={int(time.time()) % 97}"],
        ["collect", "--all", "--to", results],
    ]
    t0 = time.monotonic()
    from testbed.cli import app

    cmd = typer.main.get_command(app)
    try:
        for args in steps:
            c.print(Rule(f"[bold]testbed {' '.join(args)}[/bold]", align="left"))
            rc = cmd.main(args, prog_name="testbed", standalone_mode=False)
            if isinstance(rc, int) and rc != 0:
                raise TestbedError(f"demo step 'testbed {' '.join(args)}' failed (exit {rc})", where="demo",
                                   fix="run that command by hand to see why (testbed doctor checks the machine)")
        reports = []
        for run_dir in sorted(glob.glob(os.path.join(results, "*", "*", "manifest.json"))):
            d = os.path.dirname(run_dir)
            c.print(Rule(f"[bold]testbed report {d}[/bold]", align="left"))
            cmd.main(["report", d], prog_name="testbed", standalone_mode=False)
            reports.append(d)
    finally:
        if not keep:
            c.print(Rule(f"[bold]testbed destroy {tb}[/bold]", align="left"))
            cmd.main(["destroy", tb, "--yes"], prog_name="testbed", standalone_mode=False)
    c.print(f"\n[bold green]demo done[/bold green] in {time.monotonic() - t0:.0f} s; results in {results}/ "
            f"({len(reports)} runs with a manifest and a report)")
    from testbed.run.runner import describe_event

    st = store()
    for run_id in st.run_ids(newest_first=True, limit=1):  # the host-kill run: how its recovery went
        for ev in st.events(run_id):
            if ev.kind in ("resumed", "goodput"):
                c.print(f"host kill in {run_id}: {escape(describe_event(ev))}")


def register(app: typer.Typer) -> None:
    """Add doctor and demo to ``app``."""
    app.command()(doctor)
    app.command()(demo)
