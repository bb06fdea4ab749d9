"""The readers of a suite's declared tables (testbed.tables): text in, rows (column -> value) out; pure.

``regex_rows``, ``csv_rows`` and ``json_rows`` read every value a file gives; :func:`typed_columns` then makes a
column int or float where its values parse as such.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from testbed import rx as rx_mod
from testbed.report.model import Parsed
from testbed.report.textio import skip_note, summarise_skips

Row = dict[str, Any]


def regex_rows(text: str, regex: str, label: str = "<text>") -> Parsed[Row]:
    """One row per match of ``regex`` (``^``/``$`` at each line), a column per named group."""
    rx = rx_mod.compile(regex, multiline=True)  # RE2: linear in the text, whatever the pattern
    out: Parsed[Row] = Parsed()
    names = rx_mod.group_names(regex)  # in the order the groups open, as the regex writes them
    out.rows = [{k: m.group(k) for k in names} for m in rx.finditer(text)]
    if not out.rows:
        out.skipped.append(f"{label}: no line matches the table's regex")
    return out


def csv_rows(text: str, delimiter: str = ",", label: str = "<text>") -> Parsed[Row]:
    """One row per CSV line after the header; a short line (a truncated last row) is skipped with a note."""
    out: Parsed[Row] = Parsed()
    notes: list[str] = []
    cols: list[str] | None = None
    for lineno, cells in enumerate(csv.reader(io.StringIO(text), delimiter=delimiter), start=1):
        if not cells or not "".join(cells).strip():
            continue
        if cols is None:
            cols = [c.strip() for c in cells]
            continue
        if len(cells) < len(cols):
            notes.append(skip_note(label, lineno, delimiter.join(cells), "short row (truncated?)"))
            continue
        out.rows.append({c: v.strip() for c, v in zip(cols, cells, strict=False)})
    if cols is None:
        out.skipped.append(f"{label}: empty file")
    out.meta["columns"] = cols or []
    out.skipped += summarise_skips(label, notes)
    return out


def json_rows(text: str, label: str = "<text>") -> Parsed[Row]:
    """One row per object: a JSON list of objects, one object, or JSON lines (one object per line)."""
    out: Parsed[Row] = Parsed()
    try:
        data = json.loads(text)
    except RecursionError:
        out.skipped.append(f"{label}: JSON nested deeper than testbed reads (about {sys.getrecursionlimit()} "
                           "levels); not read")
        return out
    except ValueError:
        notes: list[str] = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):
                notes.append(skip_note(label, lineno, line, "not JSON"))
                continue
            _add(out, item, f"{label}:{lineno}")
        out.skipped += summarise_skips(label, notes)
        return out
    for i, item in enumerate(data if isinstance(data, list) else [data]):
        _add(out, item, f"{label}: item {i + 1}" if isinstance(data, list) else label)
    return out


def _add(out: Parsed[Row], item: Any, where: str) -> None:
    if isinstance(item, Mapping):
        out.rows.append({str(k): _cell(v) for k, v in item.items()})
    else:
        out.skipped.append(f"{where}: not a JSON object; skipped")


def _cell(v: Any) -> Any:
    """A JSON value as a cell: scalars as they are, a list or object as its JSON text."""
    return v if v is None or isinstance(v, bool | int | float | str) else json.dumps(v, sort_keys=True)


def keep(rows: Sequence[Row], columns: Sequence[str] | Mapping[str, str] | None,
         label: str = "<text>") -> tuple[list[str], list[Row], list[str]]:
    """(the table's columns, the rows with only those, notes): ``columns`` keeps (a mapping also renames) the
    file's columns; None keeps every one, in the order first seen."""
    if columns is None:
        names: list[str] = []
        for r in rows:
            names += [k for k in r if k not in names]
        return names, [dict(r) for r in rows], []
    pairs = list(columns.items()) if isinstance(columns, Mapping) else [(c, c) for c in columns]
    missing = sorted({src for src, _ in pairs for r in rows if src not in r})
    notes = [f"{label}: no {', '.join(missing)} in some rows (left empty)"] if missing else []
    return [new for _, new in pairs], [{new: r.get(src) for src, new in pairs} for r in rows], notes


_PARSE = {"int": int, "float": float}


def typed_columns(names: Sequence[str], rows: list[Row], types: Mapping[str, str]) -> list[str]:
    """Type each column in place: as ``types`` says, else int when every text value is an integer, float when
    every one is a number; an empty text is None. Notes for values that do not parse as their declared type."""
    notes: list[str] = []
    for name in names:
        texts = [r[name] for r in rows if isinstance(r.get(name), str)]
        for r in rows:
            if r.get(name) == "":
                r[name] = None
        texts = [t for t in texts if t != ""]
        kind = types.get(name) or next((k for k in ("int", "float") if all(_parses(t, k) for t in texts)), "str")
        if kind == "str" or not texts:
            continue
        bad = 0
        for r in rows:
            v = r.get(name)
            if isinstance(v, str):
                r[name] = _PARSE[kind](v) if _parses(v, kind) else None
                bad += not _parses(v, kind)
        if bad:
            notes.append(f"column {name}: {bad} value(s) not {kind}; left empty")
    return notes


def _parses(text: str, kind: str) -> bool:
    try:
        _PARSE[kind](text.strip())
    except (ValueError, OverflowError):
        return False
    return True
