"""Per-batch timing CSV ``<gpu>/<arch>-batch<bs>.csv``: ``data_stall_time<tab>cpu2gpu_time<tab>gpu_time``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.parsers.csv_rows import parse_csv

HEADER = ("data_stall_time", "cpu2gpu_time", "gpu_time")


@dataclass(frozen=True)
class BatchTiming:
    data_stall_time: float
    cpu2gpu_time: float
    gpu_time: float


def parse_batch_csv(src: Path | str) -> Parsed[BatchTiming]:
    """Rows for epochs >= 1 (as written by the profiler; its cpu2gpu column repeats the last value)."""
    return parse_csv(src, HEADER, lambda d: BatchTiming(float(d["data_stall_time"]), float(d["cpu2gpu_time"]),
                                                        float(d["gpu_time"])), delimiter="\t")
