"""ISCA injection spec ``inj_<name>.csv``: ``key,value`` rows, no header."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.model import Parsed
from testbed.report.textio import load_text, skip_note


@dataclass(frozen=True)
class InjectionRow:
    key: str
    value: str


def parse_injection(src: Path | str) -> Parsed[InjectionRow]:
    """Key/value rows; ``meta`` holds them as a dict (target_epoch and target_step as ints when numeric)."""
    text, label = load_text(src)
    out: Parsed[InjectionRow] = Parsed()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition(",")
        if not sep or not key.strip():
            out.skipped.append(skip_note(label, lineno, line, "not a key,value row"))
            continue
        out.rows.append(InjectionRow(key.strip(), value.strip()))
        out.meta[key.strip()] = value.strip()
    for key in ("target_epoch", "target_step", "target_worker"):
        if str(out.meta.get(key, "")).isdigit():
            out.meta[key] = int(out.meta[key])
    return out
