"""Reading artifact outputs: a path or the text itself, never failing on bad bytes."""

from __future__ import annotations

import math
from pathlib import Path


def load_text(src: Path | str) -> tuple[str, str]:
    """(text, label): a Path is read (bad bytes replaced), a str is the text itself."""
    if isinstance(src, Path):
        return src.read_text(encoding="utf-8", errors="replace"), src.name
    return src, "<text>"


def to_float(value: str) -> float | None:
    """A float from a cell like ``80.0%``, ``1,234`` or ``nan``; None for N/A, #VALUE!, blanks."""
    v = value.strip().rstrip("%").replace(",", "")
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def skip_note(label: str, lineno: int, line: str, why: str = "unrecognised line") -> str:
    """A uniform note for a skipped line: ``file:line: why: 'text'``."""
    text = line.strip()
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{label}:{lineno}: {why}: {text!r}"


def summarise_skips(label: str, notes: list[str], limit: int = 5) -> list[str]:
    """Keep the first ``limit`` notes and count the rest, so a noisy file does not flood the report."""
    if len(notes) <= limit:
        return notes
    return [*notes[:limit], f"{label}: ... and {len(notes) - limit} more skipped lines"]
