"""The index's line per run says the run's status, its checks and its verdicts side by side: never a bare "pass"
over a verdict outside tolerance (issue 41: a green headline over a red verdict, and "run pass")."""

from __future__ import annotations

import json
from pathlib import Path

from test_campaign_report import _app, results_tree
from typer.testing import CliRunner

from testbed.report.folders import IndexResult


def _printed(res: IndexResult, capsys) -> list[str]:  # type: ignore[no-untyped-def]
    from testbed.cli.collect import _print_index

    _print_index(res)
    return [" ".join(ln.split()) for ln in capsys.readouterr().out.splitlines() if ln.startswith("run ")]


def test_a_run_outside_tolerance_is_never_printed_as_a_bare_pass(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    row = {"run_id": "r1", "suite": "s", "campaign": None, "status": "succeeded", "report": str(tmp_path / "r.md"),
           "passed": True, "error": None, "cause": None, "verdicts": "1 of 2 within tolerance, 1 outside",
           "outside": 1, "all_within": False}
    (line,) = _printed(IndexResult([tmp_path / "index.md"], [row]), capsys)
    assert line.startswith("run succeeded (checks pass, 1 of 2 within tolerance, 1 outside) r1:"), line
    ok = {**row, "verdicts": "2 of 2 within tolerance", "outside": 0, "all_within": True, "status": "failed",
          "passed": False}
    (line,) = _printed(IndexResult([tmp_path / "index.md"], [ok]), capsys)
    assert line.startswith("run failed (checks FAIL, 2 of 2 within tolerance) r1:"), line


def test_the_index_carries_each_runs_verdicts(tmp_path: Path, tb_home: Path) -> None:
    """A real results tree (isca and tesla runs with references): every run's line and JSON row carry its
    verdicts' summary, counted from its own report."""
    root = results_tree(tmp_path / "results")
    r = CliRunner().invoke(_app(), ["report", str(root), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["runs"]
    assert rows and all(x["verdicts"] and " of " in x["verdicts"] and x["outside"] == 0 for x in rows), rows
    r = CliRunner().invoke(_app(), ["report", str(root)])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("run ")]
    assert lines and all("(checks pass, " in ln and "within tolerance" in ln for ln in lines), lines
