"""Bounded everywhere, second pass (issue 51): a user's regular expression runs in linear time (RE2) or is
refused at load naming its line; parsed JSON and YAML have a depth bound; every file the demo reads is checked
to be a regular file first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
EVIL = r"(?P<x>(a+)+)$"  # exponential in Python's re on 'aaaa…b'


@pytest.mark.timeout(60)
def test_a_declared_regex_that_would_backtrack_reads_a_line_at_once() -> None:
    from testbed.report.parsers.declared import regex_rows

    t0 = time.monotonic()
    out = regex_rows("a" * 36 + "b\n", EVIL)
    assert time.monotonic() - t0 < 1.0
    assert out.rows == [] and out.skipped


@pytest.mark.timeout(60)
def test_checkpoint_and_progress_patterns_run_in_linear_time() -> None:
    from testbed.run.runner import last_line

    t0 = time.monotonic()
    assert last_line("a" * 40 + "b\n", r"(a+)+$") == ""
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(("where", "pattern", "said"), [
    ("table", r"(?P<a>x)\1", "no backreferences"),
    ("table", r"(?P<a>x)(?=y)", "no lookahead or lookbehind"),
    ("progress", r"(?<!x)step", "no lookahead or lookbehind"),
    ("checkpoint", r"saved (\d+)(?!\d)", "no lookahead or lookbehind"),
    ("table", r"(?P<a>[x", "not a regular expression RE2 accepts"),
])
def test_a_pattern_only_a_backtracking_engine_runs_is_refused_at_its_line(tmp_path: Path, where: str, pattern: str,
                                                                           said: str) -> None:
    from testbed.suite import load_suite

    quoted = json.dumps(pattern)
    extra = {"table": f"tables:\n  t:\n    files: 'rank*.out'\n    regex: {quoted}\n",
             "progress": f"progress: {quoted}\n",
             "checkpoint": f"checkpoint:\n  file: ck.pt\n  saved: {quoted}\n"}[where]
    path = tmp_path / "s.yml"
    path.write_text("name: s\nsteps:\n  launch:\n    command: 'true'\n" + extra)
    with pytest.raises(UsageError) as ei:
        load_suite(str(path))
    assert said in ei.value.what and str(path) in (ei.value.where or ""), ei.value


@pytest.mark.timeout(120)
def test_a_collected_json_nested_very_deep_is_a_note_not_a_crash(tmp_path: Path) -> None:
    from testbed.report.parsers.declared import json_rows

    deep = "[" * 100_000 + "]" * 100_000
    out = json_rows(deep, label="node0/deep.json")
    assert out.rows == [] and any("nested" in s for s in out.skipped), out.skipped


@pytest.mark.timeout(60)
def test_yaml_nested_very_deep_is_refused_with_its_bound(tmp_path: Path) -> None:
    from testbed.suite import load_suite

    path = tmp_path / "deep.yml"
    path.write_text("name: deep\nvars:\n  x: " + "[" * 5000 + "]" * 5000 + "\nsteps:\n  launch:\n    command: 'true'\n")
    with pytest.raises(UsageError) as ei:
        load_suite(str(path))
    assert "nested" in ei.value.what and str(path) in (ei.value.where or ""), ei.value


@pytest.mark.timeout(120)
def test_the_demo_never_blocks_on_a_fifo_or_a_bad_file_among_the_suites(tmp_path: Path) -> None:
    """A FIFO and a non-UTF-8 file among this folder's suites: the demo's listing names them and goes on."""
    exp = tmp_path / "experiments"
    exp.mkdir()
    os.mkfifo(exp / "pipe.yml")
    (exp / "latin.yml").write_bytes(b"name: latin\ndescription: caf\xe9\n")
    r = subprocess.run([sys.executable, "-m", "testbed", "list", "suites"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300",
                            "TESTBED_HOME": str(tmp_path / ".testbed")})
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert "mpi-hello" in r.stdout, r.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["fifo", "latin"])
def test_the_demo_names_a_fifo_or_a_non_utf8_suite_without_blocking(tmp_path: Path, bad: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.cli.tools import demo_runs

    exp = tmp_path / "experiments"
    exp.mkdir()
    if bad == "fifo":
        os.mkfifo(exp / "zz.yml")
    else:
        (exp / "zz.yml").write_bytes(b"name: zz\ndescription: caf\xe9\ndemo: [[]]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as ei:
        demo_runs("local")
    assert str(exp / "zz.yml") in (ei.value.where or "") and ("FIFO" in ei.value.what or "UTF-8" in ei.value.what)


@pytest.mark.timeout(60)
def test_a_readme_that_trickles_is_cut_off_at_the_total_deadline() -> None:
    """A server on loopback that sends a line every 0.3 s, for ever: fetch gives up at its total deadline (each
    read alone is quick, so a per-read timeout never fires); a server that answers at once is read whole."""
    import http.server
    import threading

    from testbed.cli.newsuite import fetch

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            if self.path == "/fast":
                self.wfile.write(b"# README\n\n    git clone https://example.org/a.git\n")
                return
            for i in range(1000):
                try:
                    self.wfile.write(f"line {i}\n".encode())
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.3)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert "git clone" in fetch(f"{url}/fast", 1 << 20, timeout=2.0)
        t0 = time.monotonic()
        with pytest.raises(UsageError) as ei:
            fetch(f"{url}/slow", 1 << 20, timeout=2.0)
        assert time.monotonic() - t0 < 4.0
        assert "did not arrive within 2 s" in ei.value.what and ei.value.where == f"{url}/slow"
    finally:
        server.shutdown()


@pytest.mark.parametrize("argv", [["status", "x\udcffy"], ["show", "caf\udce9"], ["report", "/tmp/\udcff"],
                                  ["run", "mpi-hello", "-p", "n=\udcff", "--dry-run"]])
def test_an_argument_that_is_not_utf8_is_refused_naming_it(tmp_path: Path, argv: list[str]) -> None:
    """Bytes that are not UTF-8 on the command line (Python keeps them as lone surrogates): one message, exit 2."""
    r = subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=tmp_path, capture_output=True, timeout=60,
                       check=False, env={**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tmp_path / "h")})
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2 and "is not UTF-8 text" in err and "where: command line" in err, err
    assert "internal error" not in err and "Traceback" not in err


def test_a_suite_copy_into_a_full_disk_leaves_no_empty_copy(tmp_path: Path) -> None:
    """collect's copy of the suite into the run folder, on a disk that takes no more bytes: one note naming the
    run folder and the disk, and no file (least of all an empty one) under the copy's name."""
    import hashlib

    suite = tmp_path / "experiments" / "s" / "suite.yml"
    suite.parent.mkdir(parents=True)
    suite.write_text("name: s\nsteps:\n  launch:\n    command: 'true'\n" + "# padding\n" * 500)
    run = tmp_path / "results" / "s" / "s-1"
    run.mkdir(parents=True)
    info = {"suite_file": str(suite), "suite_sha256": hashlib.sha256(suite.read_bytes()).hexdigest(), "suite": "s"}
    code = ("import json, sys, resource, signal; from pathlib import Path; "
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)); "
            "from testbed.collect.suite_copy import copy_suite; "
            f"print(json.dumps(copy_suite(json.loads({json.dumps(json.dumps(info))}), Path({str(run)!r}), None)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    rec, why = json.loads(r.stdout)
    assert rec is None and str(run) in why and "disk" in why, (r.stdout, r.stderr)
    assert not [p for p in run.rglob("*") if p.is_file()], list(run.rglob("*"))
