"""Results without testbed's package: a user's suite folder declares tables (a regex over rank logs, CSV and JSON
files) and registers parsers in its own report.py; references and checks on those tables give verdicts; a
reference to a table nothing makes is refused at ``show`` and ``run --dry-run`` with the suite's file:line; a
broken report.py is one clear error (testbed.tables, testbed.results, testbed.report.declared)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed.errors import UsageError
from testbed.report.build import build_report
from testbed.report.declared import glob_rx, unknown_tables
from testbed.report.parsers.declared import csv_rows, json_rows, regex_rows, typed_columns
from testbed.suite import list_suites, load_suite

ROOT = Path(__file__).resolve().parents[1]

SUITE = """\
name: my-artifact
description: a user's artifact, outside testbed's package
steps:
  launch: {command: "python3 train.py > out/log.txt"}
outputs: ["out/**"]
tables:
  steps:
    files: "rank*.out"
    regex: 'step (?P<step>\\d+) loss (?P<loss>[0-9.]+)'
  throughput:
    files: "out/*.csv"
    format: csv
    columns: {model: model, img_s: images_per_s}
  latency:
    files: "out/latency.json*"
    format: json
    columns: [op, p50_ms]
checks:
  - {name: loss bounded, table: steps, column: loss, min: 0, max: 5, rows: 4}
  - {name: every rank stepped, table: steps, where: {rank: 1}, rows: 3}
references:
  metrics:
    - {metric: final loss, table: steps, column: loss, where: {step: 3}, value: 0.5,
       tolerance: {abs: 0.05, why: seeds differ}, source: "paper, Table 2"}
    - {metric: resnet throughput, table: throughput, column: images_per_s, where: {model: resnet},
       value: 100, tolerance: {rel: 5, why: the GPU differs}, source: "paper, Figure 3"}
    - {metric: read p50, table: latency, column: p50_ms, where: {op: read}, value: 2.0,
       tolerance: {rel: 10, why: the disk differs}, source: "paper, Table 4"}
"""

REPORT_PY = """\
import re

from testbed import results

results.require(1)


@results.parser("epochs", files="rank*.out", columns=["step", "half_loss"])
def epochs(text: str) -> list[dict]:
    return [{"step": int(s), "half_loss": float(v) / 2} for s, v in re.findall(r"step (\\d+) loss (\\S+)", text)]
"""


def make_suite(root: Path, suite: str = SUITE, report_py: str | None = None) -> Path:
    """``root/my-artifact/suite.yml`` (and its report.py): a suite folder the user owns."""
    folder = root / "my-artifact"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yml").write_text(suite)
    if report_py is not None:
        (folder / "report.py").write_text(report_py)
    return folder / "suite.yml"


def make_run(root: Path, suite_yml: Path, run_id: str = "run-1", loss: float = 0.52) -> Path:
    """A collected run as collect writes it: a manifest naming the suite's file, one folder per host holding the
    rank logs and the declared outputs."""
    run = root / "results" / "my-artifact" / run_id
    for host, rank, last in (("node0", 0, loss), ("node1", 1, loss - 0.04)):
        (run / host / "out").mkdir(parents=True)
        (run / host / f"rank{rank}.out").write_text(f"start\nstep 1 loss 2.0\nstep 2 loss 1.1\nstep 3 loss {last:g}\n")
        (run / host / f"rank{rank}.err").write_text("")
    (run / "node0/out/throughput.csv").write_text("model,img_s,batch\nresnet,120,32\nvgg,51.5,32\n")
    (run / "node1/out/latency.jsonl").write_text('{"op": "read", "p50_ms": 2.1}\n{"op": "write", "p50_ms": 5}\n')
    manifest = {"schema": 1, "suite": "my-artifact", "run_id": run_id, "status": "succeeded",
                "suite_file": {"path": str(suite_yml.absolute()), "sha256": "0" * 64},
                "hosts": [{"name": "node0", "status": "succeeded", "exit_code": 0},
                          {"name": "node1", "status": "succeeded", "exit_code": 0}]}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``testbed ARGV`` as a user runs it: a fresh process, its own state home, nothing imported beforehand."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(cwd / ".testbed"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


# --- the pure readers ---------------------------------------------------------------------------------------------
def test_the_readers_are_pure_functions_of_text() -> None:
    got = regex_rows("a\nstep 1 loss 2.5\nstep 2 loss 1\n", r"^step (?P<step>\d+) loss (?P<loss>\S+)$")
    assert got.rows == [{"step": "1", "loss": "2.5"}, {"step": "2", "loss": "1"}]
    assert regex_rows("nothing", r"(?P<x>\d+)", "f.log").skipped == ["f.log: no line matches the table's regex"]
    c = csv_rows("a;b\n1;x\n2\n", ";", "t.csv")
    assert c.rows == [{"a": "1", "b": "x"}] and "short row" in c.skipped[0]
    assert json_rows('[{"a": 1, "b": {"c": 2}}, 3]').rows == [{"a": 1, "b": '{"c": 2}'}]
    assert json_rows('{"a": 1}').rows == [{"a": 1}]
    lines = json_rows('{"a": 1}\nnot json\n{"a": 2}\n', "x.jsonl")
    assert lines.rows == [{"a": 1}, {"a": 2}] and lines.skipped == ["x.jsonl:2: not JSON: 'not json'"]
    rows = [{"i": "1", "f": "2", "s": "x", "t": "3"}, {"i": "2", "f": "2.5", "s": "1", "t": "oops"}]
    assert typed_columns(["i", "f", "s", "t"], rows, {"t": "int"}) == ["column t: 1 value(s) not int; left empty"]
    assert rows == [{"i": 1, "f": 2.0, "s": "x", "t": 3}, {"i": 2, "f": 2.5, "s": "1", "t": None}]
    assert glob_rx("rank*.out").fullmatch("rank0.out") and not glob_rx("rank*.out").fullmatch("a/rank0.out")
    assert glob_rx("**/*.csv").fullmatch("a/b/x.csv") and glob_rx("**/*.csv").fullmatch("x.csv")


# --- declared tables -> verdicts and checks -----------------------------------------------------------------------
def test_declared_tables_give_verdicts_without_python(tmp_path: Path) -> None:
    run = make_run(tmp_path, make_suite(tmp_path))
    res = build_report(run)
    by = {v.metric: v for v in res.verdicts}
    assert by["final loss"].within is True and by["final loss"].ours == pytest.approx(0.50)  # mean of 2 ranks
    assert by["final loss"].note == "mean of 2 rows"
    assert by["resnet throughput"].within is False and by["resnet throughput"].ours == 120
    assert by["read p50"].within is True and by["read p50"].ours == 2.1
    checks = {n: (ok, d) for n, ok, d in res.checks}
    assert checks["loss bounded"] == (True, "6 loss values within [0, 5] (0.48..2)")
    assert checks["every rank stepped"] == (True, "3 rows where rank=1 in steps")
    steps = list(csv.reader((run / "report/steps.csv").open()))
    assert steps[0] == ["host", "rank", "file", "step", "loss"]
    assert steps[1:3] == [["node0", "0", "rank0.out", "1", "2.0"], ["node0", "0", "rank0.out", "2", "1.1"]]
    thr = list(csv.reader((run / "report/throughput.csv").open()))
    assert thr == [["host", "rank", "file", "model", "images_per_s"],
                   ["node0", "", "out/throughput.csv", "resnet", "120.0"],  # a float: every value is a number
                   ["node0", "", "out/throughput.csv", "vgg", "51.5"]]
    assert [r[-1] for r in {t.name: t for t in res.tables}["steps"].rows] == [2.0, 1.1, 0.52, 2.0, 1.1, 0.48]
    assert "Results tables" in res.path.read_text()


def test_a_table_check_fails_and_a_missing_point_is_not_measured(tmp_path: Path) -> None:
    suite = SUITE.replace("max: 5, rows: 4", "max: 1, rows: 4")
    run = make_run(tmp_path, make_suite(tmp_path, suite))
    (run / "node0/out/throughput.csv").write_text("model,img_s\nvgg,50\n")
    res = build_report(run)
    checks = {n: (ok, d) for n, ok, d in res.checks}
    assert checks["loss bounded"][0] is False
    assert checks["loss bounded"][1].startswith("4 of 6 loss values not a number within [0, 1]")
    by = {v.metric: v for v in res.verdicts}
    assert by["resnet throughput"].within is None and by["resnet throughput"].note == \
        "no images_per_s where model=resnet"
    assert res.passed is False


def test_a_campaign_of_the_user_suite_gets_its_verdicts(tmp_path: Path) -> None:
    from testbed.report.folders import report_suite_folder

    suite_yml = make_suite(tmp_path)
    make_run(tmp_path, suite_yml, "run-1", 0.52)
    make_run(tmp_path, suite_yml, "run-2", 0.9)
    res = report_suite_folder(tmp_path / "results/my-artifact")
    by = {v.metric: v for v in res.verdicts}
    assert by["final loss"].within is False and "outside in run-2" in by["final loss"].note


# --- report.py --------------------------------------------------------------------------------------------------
def test_report_py_is_loaded_by_path_by_a_plain_testbed_report(tmp_path: Path) -> None:
    suite = SUITE + """\
    - {metric: half loss, table: epochs, column: half_loss, where: {step: 1, host: node0}, value: 1.0,
       tolerance: {exact: true, why: computed}, source: "report.py"}
"""
    run = make_run(tmp_path, make_suite(tmp_path, suite, REPORT_PY))
    r = cli(tmp_path, "report", str(run), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by = {v["metric"]: v for v in out["verdicts"]}
    assert by["half loss"]["status"] == "within tolerance" and by["half loss"]["ours"] == 1.0
    epochs = list(csv.reader((run / "report/epochs.csv").open()))
    assert epochs[0] == ["host", "rank", "file", "step", "half_loss"] and len(epochs) == 7
    assert "testbed_suite_report" not in r.stderr  # never imported by name: no module of that name is asked for
    # the same file, tested as testbed loads it
    from testbed import results

    loaded = results.load(run.parents[2] / "my-artifact/report.py")
    assert results.API_VERSION == 3 and results.__version__ == "3"
    assert list(loaded.parsers) == ["epochs"] and loaded.parsers["epochs"].columns == ("step", "half_loss")
    assert list(loaded.parsers["epochs"].fn("step 4 loss 3")) == [{"step": 4, "half_loss": 1.5}]
    assert loaded.parsers["epochs"].where.endswith("report.py:8")


def test_a_report_py_reporter_replaces_the_generic_report(tmp_path: Path) -> None:
    reporter = """\
from testbed import results


@results.reporter(tables=["score"])
def report(run: results.RunDir, rep: results.Report) -> None:
    rep.table("score", ["value"], [[len(run.hosts)]])
    rep.check("two hosts", len(run.hosts) == 2, "")
"""
    suite = SUITE + """\
    - {metric: hosts, table: score, column: value, value: 2, tolerance: {exact: true, why: a count},
       source: the run}
"""
    run = make_run(tmp_path, make_suite(tmp_path, suite, reporter))
    res = build_report(run)
    assert {v.metric: v.within for v in res.verdicts}["hosts"] is True
    assert ("two hosts", True, "") in res.checks
    assert "No reporter is registered" not in res.path.read_text()
    assert unknown_tables(load_suite(str(tmp_path / "my-artifact/suite.yml"))) == []


def test_a_parser_that_raises_is_a_note_and_a_failed_check(tmp_path: Path) -> None:
    broken = REPORT_PY.replace('float(v) / 2}', 'float(v) / 0}')
    run = make_run(tmp_path, make_suite(tmp_path, report_py=broken))
    res = build_report(run)
    failed = [d for n, ok, d in res.checks if n == "report complete" and ok is False]
    assert len(failed) == 1 and "report.py:10) failed on node0/rank0.out: ZeroDivisionError" in failed[0]
    assert {v.metric: v.within for v in res.verdicts}["final loss"] is True  # the declared tables still made


@pytest.mark.parametrize(("text", "line", "what"), [
    ("import re\nfrom testbed import results\n\nx = 1 / 0\n", 4, "ZeroDivisionError: division by zero"),
    ("def f(:\n    pass\n", 1, "syntax error"),
    ("from testbed import results\n\nresults.require(4)\n", 3, "needs testbed.results API 4"),
    ("from testbed import results\n\nresults.parser('t', files='*', columns=['host'])(print)\n", 3,
     "column 'host' would hide"),
    ("from testbed import results\n\n\n@results.parser('t', files='*', columns='ab')\ndef f(text):\n    return []\n",
     4, "not a list of names"),
])
def test_a_broken_report_py_is_one_clear_error(tmp_path: Path, text: str, line: int, what: str) -> None:
    run = make_run(tmp_path, make_suite(tmp_path, report_py=text))
    path = tmp_path / "my-artifact/report.py"
    r = cli(tmp_path, "report", str(run))
    assert r.returncode == 2, r.stdout + r.stderr
    assert what in r.stderr and f"{path}:{line}" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr
    with pytest.raises(UsageError) as e:
        build_report(run)
    assert e.value.where == f"{path}:{line}" and what in e.value.what


# --- refused before a run ---------------------------------------------------------------------------------------
def test_a_reference_to_an_unknown_table_is_refused_at_show_and_dry_run(tmp_path: Path) -> None:
    bad = SUITE.replace("table: throughput, column", "table: thruput, column")
    suite_yml = make_suite(tmp_path, bad)
    line = next(i for i, t in enumerate(bad.splitlines(), 1) if "resnet throughput" in t)
    for argv in (["show", str(suite_yml)], ["run", str(suite_yml), "--dry-run"]):
        r = cli(tmp_path, *argv)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        err = " ".join(r.stderr.split())
        assert "table 'thruput' is made by no parser, declared table or report.py" in err, err
        assert f"{suite_yml}:{line}" in err and "did you mean 'throughput'?" in err
    make_suite(tmp_path, SUITE)
    r = cli(tmp_path, "show", str(suite_yml))
    assert r.returncode == 0, r.stderr


def test_a_check_or_column_nothing_makes_is_refused(tmp_path: Path) -> None:
    suite = SUITE.replace("table: steps, where: {rank: 1}", "table: epochs, where: {rank: 1}")
    errors = unknown_tables(load_suite(str(make_suite(tmp_path, suite))))
    line = next(i for i, t in enumerate(suite.splitlines(), 1) if "every rank stepped" in t)
    assert len(errors) == 1 and "table 'epochs'" in errors[0].what
    assert errors[0].where == f"{tmp_path / 'my-artifact/suite.yml'}:{line}"
    make_suite(tmp_path, suite, REPORT_PY)  # report.py makes it
    assert unknown_tables(load_suite(str(tmp_path / "my-artifact/suite.yml"))) == []
    suite = SUITE.replace("column: loss, where: {step: 3}", "column: los, where: {step: 3}")
    errors = unknown_tables(load_suite(str(make_suite(tmp_path, suite))))
    assert [e.what for e in errors] == ["my-artifact: table 'steps' has no column 'los'"]
    assert errors[0].fix == "name one of its columns: host, rank, file, step, loss"


def test_every_shipped_suite_names_only_tables_its_reports_make() -> None:
    for name, path in list_suites().items():
        assert unknown_tables(load_suite(str(path))) == [], name


@pytest.mark.parametrize(("table", "what", "line"), [
    ("{files: 'x', regex: 'no groups'}", "no named group", 3),
    ("{files: 'x'}", "with a regex or as CSV or JSON", 3),
    ("{files: 'x', format: csv, regex: '(?P<a>x)'}", "'regex' reads text, not csv", 3),
    ("{files: 'x', regex: '(?P<a>x)', columns: [b]}", "'b' is not a named group", 3),
    ("{files: 'x', regex: '(?P<host>x)'}", "would hide the 'host' column", 3),
    ("{files: 'x', regex: '(?P<a>x)', types: {b: int}}", "types names 'b'", 3),
])
def test_a_bad_declared_table_is_refused_with_its_line(tmp_path: Path, table: str, what: str, line: int) -> None:
    text = textwrap.dedent(f"""\
        name: t
        tables:
          t1: {table}
        steps:
          launch: {{command: "true"}}
        """)
    (tmp_path / "t.yml").write_text(text)
    with pytest.raises(UsageError) as e:
        load_suite(str(tmp_path / "t.yml"))
    assert what in e.value.what and e.value.where == f"{tmp_path / 't.yml'}:{line}", (e.value.what, e.value.where)
    (tmp_path / "t.yml").write_text(text.replace("t1:", "hosts:").replace(table, "{files: x, regex: '(?P<a>x)'}"))
    with pytest.raises(UsageError, match="every report has a table 'hosts' already"):
        load_suite(str(tmp_path / "t.yml"))


def test_each_shipped_reporter_declares_the_tables_its_module_makes() -> None:
    """What ``show`` checks references against: every table a shipped reporter's module (a suite folder's
    report.py, loaded as testbed loads it, or one still built in) makes by a literal name is among the tables it
    declares (fig4{part}_breakdown, a computed name, is declared by hand)."""
    import ast
    import inspect

    from testbed import results
    from testbed.report import registry

    def made(module: str) -> set[str]:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
        return {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "table" and n.args
                and isinstance(n.args[0], ast.Constant)}

    checked = 0
    for path in sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*/report.py")):
        own = results.load(path)
        fns = [r for r in (own.reporter, getattr(own, "campaign", None)) if r is not None]
        if not fns:
            continue
        declared = set().union(*(r.tables for r in fns))
        got = made(fns[0].fn.__module__)
        assert got and got <= declared, (path, got - declared)
        checked += 1
    for kind, reporters in (("run", registry._REPORTERS), ("campaign", registry._CAMPAIGN_REPORTERS)):
        for suite, fn in reporters.items():
            tables = registry.tables_of(kind, suite)
            assert tables is not None, f"the {kind} reporter of {suite} declares no tables"
            got = made(fn.__module__)
            assert got and got <= tables, (kind, suite, got - tables)
            checked += 1
    assert checked >= 3


def test_a_rehearsal_stops_at_a_reference_nothing_measures(tb_home: Path) -> None:
    from testbed.rehearse import rehearse

    suite_yml = make_suite(tb_home, SUITE.replace("table: latency, column", "table: latencies, column"))
    res = rehearse(str(suite_yml), {})
    assert res.replica == "" and len(res.findings) == 1
    assert "table 'latencies' is made by no parser" in res.findings[0] and f"{suite_yml}:" in res.findings[0]


def test_a_table_reads_only_files_inside_the_run(tmp_path: Path) -> None:
    """A results folder is untrusted data: a link out of it, or a host named '..', is never read into a table."""
    from testbed.report.declared import host_files
    from testbed.report.rundir import RunDir

    run = make_run(tmp_path, make_suite(tmp_path))
    (tmp_path / "secret.out").write_text("step 9 loss 9\n")
    (run / "node0/rank9.out").symlink_to(tmp_path / "secret.out")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["hosts"].append({"name": ".."})
    (run / "manifest.json").write_text(json.dumps(manifest))
    found = [(h, rel) for h, rel, _ in host_files(RunDir.open(run), "**/rank*.out")]
    assert found == [("node0", "rank0.out"), ("node1", "rank1.out")]


def test_why_missing_words_a_missing_points_problem() -> None:
    """The problem cell the shipped campaign reporters (datastall-emulator, isca-resnet18, tesla) give a point
    they lack: the runs launched for it, else 'no run'."""
    from testbed import results

    launched = {("3", "resnet18"): ["r1", "r2"], "inj_a": ["r3"]}
    assert results.why_missing(launched, ("3", "resnet18")) == "no output from run r1, r2"
    assert results.why_missing(launched, "inj_a", "metrics.csv") == "no metrics.csv from run r3"
    assert results.why_missing(launched, "inj_b") == "no run"
    assert results.why_missing({}, "x", "metrics.csv") == "no run"
