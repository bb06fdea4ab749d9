"""A verdict that needs another point's run is a static finding (issue 37, item 5): a reference whose row one point
makes, and whose own words compare it with another run (the fault-free run, the baseline run), when that point's
commands never make such a run nor read it from another point through ``after:``."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import lint
from testbed.suite import load_suite

SUITE = """\
name: xp
parameters:
  mode: {type: str, default: a, choices: [a, b]}
matrix:
  mode: [a, b]
AFTER
steps:
  launch:
    command: >-
      {% if mode == 'a' %}python3 run.py --file fault_free.csv && {% endif %}python3 run.py --mode {{ mode }}
      --out {{ run_dir }}/r.txt
tables:
  t: {files: "*.csv", format: csv}
references:
  metrics:
    - metric: outcome of b
      table: t
      where: {run: b}
      column: outcome
      value: Degraded
      tolerance: {exact: true, why: "a class"}
      source: "README.md:9, WORDS"
"""


def _findings(tb_home: Path, words: str, after: str = "") -> list[lint.Finding]:
    (tb_home / "experiments").mkdir(exist_ok=True)
    (tb_home / "experiments" / "xp.yml").write_text(SUITE.replace("WORDS", words).replace("AFTER", after))
    s = load_suite("xp")
    return lint.cross_point_verdicts(s, lint._runs(s))


def test_a_verdict_compared_with_a_run_only_another_point_makes_is_named_at_its_reference(tb_home: Path) -> None:
    found = _findings(tb_home, "lower than the error-free run's")
    assert len(found) == 1, found
    line = SUITE.splitlines().index("    - metric: outcome of b") + 1
    assert found[0].where == f"{tb_home / 'experiments' / 'xp.yml'}:{line}"
    assert found[0].what.startswith("reference 'outcome of b' is judged on the run of mode=b against 'error-free run', "
                                    "which only mode=a makes: that point run alone has no such run to compare with")


def test_reading_the_point_that_makes_it_through_after_is_no_finding(tb_home: Path) -> None:
    after = "after:\n  - {name: ff, point: {mode: b}, reads: {mode: a}}"
    assert _findings(tb_home, "lower than the fault-free run", after) == []


@pytest.mark.parametrize(("words", "who"), [
    ("2x the baseline run", "which no point makes"),  # no command makes a baseline run at all
    ("within 2% of the fault-free training", "which only mode=a makes"),
])
def test_the_run_compared_with_is_read_from_the_references_words(tb_home: Path, words: str, who: str) -> None:
    found = _findings(tb_home, words)
    assert len(found) == 1 and who in found[0].what, found


@pytest.mark.parametrize("words", ["the paper's Table 3", "a fault-free checkpoint", "README: the run's accuracy"])
def test_a_reference_that_names_no_other_run_is_no_finding(tb_home: Path, words: str) -> None:
    assert _findings(tb_home, words) == []


def test_a_reference_of_every_point_is_no_finding(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "xp.yml").write_text(
        SUITE.replace("WORDS", "within 2% of the fault-free run").replace("AFTER", "")
        .replace("      where: {run: b}\n", ""))
    s = load_suite("xp")
    assert lint.cross_point_verdicts(s, lint._runs(s)) == []


def test_the_shipped_isca_suite_makes_the_fault_free_run_in_each_point_that_is_judged_against_one() -> None:
    s = load_suite("isca-resnet18")
    assert lint.cross_point_verdicts(s, lint._runs(s)) == []
