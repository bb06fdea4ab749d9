"""Helpers shared by suite reporters."""

from __future__ import annotations

import re
from pathlib import Path
from statistics import fmean

_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def rank_of(path: Path, default: int) -> int:
    """The rank named in a file or folder name (``rank3``, ``matmul_rank3.csv``), else ``default``."""
    for part in reversed(path.parts):
        m = _RANK.search(part)
        if m:
            return int(m[1])
    return default


def mean_by(pairs: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    """Group (x, y) pairs by x, average y; sorted by x."""
    groups: dict[int, list[float]] = {}
    for x, y in pairs:
        groups.setdefault(x, []).append(y)
    xs = sorted(groups)
    return xs, [fmean(groups[x]) for x in xs]
