"""Every table of a report as a tidy CSV next to it."""

from __future__ import annotations

import csv
from pathlib import Path

from testbed.report.model import Check, Report, Table, Timestamp


def write_table(out_dir: Path, table: Table) -> Path:
    """Write ``<name>.csv``: a header row, then one row per observation."""
    path = out_dir / f"{table.name}.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(table.columns)
        for row in table.rows:
            writer.writerow(["" if c is None else c.epoch if isinstance(c, Timestamp) else c for c in row])
    return path


def checks_table(checks: list[Check]) -> Table:
    rows = [[name, _verdict(passed), detail] for name, passed, detail in checks]
    return Table("checks", ["check", "result", "detail"], rows, "Checks")


def write_all(report: Report) -> list[Path]:
    """All tables, plus checks.csv when there are checks; names made unique."""
    seen: dict[str, int] = {}
    paths = []
    tables = list(report.tables)
    if report.checks:
        tables.append(checks_table(report.checks))
    for tab in tables:
        n = seen.get(tab.name, 0)
        seen[tab.name] = n + 1
        if n:
            tab.name = f"{tab.name}_{n + 1}"
        paths.append(write_table(report.out_dir, tab))
    return paths


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else ("pass" if passed else "FAIL")
