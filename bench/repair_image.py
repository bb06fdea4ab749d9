"""Repair from the image: the demo's host kill with the lost host repaired from the image of its set-up, against
the same kill repaired with a whole set-up (no image), downtime and goodput.

Run by hand as root:  .venv/bin/python bench/repair_image.py [--seeds 10] [--hosts 4] [--subnets A,B]

Two local testbeds of ``--hosts`` hosts, each in a state home of its own, both set up with ``local-suites`` as
``testbed demo`` does: ``image``'s first set-up bakes an image by itself (the local testbed's default); ``plain``
is set up with ``--no-bake``, so its state holds no image and a lost host gets the whole set-up again (as before
images were used for repairs). Each testbed first runs fault-drill once with no fault (the measured fault-free
run). Then per seed, the two alternate (the order rotates) a fault-drill run with the demo's fault (kill-host: the
last rank's whole host killed at a step the seed picks), with the suite's default parameters.

From each run's recorded events: the killed host's downtime (the fault to the relaunch: ``resumed``), its parts,
and the goodput against a fault-free run two ways: the run's own estimate (its start-up and its pace between
faults, the figure ``testbed demo`` prints) and the measured one (the fault-free run's started-to-ended time over
this run's). Printed: medians and spreads per testbed, the ratios image/plain, and the targets with the image
(downtime at most 8 s, goodput at least 60 % of fault-free) MET or MISSED.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import loadavg, median, table
from localbed import free_subnet, local_available

DOWNTIME_TARGET = 8.0  # seconds, at most
GOODPUT_TARGET = 0.60  # of a fault-free run, at least
PROFILE = "local-suites"


class Bed:
    """One local testbed in a state home of its own (``cwd/.testbed``)."""

    def __init__(self, root: Path, name: str, hosts: int, subnet: str):
        self.cwd, self.name = root / name, name
        (self.cwd / "inventories").mkdir(parents=True)
        spec = {"provider": {"kind": "local", "hosts": hosts, "subnet": subnet}, "user": "root", "profile": PROFILE,
                "groups": {"workers": [f"node{i}" for i in range(1, hosts)]}}
        (self.cwd / "inventories" / f"{name}.yml").write_text(json.dumps(spec))

    def enter(self) -> Any:
        """This testbed's folder and state home made current; its store."""
        from testbed.state import Store

        os.chdir(self.cwd)
        os.environ["TESTBED_HOME"] = str(self.cwd / ".testbed")
        return Store(self.cwd / ".testbed" / "state.db")

    def run(self, seed: int, faults: list[str]) -> list[Any]:
        """fault-drill with ``faults`` (the suite's default parameters, as the demo runs it): its events."""
        from testbed.run import runner

        st = self.enter()
        plan = runner.plan_run("fault-drill", self.name, {"seed": seed, "port": 29600 + 2 * (seed % 100)},
                               faults=faults, store=st)
        run_id = runner.start_run(plan, store=st)
        row = runner.wait(run_id, timeout=600, store=st)
        # with no fault, the suite's check that training went on after the fault fails: the timing stands
        if row.status != "succeeded" and not (not faults and (row.reason or "").startswith("check step")):
            sys.exit(f"{self.name}: seed {seed}: the run {run_id} {row.status}: {row.reason}")
        return st.events(run_id)


def _span(events: list[Any]) -> float:
    """Started to ended (seconds) of a run, from its events."""
    ts = {e.kind: e.ts for e in events if e.kind in ("started", "ended")}
    return ts["ended"] - ts["started"]


def _figures(events: list[Any], fault_free: float) -> dict[str, Any]:
    """What one host-kill run gives: downtime and its parts, goodput (estimated and measured), the image used."""
    res = next(e.detail for e in events if e.kind == "resumed" and e.detail.get("hosts_repaired"))
    rep = next(e.detail for e in events if e.kind == "repaired" and e.host)
    good = next(e.detail for e in events if e.kind == "goodput")
    return {"downtime": res["downtime_seconds"], "detect": res.get("detect_seconds"), "drain": res.get("drain_seconds"),
            "repair": res.get("repair_seconds"), "setup": res.get("setup_seconds"),
            "relaunch": res.get("relaunch_seconds"), "goodput (run's estimate)": good.get("ratio"),
            "goodput (measured)": round(fault_free / _span(events), 3), "image": rep.get("image"),
            "setup roles": rep.get("setup_roles")}


def _prepare(beds: dict[str, Bed]) -> dict[str, float]:
    """Provision and set up both testbeds (``plain`` with no image), then one fault-free run each: its span."""
    from testbed.handle import Testbed

    free = {}
    for mode, b in beds.items():
        st = b.enter()
        tb = Testbed.open(b.name, st).provision()
        res = tb.setup(PROFILE, bake=None if mode == "image" else False)
        images = [r["id"] for r in st.images()]
        print(f"  {mode:5} set-up {res.elapsed:6.1f} s; images in its state: {', '.join(images) or 'none'}",
              flush=True)
        if bool(images) != (mode == "image"):
            sys.exit(f"{mode}: expected {'an image' if mode == 'image' else 'no image'} after the first set-up")
        free[mode] = _span(b.run(0, []))
        print(f"  {mode:5} fault-free run: {free[mode]:.2f} s", flush=True)
    return free


def _report(rows: dict[str, list[dict[str, Any]]], seeds: int) -> None:
    cols = ["downtime", "detect", "drain", "repair", "setup", "relaunch", "goodput (run's estimate)",
            "goodput (measured)"]
    out = []
    for mode, rs in rows.items():
        for c in cols:
            v = [float(r[c]) for r in rs if r[c] is not None]
            out.append([mode, c, median(v), f"{min(v):.2f}-{max(v):.2f}" if v else "-"])
    print(table(f"fault-drill kill-host, {seeds} seeds (seconds; goodput: of a fault-free run; load average at end "
                f"{loadavg()})", ["testbed", "figure", "median", "spread"], out))
    med = {m: {c: median([float(r[c]) for r in rs if r[c] is not None]) for c in cols} for m, rs in rows.items()}
    img, plain = med["image"], med["plain"]
    ratios = [["downtime image/plain", img["downtime"] / plain["downtime"], "-", "-"],
              ["goodput image/plain (measured)", img["goodput (measured)"] / plain["goodput (measured)"], "-", "-"],
              ["downtime with the image (s)", img["downtime"], f"<= {DOWNTIME_TARGET:g}",
               "MET" if img["downtime"] <= DOWNTIME_TARGET else "MISSED"]]
    for how in ("run's estimate", "measured"):
        g = img[f"goodput ({how})"]
        ratios.append([f"goodput with the image ({how})", g, f">= {GOODPUT_TARGET:.2f}",
                       "MET" if g >= GOODPUT_TARGET else "MISSED"])
    print(table("ratios and targets", ["what", "value", "target", "met"], ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="host-kill runs per testbed (the fault's step varies)")
    ap.add_argument("--hosts", type=int, default=4, help="hosts per testbed (the demo's: 4)")
    ap.add_argument("--subnets", default="", help="the two testbeds' subnets, A,B (default: free 10.213.N.0/24)")
    args = ap.parse_args()
    reason = local_available()
    if reason:
        sys.exit(f"local testbed unavailable: {reason}")
    subnets = args.subnets.split(",") if args.subnets else [free_subnet(), free_subnet()]
    root = Path(tempfile.mkdtemp(prefix="tb-bench-repair-"))
    beds = {"image": Bed(root, "img", args.hosts, subnets[0]), "plain": Bed(root, "plain", args.hosts, subnets[1])}
    print(f"load average at start: {loadavg()}", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {"image": [], "plain": []}
    try:
        free = _prepare(beds)
        for seed in range(args.seeds):
            for mode in (["image", "plain"] if seed % 2 == 0 else ["plain", "image"]):
                f = _figures(beds[mode].run(seed, ["kill-host"]), free[mode])
                rows[mode].append(f)
                est = f["goodput (run's estimate)"]
                print(f"  seed {seed} {mode:5} down {f['downtime']:6.2f} s (set-up {f['setup']} s, roles "
                      f"{f['setup roles']}, image {f['image']}); goodput {est} / measured {f['goodput (measured)']}",
                      flush=True)
    finally:
        from testbed.handle import Testbed
        from testbed.setup import images

        for b in beds.values():
            st = b.enter()
            try:
                Testbed.open(b.name, st).destroy()
                images.prune(st)
            except Exception as e:  # report it and go on: the other testbed goes too
                print(f"  destroy {b.name}: {e}", file=sys.stderr)
        os.chdir("/")
        shutil.rmtree(root, ignore_errors=True)
    _report(rows, args.seeds)


if __name__ == "__main__":
    main()
