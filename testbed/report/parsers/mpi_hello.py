"""mpi-hello stdout: ``Hello world from processor <host>, rank <r> out of <n> processors``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text

_RX = re.compile(r"Hello world from processor (\S+), rank (\d+) out of (\d+) processors")


@dataclass(frozen=True)
class HelloRow:
    processor: str
    rank: int
    size: int


def parse_mpi_hello(src: Path | str) -> Parsed[HelloRow]:
    """Every greeting in the text (other lines are ordinary log noise and not reported as skipped)."""
    text, _ = load_text(src)
    return Parsed([HelloRow(m[1], int(m[2]), int(m[3])) for m in _RX.finditer(text)])
