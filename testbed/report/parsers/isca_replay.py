"""ISCA fault-injection logs: ``replay_<inj>.txt`` and ``fault_free.txt`` (artifacts.md section 4)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.textio import load_text, skip_note, summarise_skips

_NUM = r"([-+\w.]+)"  # also matches nan / inf
_STEP = re.compile(rf"Epoch: (\d+)/(\d+), step: (\d+)/(\d+), loss: {_NUM}, accuracy: {_NUM}\s*$")
_END = re.compile(rf"End of epoch: (\d+)/(\d+), train loss: {_NUM}, train accuracy: {_NUM}, "
                  rf"valid loss: {_NUM}, valid accuracy: {_NUM}\s*$")
_KV = re.compile(r"(Inject to epoch|Inject to step|Inject worker|Inject layer):\s*(.*?)\s*$"
                 r"|(Load weights from) (.*?)\s*$")
_KNOWN = ("Shape for target layer", "Position is", "Encounter NaN")


@dataclass(frozen=True)
class StepRow:
    epoch: int
    step: int
    steps_per_epoch: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    train_loss: float
    train_accuracy: float
    valid_loss: float
    valid_accuracy: float


@dataclass
class ReplayLog:
    """One replay (or fault-free) run: step rows, end-of-epoch rows, injection facts and what was skipped."""

    steps: list[StepRow] = field(default_factory=list)
    epochs: list[EpochRow] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    nan_terminated: bool = False
    skipped: list[str] = field(default_factory=list)

    @property
    def first_nonfinite(self) -> StepRow | None:
        return next((s for s in self.steps if not math.isfinite(s.loss)), None)

    @property
    def final(self) -> EpochRow | None:
        return self.epochs[-1] if self.epochs else None


def _f(text: str) -> float:
    return float(text.rstrip(","))


def parse_replay(src: Path | str) -> ReplayLog:
    """Parse a replay or fault-free log; a cut-off last line or stray text is skipped with a note."""
    text, label = load_text(src)
    log = ReplayLog()
    notes: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if m := _STEP.search(line):
                log.steps.append(StepRow(int(m[1]), int(m[3]), int(m[4]), _f(m[5]), _f(m[6])))
            elif m := _END.search(line):
                log.epochs.append(EpochRow(int(m[1]), _f(m[3]), _f(m[4]), _f(m[5]), _f(m[6])))
            elif m := _KV.match(line.strip()):
                log.info[m[1] or m[3]] = m[2] if m[1] else m[4]
            elif line.strip().startswith(_KNOWN):
                log.nan_terminated |= line.strip().startswith("Encounter NaN")
                if line.strip().startswith("Position is"):
                    log.info["Position"] = line.strip()[len("Position is "):]
            else:
                notes.append(skip_note(label, lineno, line))
        except ValueError as exc:
            notes.append(skip_note(label, lineno, line, f"bad number ({exc})"))
    log.skipped = summarise_skips(label, notes)
    return log
