"""isca-resnet18's report: replayed injections against fault-free training; detection and replay overheads; and,
across a campaign's runs, the outcome of every injection, counted and matched against the expected results.

Loaded by testbed from this folder (testbed.results, API 3: reporter and campaign_reporter) whenever it reports a
run or a campaign of this suite. The artifact's files: injection specs ``inj_<name>.csv`` (``key,value`` rows, no
header), fault-injection logs ``replay_<inj>.txt`` and ``fault_free.txt`` (its artifacts.md section 4), and
technique timings ``train_recorder_<variant>.txt`` (``Total elapsed time: <seconds>``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import results

results.require(3)


# --- parsers: injection specs, replay logs, elapsed times ---------------------------------------------------------
@dataclass(frozen=True)
class InjectionRow:
    key: str
    value: str


def parse_injection(src: Path | str) -> results.Parsed[InjectionRow]:
    """Key/value rows; ``meta`` holds them as a dict (target_epoch and target_step as ints when numeric)."""
    text, label = results.load_text(src)
    out: results.Parsed[InjectionRow] = results.Parsed()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition(",")
        if not sep or not key.strip():
            out.skipped.append(results.skip_note(label, lineno, line, "not a key,value row"))
            continue
        out.rows.append(InjectionRow(key.strip(), value.strip()))
        out.meta[key.strip()] = value.strip()
    for key in ("target_epoch", "target_step", "target_worker"):
        if str(out.meta.get(key, "")).isdigit():
            out.meta[key] = int(out.meta[key])
    return out


_NUM = r"([-+\w.]+)"  # also matches nan / inf
_STEP = re.compile(rf"Epoch: (\d+)/(\d+), step: (\d+)/(\d+), loss: {_NUM}, accuracy: {_NUM}\s*$")
_END = re.compile(rf"End of epoch: (\d+)/(\d+), train loss: {_NUM}, train accuracy: {_NUM}, "
                  rf"valid loss: {_NUM}, valid accuracy: {_NUM}\s*$")
_KV = re.compile(r"(Inject to epoch|Inject to step|Inject worker|Inject layer):\s*(.*?)\s*$"
                 r"|(Load weights from) (.*?)\s*$")
_KNOWN = ("Shape for target layer", "Position is", "Encounter NaN")


@dataclass(frozen=True)
class StepRow:
    epoch: int
    step: int
    steps_per_epoch: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    train_loss: float
    train_accuracy: float
    valid_loss: float
    valid_accuracy: float


@dataclass
class ReplayLog:
    """One replay (or fault-free) run: step rows, end-of-epoch rows, injection facts and what was skipped."""

    steps: list[StepRow] = field(default_factory=list)
    epochs: list[EpochRow] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    nan_terminated: bool = False
    skipped: list[str] = field(default_factory=list)

    @property
    def first_nonfinite(self) -> StepRow | None:
        return next((s for s in self.steps if not math.isfinite(s.loss)), None)

    @property
    def final(self) -> EpochRow | None:
        return self.epochs[-1] if self.epochs else None


def _f(text: str) -> float:
    return float(text.rstrip(","))


def parse_replay(src: Path | str) -> ReplayLog:
    """Parse a replay or fault-free log; a cut-off last line or stray text is skipped with a note."""
    text, label = results.load_text(src)
    log = ReplayLog()
    notes: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if m := _STEP.search(line):
                log.steps.append(StepRow(int(m[1]), int(m[3]), int(m[4]), _f(m[5]), _f(m[6])))
            elif m := _END.search(line):
                log.epochs.append(EpochRow(int(m[1]), _f(m[3]), _f(m[4]), _f(m[5]), _f(m[6])))
            elif m := _KV.match(line.strip()):
                log.info[m[1] or m[3]] = m[2] if m[1] else m[4]
            elif line.strip().startswith(_KNOWN):
                log.nan_terminated |= line.strip().startswith("Encounter NaN")
                if line.strip().startswith("Position is"):
                    log.info["Position"] = line.strip()[len("Position is "):]
            else:
                notes.append(results.skip_note(label, lineno, line))
        except ValueError as exc:
            notes.append(results.skip_note(label, lineno, line, f"bad number ({exc})"))
    log.skipped = results.summarise_skips(label, notes)
    return log


_ELAPSED = re.compile(r"Total elapsed time:\s*([0-9.eE+-]+)")


def parse_elapsed(src: Path | str) -> results.Parsed[float]:
    """The elapsed seconds found (normally one); other non-empty lines are noted as skipped."""
    text, label = results.load_text(src)
    out: results.Parsed[float] = results.Parsed()
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _ELAPSED.search(line)
        if m:
            try:
                out.rows.append(float(m[1]))
                continue
            except ValueError:
                pass
        if line.strip():
            out.skipped.append(results.skip_note(label, lineno, line))
    if not out.rows:
        out.skipped.append(f"{label}: no 'Total elapsed time' line")
    return out


def overhead_pct(base: float, treated: float, per: float) -> float:
    """(treated - base) / base / per * 100: the per-unit overhead in percent (per = checks or reruns)."""
    return (treated - base) / base / per * 100


# --- a run's report -----------------------------------------------------------------------------------------------
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


@results.reporter(tables=["injections", "replay_steps", "replay_epochs", "replay_outcomes", "overheads"])
def report(run: results.RunDir, rep: results.Report) -> None:
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
    outcomes(rep, logs, dict.fromkeys(logs, ff), specs)
    _overheads(run, rep)


def outcomes(rep: results.Report, logs: dict[str, ReplayLog], ffs: Mapping[str, ReplayLog | None],
             specs: Mapping[str, object]) -> None:
    """Each replay's outcome (the paper's classes), where it first went non-finite, and its final accuracies;
    ``ffs``: each replay's fault-free run (None: none, and an outcome that needs one is left unclassified)."""
    rows = []
    for name, log in sorted(logs.items()):
        bad = log.first_nonfinite
        final = log.final
        got = "fault-free" if name == FAULT_FREE else outcome(log, ffs.get(name), specs.get(name))
        if got is None:
            rep.skip([f"{name}: outcome not classified: it needs a fault-free run from the same checkpoint, and "
                      "none is in this run (its point makes one beside the injection)"])
        rows.append([name, got,
                     bad.epoch if bad else None, bad.step if bad else None,
                     final.train_accuracy if final else None, final.valid_accuracy if final else None])
    if rows:
        rep.table("replay_outcomes", ["run", "outcome", "nonfinite_epoch", "nonfinite_step", "final_train_accuracy",
                               "final_valid_accuracy"], rows, "Outcome of each replayed injection")


def _plot(rep: results.Report, name: str, log: ReplayLog, ff: ReplayLog | None) -> None:
    for metric in ("loss", "accuracy"):
        series = {name: (_x(log), [getattr(s, metric) for s in log.steps])}
        if ff is not None:
            series[FAULT_FREE] = (_x(ff), [getattr(s, metric) for s in ff.steps])
        rep.figure(f"{name}_{metric}", results.plotting.lines(series, xlabel="epoch",
                                                              ylabel=f"train {metric} (per step)",
                                                              title=f"{name}: {metric} vs fault-free"),
                   f"{name}: per-step training {metric} against the fault-free run.")


def outcome(log: ReplayLog, ff: ReplayLog | None, spec: object = None) -> str | None:
    """The paper's outcome of one injection: Immediate INFs/NaNs, INFs/NaNs later, Masked, Degraded, Incomplete;
    None where it needs a fault-free run and ``ff`` is none (unclassified: never a class it was not compared for).

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
        return None
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


def outcome_check(rep: results.Report, name: str, log: ReplayLog, ff: ReplayLog | None, spec: object) -> None:
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


def elapsed(paths: list[Path], rep: results.Report) -> dict[str, float]:
    """``train_recorder_<variant>.txt`` -> {variant: elapsed seconds} (the last value of each file)."""
    out = {}
    for path in paths:
        parsed = parse_elapsed(path)
        rep.skip(parsed.skipped)
        if parsed.rows:
            out[Path(path).stem.removeprefix("train_recorder_")] = parsed.rows[-1]
    return out


def _overheads(run: results.RunDir, rep: results.Report) -> None:
    overheads(rep, elapsed([p for _, p in run.files(r"train_recorder_.*\.txt")], rep))


def overheads(rep: results.Report, t: dict[str, float]) -> None:
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


# --- a campaign's report ------------------------------------------------------------------------------------------
EXPERIMENTS = ("inj_immediate_infs_nans", "inj_masked", "inj_slow_degrade", "detection", "replay")
RECORDERS = {"detection": ("no_check", "check"), "replay": ("no_rerun", "rerun")}


@results.campaign_reporter(tables=[
    "injections", "replay_steps", "replay_epochs", "replay_outcomes", "overheads", "outcomes", "outcome_counts",
    "missing_points"])
def campaign(camp: results.Campaign, rep: results.Report) -> None:
    logs, ffs, specs, recorders, launched = _campaign_files(camp, rep)
    injections = sorted(logs)
    # each injection against the fault-free run its own point made; else (a point from before each made its own)
    # the campaign's one, named in the table
    spare = next(iter(sorted(ffs.items())), None)
    paired = {n: (rid, ffs[rid]) if rid in ffs else spare for n, (_, rid) in logs.items()}
    rep.heading("Outcomes")
    rows = []
    for name in injections:
        log, rid = logs[name]
        ff_rid, ff = paired[name] or (None, None)
        meta = specs[name].meta if name in specs else {}
        got, want = outcome(log, ff, specs.get(name)), expected_outcome(name)
        bad = log.first_nonfinite
        rows.append([name, rid, meta.get("fmodel"), meta.get("target_layer"),
                     f"{meta.get('target_epoch')}/{meta.get('target_step')}" if meta else None,
                     f"{bad.epoch}/{bad.step}" if bad else None,
                     log.final.train_accuracy if log.final else None,
                     ff.final.train_accuracy if ff and ff.final else None, ff_rid,
                     got or "unclassified (no fault-free run)", want, None if want is None else got == want])
    rep.table("outcomes", ["injection", "run", "fault_model", "layer", "injected_at", "first_nonfinite_at",
                           "final_train_acc", "fault_free_train_acc", "fault_free_run", "outcome", "expected",
                           "matches"], rows,
              "Masked: final train accuracy within 2% of the fault-free run's; Degraded: further below")
    counts: dict[str, list[int]] = {}
    for r in rows:
        counts.setdefault(str(r[9]), [0, 0])[0] += 1
        if r[10]:
            counts.setdefault(str(r[10]), [0, 0])[1] += 1
    rep.table("outcome_counts", ["outcome", "count", "expected_count"],
              [[k, v[0], v[1]] for k, v in sorted(counts.items())], "Injections per outcome")
    named = [r for r in rows if r[11] is not None]
    if named:
        wrong = [f"{r[0]}: {r[9]} (expected {r[10]})" for r in named if not r[11]]
        rep.check("every injection has its expected outcome", not wrong,
                  "; ".join(wrong) if wrong else f"{len(named)} of {len(named)} as expected")
    for name in injections:
        outcome_check(rep, name, logs[name][0], (paired[name] or (None, None))[1], specs.get(name))
    every = {n: lg for n, (lg, _) in logs.items()}
    if spare is not None:
        every[FAULT_FREE] = spare[1]
    outcomes(rep, every, {n: (paired.get(n) or (None, None))[1] for n in every}, specs)
    _accuracy_figure(rep, {n: every[n] for n in [*injections, FAULT_FREE] if n in every})
    overheads(rep, elapsed(list(recorders.values()), rep))
    _missing(rep, set(injections), recorders, launched)


def _campaign_files(camp: results.Campaign, rep: results.Report) -> tuple[
        dict[str, tuple[ReplayLog, str]], dict[str, ReplayLog], dict[str, results.Parsed[InjectionRow]],
        dict[str, Path], dict[str, list[str]]]:
    """The campaign's result files: (injection -> its replay log and run id, run id -> the fault-free run it
    made, injection -> its CSV, recorder variant -> its file, experiment -> the runs launched for it)."""
    logs: dict[str, tuple[ReplayLog, str]] = {}
    ffs: dict[str, ReplayLog] = {}
    specs: dict[str, results.Parsed[InjectionRow]] = {}
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
            if (name == FAULT_FREE and run.run_id in ffs) or (name in owned and not own):
                continue  # another run's copy: the run launched for it wins
            log = parse_replay(path)
            rep.skip([f"{run.run_id}/{host}: {s}" for s in log.skipped])
            if name == FAULT_FREE:
                ffs[run.run_id] = log
                continue
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
    return logs, ffs, specs, recorders, launched


def _accuracy_figure(rep: results.Report, logs: dict[str, ReplayLog]) -> None:
    series = {n: ([float(e.epoch) for e in lg.epochs], [e.train_accuracy for e in lg.epochs])
              for n, lg in logs.items() if lg.epochs}
    if series:
        rep.figure("train_accuracy", results.plotting.lines(series, xlabel="epoch",
                                                            ylabel="train accuracy (end of epoch)", marker="."),
                   "End-of-epoch train accuracy of every injection against the fault-free run.")


def _missing(rep: results.Report, injections: set[str], recorders: dict[str, Any],
             launched: dict[str, list[str]]) -> None:
    rows = []
    for exp in sorted(set(EXPERIMENTS) | set(launched), key=lambda e: (e not in EXPERIMENTS, e)):
        have = exp in injections if exp.startswith("inj_") else all(v in recorders for v in RECORDERS.get(exp, ()))
        if not have:
            rows.append([exp, results.why_missing(launched, exp)])
    rep.heading("Missing experiments")
    rep.table("missing_points", ["experiment", "problem"], rows, "the artifact's three injections and two techniques")
