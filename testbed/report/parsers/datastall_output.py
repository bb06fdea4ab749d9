"""Data-stall emulator stdout ``output*.txt`` (artifacts.md section 3).

Each batch prints ``batch N <tab> data_time: x <tab> cpu2gpu_time: y <tab> gpu_time: z`` and then a line of
the epoch's *cumulative* ``data cpu2gpu gpu`` seconds. **Epoch boundaries** are found from the batch index:
a ``batch N`` line whose N is not greater than the previous batch's starts a new epoch (the emulator counts
from 0 each epoch and resets its cumulative totals there). An epoch's totals are its last cumulative line.
The last epoch is incomplete when the run was interrupted (a Python traceback follows) or when it has fewer
batches than the epoch before it; incomplete epochs are kept but flagged, and noted as skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.textio import load_text, skip_note, summarise_skips

_BATCH = re.compile(r"^batch\s+(\d+)\s+data_time:\s*(\S+)\s+cpu2gpu_time:\s*(\S+)\s+gpu_time:\s*(\S+)\s*$")
_TOTALS = re.compile(r"^\s*([0-9.eE+-]+)\s+([0-9.eE+-]+)\s+([0-9.eE+-]+)\s*$")
_HEADER = re.compile(r"batch_size:\s*(\d+)\s+batch_cpu2gpu_time:\s*(\S+)\s+batch_gpu_compute_time:\s*(\S+)")
_NOISE = ("We don't find the matching batch size", "=> creating model", "using CPU", "NOT using MinIO",
          "Using MinIO", "=> ", "Use GPU")


@dataclass(frozen=True)
class Totals:
    """Seconds spent waiting for data, copying to the (emulated) GPU, and computing."""

    data: float
    cpu2gpu: float
    gpu: float

    @property
    def total(self) -> float:
        return self.data + self.cpu2gpu + self.gpu


@dataclass(frozen=True)
class BatchRow:
    epoch: int
    batch: int
    data: float
    cpu2gpu: float
    gpu: float


@dataclass
class Epoch:
    number: int  # 1-based
    batches: int = 0
    last_batch: int = -1
    totals: Totals | None = None
    complete: bool = True


@dataclass
class EmulatorOutput:
    """A parsed output file: header, per-batch rows, per-epoch cumulative totals, what was skipped."""

    batch_size: int | None = None
    batch_cpu2gpu_time: float | None = None
    batch_gpu_compute_time: float | None = None
    rows: list[BatchRow] = field(default_factory=list)
    epochs: list[Epoch] = field(default_factory=list)
    interrupted: str | None = None
    skipped: list[str] = field(default_factory=list)

    def epoch_totals(self, number: int) -> Totals | None:
        """Cumulative totals of a complete epoch (1-based), or None."""
        ep = next((e for e in self.epochs if e.number == number), None)
        return ep.totals if ep and ep.complete else None

    @property
    def final(self) -> Totals | None:
        """Totals of the last complete epoch (the file's last line when the run finished)."""
        done = [e for e in self.epochs if e.complete and e.totals]
        return done[-1].totals if done else None

    @property
    def final_epoch(self) -> Epoch | None:
        done = [e for e in self.epochs if e.complete and e.totals]
        return done[-1] if done else None


def parse_emulator_output(src: Path | str) -> EmulatorOutput:
    text, label = load_text(src)
    out = EmulatorOutput()
    notes: list[str] = []
    traceback_at = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if traceback_at:
            if re.match(r"^\w*(Error|Interrupt|Exception)\b", line):
                out.interrupted = line
            continue
        if line.startswith("Traceback"):
            traceback_at = lineno
            out.interrupted = "traceback"
            continue
        try:
            if m := _BATCH.match(line):
                idx = int(m[1])
                if not out.epochs or idx <= out.epochs[-1].last_batch:
                    out.epochs.append(Epoch(len(out.epochs) + 1))
                ep = out.epochs[-1]
                out.rows.append(BatchRow(ep.number, idx, float(m[2]), float(m[3]), float(m[4])))
                ep.batches += 1
                ep.last_batch = idx
            elif m := _TOTALS.match(line):
                if not out.epochs:
                    notes.append(skip_note(label, lineno, line, "totals before any batch"))
                else:
                    out.epochs[-1].totals = Totals(float(m[1]), float(m[2]), float(m[3]))
            elif m := _HEADER.search(line):
                out.batch_size = int(m[1])
                out.batch_cpu2gpu_time, out.batch_gpu_compute_time = float(m[2]), float(m[3])
            elif line.startswith("We don't find") and not line.startswith(_NOISE):  # no profile row: it exits 0
                out.interrupted = f"the emulator found no profile data: {line.strip()[:120]}"
                out.skipped.append(f"{label}:{lineno}: {line.strip()[:160]} (the emulator stopped: nothing measured)")
            elif not line.startswith(_NOISE):
                notes.append(skip_note(label, lineno, line))
        except ValueError as exc:
            notes.append(skip_note(label, lineno, line, f"bad number ({exc})"))
    _flag_incomplete(out, label)
    out.skipped = summarise_skips(label, notes) + out.skipped
    return out


def _flag_incomplete(out: EmulatorOutput, label: str) -> None:
    if not out.epochs:
        return
    last = out.epochs[-1]
    shorter = len(out.epochs) > 1 and last.batches < out.epochs[-2].batches
    if out.interrupted or shorter or last.totals is None:
        last.complete = False
        why = f"interrupted ({out.interrupted})" if out.interrupted else "fewer batches than the epoch before"
        out.skipped.append(f"{label}: epoch {last.number} incomplete, {why} after batch {last.last_batch} "
                           f"({last.batches} batches); its totals are not used")


def parse_totals_lines(src: Path | str) -> tuple[list[Totals], list[str]]:
    """Lines of three numbers ``data cpu2gpu gpu`` (e.g. the artifact's parsed_output.txt)."""
    text, label = load_text(src)
    rows, notes = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _TOTALS.match(line)
        if m:
            rows.append(Totals(float(m[1]), float(m[2]), float(m[3])))
        else:
            notes.append(skip_note(label, lineno, line))
    return rows, summarise_skips(label, notes)
