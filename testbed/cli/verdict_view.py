"""The verdict table in a terminal (``testbed report``, ``testbed reproduce``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from testbed.report.verdicts import Verdict


def print_verdicts(c: Console, verdicts: Sequence[Verdict], title: str = "verdicts") -> None:
    """One line of summary, then a table: metric, reference, ours, difference, verdict, tolerance, hardware."""
    from rich.table import Table

    # lazy: testbed --help and completion load every command module
    from testbed.report.render import _difference, fmt_cell
    from testbed.report.verdicts import summary

    c.print(f"{title}: {escape(summary(verdicts))}")
    notes = {v.hardware for v in verdicts}
    one = len(notes) == 1  # the same hardware difference for every verdict: named once, above the table
    if one and next(iter(notes)):
        c.print(f"hardware: {escape(next(iter(notes)))}")
    t = Table(show_edge=False, pad_edge=False)
    for col in ("metric", "reference", "ours", "difference", "verdict", "tolerance", *(() if one else ("hardware",))):
        t.add_column(col, overflow="fold")
    style = {"within tolerance": "green", "outside tolerance": "red", "not measured": "yellow"}
    for v in verdicts:
        t.add_row(escape(v.metric), escape(fmt_cell(v.reference)), escape(fmt_cell(v.ours)), escape(_difference(v)),
                  f"[{style[v.status]}]{v.status}[/{style[v.status]}]", escape(v.tolerance),
                  *(() if one else (escape(v.hardware),)))
    c.print(t)
