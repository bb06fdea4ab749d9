"""Summaries never contradict what the runs measured: a suite's report counts the verdicts its runs measured (one
run measuring all four is not "0 of 4, 4 not measured"), a run's headline puts its verdicts beside its status
(never a bare green "succeeded" over an outside tolerance), and the CLI's line for the run says both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from localbed import invoke
from test_report_first_screen import fault_drill_run

from testbed.report.build import build_report
from testbed.report.folders import build_index, report_suite_folder


def _second_run(first: Path, name: str = "run-2") -> Path:
    """A second fault-drill run beside ``first`` that failed before logging anything (it measures nothing)."""
    run = first.parent / name
    shutil.copytree(first, run)
    for host in run.glob("node*"):
        (host / "train_log.csv").unlink()
    m = json.loads((run / "manifest.json").read_text())
    (run / "node1" / "rank1.err").write_text("Traceback: ImportError: no module named torch\n")
    m.update(run_id=name, status="failed", reason="rank 1 exited 1", events=m["events"][:1],
             files=[{"host": "node1", "path": "rank1.err", "size": 46, "sha256": "cd" * 32}])
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def test_a_suite_report_counts_the_verdicts_its_runs_measured(tmp_path: Path) -> None:
    first = fault_drill_run(tmp_path)
    _second_run(first)
    res = report_suite_folder(first.parent)
    assert [v.status for v in res.verdicts] == ["within tolerance"] * 4, [(v.metric, v.note) for v in res.verdicts]
    assert all(v.note.startswith("measured by 1 of 2 runs (run-1)") for v in res.verdicts), res.verdicts
    md = res.path.read_text()
    assert "4 of 4 within tolerance" in md and "not measured" not in md.split("## Checks")[0], md[:2000]
    code, out, exc = invoke("report", str(tmp_path / "results"))  # the index: the suite folder's line
    assert code == 1, (out, exc)  # run-2 failed
    line = next(ln for ln in out.splitlines() if ln.startswith("campaign "))
    assert line.startswith("campaign fault-drill (2 runs; checks FAIL, 4 of 4 within tolerance)"), out


def test_a_run_outside_tolerance_makes_the_suite_verdict_outside_and_says_where(tmp_path: Path) -> None:
    first = fault_drill_run(tmp_path)
    bad = first.parent / "run-3"
    shutil.copytree(first, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["run_id"] = "run-3"
    for e in m["events"]:
        if e["kind"] == "resumed":
            e["detail"]["downtime_seconds"] = 45.0  # over the suite's 30 s bound
    (bad / "manifest.json").write_text(json.dumps(m))
    own = build_report(bad)
    outside = [v.metric for v in own.verdicts if v.within is False]
    assert outside, [(v.metric, v.ours, v.note) for v in own.verdicts]
    res = report_suite_folder(first.parent)
    by = {v.metric: v for v in res.verdicts}
    for metric in outside:
        assert by[metric].within is False and "outside in run-3" in by[metric].note, by[metric]
    assert "2 of 2 runs" in by[outside[0]].note


def test_a_runs_headline_and_cli_line_say_its_status_and_its_verdicts(tmp_path: Path) -> None:
    run = fault_drill_run(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    for e in m["events"]:
        if e["kind"] == "resumed":
            e["detail"]["downtime_seconds"] = 45.0
    (run / "manifest.json").write_text(json.dumps(m))
    md = build_report(run).path.read_text()
    head = next(ln for ln in md.splitlines() if ln.startswith("**Status:**"))
    assert head.startswith("**Status:** succeeded, but ") and "outside tolerance" in head, head
    html = build_report(run, "html").path.read_text()
    status = html.split('id="status"', 1)[1].split("</p>", 1)[0]
    assert "st-bad" in status.split(">", 1)[0] and "outside tolerance" in status, status
    code, out, exc = invoke("report", str(run))
    assert code == 0, (out, exc)
    line = next(ln for ln in out.splitlines() if ln.startswith("run "))
    assert line.startswith("run run-1 succeeded, but ") and "outside tolerance" in line, out
    assert "run pass" not in out
    idx = build_index(tmp_path / "results")
    row = next(r for r in idx.runs if r["run_id"] == "run-1")
    assert row["outside"] and not row["all_within"]


def test_the_line_after_a_collected_run_says_its_status_and_its_verdicts(tmp_path: Path) -> None:
    """`testbed run ... --collect`: the last line is the run's headline from its report, in red when a verdict is
    outside tolerance; a run not collected has no verdicts to say, and says its status alone."""
    import io

    from rich.console import Console

    from testbed.cli.runs import run_line

    run = fault_drill_run(tmp_path)
    c = Console(file=io.StringIO())
    good = run_line("run-1", run, c)
    assert good.startswith("[green]run run-1 succeeded; 4 of 4 within tolerance[/green]"), good
    m = json.loads((run / "manifest.json").read_text())
    for e in m["events"]:
        if e["kind"] == "resumed":
            e["detail"]["downtime_seconds"] = 45.0
    (run / "manifest.json").write_text(json.dumps(m))
    bad = run_line("run-1", run, c)
    assert bad.startswith("[red]run run-1 succeeded, but 1 of 4 verdicts outside tolerance[/red]"), bad
    assert "reporting run-1" in c.file.getvalue()  # type: ignore[attr-defined]
    assert run_line("run-1", None, c) == "[green]run run-1 succeeded[/green]"  # a suite without references
    assert run_line("run-1", None, c, pending="fault-drill/run-1") == (  # not collected: says the verdict is not known
        "[green]run run-1 succeeded[/green]; verdicts not judged yet: testbed collect run-1 && testbed report "
        "results/fault-drill/run-1")
