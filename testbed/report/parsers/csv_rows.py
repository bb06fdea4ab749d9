"""A header-checked CSV reader shared by the CSV formats: typed rows, skipped lines noted."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note, summarise_skips

R = TypeVar("R")


def parse_csv(
    src: Path | str,
    header: Sequence[str],
    make: Callable[[dict[str, str]], R],
    delimiter: str = ",",
) -> Parsed[R]:
    """Rows of a CSV whose first line is ``header`` (columns found by name, so order may differ).

    A row that is short (a truncated last line) or whose cells do not convert is skipped with a note.
    """
    text, label = load_text(src)
    out: Parsed[R] = Parsed()
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    cols: list[str] | None = None
    notes: list[str] = []
    for lineno, cells in enumerate(reader, start=1):
        if not cells or not "".join(cells).strip():
            continue
        if cols is None:
            names = [c.strip() for c in cells]
            missing = [h for h in header if h not in names]
            if missing:
                out.skipped.append(f"{label}:{lineno}: header lacks {', '.join(missing)}; file skipped")
                return out
            cols = names
            continue
        if len(cells) < len(cols):
            notes.append(skip_note(label, lineno, delimiter.join(cells), "short row (truncated?)"))
            continue
        try:
            out.rows.append(make(dict(zip(cols, (c.strip() for c in cells), strict=False))))
        except (ValueError, KeyError) as exc:
            notes.append(skip_note(label, lineno, delimiter.join(cells), f"bad value ({exc})"))
    if cols is None:
        out.skipped.append(f"{label}: empty file")
    out.skipped += summarise_skips(label, notes)
    return out
