"""Shared-home write tracing in a rehearsal (issue 37 item 4): which paths each host wrote in each step, read from
real strace output, and a real rehearsal on a 3-host local replica whose home is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from localbed import free_subnet

from testbed.run import hometrace as ht

SAMPLES = Path(__file__).parent / "samples" / "hometrace"


def test_a_real_trace_gives_each_write_absolute_through_fork_chdir_and_rename() -> None:
    """Captured with ht.traced_command (dash, strace 6.1) running, in ~/run: mkdir -p data/raw; echo x >
    data/raw/a.txt; (cd data && echo y > b.tmp && mv b.tmp b.txt); sh -c 'cd ~ && touch abs-file && ln -s
    abs-file link1'; rm data/raw/a.txt; : > "sp ace,\\"q\\".txt" (the capture's home renamed /home/tb)."""
    t = ht.writes((SAMPLES / "fork-chdir-rename.trace").read_text())
    assert (t.cwd, t.home, t.traced) == ("/home/tb/run", "/home/tb", True)
    assert t.writes == {
        "/home/tb/run/data": "mkdir",  # relative, in the cwd of a vfork'd child
        "/home/tb/run/data/raw": "mkdir",  # relative, after an fchdir
        "/home/tb/run/data/raw/a.txt": "openat",  # O_WRONLY|O_CREAT, later unlinked
        "/home/tb/run/data/b.tmp": "openat",  # in a subshell after chdir
        "/home/tb/run/data/b.txt": "renameat2",
        "/home/tb/abs-file": "openat",  # a grandchild of a child that chdir'd to an absolute path
        "/home/tb/link1": "symlinkat",
        '/home/tb/run/sp ace,"q".txt': "openat",  # quotes and a comma inside the string
    }
    # reads are not writes, and the parser is bounded by its input
    assert ht.writes('#cwd /h\n#home /h\n7 openat(AT_FDCWD</h>, "x", O_RDONLY|O_CLOEXEC) = 3</h/x>\n'
                     '7 openat(AT_FDCWD</h>, "O_CREAT", O_RDONLY) = 3</h/O_CREAT>\n').writes == {}


def test_an_unfinished_call_is_joined_to_its_resumed_end_and_failures_are_not_writes() -> None:
    text = ("#cwd /h/r\n#home /h\n"
            "5 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>\n"
            "6 chdir(\"..\") = 0\n"
            "5 <... clone resumed>) = 6\n"
            "6 openat(AT_FDCWD</h>, \"late\", O_WRONLY|O_CREAT <unfinished ...>\n"
            "6 <... openat resumed>, 0666) = 3</h/late>\n"
            "6 mkdir(\"d\", 0777) = 0\n"
            "6 unlink(\"/h/nope\") = -1 ENOENT (No such file or directory)\n")
    assert ht.writes(text).writes == {"/h/late": "openat", "/h/d": "mkdir"}


def test_no_strace_says_why_and_the_read_back_splits_by_step() -> None:
    t = ht.writes("#cwd /h\n#home /h\n#nostrace strace is missing\n")
    assert not t.traced and t.why == "strace is missing"
    # read back through any login shell: a csh (tesla's tcsh) expands "!" even inside single quotes
    assert "!" not in ht.read_command("~/.testbed-runs/r1", ["prepare0", "post1"], "node1")
    got = ht.split_read("@@ prepare0 120\n#cwd /h\nline\n\n@@ post1 -\n")
    assert got == {"prepare0": ("#cwd /h\nline\n", 120), "post1": ("", None)}


def _trace(home: str, *paths: str) -> ht.Trace:
    return ht.Trace(cwd=home, home=home, writes=dict.fromkeys(paths, "openat"))


def test_two_hosts_writing_one_path_under_the_home_is_named_with_the_hosts() -> None:
    h = "/home/u"
    line = ht.collisions("make venv", {"node1": _trace(h, f"{h}/vit_env/bin/python", "/tmp/x"),
                                       "node2": _trace(h, f"{h}/vit_env/bin/python", "/tmp/x"),
                                       "node3": _trace(h, f"{h}/vit_env/bin/python", f"{h}/vit_env/pyvenv.cfg")},
                         "~/.testbed-runs/r1")
    assert line == ("step 'make venv' wrote ~/vit_env/bin/python from node1, node2 and node3 at once on the shared "
                    "home: mark it `per: home`, or write per-host paths")
    # outside the home, per-host names, __pycache__ and the traces themselves are not collisions
    assert ht.collisions("s", {n: _trace(h, "/tmp/x", f"{h}/out-{n}.log", f"{h}/{n}/x", f"{h}/m/__pycache__/a.pyc",
                                         f"{h}/.testbed-runs/r1/hometrace/prepare0-{n}.trace")
                               for n in ("node1", "node10")}, "~/.testbed-runs/r1") is None
    ranks = {"node1": _trace(h, f"{h}/ckpt-1.pt", f"{h}/all.log"), "node2": _trace(h, f"{h}/ckpt-2.pt", f"{h}/all.log")}
    assert ht.collisions("launch", ranks, "~/r", {"node1": [1], "node2": [2]}) == (
        "the launch's ranks wrote ~/all.log from node1 and node2 at once on the shared home: write per-rank or "
        "per-host paths, or write it from one rank")
    many = ht.collisions("s", {n: _trace(h, f"{h}/a b", f"{h}/c/d", f"{h}/e") for n in ("n1", "n2")}, "~/r")
    odd = ht.collisions("s", {n: _trace(h, f"{h}/x\ny; rm -rf ~") for n in ("n1", "n2")}, "~/r")
    assert odd is not None and "\n" not in odd and odd.startswith("step 's' wrote ~/'x\\ny; rm -rf ~' from"), odd
    assert many is not None and many.startswith("step 's' wrote ~/'a b' from n1 and n2 at once on the shared home "
                                                "(and 2 more such paths):"), many


SUITE = """name: race
description: three steps writing under a shared home
testbed: nfs3
requires: {hosts: 3}
parameters:
  per_host: {type: bool, default: false, help: "each host makes its own env (~/race_env_HOST)"}
steps:
  prepare:
    - name: make venv
      on: all
      run: >-
        {% set d = '~/race_env_' ~ host if per_host else '~/race_env' %}
        mkdir -p {{ d }}/bin && echo python > {{ d }}/bin/python
    - name: once per home
      on: all
      per: home
      run: echo once > ~/race_once.txt
    - name: per host
      on: all
      run: echo {{ host }} > ~/race_{{ host }}.txt
  launch:
    on: all
    command: "echo {{ rank }} > ~/race_{{ 'rank' ~ rank if per_host else 'ranks' }}.txt"
estimate: 10s
timeouts: {prepare: 120, run: 60, grace: 5, poll: 0.5}
"""
SPEC = """description: three hosts sharing one NFS home
provider: {kind: local, hosts: 3, subnet: 10.231.0.0/24}
user: root
hardware: {shared_home: true}
"""


def _rehearse(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "testbed", "rehearse", "race", *args, "--subnet", free_subnet(),
                        "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
                       env={**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed")})
    assert r.stdout.strip(), r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout)


@pytest.mark.slow
def test_a_rehearsal_on_a_shared_home_names_the_path_two_hosts_wrote_in_one_step(tmp_path: Path,
                                                                                 need_local: None) -> None:
    """One point on a 3-host replica: the step every host writes ~/race_env/bin/python in fails naming it, and so
    do the ranks (one per host) that all write ~/race_ranks.txt; the step marked ``per: home`` and the step writing
    per-host paths pass. Then the same suite with the env and the ranks' files made per host and rank (``-p
    per_host=true``) rehearses green."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "race.yml").write_text(SUITE)
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "nfs3.yml").write_text(SPEC)
    rc, out = _rehearse(tmp_path)
    (point,) = out["points"]
    assert rc != 0 and not out["ok"] and not point["ok"], json.dumps(out, indent=1)
    assert point["failures"] == [
        "step 'make venv' wrote ~/race_env/bin/python from node0, node1 and node2 at once on the shared home: "
        "mark it `per: home`, or write per-host paths",
        "the launch's ranks wrote ~/race_ranks.txt from node0, node1 and node2 at once on the shared home: write "
        "per-rank or per-host paths, or write it from one rank"], json.dumps(point, indent=1)
    assert not [n for n in point["not_rehearsed"] if "shared home" in n], point["not_rehearsed"]
    rc, out = _rehearse(tmp_path, "-p", "per_host=true")
    assert rc == 0 and out["ok"] and out["points"][0]["failures"] == [], json.dumps(out, indent=1)


@pytest.mark.parametrize("with_strace", [True, False])
def test_the_traced_command_keeps_its_exit_status_and_says_when_strace_is_missing(tmp_path: Path,
                                                                                  with_strace: bool) -> None:
    """Run for real by sh: under strace where it is on the PATH, else untraced with the header saying so (the
    point then says the shared-home check was not made, never that it passed)."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "mkdir", "dirname", *(["strace"] if with_strace else [])):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (bin_dir / tool).symlink_to(found)
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    cmd = ht.traced_command("echo hi > 'out put.txt'; exit 3", "~/run/hometrace/prepare0-node1.trace")
    r = subprocess.run(["sh", "-c", cmd], cwd=home / "run", env={"HOME": str(home), "PATH": str(bin_dir)},
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3, r.stderr
    assert (home / "run" / "out put.txt").read_text() == "hi\n"
    text = (home / "run" / "hometrace" / "prepare0-node1.trace").read_text()
    t, note = ht.judge("make venv", "node1", text)
    if with_strace:
        assert t.traced and note is None and t.writes == {str(home / "run" / "out put.txt"): "openat"}, text
    else:
        assert not t.traced and t.writes == {}, text
        assert note == "shared home: not checked for step 'make venv' on node1: strace is missing (install strace " \
                       "there to check it)"
