"""Every table of a report as a tidy CSV next to it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.report.model import Check, Report, Table, Timestamp

if TYPE_CHECKING:
    from testbed.report.verdicts import Verdict


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
    rows: list[list[object]] = [[name, _verdict(passed), detail] for name, passed, detail in checks]
    return Table("checks", ["check", "result", "detail"], rows, "Checks")


VERDICT_COLUMNS = ["metric", "reference", "ours", "difference", "relative_pct", "verdict", "tolerance", "hardware",
                   "source", "note"]


def verdicts_table(verdicts: list[Verdict]) -> Table:
    """The verdicts (testbed.report.verdicts.Verdict) as a tidy table."""
    rows = [[v.metric, v.reference, v.ours, v.difference, v.relative_pct, v.status, v.tolerance, v.hardware, v.source,
             v.note] for v in verdicts]
    return Table("verdicts", VERDICT_COLUMNS, rows, "Verdicts")


def write_all(report: Report) -> list[Path]:
    """All tables, plus verdicts.csv and checks.csv when there are verdicts and checks; names made unique."""
    seen: dict[str, int] = {}
    paths = []
    tables = list(report.tables)
    if report.verdicts:
        tables.append(verdicts_table(report.verdicts))
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
