"""Start-up: ``testbed status``, ``exec``, ``--help`` and ``--version`` against ``python -c pass``.

Run by hand:  .venv/bin/python bench/startup.py [--rounds 15]

Commands alternate round by round (rotated order) in an empty TESTBED_HOME, running this checkout's testbed
(PYTHONPATH is this tree, whatever the venv has installed); the table shows medians, min and max, and each
median's distance from ``python -c pass`` and its ratio to ``import typer`` (which every command line pays: one
Typer app parses them all). The target is ``testbed status`` (the ledger) and ``testbed exec``'s fixed cost
under 0.1 s above ``python -c pass``; ``--help`` (which loads every command's module), ``--version``, ``status
lab1`` (which loads the testbed's spec) and ``exec --help`` are shown without a target. ``testbed exec`` runs
against a testbed recorded in state whose one host answers at once (a lab host at 127.0.0.1 whose ssh is
``true``), so what is timed is start-up, parsing, state and the output, not a network.
Also prints the slowest imports of ``testbed.cli`` (python -X importtime) to show where time goes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO, env_with, loadavg, median, sh, table, tool


def slowest_imports(env: dict[str, str], argv: list[str], n: int = 8) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of the ``n`` slowest top-level imports while running ``argv``."""
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env,
                       cwd=env["TESTBED_HOME"], check=False)  # not in a checkout: `-m testbed` is PYTHONPATH's
    out = []
    for ln in r.stderr.splitlines():
        if not ln.startswith("import time:") or "|" not in ln:
            continue
        _, cum, name = ln.split("|")
        if cum.strip().isdigit() and not name.startswith("   "):  # top-level (depth 1) only
            out.append((int(cum), name.strip()))
    return sorted(out, reverse=True)[:n]


def _record_testbed(home: str) -> None:
    """State with one testbed 'lab1' of one host (what ``testbed exec lab1`` needs), written in ``home``."""
    os.environ["TESTBED_HOME"] = home
    sys.path.insert(0, str(REPO))  # this checkout's testbed, as the timed commands run it
    from testbed import ssh
    from testbed.hosts import Host
    from testbed.state import Store

    hosts = [Host(name="h1", address="127.0.0.1")]
    st = Store(Path(home) / "state.db")
    st.upsert_testbed("lab1", "lab", None, "up", {})
    st.set_hosts("lab1", hosts)
    ssh.write_ssh_config("lab1", hosts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tb-startup-")
    fake_bin = Path(home) / "bin"
    fake_bin.mkdir()
    (fake_bin / "ssh").write_text("#!/bin/sh\nexit 0\n")  # the host answers at once: start-up is what is timed
    (fake_bin / "ssh").chmod(0o755)
    env = env_with(TESTBED_HOME=home, PATH=f"{fake_bin}:{os.environ['PATH']}", PYTHONPATH=str(REPO))
    _record_testbed(home)
    py = sys.executable
    cmds: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import typer'": [py, "-c", "import typer"],
        "testbed --help": [tool("testbed"), "--help"],
        "testbed --version": [tool("testbed"), "--version"],
        "testbed status": [tool("testbed"), "status"],
        "testbed status --json": [tool("testbed"), "status", "--json"],
        "testbed status lab1": [tool("testbed"), "status", "lab1"],
        "testbed exec": [tool("testbed"), "exec", "lab1", "--", "true"],
        "testbed exec --help": [tool("testbed"), "exec", "--help"],
    }
    for argv in cmds.values():  # warm the page cache and .pyc files
        sh(argv, env=env)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for r in range(a.rounds):
        keys = list(cmds)
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[k].append(sh(cmds[k], env=env))
    base = median(times["python -c 'import typer'"])
    floor = median(times["python -c pass"])
    rows: list[list[object]] = [[k, median(v), min(v), max(v), median(v) - floor, median(v) / base]
                                for k, v in times.items()]
    print(table(f"start-up ({a.rounds} rounds, seconds; load {loadavg()})",
                ["command", "median", "min", "max", "- python -c pass", "/import typer"], rows))
    print()
    for k in ("testbed status", "testbed exec"):
        above = median(times[k]) - floor
        print(f"{k}: {above:.3f} s above python -c pass; target < 0.1 s: {'MET' if above < 0.1 else 'MISSED'}")
    print("\nslowest top-level imports during 'testbed status' (cumulative ms):")
    for us, name in slowest_imports(env, ["-m", "testbed", "status"]):
        print(f"  {us / 1000:7.1f}  {name}")
    subprocess.run(["rm", "-rf", home], check=False)


if __name__ == "__main__":
    main()
