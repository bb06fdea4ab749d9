"""The one SSH transport (testbed.remote) and the remote scripts (testbed/scripts/*.sh).

The process policy (timeouts and idle limits that stop the whole process group, bounded output, stdin from a
file) is checked with local processes; the host-side run scripts run here under sh exactly as they are sent;
ssh, sftp, rsync, the master connection and keyscan against a real local host.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed import remote, scripts
from testbed.errors import TestbedError
from testbed.records import PlanHost, PlanTimeouts, Rank, RunPlan
from testbed.run import ranks as run_remote

SCRIPTS = sorted((Path(scripts.__file__).parent).glob("*.sh"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_timeout_stops_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    res = remote.call(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo started; wait"], host="h", timeout=1)
    assert time.monotonic() - t0 < 1 + remote.GRACE
    assert res.exit_code is None and not res.ok and res.error == "timed out after 1 s" and res.host == "h"
    assert res.stdout == "started\n"
    deadline = time.monotonic() + 5
    while _alive(int(pidfile.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(pidfile.read_text())), "the grandchild survived the timeout"


@pytest.mark.slow
def test_a_process_ignoring_sigterm_gets_sigkill_after_the_grace() -> None:
    t0 = time.monotonic()
    res = remote.call(["sh", "-c", "trap '' TERM; sleep 60"], timeout=0.5)
    dt = time.monotonic() - t0
    assert res.exit_code is None and "timed out" in (res.error or "")
    assert 0.5 + remote.GRACE - 0.2 < dt < 0.5 + remote.GRACE + 3


def test_output_is_bounded_and_stdin_is_a_file() -> None:
    res = remote.call(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo end"], max_output=1 << 20)
    assert res.ok and res.truncated and len(res.stdout) == 1 << 20 and res.stdout.endswith("a\nend\n")
    data = os.urandom(4 << 20)  # more than a pipe holds: a file never blocks the writer
    res = remote.call(["sha256sum"], stdin=data)
    import hashlib

    assert res.ok and not res.truncated and res.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert remote.call(["cat"]).stdout == ""  # no stdin: /dev/null, never the caller's terminal


@pytest.mark.slow
def test_idle_limit_from_output_and_from_a_probe() -> None:
    seen: list[bytes] = []
    res = remote.call(["sh", "-c", "echo a; sleep 30"], idle=0.6, on_output=seen.append)
    assert res.exit_code is None and res.lost and res.error == "no data for 0.6 s" and b"".join(seen) == b"a\n"
    ticks = iter(range(10**6))
    res = remote.call(["sleep", "1.5"], idle=0.6, probe=lambda: next(ticks))  # progress all along: not idle
    assert res.ok and not res.lost
    res = remote.call(["sleep", "30"], idle=0.6, probe=lambda: 0)
    assert res.lost and res.exit_code is None


def test_a_failing_reader_leaves_nothing_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    def boom(chunk: bytes) -> None:
        raise RuntimeError("reader failed")

    with pytest.raises(RuntimeError):
        remote.call(["sh", "-c", f"echo $$ > {pidfile}; echo x; sleep 60"], on_output=boom)
    assert not _alive(int(pidfile.read_text()))


def test_a_missing_tool_is_a_result_not_a_traceback() -> None:
    res = remote.call(["/nonexistent/ssh", "x"], host="node0")
    assert not res.ok and res.exit_code is None and "cannot start /nonexistent/ssh" in (res.error or "")


def test_sftp_words_escape_and_refuse() -> None:
    assert remote.sftp_word("/a b/[x]*.txt", glob=True) == "/a\\ b/\\[x\\]\\*.txt"
    with pytest.raises(Exception, match="sftp cannot write"):
        remote.sftp_word("/results/[x]", glob=False)


# remote scripts ----------------------------------------------------------------------------------
def test_scripts_are_package_files_and_arguments_stay_data(tmp_path: Path) -> None:
    names = {p.name for p in SCRIPTS}
    assert {"listing.sh", "facts.sh", "poll.sh", "signal.sh", "launch.sh", "unpack.sh", "tb-rank.sh",
            "activate.sh"} <= names
    evil = ["$(touch pwned)", "a'b", "`touch pwned2`", "line\nbreak", "", "-e", "*"]
    head = "set -- " + " ".join(shlex.quote(a) for a in evil) + "\n"
    assert scripts.program("poll.sh", *evil) == head + scripts.text("poll.sh")
    prog = head + "printf '[%s]\\n' \"$@\"\n"
    out = subprocess.run(["sh", "-s"], input=prog, capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out == "".join(f"[{a}]\n" for a in evil)
    assert not list(tmp_path.iterdir())
    assert f"exit {run_remote.ENV_MISSING}" in scripts.text("activate.sh")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (make deps)")
def test_scripts_are_shellcheck_clean() -> None:
    r = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def _on_host(command: str, stdin: bytes | None = None, home: Path | None = None) -> remote.HostResult:
    """``command`` as a host's login shell gets it (sh -c), here."""
    env = {**os.environ, "HOME": str(home)} if home else None
    r = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, env=env, timeout=60)
    return remote.HostResult("here", r.returncode, r.stdout.decode(), r.stderr.decode())


def test_run_scripts_upload_launch_poll_and_signal_here(tmp_path: Path) -> None:
    """unpack.sh, launch.sh, tb-rank.sh, poll.sh (with parse_poll) and signal.sh run under sh as they are sent."""
    home = tmp_path / "home"
    home.mkdir()
    ranks = [Rank(rank=0, host="here", address="127.0.0.1", env={"MSG": "hi $(x)"}, command='echo "$MSG"; echo ready'),
             Rank(rank=1, host="here", address="127.0.0.1", command="echo ready; sleep 60")]
    plan = RunPlan(run_id="r", suite="s", testbed="here", provider="local", params={}, run_dir="~/runs/r 1",
                hosts=[PlanHost(name="here", address="127.0.0.1")], master="here", ranks=ranks,
                timeouts=PlanTimeouts(prepare=1, run=1, post=1, grace=1, unreachable=1, poll=1))
    rd = home / "runs/r 1"
    tar = run_remote._tar({"tb-rank.sh": scripts.text("tb-rank.sh").encode()})
    assert _on_host(run_remote.sh(scripts.program("unpack.sh", plan.run_dir)), tar, home).exit_code == 0
    assert (rd / "tb-rank.sh").is_file()
    tar = run_remote._tar({f"rank{r.rank}.a0.sh": run_remote.rank_script(plan, r).encode() for r in ranks})
    cmd = run_remote.sh(scripts.program("launch.sh", plan.run_dir, 0, 0, 1))
    assert _on_host(cmd, tar, home).exit_code == 0
    poll = run_remote.poll_command(plan.run_dir, [0, 1], {"go": (1, "^read[y]$"), "never": (0, "$(touch x)")})
    deadline = time.monotonic() + 20
    while True:
        hp = run_remote.parse_poll(_on_host(poll, home=home))
        if (hp.ranks[0].exit_code == 0 and hp.ranks[1].alive and "go" in hp.triggers) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert hp.ok and hp.ranks[0].exit_code == 0 and hp.ranks[1].alive and hp.ranks[1].exit_code is None
    assert hp.triggers == ["go"] and not (rd / "x").exists()
    assert (rd / "rank0.out").read_text() == "hi $(x)\nready\n"
    pid = int((rd / "rank1.pid").read_text())
    assert _on_host(run_remote.sh(scripts.program("signal.sh", plan.run_dir, "TERM", 1)), home=home).exit_code == 0
    while (not (rd / "rank1.exit").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (rd / "rank1.exit").read_text().strip() == str(128 + signal.SIGTERM)
    hp = run_remote.parse_poll(_on_host(poll, home=home))
    assert hp.ranks[1].alive is False and hp.ranks[1].exit_code == 128 + signal.SIGTERM
    assert not _alive(pid)
    assert run_remote.parse_poll(_on_host(run_remote.poll_command("~/gone", [0], {}), home=home)).no_run_dir
    (rd / "rank0.out").write_text("step 1\nTAIL\nR 9 0 1 - -\nstep 2\n")  # a log that looks like poll output
    hp = run_remote.parse_poll(_on_host(run_remote.poll_command(plan.run_dir, [0], {}, tail=(0, 24)), home=home))
    assert hp.log_tail == "TAIL\nR 9 0 1 - -\nstep 2\n" and list(hp.ranks) == [0]  # its last 24 bytes, as they are
    hp = run_remote.parse_poll(_on_host(run_remote.poll_command(plan.run_dir, [], {}, tail=(7, 20)), home=home))
    assert hp.ok and hp.log_tail == "" and not hp.ranks  # no such log: an empty end
    (rd / "rank0.exit").write_text("7")  # the shell's read takes a last line with no newline too
    (rd / "rank0.end").write_text("")  # and an empty file is not known yet
    hp = run_remote.parse_poll(_on_host(run_remote.poll_command(plan.run_dir, [0], {}), home=home))
    assert hp.ranks[0].exit_code == 7 and hp.ranks[0].ended is None, hp


# against a real host -----------------------------------------------------------------------------
def test_transport_against_a_real_host(local_testbed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bed = local_testbed(hosts=2, name="tp")
    names = [h.name for h in bed.hosts]
    # run: fan-out over multiplexed connections, stdin, per-host commands, duplicates kept in order
    res = remote.run(bed.name, [*names, names[0]], "hostname; cat", stdin=b"in\n", timeout=30)
    assert [r.stdout for r in res] == [f"{n}\nin\n" for n in [*names, names[0]]] and all(r.ok for r in res)
    assert remote.control(bed.name, names[0], "check").ok  # the fan-out left a master running
    res = remote.run_each(bed.name, {names[1]: "exit 3", names[0]: "echo $0 >&2"}, timeout=30)
    assert [(r.host, r.exit_code, r.error) for r in res] == [(names[1], 3, None), (names[0], 0, None)]
    res = remote.run(bed.name, names[:1], "id -un", timeout=30, mux="none", user="root")[0]
    assert res.ok and res.stdout == "root\n"
    res = remote.run(bed.name, names[:1], "true", timeout=30, mux="none", user="nosuchuser")[0]
    assert not res.ok and res.exit_code == 255 and res.error and "Permission denied" in res.error
    res = remote.run(bed.name, names[:1], "sleep 30", timeout=1)[0]
    assert res.error == "timed out after 1 s" and res.exit_code is None
    # script: a program with arguments on bash's stdin
    r = remote.script(bed.name, names[0], scripts.program("facts.sh", "--host"), timeout=30)
    assert r.ok and f"@F hostname {names[0]}" in r.stdout
    # master connection: exit, check, start
    assert remote.control(bed.name, names[0], "exit").ok
    assert not remote.control(bed.name, names[0], "check").ok
    assert remote.control(bed.name, names[0], "start").ok and remote.control(bed.name, names[0], "check").ok
    # put and get (sftp), with names sftp would glob or split
    src = tmp_path / "odd [1] *.txt"
    src.write_bytes(b"payload")
    dst = "/tmp/tp odd (1) 'q' $x.txt"
    r = remote.put(bed.name, names[1], [(src, dst)])
    assert r.ok, r
    with pytest.raises(TestbedError, match="sftp cannot write"):
        remote.put(bed.name, names[1], [(src, "/tmp/[1].txt")])
    back = tmp_path / "back" / "copy.txt"
    back.parent.mkdir()
    r = remote.get(bed.name, names[1], [(dst, back)])
    assert r.ok and back.read_bytes() == b"payload", r
    r = remote.get(bed.name, names[1], [("/nonexistent/file", back)])
    assert not r.ok and r.error and names[1] in r.error and "sftp" in r.error
    # rsync both ways, a list of files, progress in bytes
    (tmp_path / "up/sub").mkdir(parents=True)
    (tmp_path / "up/sub/a.bin").write_bytes(os.urandom(300_000))
    (tmp_path / "up/b.txt").write_text("b")
    moved: list[int] = []
    r = remote.rsync(bed.name, names[0], "/tmp/tp-rsync", tmp_path / "up", push=True, options=["-rt", "--stats"],
                     progress=moved.append)
    assert r.ok and "Number of regular files transferred: 2" in r.stdout and sum(moved) >= 300_000, r
    r = remote.rsync(bed.name, names[0], "/tmp/tp-rsync", tmp_path / "down", files=["sub/a.bin"])
    assert r.ok and (tmp_path / "down/sub/a.bin").read_bytes() == (tmp_path / "up/sub/a.bin").read_bytes()
    assert not (tmp_path / "down/b.txt").exists()
    r = remote.rsync(bed.name, names[0], "/nonexistent", tmp_path / "down")
    assert not r.ok and r.error and f"rsync from {names[0]} failed" in r.error
    # keyscan: the host's keys, as pinned
    keys = remote.keyscan(bed.hosts[0].address).stdout
    assert "ssh-ed25519" in keys
    # a host that is down: one sentence naming it
    bed.provider.kill_host(names[1])
    r = remote.run(bed.name, [names[1]], "true", timeout=20, mux="none")[0]
    assert not r.ok and r.error and names[1] in r.error


def test_each_keeps_order_bounds_concurrency_and_stops_at_a_raise() -> None:
    """testbed's one fan-out: results in the items' order, at most ``limit`` at once, and a raise (a bug, not a
    host's failure) starts no further item, calls ``stop`` and is raised to the caller."""
    import threading
    import time

    running, peak, lock = [0], [0], threading.Lock()

    def slow(x: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return x * x

    assert remote.each(slow, list(range(12)), limit=3) == [x * x for x in range(12)]
    assert 1 < peak[0] <= 3
    assert remote.each(slow, []) == [] and remote.each(slow, [4]) == [16]

    started: list[int] = []
    stopped: list[bool] = []

    def boom(x: int) -> int:
        started.append(x)
        if x == 2:
            raise RuntimeError("a bug")
        time.sleep(0.05)
        return x

    with pytest.raises(RuntimeError, match="a bug"):
        remote.each(boom, list(range(20)), limit=2, stop=lambda: stopped.append(True))
    assert stopped == [True] and len(started) < 20
