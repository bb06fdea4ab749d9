"""ISCA technique timings ``train_recorder_<variant>.txt``: ``Total elapsed time: <seconds>``."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note

_RX = re.compile(r"Total elapsed time:\s*([0-9.eE+-]+)")


def parse_elapsed(src: Path | str) -> Parsed[float]:
    """The elapsed seconds found (normally one); other non-empty lines are noted as skipped."""
    text, label = load_text(src)
    out: Parsed[float] = Parsed()
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _RX.search(line)
        if m:
            try:
                out.rows.append(float(m[1]))
                continue
            except ValueError:
                pass
        if line.strip():
            out.skipped.append(skip_note(label, lineno, line))
    if not out.rows:
        out.skipped.append(f"{label}: no 'Total elapsed time' line")
    return out


def overhead_pct(base: float, treated: float, per: float) -> float:
    """(treated - base) / base / per * 100: the per-unit overhead in percent (per = checks or reruns)."""
    return (treated - base) / base / per * 100
