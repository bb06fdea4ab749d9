"""vmtouch output (``cache_result*.txt``): ``Resident Pages: 991250/2620080  3G/9G  37.8%``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from testbed.report.textio import load_text

_PAGES = re.compile(r"Resident Pages:\s*(\d+)/(\d+)\s+\S+/\S+\s+([0-9.]+)%")
_FILES = re.compile(r"Files:\s*(\d+)")


@dataclass(frozen=True)
class CacheResult:
    resident_pages: int
    total_pages: int
    percent: float
    files: int | None = None


def parse_vmtouch(src: Path | str) -> CacheResult | None:
    """The page-cache residency, or None when there is no ``Resident Pages`` line."""
    text, _ = load_text(src)
    m = _PAGES.search(text)
    if not m:
        return None
    f = _FILES.search(text)
    return CacheResult(int(m[1]), int(m[2]), float(m[3]), int(f[1]) if f else None)
