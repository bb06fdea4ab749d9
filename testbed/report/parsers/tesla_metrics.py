"""Scalable-ViT ``metrics.csv`` (header read by name; ``GPU_Load`` like ``80.0%``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.parsers.csv_rows import parse_csv
from testbed.report.textio import to_float

HEADER = ("Timestamp", "Rank", "Epoch", "Computation_Time", "GPU_ID", "GPU_Name", "GPU_Load",
          "GPU_Free_Mem_MB", "GPU_Used_Mem_MB", "GPU_Total_Mem_MB", "GPU_Temp_C")
_CONFIG = re.compile(r"(\d+)_GPUs?/p([\d.]+)_b(\d+)_e(\d+)")


@dataclass(frozen=True)
class MetricRow:
    timestamp: str
    rank: int
    epoch: int
    computation_time: float
    gpu_id: int
    gpu_name: str
    gpu_load_pct: float | None
    gpu_free_mem_mb: float | None
    gpu_used_mem_mb: float | None
    gpu_total_mem_mb: float | None
    gpu_temp_c: float | None


def _row(d: dict[str, str]) -> MetricRow:
    return MetricRow(d["Timestamp"], int(d["Rank"]), int(d["Epoch"]), float(d["Computation_Time"]),
                     int(float(d["GPU_ID"])), d["GPU_Name"], to_float(d["GPU_Load"]), to_float(d["GPU_Free_Mem_MB"]),
                     to_float(d["GPU_Used_Mem_MB"]), to_float(d["GPU_Total_Mem_MB"]), to_float(d["GPU_Temp_C"]))


def parse_metrics(src: Path | str) -> Parsed[MetricRow]:
    return parse_csv(src, HEADER, _row)


@dataclass(frozen=True)
class RunConfig:
    """From ``log/<N>_GPU[s]/p<pct>_b<micro>_e<epochs>/``."""

    gpus: int
    fraction: float
    micro_batch: int
    epochs: int


def config_from_path(path: Path | str) -> RunConfig | None:
    m = _CONFIG.search(Path(path).as_posix())
    return RunConfig(int(m[1]), float(m[2]), int(m[3]), int(m[4])) if m else None
