"""matmul-baseline ``matmul_rank<r>.csv``: ``rank,host,iteration,size,seconds,gflops``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.parsers.csv_rows import parse_csv

HEADER = ("rank", "host", "iteration", "size", "seconds", "gflops")


@dataclass(frozen=True)
class MatmulRow:
    rank: int
    host: str
    iteration: int
    size: int
    seconds: float
    gflops: float


def parse_matmul(src: Path | str) -> Parsed[MatmulRow]:
    return parse_csv(src, HEADER, lambda d: MatmulRow(int(d["rank"]), d["host"], int(d["iteration"]),
                                                      int(d["size"]), float(d["seconds"]), float(d["gflops"])))
