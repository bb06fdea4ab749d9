"""matmul-baseline's report: per-rank matmul times, median seconds and GFLOP/s, and did every rank report?

Loaded by testbed from this folder (testbed.results, API 2: csv_rows, boxes) whenever it reports a run of this
suite. Each rank writes ``matmul_rank<r>.csv``: ``rank,host,iteration,size,seconds,gflops``."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from testbed import results

results.require(2)

HEADER = ("rank", "host", "iteration", "size", "seconds", "gflops")


def timings(src: Path | str) -> tuple[list[tuple[int, str, int, int, float, float]], list[str]]:
    """The typed rows of one matmul_rank<r>.csv (a Path, or its text) and the notes of the rows skipped."""
    rows, notes = results.csv_rows(src, HEADER)
    out = []
    for r in rows:
        try:
            out.append((int(r["rank"]), r["host"], int(r["iteration"]), int(r["size"]), float(r["seconds"]),
                        float(r["gflops"])))
        except ValueError as exc:
            notes.append(f"{getattr(src, 'name', '<text>')}: row skipped, bad value ({exc}): {','.join(r.values())}")
    return out, notes


@results.reporter(tables=["matmul", "matmul_median"])
def report(run: results.RunDir, rep: results.Report) -> None:
    rows: list[tuple[int, str, int, int, float, float]] = []
    for host, path in run.files(r"matmul_rank\d+\.csv"):
        got, notes = timings(path)
        rep.skip([f"{host}: {s}" for s in notes])
        rows += got
    rep.heading("Matrix multiply per rank")
    if not rows:
        rep.text("No matmul_rank<r>.csv was found.")
        rep.check("every rank reported", None, "no matmul output")
        return
    rep.table("matmul", ["rank", "host", "iteration", "size", "seconds", "gflops"], [list(r) for r in rows],
              "All iterations")
    ranks = sorted({r[0] for r in rows})
    by_rank = {k: [r for r in rows if r[0] == k] for k in ranks}
    rep.table("matmul_median", ["rank", "host", "iterations", "median_seconds", "median_gflops"],
              [[k, rs[0][1], len(rs), median(r[4] for r in rs), median(r[5] for r in rs)]
               for k, rs in by_rank.items()], "Median per rank")
    rep.figure("matmul_seconds", results.boxes({f"rank {k}": [r[4] for r in rs] for k, rs in by_rank.items()},
                                               ylabel="seconds per matmul", title="Matmul time per rank"),
               "Distribution of per-iteration matmul time, one box per rank.")
    n = max(world(run) or 0, len(ranks))
    missing = sorted(set(range(n)) - set(ranks))
    detail = f"{len(ranks)} of {n} rank{'' if n == 1 else 's'}" + (f"; missing {missing}" if missing else "")
    rep.check("every rank reported", not missing, detail)


def world(run: results.RunDir) -> int | None:
    """The rank count the run was asked for: its ranks/np/world_size parameter, else its host count."""
    for key in ("ranks", "np", "world_size"):
        v = run.params.get(key)
        if isinstance(v, int):
            return v
    return len(run.hosts) or None
