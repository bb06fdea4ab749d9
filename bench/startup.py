"""Start-up: ``testbed --help`` and ``testbed status`` against ``python -c 'import typer'``.

Run by hand:  .venv/bin/python bench/startup.py [--rounds 15]

Commands alternate round by round (rotated order) in an empty TESTBED_HOME; the table shows medians and
ratios to ``import typer`` (the floor any Typer CLI pays). Target: ``testbed --help`` under 0.3 s.
Also prints the slowest imports of ``testbed.cli`` (python -X importtime) to show where time goes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

from _common import env_with, median, sh, table, tool


def slowest_imports(env: dict[str, str], argv: list[str], n: int = 8) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of the ``n`` slowest top-level imports while running ``argv``."""
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env,
                       check=False)
    out = []
    for ln in r.stderr.splitlines():
        if not ln.startswith("import time:") or "|" not in ln:
            continue
        _, cum, name = ln.split("|")
        if cum.strip().isdigit() and not name.startswith("   "):  # top-level (depth 1) only
            out.append((int(cum), name.strip()))
    return sorted(out, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tb-startup-")
    env = env_with(TESTBED_HOME=home)
    py = sys.executable
    cmds: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import typer'": [py, "-c", "import typer"],
        "testbed --help": [tool("testbed"), "--help"],
        "testbed status": [tool("testbed"), "status"],
        "testbed status --json": [tool("testbed"), "status", "--json"],
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
    rows: list[list[object]] = [[k, median(v), min(v), max(v), median(v) / base] for k, v in times.items()]
    print(table(f"start-up ({a.rounds} rounds, seconds; target: testbed --help < 0.3 s)",
                ["command", "median", "min", "max", "/import typer"], rows))
    help_med = median(times["testbed --help"])
    print(f"\ntestbed --help median {help_med:.3f} s: target < 0.3 s {'MET' if help_med < 0.3 else 'MISSED'}")
    print("\nslowest top-level imports during 'testbed status' (cumulative ms):")
    for us, name in slowest_imports(env, ["-m", "testbed", "status"]):
        print(f"  {us / 1000:7.1f}  {name}")
    subprocess.run(["rm", "-rf", home], check=False)


if __name__ == "__main__":
    main()
