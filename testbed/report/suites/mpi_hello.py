"""mpi-hello: who answered, and did every rank answer?"""

from __future__ import annotations

from testbed.report.model import Report
from testbed.report.parsers.mpi_hello import HelloRow, parse_mpi_hello
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir
from testbed.textfmt import plural


@reporter("mpi-hello", tables=("hello",))
def report(run: RunDir, rep: Report) -> None:
    seen: dict[tuple[int, str], tuple[str, str, HelloRow]] = {}
    for host, path in run.files(r".*\.(out|log|txt)"):
        for row in parse_mpi_hello(path).rows:  # mpirun may echo every rank's line on the launcher too
            seen.setdefault((row.rank, row.processor), (host, run.rel(path), row))
    found = list(seen.values())
    rep.heading("Greetings")
    rep.table("hello", ["host_folder", "file", "processor", "rank", "size"],
              [[h, f, r.processor, r.rank, r.size] for h, f, r in sorted(found, key=lambda t: t[2].rank)],
              "Hello lines")
    if not found:
        rep.check("all ranks answered", False, "no Hello world line found")
        return
    size = max(r.size for _, _, r in found)
    ranks = {r.rank for _, _, r in found}
    missing = sorted(set(range(size)) - ranks)
    rep.check("all ranks answered", not missing,
              f"{len(ranks)} of {plural(size, 'rank')}" + (f"; missing {missing}" if missing else ""))
