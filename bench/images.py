"""Images of a set-up: a testbed provisioned and made ready from an image against one provisioned and set up
from scratch, and a kill-host repair with a new disk from the image against today's.

Run by hand as root (under the local-tests lock when others share the machine):
  .venv/bin/python bench/images.py [--hosts 4] [--profile local-suites] [--rounds 2]

In one temporary state home: each round provisions a fresh testbed A the way it is done today (no image) and
sets it up (the first set-up); round 0 bakes an image from A's node0; each round then provisions a fresh testbed
B, which boots from that image, and sets it up (only the per-testbed roles run, written by testbed over its SSH
masters: testbed.setup.direct). Then, on the last round's A and B, node1 is killed and its disk thrown away, and
it is repaired: the set-up part of A's repair (today's) against B's (from the image). Printed: medians, the
ratios, and whether the targets are met (both at most 0.1x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import loadavg, table, timed
from localbed import free_subnet, local_available

TARGET = 0.1


def _spec(cwd: Path, name: str, hosts: int, profile: str) -> None:
    spec = {"provider": {"kind": "local", "hosts": hosts, "subnet": free_subnet()}, "user": "root",
            "profile": profile, "groups": {"workers": [f"node{i}" for i in range(1, hosts)]}}
    (cwd / "inventories" / f"{name}.yml").write_text(json.dumps(spec))


def _ready(name: str, *, image: bool) -> tuple[float, float, Any]:
    """Provision ``name`` (from an image when ``image``; else as today, never from one) and set it up: the two
    times and the set-up's result."""
    from testbed.handle import Testbed

    tb = Testbed.open(name)
    if image:
        t_prov = timed(tb.provision)
        if not all(h.facts.get("image") for h in tb.hosts):
            sys.exit(f"{name}: its hosts did not boot from the image")
    else:
        t_prov = timed(lambda: tb.provider().provision())
        tb = Testbed.open(name)
    res: list[Any] = []
    t_setup = timed(lambda: res.append(tb.setup(bake=False)))  # the bake is timed on its own
    r = res[0]
    if not r.ok or bool(r.partial) != image:
        sys.exit(f"{name}: set-up not as expected (partial={r.partial}): {r.to_json()}")
    print(f"  {name:4} provision {t_prov:6.2f} s  set-up {t_setup:6.2f} s  changed {r.changed:3}"
          f"  roles run: {', '.join(r.partial_roles) if r.partial else 'all'}"
          f"{' (by testbed over SSH, no Ansible)' if r.direct else ''}", flush=True)
    return t_prov, t_setup, r


def _repair_new_disk(name: str) -> float:
    """Kill node1, throw its disk away, repair it; the set-up part of the repair (seconds)."""
    from testbed.handle import Testbed

    tb = Testbed.open(name)
    p = tb.provider()
    sl = p.slot("node1")  # type: ignore[attr-defined]
    p.kill_host("node1")
    shutil.rmtree(sl.upper)
    (sl.root / "host_key.pub").unlink()
    done = tb.repair("node1")
    if done.replaced != ["node1"] or done.setup_seconds is None:
        sys.exit(f"{name}: repair not as expected: {done}")
    print(f"  {name:4} repair of node1 with a new disk: {done.repair_seconds:.2f} s, then set-up "
          f"{done.setup_seconds:.2f} s on {', '.join(done.setup_hosts)}", flush=True)
    return float(done.setup_seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--profile", default="local-suites")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    reason = local_available()
    if reason:
        sys.exit(f"local testbed unavailable: {reason}")
    from testbed.handle import Testbed
    from testbed.setup import images
    from testbed.state import Store

    tmp = Path(tempfile.mkdtemp(prefix="tb-bench-images-"))
    (tmp / "inventories").mkdir()
    os.chdir(tmp)
    os.environ["TESTBED_HOME"] = str(tmp / ".testbed")
    print(f"load average at start: {loadavg()}", flush=True)
    t: dict[str, list[float]] = {}
    names: list[str] = []
    try:
        for r in range(args.rounds):
            a, b = f"a{r}", f"b{r}"
            _spec(tmp, a, args.hosts, args.profile)
            _spec(tmp, b, args.hosts, args.profile)
            names += [a, b]
            prov, setup, _ = _ready(a, image=False)
            t.setdefault("provision + first set-up", []).append(prov + setup)
            if r == 0:
                t0 = time.perf_counter()
                img = images.bake(Testbed.open(a))
                print(f"  bake from {a}/node0: {time.perf_counter() - t0:.2f} s, {img['size'] / 1e6:.1f} MB",
                      flush=True)
            prov, setup, _ = _ready(b, image=True)
            t.setdefault("provision + ready from the image", []).append(prov + setup)
            if r < args.rounds - 1:
                for n in (a, b):
                    Testbed.open(n).destroy()
        last = args.rounds - 1
        t["repair set-up, new disk (today)"] = [_repair_new_disk(f"a{last}")]
        t["repair set-up, new disk (image)"] = [_repair_new_disk(f"b{last}")]
    finally:
        for n in names:
            try:
                Testbed.open(n).destroy()
            except Exception as e:  # already destroyed, or report it and go on
                print(f"  destroy {n}: {e}", file=sys.stderr)
        st = Store(tmp / ".testbed" / "state.db")
        images.prune(st)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in t.items()}
    ready = med["provision + ready from the image"] / med["provision + first set-up"]
    repair = med["repair set-up, new disk (image)"] / med["repair set-up, new disk (today)"]
    rows: list[list[object]] = [[k, len(v), med[k], f"{min(v):.2f}-{max(v):.2f}"] for k, v in t.items()]
    print(table(f"images, '{args.profile}' on {args.hosts} local hosts (seconds; load average at end {loadavg()})",
                ["what", "runs", "median", "spread"], rows))
    print(table("ratios", ["ratio", "value", "target", "met"],
                [["ready from the image / provision + first set-up", ready, TARGET, "met" if ready <= TARGET
                  else "MISSED"],
                 ["repair set-up from the image / today's", repair, TARGET, "met" if repair <= TARGET else "MISSED"]]))


if __name__ == "__main__":
    main()
