"""Runs on a real local testbed: local suites end to end, fault on a log line with recovery, the CLI killed
mid-run and reattached, a host killed mid-run (fail fast naming it), a campaign interrupted and resumed, and
shell metacharacters staying inert."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.records import RunEvent
from testbed.run import bookkeeping as rs
from testbed.run import runner
from testbed.state import Store

PY = sys.executable
SLEEPY = """\
name: sleepy
parameters:
  seconds: {type: float, default: 4}
  n: {type: int, default: 0}
  host_count: {type: int, default: 2}
matrix:
  n: [1, 2, 3]
placement: {hosts: "{{ host_count }}"}
steps:
  launch:
    command: "sleep {{ seconds }}; echo done rank {{ rank }} n {{ n }}"
timeouts: {poll: 0.5, grace: 2, unreachable: 3}
"""
ECHO = """\
name: echo
parameters:
  msg: {type: str, default: hi}
placement: {hosts: 1}
steps:
  launch:
    command: "echo {{ msg }} > said.txt; printf '%s\\n' {{ msg }}"
timeouts: {poll: 0.5}
"""

SECRET = "s3cr3t-Value-8842"  # the controller holds it (TB_TEST_API_KEY) and the failing rank prints it
FLAKY = f"""\
name: flaky
parameters:
  n: {{type: int, default: 1}}
matrix:
  n: [1, 2, 3]
placement: {{hosts: 1}}
steps:
  launch:
    command: >-
      {{% if n == 2 %}}echo 'loading weights' >&2; echo 'connecting with api_key={SECRET} password=pw-in-log' >&2;
      echo 'RuntimeError: boom at step 7' >&2; exit 3{{% else %}}echo ok n {{{{ n }}}}{{% endif %}}
timeouts: {{poll: 0.5, grace: 2}}
"""

# a rank that outlives timeouts.run, and one that even exits 0 when it is stopped (it traps TERM)
SLOWPOKE = """\
name: slowpoke
placement: {hosts: 2}
steps:
  launch:
    command: "{% if rank == 0 %}trap 'exit 0' TERM; {% endif %}sleep 60 & wait"
timeouts: {run: 2, poll: 0.5, grace: 1, unreachable: 3}
"""

ENVIRONED = """\
name: environed
parameters:
  env: {type: str, default: ~/tb-env-test}
environment: "{{ env }}"
placement: {hosts: 2}
steps:
  prepare:
    - name: which python
      run: command -v python > which.txt
  launch:
    command: >-
      python -c 'import os, sys; print(sys.prefix, os.environ.get("PYTHONUNBUFFERED")); print("step 1")'
faults:
  never:
    action: signal
    rank: 1
    when: "step 999"
default_faults: [never]
timeouts: {poll: 0.5, grace: 2}
"""

# a rank that prints a step line, then noise, for a while: the live status line shows the step lines
CHATTY = """\
name: chatty
parameters:
  steps: {type: int, default: 12}
placement: {hosts: 2}
progress: "step ([0-9]+) of"
steps:
  launch:
    command: >-
      for i in $(seq 1 {{ steps }}); do echo "rank {{ rank }} step $i of {{ steps }}"; echo noise; sleep 0.5; done
timeouts: {poll: 0.5}
"""


@pytest.fixture(scope="module")
def bed(shared_local_testbed):  # type: ignore[no-untyped-def]
    b = shared_local_testbed
    (b.cwd / "experiments").mkdir(exist_ok=True)
    (b.cwd / "experiments" / "sleepy.yml").write_text(SLEEPY)
    (b.cwd / "experiments" / "echo.yml").write_text(ECHO)
    (b.cwd / "experiments" / "environed.yml").write_text(ENVIRONED)
    (b.cwd / "experiments" / "slowpoke.yml").write_text(SLOWPOKE)
    (b.cwd / "experiments" / "chatty.yml").write_text(CHATTY)
    (b.cwd / "experiments" / "flaky.yml").write_text(FLAKY)
    os.chdir(b.cwd)
    os.environ["TESTBED_HOME"] = str(b.home)
    return b


def cli(bed, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run([PY, "-m", "testbed.cli.runs", *args], cwd=bed.cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TESTBED_HOME": str(bed.home)}, check=False)


def start(bed, suite: str, params: dict, **kw) -> str:  # type: ignore[no-untyped-def]
    return runner.start_run(runner.plan_run(suite, bed.name, params, **kw))


def events(run_id: str) -> list[RunEvent]:
    return rs.events(Store.open_default(), run_id)


def test_mpi_hello_end_to_end(bed) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    r = cli(bed, "run", "mpi-hello", "--on", bed.name, "--no-setup")
    assert r.returncode == 0, r.stderr
    run_id = r.stderr.split("run ", 1)[1].split()[0]
    out = bed.ssh("node0", f"cat ~/.testbed-runs/{run_id}/rank0.out").stdout
    hellos = sorted(ln for ln in out.splitlines() if ln.startswith("Hello world"))
    assert hellos == [f"Hello world from processor node{i}, rank {i} out of 4 processors" for i in range(4)]
    # the supervisor says how long its polls took against the pause between them
    log = (rs.run_home(run_id) / "supervisor.log").read_text()
    assert re.search(r"polls: \d+ polls? of up to \d+ hosts?: median [\d.]+ s over the \d+ polls? of [\d,]+, "
                     r"slowest [\d.]+ s; \d+ of [\d,]+ longer than the [\d.]+ s between polls \(timeouts.poll\)",
                     log), log
    print(f"mpi-hello end to end: {time.monotonic() - t0:.1f} s")


def test_matmul_baseline_writes_per_rank_csv(bed) -> None:  # type: ignore[no-untyped-def]
    run_id = start(bed, "matmul-baseline", {"size": "64", "iterations": "2", "host_count": "2", "python": PY})
    row = runner.wait(run_id, timeout=120)
    assert row.status == "succeeded", row.reason
    csv = bed.ssh("node1", f"cat ~/.testbed-runs/{run_id}/matmul_rank1.csv").stdout.splitlines()
    assert csv[0] == "rank,host,iteration,size,seconds,gflops"
    assert csv[1].startswith("1,node1,0,64,")
    assert row.info.outputs["node0"][0] == "matmul_rank*.csv"


@pytest.mark.slow  # a drill
def test_fault_drill_fault_on_log_line_and_recovery(bed) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    run_id = start(bed, "fault-drill", {"ranks": "2", "python": PY})
    row = runner.wait(run_id, timeout=240)
    print(f"fault-drill end to end: {time.monotonic() - t0:.1f} s")
    assert row.status == "succeeded", row.reason
    evs = events(run_id)
    kinds = [e.kind for e in evs]
    assert kinds.index("fault") < kinds.index("failed") < kinds.index("recovery") < kinds.index("relaunched")
    fault = next(e for e in evs if e.kind == "fault")
    assert fault.detail["signal"] == "SIGKILL" and fault.host == "node1" and fault.detail["rank"] == 1
    failed = [e.detail["reason"] for e in evs if e.kind == "failed"]
    assert any("node1 rank 1: signal 9 (SIGKILL)" in f for f in failed)
    log = bed.ssh("node0", f"cat ~/.testbed-runs/{run_id}/train_log.csv").stdout.splitlines()
    assert log[0] == "time,attempt,epoch,step,loss"
    rows = [ln.split(",") for ln in log[1:]]
    first = [int(r[3]) for r in rows if r[1] == "0"]
    second = [int(r[3]) for r in rows if r[1] == "1"]
    assert first and second and second[0] <= max(first) + 1 and second[-1] == 24  # continues from the checkpoint
    assert second[0] > 1  # not from scratch
    ranks = rs.ranks(Store.open_default(), run_id)
    assert all(r.status == "succeeded" and r.exit_code == 0 for r in ranks)


def test_a_run_that_hits_its_timeout_is_not_a_success(bed) -> None:  # type: ignore[no-untyped-def]
    """Stopped at timeouts.run, its ranks end 'stopped' (or 0, trapping TERM): the run timed out (its own status
    and exit code 124, as timeout(1)), and says why."""
    r = cli(bed, "run", "slowpoke", "--on", bed.name, "--no-setup", timeout=120)
    assert r.returncode == rs.OUTCOMES["timed-out"] == 124, r.stderr
    assert "timed-out: timed out after 2 s (timeouts.run)" in r.stderr and "Traceback" not in r.stderr
    run_id = r.stderr.split("run ", 1)[1].split()[0]
    row = rs.require(Store.open_default(), run_id)
    assert row.status == "timed-out" and "timeouts.run" in (row.reason or ""), row
    assert {x.status for x in rs.ranks(Store.open_default(), run_id)} <= {"stopped", "succeeded"}
    r = cli(bed, "status", run_id)
    assert "timed-out" in r.stdout + r.stderr


def test_a_run_whose_folder_vanishes_on_a_host_fails_naming_it(bed) -> None:  # type: ignore[no-untyped-def]
    run_id = start(bed, "sleepy", {"seconds": "60", "n": "1", "host_count": "2"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "rank1.pid" not in bed.ssh("node1", f"ls ~/.testbed-runs/{run_id}").stdout:
        time.sleep(0.3)
    bed.ssh("node1", f"rm -rf ~/.testbed-runs/{run_id}")
    row = runner.wait(run_id, timeout=60)
    assert row.status == "failed" and "vanished on node1" in (row.reason or ""), row


def test_metacharacters_stay_inert(bed) -> None:  # type: ignore[no-untyped-def]
    evil = "a'b; touch /tmp/pwned-tb; $(touch /tmp/pwned-tb2) `id` && echo x | cat > /tmp/pwned-tb3"
    run_id = start(bed, "echo", {"msg": evil})
    row = runner.wait(run_id, timeout=60)
    assert row.status == "succeeded", row.reason
    assert bed.ssh("node0", f"cat ~/.testbed-runs/{run_id}/said.txt").stdout == evil + "\n"
    assert bed.ssh("node0", "ls /tmp/pwned-tb /tmp/pwned-tb2 /tmp/pwned-tb3 2>&1; true").stdout.count("No such") == 3


def test_cli_killed_mid_run_then_reattach(bed) -> None:  # type: ignore[no-untyped-def]
    p = subprocess.Popen([PY, "-m", "testbed.cli.runs", "run", "sleepy", "--on", bed.name, "-p", "seconds=5"],
                         cwd=bed.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TESTBED_HOME": str(bed.home)}, start_new_session=True)
    st = Store.open_default()
    deadline = time.monotonic() + 60
    run_id = None
    while time.monotonic() < deadline:
        rows = st.query("SELECT id, status FROM runs WHERE suite='sleepy' AND campaign IS NULL "
                        "ORDER BY created DESC LIMIT 1")
        if rows and rows[0]["status"] == "running":
            run_id = rows[0]["id"]
            break
        time.sleep(0.2)
    assert run_id, "the run never started"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)
    logs = cli(bed, "logs", run_id, "-f", timeout=60)  # reattaches and streams until the end
    assert logs.returncode == 0, logs.stderr
    assert "done rank 0 n 0" in logs.stdout and "done rank 1 n 0" in logs.stdout
    assert rs.require(st, run_id).status == "succeeded"
    status = cli(bed, "status", run_id, "--json")
    assert '"status": "succeeded"' in status.stdout


def test_campaign_interrupted_and_resumed(bed) -> None:  # type: ignore[no-untyped-def]
    args = ["run", "sleepy", "--on", bed.name, "--matrix", "-p", "host_count=4", "-p", "seconds=2"]
    p = subprocess.Popen([PY, "-m", "testbed.cli.runs", *args], cwd=bed.cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "TESTBED_HOME": str(bed.home)},
                         start_new_session=True)
    st = Store.open_default()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # interrupt once the first run finished and the second started
        rows = st.query("SELECT status FROM runs WHERE campaign IS NOT NULL ORDER BY created")
        if len(rows) >= 2 and rows[0]["status"] == "succeeded":
            break
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)
    before = {r["id"] for r in st.query("SELECT id FROM runs WHERE campaign IS NOT NULL")}
    assert len(before) == 2
    r = cli(bed, *args, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "resuming; 1/3 runs already finished" in r.stderr
    runs = st.query("SELECT id, params, status FROM runs WHERE campaign IS NOT NULL ORDER BY created")
    assert len(runs) == 3 and before <= {x["id"] for x in runs}  # nothing repeated
    assert sorted(__import__("json").loads(x["params"])["n"] for x in runs) == [1, 2, 3]
    assert all(x["status"] == "succeeded" for x in runs)


def test_a_campaign_with_a_failed_run_fails_and_its_reports_say_why(bed) -> None:  # type: ignore[no-untyped-def]
    """A real campaign, one point of which exits 3 after printing to stderr (a secret among it): the campaign ends
    failed (state, exit code, last line); collected, its run's report shows the failing rank's stderr tail with
    the secret masked (text, Markdown, HTML) and the campaign's report fails with that cause in the run's row; a
    run of the campaign missing from the results fails the campaign's report too."""
    import json
    import re
    import shutil

    env = {**os.environ, "TESTBED_HOME": str(bed.home), "TB_TEST_API_KEY": SECRET}
    r = subprocess.run([PY, "-m", "testbed.cli.runs", "run", "flaky", "--on", bed.name, "--matrix", "--collect"],
                       cwd=bed.cwd, capture_output=True, text=True, timeout=240, env=env, check=False)
    err = " ".join(r.stderr.split())
    assert r.returncode == 1, r.stderr
    cid = re.search(r"campaign (flaky-[0-9a-f]{8}): 3 runs", err)[1]  # type: ignore[index]
    assert f"campaign {cid} failed: 2/3 runs succeeded" in err, err
    camp = Store.open_default().campaign(cid)
    assert camp is not None and camp.status == "failed"
    bad = next(p.run_id for p in camp.points if p.params["n"] == 2)
    assert bad and f"{bad} failed" in err and f"testbed logs {bad}" in err

    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "testbed", "report", *args], cwd=bed.cwd, capture_output=True, text=True,
                              timeout=120, env={**env, "COLUMNS": "200"}, check=False)

    folder = bed.cwd / "results" / "flaky" / bad
    rep = report(str(folder))
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "why it failed:" in rep.stdout and "| RuntimeError: boom at step 7" in rep.stdout, rep.stdout
    assert SECRET not in rep.stdout and "pw-in-log" not in rep.stdout and "api_key=***" in rep.stdout
    md = (folder / "report" / "report.md").read_text()
    assert "## Why it failed" in md and "rank 0 failed with exit 3" in md and "```text" in md
    assert "loading weights" in md and SECRET not in md
    assert report(str(folder), "--format", "html").returncode == 1
    html = (folder / "report" / "report.html").read_text()
    assert "RuntimeError: boom at step 7</pre>" in html and SECRET not in html
    # the campaign's report: FAIL, with the failed run's cause in its row
    rep = report("results", "--campaign", cid, "--json")
    assert rep.returncode == 1, rep.stdout + rep.stderr
    out = json.loads(rep.stdout)
    assert not out["passed"] and [b["run_id"] for b in out["failed_runs"]] == [bad]
    assert out["failed_runs"][0]["cause"].endswith("failed (exit 3): RuntimeError: boom at step 7")
    rows = (Path(out["path"]).parent / "runs.csv").read_text()
    assert "RuntimeError: boom at step 7" in rows and SECRET not in rows
    # a run of the campaign missing from the results: the campaign's report fails naming it
    good = next(p.run_id for p in camp.points if p.params["n"] == 1)
    shutil.rmtree(bed.cwd / "results" / "flaky" / str(good))
    out = json.loads(report("results", "--campaign", cid, "--json").stdout)
    assert {b["run_id"]: b["status"] for b in out["failed_runs"]} == {bad: "failed", good: "missing"}


def test_host_killed_mid_run_fails_fast_naming_it(bed) -> None:  # type: ignore[no-untyped-def]
    run_id = start(bed, "sleepy", {"host_count": "4", "seconds": "60"})
    st = Store.open_default()
    deadline = time.monotonic() + 60
    while rs.require(st, run_id).status != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    t0 = time.monotonic()
    bed.provider.kill_host("node3")
    try:
        row = runner.wait(run_id, timeout=60)
        assert time.monotonic() - t0 < 40  # well before the 60 s sleep ends
        assert row.status == "failed"
        assert (row.reason or "").startswith("node3 rank 3: host unreachable")
        ranks = {r.host: r for r in rs.ranks(st, run_id)}
        assert ranks["node3"].status == "failed" and ranks["node0"].status == "stopped"
    finally:
        bed.provider.provision()  # bring node3 back for anyone after us


def test_suite_environment_unbuffered_and_a_fault_that_never_fired(bed) -> None:  # type: ignore[no-untyped-def]
    """Every step and rank runs inside the suite's environment with unbuffered Python; a log-line fault that
    never fired is an event; a missing environment fails the run with a message naming it."""
    for h in ("node0", "node1"):
        r = bed.ssh(h, "rm -rf ~/tb-env-test && python3 -m venv --without-pip ~/tb-env-test")
        assert r.returncode == 0, r.stderr
    run_id = start(bed, "environed", {})
    row = runner.wait(run_id, timeout=120)
    assert row.status == "succeeded", row.reason
    home = bed.ssh("node0", "echo $HOME").stdout.strip()
    which = bed.ssh("node1", f"cat ~/.testbed-runs/{run_id}/which.txt").stdout.strip()
    assert which == f"{home}/tb-env-test/bin/python"
    out = bed.ssh("node1", f"cat ~/.testbed-runs/{run_id}/rank1.out").stdout
    assert out.splitlines()[0] == f"{home}/tb-env-test 1", out
    missed = [e for e in events(run_id) if e.kind == "fault-missed"]
    assert len(missed) == 1 and missed[0].detail["fault"] == "never"
    assert "rank 1 on node1 never logged a line matching /step 999/" in missed[0].detail["reason"]
    bad = start(bed, "environed", {"env": "~/no-such-env"}, faults=[])
    row = runner.wait(bad, timeout=120)
    assert row.status == "failed" and "environment does not exist" in (row.reason or ""), row.reason


def test_ranks_last_lines_while_a_run_goes_on(bed) -> None:  # type: ignore[no-untyped-def]
    """What `testbed run` shows under its live status line: each rank's last line matching the suite's progress
    pattern (not the noise printed after it), read from the hosts while the ranks run."""
    rid = start(bed, "chatty", {})
    plan = rs.load_plan(rid)
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 2:
        seen.update({ln.rank: ln.text for ln in runner.rank_lines(plan)})
        time.sleep(0.5)
    runner.wait(rid, timeout=120)
    assert set(seen) == {0, 1}, seen
    assert all(t.startswith(f"rank {k} step ") and t.endswith(" of 12") for k, t in seen.items()), seen
    done = {ln.rank: ln.text for ln in runner.rank_lines(plan)}
    assert done == {0: "rank 0 step 12 of 12", 1: "rank 1 step 12 of 12"}


def test_run_on_a_terminal_shows_the_ranks_lines_live(bed) -> None:  # type: ignore[no-untyped-def]
    """`testbed run` on a terminal (a pseudo-terminal here) draws the live status line with the ranks' progress
    lines while it follows the events, and leaves the events alone once the run ended."""
    import pty
    import select

    leader, follower = pty.openpty()
    env = {**os.environ, "TESTBED_HOME": str(bed.home), "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    proc = subprocess.Popen([PY, "-m", "testbed.cli.runs", "run", "chatty", "--on", bed.name, "--no-setup"],
                            cwd=bed.cwd, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the pty closed: the command ended
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=30) == 0, out.decode(errors="replace")[-2000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))  # colours and cursor moves
    assert "r0  rank 0 step " in text and "r1  rank 1 step " in text, text[-3000:]
    assert "Ctrl-C detaches" in text
    assert "noise" not in text  # the suite's progress pattern picks the lines


def test_a_campaign_of_a_suite_folder_named_by_its_path(bed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``run ./folder --matrix``: a suite folder outside experiments/ (its name finds nothing) is recorded by its file,
    so the campaign, driven after the command that named it, loads it; before, every point stopped at "no suite
    named 'twice'"."""
    folder = tmp_path / "mine"
    folder.mkdir()
    text = SLEEPY.replace("name: sleepy", "name: twice").replace("n: [1, 2, 3]", "n: [1, 2]")
    (folder / "suite.yml").write_text(text)
    r = cli(bed, "run", str(folder), "--on", bed.name, "--matrix", "-p", "seconds=0.5", "-p", "host_count=1")
    err = " ".join(r.stderr.split())
    assert r.returncode == 0, r.stderr
    assert "no suite named" not in err and "succeeded: 2/2 runs succeeded" in err, err
    cid = err.split("campaign ", 1)[1].split(":", 1)[0]
    camp = Store.open_default().campaign(cid)
    assert camp is not None and camp.suite == "twice" and camp.info.suite_file == str((folder / "suite.yml").resolve())
