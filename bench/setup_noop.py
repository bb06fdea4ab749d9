"""Set-up: a profile's first run against its no-op re-run, and against plain ``ansible-playbook`` of the same roles.

Run by hand as root:  .venv/bin/python bench/setup_noop.py [--hosts 4,8] [--profile base] [--roles a,b] [--rounds 3]

Per host count, two fresh local testbeds: A is set up with ``testbed.setup.apply`` (first run, then ``--rounds``
no-op re-runs), B with plain ``ansible-playbook`` of the same plan (same roles, variables and inventory, default
Ansible settings: no pipelining, no fact cache). First runs happen once per testbed; the no-op re-runs of A and B
alternate. Target: the no-op re-run at most 0.3x the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _common import bed, sh, table, timed, tool


def plain_playbook(b, plan, variables: dict[str, object], forks: int) -> tuple[list[str], dict[str, str]]:  # type: ignore[no-untyped-def]
    """argv and env for ansible-playbook run the way a user would, on the same plan."""
    from testbed import setup

    d = Path(tempfile.mkdtemp(prefix="plain-pb-"))
    inv = d / "inventory.json"
    inv.write_text(json.dumps(setup.build_inventory(b.name, b.hosts, variables)))
    pb = d / "playbook.json"
    pb.write_text(json.dumps(setup.build_playbook(plan)))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(setup.roles_dir()), "ANSIBLE_HOST_KEY_CHECKING": "True",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(d / "cp"), "ANSIBLE_LOCAL_TEMP": str(d / "tmp"),
           "TESTBED_HOME": str(b.home)}
    return [tool("ansible-playbook"), "-i", str(inv), "-f", str(forks), str(pb)], env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="4,8")
    ap.add_argument("--profile", default="base")
    ap.add_argument("--roles", default="", help="comma-separated roles instead of a profile")
    ap.add_argument("--rounds", type=int, default=3, help="no-op re-runs per testbed")
    a = ap.parse_args()
    from testbed import setup

    roles = [r for r in a.roles.split(",") if r]
    rows: list[list[object]] = []
    for n in [int(x) for x in a.hosts.split(",")]:
        with ExitStack() as stack:
            ba = stack.enter_context(bed(n, name="setupa"))
            bb = stack.enter_context(bed(n, name="setupb"))
            plan = setup.resolve_plan(profile=None if roles else a.profile, roles=roles or None)
            variables = {"testbed_cache_dir": str(bb.home / "cache"), "testbed_provider": "local",
                         "testbed_offline": True, "testbed_subnet": bb.spec.provider.subnet}  # type: ignore[union-attr]
            argv, env = plain_playbook(bb, plan, variables, forks=max(5, n))

            def tb_apply(b=ba, n: int = n) -> float:  # type: ignore[no-untyped-def]
                os.environ["TESTBED_HOME"] = str(b.home)
                os.chdir(b.cwd)
                res: list[object] = []
                dt = timed(lambda: res.append(setup.apply(b.name, profile=None if roles else a.profile,
                                                          roles=roles or None)))
                r = res[0]
                if not r.ok:  # type: ignore[attr-defined]
                    sys.exit(f"testbed setup failed: {r.to_json()}")  # type: ignore[attr-defined]
                print(f"  testbed setup {n} hosts: {dt:.2f} s, changed {r.changed}", flush=True)  # type: ignore[attr-defined]
                return dt

            def plain(argv: list[str] = argv, env: dict[str, str] = env, n: int = n) -> float:
                dt = sh(argv, env=env, timeout=3600)
                print(f"  ansible-playbook {n} hosts: {dt:.2f} s", flush=True)
                return dt

            first_a = tb_apply()
            first_b = plain()
            noop_a: list[float] = []
            noop_b: list[float] = []
            for r in range(a.rounds):
                for k in (("a", "b") if r % 2 == 0 else ("b", "a")):
                    (noop_a if k == "a" else noop_b).append(tb_apply() if k == "a" else plain())
            ma, mb = statistics.median(noop_a), statistics.median(noop_b)
            rows.append([n, "testbed setup", first_a, ma, ma / first_a, first_a / first_b, ma / mb])
            rows.append([n, "ansible-playbook", first_b, mb, mb / first_b, 1.0, 1.0])
            print(table(f"set-up '{plan.name}' on {n} hosts (seconds)",
                        ["hosts", "tool", "first", "no-op med", "no-op/first", "first/plain", "no-op/plain"],
                        rows[-2:]), flush=True)
    print(table(f"set-up summary ({a.rounds} no-op rounds; target no-op/first <= 0.3)",
                ["hosts", "tool", "first", "no-op med", "no-op/first", "first/plain", "no-op/plain"], rows))


if __name__ == "__main__":
    main()
