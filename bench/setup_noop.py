"""Set-up: a profile's first run against its unchanged re-run (skipped by the recorded address) and ``--verify``.

Run by hand as root:
  .venv/bin/python bench/setup_noop.py [--hosts 4] [--profile base] [--roles a,b] [--rounds 3] [--beds 1]
                                       [--mitogen DIR] [--plain]

Per host count and per bed set (``--beds``), fresh local testbeds: A is set up with ``testbed.setup.apply``;
with ``--mitogen DIR`` (a folder holding ``ansible_mitogen``, e.g. ``pip install --target DIR mitogen``) a
second testbed M is set up the same way with Mitogen's ``mitogen_linear`` strategy; with ``--plain`` a third, P,
with plain ``ansible-playbook`` of the same plan (default Ansible settings). First runs happen once per testbed
(their order alternates between bed sets); then ``--rounds`` rounds alternate, in a rotating order, A's skipped
re-run, A's ``--verify`` and M's ``--verify`` (and P's re-run). Printed: medians, spread (min-max), the ratios
to the first run and whether each target is met: skipped re-run at most 0.05x, ``--verify`` at most 0.3x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from _common import bed, sh, table, timed, tool

SKIP_TARGET, VERIFY_TARGET = 0.05, 0.3


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


@contextlib.contextmanager
def environ(extra: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def mitogen_env(folder: str) -> dict[str, str]:
    strategy = Path(folder).resolve() / "ansible_mitogen" / "plugins" / "strategy"
    if not strategy.is_dir():
        sys.exit(f"--mitogen {folder}: no ansible_mitogen/plugins/strategy there (pip install --target DIR mitogen)")
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategy), "ANSIBLE_STRATEGY": "mitogen_linear"}


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _apply(t: dict[str, list[float]], args: argparse.Namespace, b, label: str,  # type: ignore[no-untyped-def]
           env: dict[str, str] | None, *, want_ran: bool, verify: bool = False) -> None:
    """One ``setup.apply`` on bed ``b``, timed into ``t[label]``; exits when it did not do what was expected."""
    from testbed import setup

    roles = [r for r in args.roles.split(",") if r]
    os.environ["TESTBED_HOME"] = str(b.home)
    os.chdir(b.cwd)
    res: list[setup.SetupResult] = []
    with environ(env or {}):
        dt = timed(lambda: res.append(setup.apply(b.name, profile=None if roles else args.profile,
                                                  roles=roles or None, verify=verify)))
    r = res[0]
    if not r.ok or r.ran != want_ran or r.drift:
        sys.exit(f"{label} on {len(b.hosts)} hosts: not as expected (ran={r.ran}, drift={r.drift}): {r.to_json()}")
    t.setdefault(label, []).append(dt)
    print(f"  {label:26} {len(b.hosts)} hosts: {dt:7.2f} s  changed {r.changed}  probe {r.probe_seconds:.2f} s",
          flush=True)


def _plain(t: dict[str, list[float]], label: str, argv: list[str], env: dict[str, str]) -> None:
    dt = sh(argv, env=env, timeout=3600)
    t.setdefault(label, []).append(dt)
    print(f"  {label:26} {dt:7.2f} s", flush=True)


def bed_set(n: int, k: int, args: argparse.Namespace, mito: dict[str, str] | None, t: dict[str, list[float]]) -> str:
    """Fresh beds for one set: first runs (order alternating with ``k``), then the rounds of re-runs."""
    from testbed import setup

    roles = [r for r in args.roles.split(",") if r]
    with ExitStack() as stack:
        ba = stack.enter_context(bed(n, name="setupa"))
        plan = setup.resolve_plan(profile=None if roles else args.profile, roles=roles or None)
        firsts: list[Callable[[], None]] = [partial(_apply, t, args, ba, "first", None, want_ran=True)]
        again: list[Callable[[], None]] = [partial(_apply, t, args, ba, "skipped re-run", None, want_ran=False),
                                           partial(_apply, t, args, ba, "--verify", None, want_ran=True, verify=True)]
        if mito is not None:
            bm = stack.enter_context(bed(n, name="setupm"))
            firsts.append(partial(_apply, t, args, bm, "first (mitogen)", mito, want_ran=True))
            again.append(partial(_apply, t, args, bm, "--verify (mitogen)", mito, want_ran=True, verify=True))
        if args.plain:
            bp = stack.enter_context(bed(n, name="setupp"))
            variables = {"testbed_cache_dir": str(bp.home / "cache"), "testbed_provider": "local",
                         "testbed_offline": True, "testbed_subnet": bp.spec.provider.subnet}  # type: ignore[union-attr]
            argv, env = plain_playbook(bp, plan, variables, forks=max(5, n))
            firsts.append(partial(_plain, t, "first (ansible-playbook)", argv, env))
            again.append(partial(_plain, t, "re-run (ansible-playbook)", argv, env))
        for f in (firsts if k % 2 == 0 else firsts[::-1]):
            f()
        for r in range(args.rounds):
            shift = r % len(again)
            for f in again[shift:] + again[:shift]:
                f()
        return plan.name


HEADER = ["hosts", "what", "runs", "median", "spread", "/first", "/own first", "target", "met"]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--hosts", default="4")
    ap.add_argument("--profile", default="base")
    ap.add_argument("--roles", default="", help="comma-separated roles instead of a profile")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of re-runs per bed set")
    ap.add_argument("--beds", type=int, default=1, help="fresh bed sets per host count (first runs)")
    ap.add_argument("--mitogen", default="", help="folder holding ansible_mitogen: also measure Mitogen")
    ap.add_argument("--plain", action="store_true", help="also measure plain ansible-playbook")
    args = ap.parse_args()
    mito = mitogen_env(args.mitogen) if args.mitogen else None
    rows: list[list[object]] = []
    print(f"load average at start: {loadavg()}", flush=True)
    for n in [int(x) for x in args.hosts.split(",")]:
        t: dict[str, list[float]] = {}
        name = ""
        for k in range(args.beds):
            name = bed_set(n, k, args, mito, t)
        first = statistics.median(t["first"])
        for label, xs in t.items():
            m = statistics.median(xs)
            own = statistics.median(t["first (mitogen)"]) if "(mitogen)" in label else first
            target = SKIP_TARGET if label == "skipped re-run" else VERIFY_TARGET if label.startswith("--verify") \
                else None
            met = "-" if target is None else ("met" if m / own <= target else "MISSED")
            rows.append([n, label, len(xs), m, spread(xs), m / first, m / own, target or "-", met])
        print(table(f"set-up '{name}' on {n} hosts (seconds)", HEADER, [r for r in rows if r[0] == n]), flush=True)
    print(table(f"set-up summary ({args.rounds} rounds x {args.beds} bed sets; load average at end {loadavg()})",
                HEADER, rows))


if __name__ == "__main__":
    main()
