"""mpi-hello's report: who answered, and did every rank answer?

Loaded by testbed from this folder (testbed.results, API 1) whenever it reports a run of this suite."""

from __future__ import annotations

import re

from testbed import results

results.require(1)

HELLO = re.compile(r"Hello world from processor (\S+), rank (\d+) out of (\d+) processors")


def greetings(text: str) -> list[tuple[str, int, int]]:
    """(processor, rank, size) of every greeting in ``text`` (other lines are ordinary log noise)."""
    return [(m[1], int(m[2]), int(m[3])) for m in HELLO.finditer(text)]


@results.reporter(tables=["hello"])
def report(run: results.RunDir, rep: results.Report) -> None:
    seen: dict[tuple[int, str], tuple[str, str, int]] = {}
    for host, path in run.files(r".*\.(out|log|txt)"):
        text = path.read_text(encoding="utf-8", errors="replace")
        for processor, rank, size in greetings(text):  # mpirun may echo every rank's line on the launcher too
            seen.setdefault((rank, processor), (host, run.rel(path), size))
    rep.heading("Greetings")
    rep.table("hello", ["host_folder", "file", "processor", "rank", "size"],
              [[h, f, proc, rank, size] for (rank, proc), (h, f, size) in sorted(seen.items())], "Hello lines")
    if not seen:
        rep.check("all ranks answered", False, "no Hello world line found")
        return
    size = max(s for _, _, s in seen.values())
    ranks = {rank for rank, _ in seen}
    missing = sorted(set(range(size)) - ranks)
    rep.check("all ranks answered", not missing,
              f"{len(ranks)} of {size} rank{'' if size == 1 else 's'}" + (f"; missing {missing}" if missing else ""))
