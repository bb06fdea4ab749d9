"""Scalable-ViT text logs: ``vit_training_rank_<r>.log`` and baseline_measure's ``metrics.txt``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note, summarise_skips

_VIT_METRIC = re.compile(r"Rank (\d+) - \w+ - Epoch \[(\d+)/(\d+)\] - Loss: ([\d.eE+-]+|nan), Accuracy: ([\d.eE+-]+)")
_VIT_TIME = re.compile(r"Rank (\d+) - \w+ - Epoch \[(\d+)/(\d+)\] completed in ([\d.eE+-]+) seconds")
_BASE_UTIL = re.compile(r"^(.*?) \| Rank (\d+) \| Local GPU (\d+) \| CPU: ([\d.]+)%, Mem: ([\d.]+)%, "
                        r"GPU: ([\d.]+)%, GPU Mem: ([\d.]+) MB")
_BASE_TIME = re.compile(r"^(.*?) \| Rank (\d+) \| Epoch (\d+) \| Computation Time: ([\d.eE+-]+) seconds")
_BASE_EPOCH = re.compile(r"^Rank (\d+): Epoch (\d+)/(\d+) complete in ([\d.eE+-]+) seconds")
_BASE_NOISE = re.compile(r"^(NCCL Debugging|Rank \d+: Starting Epoch)")


@dataclass
class VitEpoch:
    rank: int
    epoch: int
    loss: float | None = None
    accuracy: float | None = None
    seconds: float | None = None


def parse_vit_log(src: Path | str) -> Parsed[VitEpoch]:
    """One row per (rank, epoch): loss, accuracy and the epoch's wall time, merged from two lines."""
    text, label = load_text(src)
    rows: dict[tuple[int, int], VitEpoch] = {}
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _VIT_METRIC.search(line):
            ep = rows.setdefault((int(m[1]), int(m[2])), VitEpoch(int(m[1]), int(m[2])))
            ep.loss, ep.accuracy = float(m[4]), float(m[5])
        elif m := _VIT_TIME.search(line):
            ep = rows.setdefault((int(m[1]), int(m[2])), VitEpoch(int(m[1]), int(m[2])))
            ep.seconds = float(m[4])
        elif line.strip():
            notes.append(skip_note(label, lineno, line))
    return Parsed(sorted(rows.values(), key=lambda e: (e.rank, e.epoch)), summarise_skips(label, notes))


@dataclass(frozen=True)
class BaselineSample:
    ts: str
    rank: int
    gpu: int
    cpu_pct: float
    mem_pct: float
    gpu_pct: float
    gpu_mem_mb: float


@dataclass(frozen=True)
class BaselineEpoch:
    rank: int
    epoch: int
    seconds: float


@dataclass
class BaselineLog:
    samples: list[BaselineSample] = field(default_factory=list)
    epochs: list[BaselineEpoch] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def parse_baseline(src: Path | str) -> BaselineLog:
    """Utilisation samples and per-epoch computation times of baseline_measure.py."""
    text, label = load_text(src)
    out = BaselineLog()
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if m := _BASE_UTIL.match(s):
            out.samples.append(BaselineSample(m[1], int(m[2]), int(m[3]), float(m[4]), float(m[5]), float(m[6]),
                                              float(m[7])))
        elif m := _BASE_TIME.match(s):
            out.epochs.append(BaselineEpoch(int(m[2]), int(m[3]), float(m[4])))
        elif m := _BASE_EPOCH.match(s):
            out.epochs.append(BaselineEpoch(int(m[1]), int(m[2]), float(m[4])))
        elif s and not _BASE_NOISE.match(s):
            notes.append(skip_note(label, lineno, line))
    out.skipped = summarise_skips(label, notes)
    return out
