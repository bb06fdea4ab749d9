"""fault-drill ``train_log.csv``: ``time,attempt,epoch,step,loss`` (time in unix seconds)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.parsers.csv_rows import parse_csv

HEADER = ("time", "attempt", "epoch", "step", "loss")


@dataclass(frozen=True)
class TrainRow:
    time: float
    attempt: int
    epoch: int
    step: int
    loss: float


def parse_train_log(src: Path | str) -> Parsed[TrainRow]:
    """Rows of one rank's training log; a truncated last line is skipped and noted."""
    return parse_csv(src, HEADER, lambda d: TrainRow(float(d["time"]), int(d["attempt"]), int(d["epoch"]),
                                                     int(d["step"]), float(d["loss"])))


def global_steps(rows: list[TrainRow]) -> list[int]:
    """A monotone step index for each row.

    If ``step`` restarts at each epoch (within one attempt, epoch goes up while step goes down),
    the global step is ``epoch * steps_per_epoch + step`` with ``steps_per_epoch = max(step) + 1``;
    otherwise ``step`` already counts across epochs and is used as is.
    """
    per_epoch = False
    for a, b in itertools.pairwise(rows):
        if a.attempt == b.attempt and b.epoch > a.epoch and b.step <= a.step:
            per_epoch = True
            break
    if not per_epoch:
        return [r.step for r in rows]
    spe = max(r.step for r in rows) + 1
    return [r.epoch * spe + r.step for r in rows]
