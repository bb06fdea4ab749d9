"""The emulator's ``profile.csv``: tab separated, no header, N/A and #VALUE! cells (read as None)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note, to_float

COLUMNS = ("gpu_type", "gpu_memory", "model", "batch_size", "input_size", "memory_required_mb",
           "cpu2gpu_time", "gpu_compute_time", "batches_per_epoch", "transfer_per_epoch",
           "compute_per_epoch", "reason")
_BAD = ("N/A", "#VALUE!")


@dataclass(frozen=True)
class ProfileRow:
    gpu_type: str
    model: str
    batch_size: int | None
    cpu2gpu_time: float | None
    gpu_compute_time: float | None
    batches_per_epoch: float | None
    transfer_per_epoch: float | None
    compute_per_epoch: float | None


def parse_profile(src: Path | str) -> Parsed[ProfileRow]:
    text, label = load_text(src)
    out: Parsed[ProfileRow] = Parsed()
    bad_cells = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) < 8 or not cells[2].strip():
            out.skipped.append(skip_note(label, lineno, line, "fewer than 8 columns"))
            continue
        cells += [""] * (len(COLUMNS) - len(cells))
        bad_cells += sum(c.strip() in _BAD for c in cells)
        bs = to_float(cells[3])
        out.rows.append(ProfileRow(cells[0].strip(), cells[2].strip(), int(bs) if bs else None,
                                   *(to_float(cells[i]) for i in range(6, 11))))
    if bad_cells:
        out.skipped.append(f"{label}: {bad_cells} N/A or #VALUE! cells read as empty")
    return out


def lookup(rows: list[ProfileRow], gpu_type: str, model: str, batch_size: int) -> tuple[float, float] | None:
    """(cpu2gpu, compute) seconds per batch; another batch size is scaled linearly, as the emulator does.

    ``gpu_type`` matches case-insensitively as a substring of the profile's GPU Type.
    """
    cands = [r for r in rows if gpu_type.lower() in r.gpu_type.lower() and r.model == model
             and r.batch_size and r.cpu2gpu_time is not None and r.gpu_compute_time is not None]
    if not cands:
        return None
    exact = [r for r in cands if r.batch_size == batch_size]
    r = exact[0] if exact else cands[0]
    scale = batch_size / r.batch_size if r.batch_size else 1.0
    return r.cpu2gpu_time * scale, r.gpu_compute_time * scale  # type: ignore[operator]
