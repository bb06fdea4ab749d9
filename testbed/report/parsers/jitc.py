"""open-jitc stdout: iteration, checkpoint/consolidation/recovery timing and test-set lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.textio import load_text

_ITER = re.compile(r"Rank (\d+) \| Epoch (\d+) \| Batch (\d+) \| Loss ([\d.eE+-]+|nan|inf) \| "
                   r"Avg Iter Time ([\d.eE+-]+)")
_TIMING = re.compile(r"(Checkpointing|Consolidation|Recovering) took ([\d.eE+-]+) seconds")
_TEST = re.compile(r"Test set: Average loss ([\d.eE+-]+|nan), Accuracy (\d+)/(\d+)")
_SIZE = re.compile(r"Model Size \(GB\): ([\d.eE+-]+)")


@dataclass(frozen=True)
class IterRow:
    rank: int
    epoch: int
    batch: int
    loss: float
    avg_iter_time: float


@dataclass(frozen=True)
class TimingRow:
    phase: str  # checkpointing | consolidation | recovering
    seconds: float


@dataclass
class JitcLog:
    iterations: list[IterRow] = field(default_factory=list)
    timings: list[TimingRow] = field(default_factory=list)
    test: tuple[float, int, int] | None = None  # (average loss, correct, total)
    model_size_gb: float | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.iterations or self.timings or self.test)


def parse_jitc(src: Path | str) -> JitcLog:
    """Recognised lines only; stdout carries much else (NCCL, warnings), which is not reported as skipped."""
    text, label = load_text(src)
    out = JitcLog()
    for line in text.splitlines():
        if m := _ITER.search(line):
            out.iterations.append(IterRow(int(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5])))
        elif m := _TIMING.search(line):
            out.timings.append(TimingRow(m[1].lower(), float(m[2])))
        elif m := _TEST.search(line):
            out.test = (float(m[1]), int(m[2]), int(m[3]))
        elif m := _SIZE.search(line):
            out.model_size_gb = float(m[1])
        elif ("took" in line or "| Batch" in line) and line.strip():
            out.skipped.append(f"{label}: cut-off or odd line: {line.strip()[:80]!r}")
    return out
