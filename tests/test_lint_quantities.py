"""A verdict that compares a different quantity than the paper's claim is a static finding: a reference whose metric
says one unit (%, a fraction, ms, s) while its column holds another."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import lint
from testbed.suite import load_suite, suite_path

SUITE = """\
name: units
steps:
  launch:
    command: python3 train.py
tables:
  t: {files: "*.csv", format: csv}
references:
  metrics:
    - metric: METRIC
      table: t
      column: COLUMN
      value: 1
      tolerance: {rel: 0.1, why: "noise"}
      source: "paper"
"""


@pytest.mark.parametrize(("metric", "column", "mismatch"), [
    ("stall %", "stall_fraction", True),
    ("stall fraction", "stall_pct", True),
    ("step time s", "step_ms", True),
    ("step time ms", "step_s", True),
    ("stall %", "stall_pct", False),
    ("epoch time s", "epoch_seconds", False),
    ("images per second", "images", False),  # a rate: no unit this check knows on the column
])
def test_a_reference_whose_metric_and_column_disagree_on_the_unit_is_named(
        tb_home: Path, metric: str, column: str, mismatch: bool) -> None:
    (tb_home / "experiments").mkdir()
    path = tb_home / "experiments" / "units.yml"
    path.write_text(SUITE.replace("METRIC", metric).replace("COLUMN", column))
    found = lint.unit_mismatches(load_suite("units"))
    assert bool(found) == mismatch, [f.line() for f in found]
    if mismatch:
        assert found[0].where == f"{path}:9" and f"compares column '{column}'" in found[0].what


def test_a_mutant_of_datastalls_cached_percent_reading_the_stall_fraction_is_found(tmp_path: Path) -> None:
    text = suite_path("datastall-emulator").read_text()
    old = "      column: cached_pct\n"
    assert old in text
    mutant = tmp_path / "datastall-emulator.yml"
    mutant.write_text(text.replace(old, "      column: fetch_stall_fraction\n", 1))
    found = lint.unit_mismatches(load_suite(str(mutant)))
    assert found and "is in percent but compares column 'fetch_stall_fraction'" in found[0].what, found
    assert lint.unit_mismatches(load_suite("datastall-emulator")) == []


def test_a_reference_keyed_by_a_host_name_is_named_and_one_keyed_by_rank_is_not(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    path = tb_home / "experiments" / "units.yml"
    text = SUITE.replace("METRIC", "epoch s").replace("COLUMN", "epoch_s")
    path.write_text(text.replace("      table: t\n", "      table: t\n      where: {host: ecetesla0}\n"))
    found = lint.host_keyed_references(load_suite("units"))
    assert len(found) == 1 and found[0].where == f"{path}:11" and "'ecetesla0'" in found[0].what, found
    path.write_text(text.replace("      table: t\n", "      table: t\n      where: {rank: 0}\n"))
    assert lint.host_keyed_references(load_suite("units")) == []
