"""An estimate that ignores the parameter that scales the run is a static finding: points of the matrix that differ
only in epochs (steps, a data fraction...) would all be planned and budgeted at one time."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import lint
from testbed.suite import load_suite

SUITE = """\
name: sweep
parameters:
  epochs: {type: int, default: 1}
  model: {type: str, default: a, choices: [a, b]}
matrix:
  epochs: [1, 10]
  model: [a, b]
steps:
  launch:
    command: python3 train.py --epochs {{ epochs }}
estimate: ESTIMATE
"""


@pytest.mark.parametrize(("estimate", "flat"), [
    ("5m", True),
    ("{by: model, cases: {a: 5m, b: 10m}}", True),
    ("2m + 1m * epochs", False),
    ("{by: model, cases: {a: 1m * epochs, b: 10m * epochs}}", False),
])
def test_an_estimate_flat_in_a_scaling_parameter_is_named(tb_home: Path, estimate: str, flat: bool) -> None:
    (tb_home / "experiments").mkdir()
    path = tb_home / "experiments" / "sweep.yml"
    path.write_text(SUITE.replace("ESTIMATE", estimate))
    found = lint.estimate_ignores_scale(load_suite("sweep"), lint._runs(load_suite("sweep")))
    assert bool(found) == flat, [f.line() for f in found]
    if flat:
        assert found[0].where == f"{path}:11" and "whose epochs is 1, 10, though epochs scales the run" in found[0].what


def test_a_mutant_of_teslas_estimate_without_the_data_fraction_is_found(tmp_path: Path) -> None:
    from testbed.suite import suite_path

    text = suite_path("tesla").read_text()
    assert "16m * epochs * dataset_percentage" in text
    mutant = tmp_path / "tesla.yml"
    mutant.write_text(text.replace("16m * epochs * dataset_percentage", "16m * epochs"))
    s = load_suite(str(mutant))
    found = lint.estimate_ignores_scale(s, lint._runs(s))
    assert found and "dataset_percentage" in found[0].what, [f.line() for f in found]
    assert lint.estimate_ignores_scale(load_suite("tesla"), lint._runs(load_suite("tesla"))) == []
