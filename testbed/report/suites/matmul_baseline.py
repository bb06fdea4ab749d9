"""matmul-baseline: per-rank matmul times and median seconds / GFLOP/s."""

from __future__ import annotations

from statistics import median

from testbed.report import plotting
from testbed.report.model import Report
from testbed.report.parsers.matmul import MatmulRow, parse_matmul
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir
from testbed.textfmt import plural


@reporter("matmul-baseline", tables=("matmul", "matmul_median"))
def report(run: RunDir, rep: Report) -> None:
    rows: list[MatmulRow] = []
    for host, path in run.files(r"matmul_rank\d+\.csv"):
        parsed = parse_matmul(path)
        rep.skip([f"{host}: {s}" for s in parsed.skipped])
        rows += parsed.rows
    rep.heading("Matrix multiply per rank")
    if not rows:
        rep.text("No matmul_rank<r>.csv was found.")
        rep.check("every rank reported", None, "no matmul output")
        return
    rep.table("matmul", ["rank", "host", "iteration", "size", "seconds", "gflops"],
              [[r.rank, r.host, r.iteration, r.size, r.seconds, r.gflops] for r in rows], "All iterations")
    ranks = sorted({r.rank for r in rows})
    by_rank = {k: [r for r in rows if r.rank == k] for k in ranks}
    rep.table("matmul_median", ["rank", "host", "iterations", "median_seconds", "median_gflops"],
              [[k, rs[0].host, len(rs), median(r.seconds for r in rs), median(r.gflops for r in rs)]
               for k, rs in by_rank.items()], "Median per rank")
    rep.figure("matmul_seconds", plotting.boxes({f"rank {k}": [r.seconds for r in rs] for k, rs in by_rank.items()},
                                                ylabel="seconds per matmul", title="Matmul time per rank"),
               "Distribution of per-iteration matmul time, one box per rank.")
    n = max((_world(run) or 0), len(ranks))
    missing = sorted(set(range(n)) - set(ranks))
    detail = f"{len(ranks)} of {plural(n, 'rank')}" + (f"; missing {missing}" if missing else "")
    rep.check("every rank reported", not missing, detail)


def _world(run: RunDir) -> int | None:
    for key in ("ranks", "np", "world_size"):
        v = run.params.get(key)
        if isinstance(v, int):
            return v
    return len(run.hosts) or None
