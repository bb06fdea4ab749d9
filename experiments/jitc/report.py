"""jitc's report: checkpoint, consolidation and recovery times per fault type; loss per rank.

Loaded by testbed from this folder (testbed.results, API 2: lines) whenever it reports a run of this suite.
open-jitc's stdout carries iteration, timing and test-set lines among much else (NCCL, warnings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from testbed import results

results.require(2)

PHASES = ("checkpointing", "consolidation", "recovering")
ITER = re.compile(r"Rank (\d+) \| Epoch (\d+) \| Batch (\d+) \| Loss ([\d.eE+-]+|nan|inf) \| "
                  r"Avg Iter Time ([\d.eE+-]+)")
TIMING = re.compile(r"(Checkpointing|Consolidation|Recovering) took ([\d.eE+-]+) seconds")
TEST = re.compile(r"Test set: Average loss ([\d.eE+-]+|nan), Accuracy (\d+)/(\d+)")
SIZE = re.compile(r"Model Size \(GB\): ([\d.eE+-]+)")


@dataclass
class JitcLog:
    """What one stdout file says: (rank, epoch, batch, loss, avg iter time) rows, (phase, seconds) timings, the
    test set's (average loss, correct, total), the model's size and the odd lines skipped."""

    iterations: list[tuple[int, int, int, float, float]] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)
    test: tuple[float, int, int] | None = None
    model_size_gb: float | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.iterations or self.timings or self.test)


def parse_jitc(text: str, label: str = "<text>") -> JitcLog:
    """Recognised lines only; a cut-off timing or iteration line is noted as skipped."""
    out = JitcLog()
    for line in text.splitlines():
        if m := ITER.search(line):
            out.iterations.append((int(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])))
        elif m := TIMING.search(line):
            out.timings.append((m[1].lower(), float(m[2])))
        elif m := TEST.search(line):
            out.test = (float(m[1]), int(m[2]), int(m[3]))
        elif m := SIZE.search(line):
            out.model_size_gb = float(m[1])
        elif ("took" in line or "| Batch" in line) and line.strip():
            out.skipped.append(f"{label}: cut-off or odd line: {line.strip()[:80]!r}")
    return out


def fault_type(run: results.RunDir) -> str:
    """The fault the run injected: its fault parameter, else the first fault event's type."""
    for key in ("fault", "fault_type", "fault_kind"):
        if run.params.get(key):
            return str(run.params[key])
    kinds = [str(e.get("detail", {}).get("type") or e.get("detail", {}).get("fault") or "")
             for e in run.events if e.get("kind") == "fault" and isinstance(e.get("detail"), dict)]
    return next((k for k in kinds if k), "none")


@results.reporter(tables=["jitc_timings", "jitc_summary", "jitc_iterations", "jitc_test"])
def report(run: results.RunDir, rep: results.Report) -> None:
    fault = fault_type(run)
    logs: list[tuple[str, str, JitcLog]] = []
    for host, path in run.files(r".*\.(out|log|txt)"):
        log = parse_jitc(path.read_text(encoding="utf-8", errors="replace"), path.name)
        rep.skip(log.skipped)
        if not log.empty:
            logs.append((host, run.rel(path), log))
    rep.heading(f"Just-in-time checkpointing (fault: {fault})")
    timing: list[list[Any]] = [[fault, h, f, phase, s] for h, f, lg in logs for phase, s in lg.timings]
    rep.table("jitc_timings", ["fault", "host", "file", "phase", "seconds"], timing, "Timing lines")
    summary = []
    for phase in PHASES:
        vals = [r[4] for r in timing if r[3] == phase]
        summary.append([fault, phase, len(vals), fmean(vals) if vals else None, max(vals) if vals else None])
    rep.table("jitc_summary", ["fault", "phase", "count", "mean_s", "max_s"], summary, "Per phase")
    iters: list[list[Any]] = [[h, *it] for h, _, lg in logs for it in lg.iterations]
    rep.table("jitc_iterations", ["host", "rank", "epoch", "batch", "loss", "avg_iter_time_s"], iters)
    tests = [[h, f, *lg.test] for h, f, lg in logs if lg.test]
    if tests:
        rep.table("jitc_test", ["host", "file", "avg_loss", "correct", "total"], tests, "Test set")
    if iters:
        series = {}
        for rank in sorted({r[1] for r in iters}):
            pts = [(i, r[4]) for i, r in enumerate(r for r in iters if r[1] == rank)]
            series[f"rank {rank}"] = ([p[0] for p in pts], [p[1] for p in pts])
        rep.figure("jitc_loss", results.lines(series, xlabel="logged iteration", ylabel="loss"),
                   "Loss per logged iteration (restarts continue the index).")
    if fault != "none":
        seen = {r[3] for r in timing}
        missing = [p for p in ("checkpointing", "recovering") if p not in seen]
        n = len(timing)
        rep.check("checkpoint and recovery timed", not missing,
                  f"missing: {', '.join(missing)}" if missing else f"{n} timing line{'' if n == 1 else 's'}")
