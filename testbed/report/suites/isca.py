"""isca-resnet18: replayed injections against fault-free training; detection and replay overheads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from testbed.report import plotting
from testbed.report.model import Report
from testbed.report.parsers.elapsed import overhead_pct, parse_elapsed
from testbed.report.parsers.isca_injection import parse_injection
from testbed.report.parsers.isca_replay import ReplayLog, parse_replay
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir

FAULT_FREE = "fault_free"
DETECTION_TARGET_PCT = 0.025  # per bound check, paper target
REPLAY_TARGET_PCT = 0.15  # per re-executed iteration, paper target
DETECTION_CHECKS = 10000
REPLAY_RERUNS = 320
MASKED_TOLERANCE = 0.02  # relative
SLOW_DEGRADE_ACC = 0.44
SLOW_DEGRADE_TOLERANCE = 0.05  # absolute


def _x(log: ReplayLog) -> list[float]:
    return [s.epoch + s.step / max(s.steps_per_epoch, 1) for s in log.steps]


@reporter("isca-resnet18", "isca", tables=("injections", "replay_steps", "replay_epochs", "replay_outcomes",
                                            "overheads"))
def report(run: RunDir, rep: Report) -> None:
    logs: dict[str, ReplayLog] = {}
    for host, path in run.files(r"replay_.*\.txt|fault_free\.txt"):
        name = FAULT_FREE if path.stem == FAULT_FREE else path.stem.removeprefix("replay_")
        logs[name] = log = parse_replay(path)
        rep.skip([f"{host}: {s}" for s in log.skipped])
    specs = {p.stem: parse_injection(p) for _, p in run.files(r"inj_.*\.csv")}
    for spec in specs.values():
        rep.skip(spec.skipped)

    if specs:
        rep.heading("Injections")
        rep.table("injections", ["injection", "key", "value"],
                  [[name, r.key, r.value] for name, sp in sorted(specs.items()) for r in sp.rows])
    rep.heading("Training under injected faults")
    ff = logs.get(FAULT_FREE)
    for name, log in sorted(logs.items()):
        if name == FAULT_FREE:
            continue
        _plot(rep, name, log, ff)
    rep.table("replay_steps", ["run", "epoch", "step", "loss", "accuracy"],
              [[n, s.epoch, s.step, s.loss, s.accuracy] for n, lg in sorted(logs.items()) for s in lg.steps],
              "Per-step loss and accuracy")
    rep.table("replay_epochs", ["run", "epoch", "train_loss", "train_accuracy", "valid_loss", "valid_accuracy"],
              [[n, e.epoch, e.train_loss, e.train_accuracy, e.valid_loss, e.valid_accuracy]
               for n, lg in sorted(logs.items()) for e in lg.epochs], "End-of-epoch metrics")
    for name, log in sorted(logs.items()):
        outcome_check(rep, name, log, ff, specs.get(name))
    outcomes(rep, logs, ff, specs)
    _overheads(run, rep)


def outcomes(rep: Report, logs: dict[str, ReplayLog], ff: ReplayLog | None, specs: Mapping[str, object]) -> None:
    """Each replay's outcome (the paper's classes), where it first went non-finite, and its final accuracies."""
    rows = []
    for name, log in sorted(logs.items()):
        bad = log.first_nonfinite
        final = log.final
        rows.append([name, "fault-free" if name == FAULT_FREE else outcome(log, ff, specs.get(name)),
                     bad.epoch if bad else None, bad.step if bad else None,
                     final.train_accuracy if final else None, final.valid_accuracy if final else None])
    if rows:
        rep.table("replay_outcomes", ["run", "outcome", "nonfinite_epoch", "nonfinite_step", "final_train_accuracy",
                               "final_valid_accuracy"], rows, "Outcome of each replayed injection")


def _plot(rep: Report, name: str, log: ReplayLog, ff: ReplayLog | None) -> None:
    for metric in ("loss", "accuracy"):
        series = {name: (_x(log), [getattr(s, metric) for s in log.steps])}
        if ff is not None:
            series[FAULT_FREE] = (_x(ff), [getattr(s, metric) for s in ff.steps])
        rep.figure(f"{name}_{metric}", plotting.lines(series, xlabel="epoch", ylabel=f"train {metric} (per step)",
                                                      title=f"{name}: {metric} vs fault-free"),
                   f"{name}: per-step training {metric} against the fault-free run.")


def outcome(log: ReplayLog, ff: ReplayLog | None, spec: object = None) -> str:
    """The paper's outcome of one injection: Immediate INFs/NaNs, INFs/NaNs later, Masked, Degraded, Incomplete.

    Masked: final train accuracy within 2% (relative) of the fault-free run's; Degraded: further below it.
    """
    bad = log.first_nonfinite
    if bad is not None or log.nan_terminated:
        meta = getattr(spec, "meta", {}) or {}
        at = (int(meta.get("target_epoch", -1)), int(meta.get("target_step", -1))) if meta else None
        injected = at if at and at[0] >= 0 else _injected_at(log)
        return "Immediate INFs/NaNs" if bad is None or (bad.epoch, bad.step) == injected else "INFs/NaNs later"
    final, ff_final = log.final, ff.final if ff else None
    if final is None:
        return "Incomplete"
    if ff_final is None:
        return "No fault-free reference"
    rel = (ff_final.train_accuracy - final.train_accuracy) / ff_final.train_accuracy
    return "Masked" if rel <= MASKED_TOLERANCE else "Degraded"


def expected_outcome(name: str) -> str | None:
    """The outcome an injection is named after (the artifact's examples name theirs), else None."""
    if "infs_nans" in name:
        return "INFs/NaNs later" if "short_term" in name else "Immediate INFs/NaNs"
    if "masked" in name:
        return "Masked"
    if "degrade" in name:
        return "Degraded"
    return None


def _injected_at(log: ReplayLog) -> tuple[int, int] | None:
    try:
        return int(log.info["Inject to epoch"]), int(log.info["Inject to step"])
    except (KeyError, ValueError):
        return None


def outcome_check(rep: Report, name: str, log: ReplayLog, ff: ReplayLog | None, spec: object) -> None:
    """The artifact README's check for an injection named like one of its examples."""
    final = log.final
    ff_final = ff.final if ff else None
    if "infs_nans" in name:
        meta = getattr(spec, "meta", {}) or {}
        want = (int(meta.get("target_epoch", 19)), int(meta.get("target_step", 38)))
        bad = log.first_nonfinite
        got = (bad.epoch, bad.step) if bad else None
        rep.check(f"{name}: NaN at epoch {want[0]} step {want[1]}", got == want and log.nan_terminated,
                  f"first non-finite loss at {got}, terminated={log.nan_terminated}" if got else "no NaN loss logged")
    elif "masked" in name:
        if final is None or ff_final is None:
            rep.check(f"{name}: final train accuracy within 2% of fault-free", None, "final epoch missing")
            return
        rel = abs(final.train_accuracy - ff_final.train_accuracy) / ff_final.train_accuracy
        rep.check(f"{name}: final train accuracy within 2% of fault-free", rel <= MASKED_TOLERANCE,
                  f"{final.train_accuracy:.4f} vs {ff_final.train_accuracy:.4f} ({rel * 100:.2f}% apart)")
    elif "degrade" in name:
        if final is None:
            rep.check(f"{name}: final train accuracy near {SLOW_DEGRADE_ACC}", None, "final epoch missing")
            return
        near = abs(final.train_accuracy - SLOW_DEGRADE_ACC) <= SLOW_DEGRADE_TOLERANCE
        lower = ff_final is None or final.train_accuracy < ff_final.train_accuracy - 0.2
        ref = f", fault-free {ff_final.train_accuracy:.4f}" if ff_final else ""
        rep.check(f"{name}: final train accuracy near {SLOW_DEGRADE_ACC} (much lower)", near and lower,
                  f"{final.train_accuracy:.4f}{ref}")


def elapsed(paths: list[Path], rep: Report) -> dict[str, float]:
    """``train_recorder_<variant>.txt`` -> {variant: elapsed seconds} (the last value of each file)."""
    out = {}
    for path in paths:
        parsed = parse_elapsed(path)
        rep.skip(parsed.skipped)
        if parsed.rows:
            out[Path(path).stem.removeprefix("train_recorder_")] = parsed.rows[-1]
    return out


def _overheads(run: RunDir, rep: Report) -> None:
    overheads(rep, elapsed([p for _, p in run.files(r"train_recorder_.*\.txt")], rep))


def overheads(rep: Report, t: dict[str, float]) -> None:
    """Detection and replay overheads (as the artifact's calc_overhead.py computes them) with their checks."""
    if not t:
        return
    rows = []
    for label, base, treated, per, target in (
        ("detection", "no_check", "check", DETECTION_CHECKS, DETECTION_TARGET_PCT),
        ("replay", "no_rerun", "rerun", REPLAY_RERUNS, REPLAY_TARGET_PCT),
    ):
        if base in t and treated in t:
            pct = overhead_pct(t[base], t[treated], per)
            rows.append([label, t[base], t[treated], per, pct, target])
            rep.check(f"{label} overhead below {target}%", math.isfinite(pct) and pct < target,
                      f"({t[treated]:.2f}-{t[base]:.2f})/{t[base]:.2f}/{per}*100 = {pct:.4f}%")
        else:
            rep.check(f"{label} overhead below {target}%", None,
                      f"need train_recorder_{base}.txt and train_recorder_{treated}.txt")
    rep.heading("Technique overheads")
    rep.table("overheads", ["technique", "baseline_s", "treated_s", "per", "overhead_pct", "target_pct"], rows,
              "overhead = (treated - baseline) / baseline / per * 100")
