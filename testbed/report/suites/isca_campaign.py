"""isca-resnet18 across runs: the outcome of every injection, counted and matched against the expected results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.report import plotting
from testbed.report.model import Parsed, Report
from testbed.report.parsers.isca_injection import InjectionRow, parse_injection
from testbed.report.parsers.isca_replay import ReplayLog, parse_replay
from testbed.report.registry import campaign_reporter
from testbed.report.rundir import Campaign
from testbed.report.suites.isca import (
    FAULT_FREE,
    elapsed,
    expected_outcome,
    outcome,
    outcome_check,
    outcomes,
    overheads,
)

EXPERIMENTS = ("inj_immediate_infs_nans", "inj_masked", "inj_slow_degrade", "detection", "replay")
RECORDERS = {"detection": ("no_check", "check"), "replay": ("no_rerun", "rerun")}


@campaign_reporter("isca-resnet18", "isca", tables=(
    "injections", "replay_steps", "replay_epochs", "replay_outcomes", "overheads", "outcomes", "outcome_counts",
    "missing_points"))
def campaign(camp: Campaign, rep: Report) -> None:
    logs: dict[str, tuple[ReplayLog, str]] = {}
    specs: dict[str, Parsed[InjectionRow]] = {}
    recorders: dict[str, Path] = {}
    owned: set[str] = set()
    launched: dict[str, list[str]] = {}
    for run in camp.runs:
        exp = str(run.params.get("experiment") or "")
        if exp:
            launched.setdefault(exp, []).append(run.run_id)
        for host, path in run.files(r"replay_.*\.txt|fault_free\.txt"):
            name = FAULT_FREE if path.stem == FAULT_FREE else path.stem.removeprefix("replay_")
            own = name == exp
            if name in owned and not own:
                continue  # another run's copy: the run launched for it wins
            log = parse_replay(path)
            rep.skip([f"{run.run_id}/{host}: {s}" for s in log.skipped])
            logs[name] = (log, run.run_id)
            owned |= {name} if own else set()
        for _, path in run.files(r"inj_.*\.csv"):
            if path.stem == exp or path.stem not in specs:
                specs[path.stem] = parse_injection(path)
        for _, path in run.files(r"train_recorder_.*\.txt"):
            variant = path.stem.removeprefix("train_recorder_")
            if variant in RECORDERS.get(exp, ()) or variant not in recorders:
                recorders[variant] = path
    for spec in specs.values():
        rep.skip(spec.skipped)
    ff = logs[FAULT_FREE][0] if FAULT_FREE in logs else None
    injections = sorted(n for n in logs if n != FAULT_FREE)
    rep.heading("Outcomes")
    rows = []
    for name in injections:
        log, rid = logs[name]
        meta = specs[name].meta if name in specs else {}
        got, want = outcome(log, ff, specs.get(name)), expected_outcome(name)
        bad = log.first_nonfinite
        rows.append([name, rid, meta.get("fmodel"), meta.get("target_layer"),
                     f"{meta.get('target_epoch')}/{meta.get('target_step')}" if meta else None,
                     f"{bad.epoch}/{bad.step}" if bad else None,
                     log.final.train_accuracy if log.final else None,
                     ff.final.train_accuracy if ff and ff.final else None, got, want,
                     None if want is None else got == want])
    rep.table("outcomes", ["injection", "run", "fault_model", "layer", "injected_at", "first_nonfinite_at",
                           "final_train_acc", "fault_free_train_acc", "outcome", "expected", "matches"], rows,
              "Masked: final train accuracy within 2% of the fault-free run's; Degraded: further below")
    counts: dict[str, list[int]] = {}
    for r in rows:
        counts.setdefault(str(r[8]), [0, 0])[0] += 1
        if r[9]:
            counts.setdefault(str(r[9]), [0, 0])[1] += 1
    rep.table("outcome_counts", ["outcome", "count", "expected_count"],
              [[k, v[0], v[1]] for k, v in sorted(counts.items())], "Injections per outcome")
    named = [r for r in rows if r[10] is not None]
    if named:
        wrong = [f"{r[0]}: {r[8]} (expected {r[9]})" for r in named if not r[10]]
        rep.check("every injection has its expected outcome", not wrong,
                  "; ".join(wrong) if wrong else f"{len(named)} of {len(named)} as expected")
    for name in injections:
        outcome_check(rep, name, logs[name][0], ff, specs.get(name))
    outcomes(rep, {n: lg for n, (lg, _) in logs.items()}, ff, specs)
    _accuracy_figure(rep, {n: logs[n][0] for n in [*injections, FAULT_FREE] if n in logs})
    overheads(rep, elapsed(list(recorders.values()), rep))
    _missing(rep, set(injections), recorders, launched)


def _accuracy_figure(rep: Report, logs: dict[str, ReplayLog]) -> None:
    series = {n: ([float(e.epoch) for e in lg.epochs], [e.train_accuracy for e in lg.epochs])
              for n, lg in logs.items() if lg.epochs}
    if series:
        rep.figure("train_accuracy", plotting.lines(series, xlabel="epoch", ylabel="train accuracy (end of epoch)",
                                                    marker="."),
                   "End-of-epoch train accuracy of every injection against the fault-free run.")


def _missing(rep: Report, injections: set[str], recorders: dict[str, Any], launched: dict[str, list[str]]) -> None:
    rows = []
    for exp in sorted(set(EXPERIMENTS) | set(launched), key=lambda e: (e not in EXPERIMENTS, e)):
        have = exp in injections if exp.startswith("inj_") else all(v in recorders for v in RECORDERS.get(exp, ()))
        if not have:
            runs = launched.get(exp, [])
            rows.append([exp, f"no output from run {', '.join(runs)}" if runs else "no run"])
    rep.heading("Missing experiments")
    rep.table("missing_points", ["experiment", "problem"], rows, "the artifact's three injections and two techniques")
