"""NeuronaBox outputs: collective benchmarks (ns/op per size) and CNN ``results<rank>.txt`` step times."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note, summarise_skips

_SIZE = re.compile(r"size = (\d+), loop = (\d+)")
_AVG = re.compile(r"\[rk(\d+)\] average time for (\w+): ([\d.eE+-]+)")
_BYPASS = re.compile(r"MOD_KERNEL_BYPASS = (\d+)")
_HOST = re.compile(r"myrank (\d+) nranks (\d+) hostname (\S+)")
_STEP = re.compile(r"^(\d+) Epoch (\d+) Step (\d+) Time (\d+)\s*$")


@dataclass(frozen=True)
class CollRow:
    size: int | None
    loop: int | None
    rank: int
    metric: str
    ns_per_op: float
    bypass: bool | None


def parse_collective(src: Path | str) -> Parsed[CollRow]:
    """One row per ``[rkN] average time`` line, with the latest ``size = , loop =`` seen.

    Both ranks print into the one mpirun output, interleaved, so a ``MOD_KERNEL_BYPASS = `` line says nothing
    about the next row's rank: eval/coll/*.cu set MOD_KERNEL_BYPASS=1 on rank 0 (the emulated node) and 0 on the
    others, so a row's bypass is its rank's. The printed values are kept in ``meta["bypass_printed"]``.
    """
    text, _ = load_text(src)
    out: Parsed[CollRow] = Parsed()
    size = loop = None
    for line in text.splitlines():
        if m := _SIZE.search(line):
            size, loop = int(m[1]), int(m[2])
        elif m := _BYPASS.search(line):
            out.meta.setdefault("bypass_printed", []).append(m[1] == "1")
        elif m := _HOST.search(line):
            out.meta.setdefault("hosts", {})[int(m[1])] = m[3]
        elif m := _AVG.search(line):
            out.rows.append(CollRow(size, loop, int(m[1]), m[2], float(m[3]), int(m[1]) == 0))
    return out


@dataclass(frozen=True)
class StepTime:
    index: int
    epoch: int
    step: int
    ns: int


def parse_step_times(src: Path | str) -> Parsed[StepTime]:
    """``<i> Epoch <e> Step <s> Time <ns>`` lines; a cut-off last line is skipped and noted."""
    text, label = load_text(src)
    out: Parsed[StepTime] = Parsed()
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _STEP.match(line.strip()):
            out.rows.append(StepTime(int(m[1]), int(m[2]), int(m[3]), int(m[4])))
        elif line.strip():
            notes.append(skip_note(label, lineno, line))
    out.skipped = summarise_skips(label, notes)
    return out
