"""jitc: checkpoint, consolidation and recovery times per fault type; loss per rank."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from testbed.report import plotting
from testbed.report.model import Report
from testbed.report.parsers.jitc import JitcLog, parse_jitc
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir
from testbed.textfmt import plural

PHASES = ("checkpointing", "consolidation", "recovering")


def fault_type(run: RunDir) -> str:
    for key in ("fault", "fault_type", "fault_kind"):
        if run.params.get(key):
            return str(run.params[key])
    kinds = [str(e.get("detail", {}).get("type") or e.get("detail", {}).get("fault") or "")
             for e in run.events if e.get("kind") == "fault" and isinstance(e.get("detail"), dict)]
    return next((k for k in kinds if k), "none")


@reporter("jitc", "open-jitc", tables=("jitc_timings", "jitc_summary", "jitc_iterations", "jitc_test"))
def report(run: RunDir, rep: Report) -> None:
    fault = fault_type(run)
    logs: list[tuple[str, str, JitcLog]] = []
    for host, path in run.files(r".*\.(out|log|txt)"):
        log = parse_jitc(path)
        rep.skip(log.skipped)
        if not log.empty:
            logs.append((host, run.rel(path), log))
    rep.heading(f"Just-in-time checkpointing (fault: {fault})")
    timing: list[list[Any]] = [[fault, h, f, t.phase, t.seconds] for h, f, lg in logs for t in lg.timings]
    rep.table("jitc_timings", ["fault", "host", "file", "phase", "seconds"], timing, "Timing lines")
    summary = []
    for phase in PHASES:
        vals = [r[4] for r in timing if r[3] == phase]
        summary.append([fault, phase, len(vals), fmean(vals) if vals else None, max(vals) if vals else None])
    rep.table("jitc_summary", ["fault", "phase", "count", "mean_s", "max_s"], summary, "Per phase")
    iters: list[list[Any]] = [[h, it.rank, it.epoch, it.batch, it.loss, it.avg_iter_time]
                              for h, _, lg in logs for it in lg.iterations]
    rep.table("jitc_iterations", ["host", "rank", "epoch", "batch", "loss", "avg_iter_time_s"], iters)
    tests = [[h, f, *lg.test] for h, f, lg in logs if lg.test]
    if tests:
        rep.table("jitc_test", ["host", "file", "avg_loss", "correct", "total"], tests, "Test set")
    if iters:
        series = {}
        for rank in sorted({r[1] for r in iters}):
            pts = [(i, r[4]) for i, r in enumerate(r for r in iters if r[1] == rank)]
            series[f"rank {rank}"] = ([p[0] for p in pts], [p[1] for p in pts])
        rep.figure("jitc_loss", plotting.lines(series, xlabel="logged iteration", ylabel="loss"),
                   "Loss per logged iteration (restarts continue the index).")
    if fault != "none":
        seen = {r[3] for r in timing}
        missing = [p for p in ("checkpointing", "recovering") if p not in seen]
        rep.check("checkpoint and recovery timed", not missing,
                  f"missing: {', '.join(missing)}" if missing else plural(len(timing), "timing line"))
