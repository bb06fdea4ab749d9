"""Results are data: a results folder someone sent (a ``.suite/`` copy with its report.py, a ``.suite`` link out of
the run, a manifest naming a suite file inside the sent tree, an ``experiments/`` planted beside the runs) never
has its code run, by any command that accepts a folder or a run; a suite the user has still reports with its own
report.py, run in a child process bounded in time and memory, whose early exit, overrun or exhaustion is said."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = """name: {name}
description: a suite
testbed: local
requires: {{hosts: 1}}
steps:
  launch:
    on: master
    command: echo hi
"""
REPORT = """import pathlib
from testbed import results
pathlib.Path({marker!r}).write_text("ran")

@results.parser("said", files="rank*.out", columns=["word"])
def said(text):
    return [{{"word": w}} for w in text.split()]
"""


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _suite(folder: Path, name: str, marker: Path, report: str = REPORT) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yml").write_text(SUITE.format(name=name))
    (folder / "report.py").write_text(report.format(marker=str(marker)))
    return folder / "suite.yml"


def a_run(results: Path, marker: Path, name: str = "evil", *, copy: bool = True, link: bool = False,
          suite_file: Path | None = None) -> Path:
    """A collected run of suite ``name`` as a sender would make it, with a report.py that writes ``marker``."""
    run = results / name / f"{name}-1"
    (run / "node0").mkdir(parents=True)
    (run / "node0" / "rank0.out").write_text("hi there\n")
    m = {"schema": 1, "run_id": f"{name}-1", "suite": name, "params": {}, "status": "succeeded", "reason": None,
         "started": "2026-01-02T10:00:00.000Z", "ended": "2026-01-02T10:01:00.000Z",
         "hosts": [{"name": "node0", "exit_code": 0, "status": "succeeded",
                    "ranks": [{"rank": 0, "status": "succeeded", "exit_code": 0}]}],
         "files": [{"host": "node0", "path": "rank0.out", "sha256": _sha(run / "node0" / "rank0.out"), "size": 9}],
         "events": [{"ts": "2026-01-02T10:00:00.000Z", "kind": "started", "host": None, "detail": {}}]}
    if copy:
        if link:  # .suite is a relative link out of the run, to a folder the sender put beside the runs
            _suite(results / "elsewhere" / name, name, marker)
            (run / ".suite").symlink_to(os.path.relpath(results / "elsewhere", run))
        else:
            _suite(run / ".suite" / name, name, marker)
        m["suite_copy"] = {"path": f".suite/{name}/suite.yml", "sha256": _sha(run / ".suite" / name / "suite.yml"),
                           "files": {}}
    if suite_file is not None:
        sf = _suite(suite_file, name, marker)
        m["suite_file"] = {"path": str(sf), "sha256": _sha(sf), "report_sha256": _sha(sf.parent / "report.py")}
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def tb(args: list[str], cwd: Path, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300",
                               "TESTBED_HOME": str(home / ".testbed"), **env})


# (case, how the sent folder is made, the command, the folder it is typed in) -----------------------------------
CASES = [
    ("report-root", {}, ["report", "{recv}"], "{base}"),
    ("report-suite-folder", {}, ["report", "{recv}/evil"], "{base}"),
    ("report-run", {}, ["report", "{run}"], "{base}"),
    ("report-dot-in-run", {}, ["report", "."], "{run}"),
    ("report-dot-in-root", {}, ["report", "."], "{recv}"),
    ("report-html", {}, ["report", "{run}", "--format", "html"], "{base}"),
    ("show-copy-file", {}, ["show", "{run}/.suite/evil/suite.yml"], "{base}"),
    ("show-copy-folder", {}, ["show", "{run}/.suite/evil"], "{base}"),
    ("dry-run-copy", {}, ["run", "{run}/.suite/evil/suite.yml", "--dry-run"], "{base}"),
    ("reproduce", {}, ["reproduce", "{run}", "--on", "nosuch"], "{base}"),
    ("report-suite-flag-copy", {}, ["report", "{run}", "--suite", "{run}/.suite/evil"], "{base}"),
    ("link-run", {"link": True}, ["report", "{run}"], "{base}"),
    ("link-root", {"link": True}, ["report", "{recv}"], "{base}"),
    ("manifest-into-tree", {"copy": False, "suite_file": "payload"}, ["report", "{run}"], "{base}"),
    ("manifest-into-tree-root", {"copy": False, "suite_file": "payload"}, ["report", "."], "{recv}"),
    ("planted-experiments-root", {"copy": False, "plant": True}, ["report", "."], "{recv}"),
    ("planted-experiments-suite", {"copy": False, "plant": True}, ["report", "evil"], "{recv}"),
    ("planted-experiments-run", {"copy": False, "plant": True}, ["report", "evil/evil-1"], "{recv}"),
]


@pytest.mark.parametrize(("how", "argv", "cwd"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_no_command_runs_a_report_py_from_a_results_folder(tmp_path: Path, how: dict[str, object],
                                                           argv: list[str], cwd: str) -> None:
    marker = tmp_path / "pwned"
    recv = tmp_path / "received"
    sf = recv / "payload" / "evil" if how.get("suite_file") else None
    run = a_run(recv, marker, copy=bool(how.get("copy", True)), link=bool(how.get("link")), suite_file=sf)
    if how.get("plant"):
        _suite(recv / "experiments" / "evil", "evil", marker)
    fill = {"recv": str(recv), "run": str(run), "base": str(tmp_path)}
    r = tb([a.format(**fill) for a in argv], Path(cwd.format(**fill)), tmp_path)
    assert not marker.exists(), f"report.py from the sent folder ran: {argv}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    if argv[0] == "report":
        assert r.returncode == 0, (r.stdout, r.stderr)
        said = " ".join((r.stdout + r.stderr).split())
        assert "is not run" in said and "a results folder is data" in said and "--suite" in said, said


def test_a_suite_the_user_has_reports_with_its_own_report_py(tmp_path: Path) -> None:
    """The same received run, with the suite in the user's ./experiments/: its report.py (not the sent copy)
    makes its table; the sent copy's still never runs."""
    sent, mine = tmp_path / "sent-ran", tmp_path / "mine-ran"
    run = a_run(tmp_path / "received", sent)
    work = tmp_path / "work"
    _suite(work / "experiments" / "evil", "evil", mine)
    r = tb(["report", str(run)], work, tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert mine.exists() and not sent.exists()
    text = (run / "report" / "report.md").read_text()
    assert "said (report.py)" in text and "there" in text, text
    # named by its path on the command line, from anywhere: the same
    mine.unlink()
    r = tb(["report", str(run), "--suite", str(work / "experiments" / "evil")], tmp_path, tmp_path)
    assert r.returncode == 0 and mine.exists() and not sent.exists(), (r.stdout, r.stderr)


def test_a_report_py_of_another_sha256_than_the_run_recorded_is_not_run_from_the_recorded_path(
        tmp_path: Path) -> None:
    """A manifest naming a suite file outside the sent tree runs its report.py only when it is the one the run
    recorded (its sha256)."""
    marker = tmp_path / "ran"
    elsewhere = tmp_path / "elsewhere" / "evil"
    run = a_run(tmp_path / "received", marker, copy=False, suite_file=elsewhere)
    (elsewhere / "report.py").write_text(REPORT.format(marker=str(marker)) + "# changed\n")
    r = tb(["report", str(run)], tmp_path, tmp_path)
    assert r.returncode == 0 and not marker.exists(), (r.stdout, r.stderr)
    assert "not the report.py the run recorded" in " ".join(r.stdout.split())


BOUNDS = [
    ("exit", "import os\nos._exit(0)\n", {}, "ended its process (exit status 0) before it returned its result"),
    ("loop", "while True:\n    pass\n", {"TESTBED_REPORT_SECONDS": "3"}, "ran past 3 s and was stopped"),
    ("memory", "x = bytearray(600 << 20)\n", {"TESTBED_REPORT_MEMORY_MB": "300"}, "ran out of memory (bound 300 MiB)"),
]


@pytest.mark.parametrize(("body", "env", "words"), [b[1:] for b in BOUNDS], ids=[b[0] for b in BOUNDS])
def test_a_report_py_that_exits_loops_or_eats_memory_is_stopped_and_said(tmp_path: Path, body: str,
                                                                         env: dict[str, str], words: str) -> None:
    work = tmp_path / "work"
    _suite(work / "experiments" / "evil", "evil", tmp_path / "m", report="from testbed import results\n" + body)
    r = tb(["show", "evil"], work, tmp_path, **env)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and words in said and "where:" in said and "Traceback" not in said, (r.stdout, said)
