"""Shell completion in real shells: the script testbed generates, sourced into bash and zsh, completes commands,
options and the names testbed knows (testbeds, suites, profiles, runs, hosts from state). And --help shows
flags as flags."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.hosts import Host
from testbed.state import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def shell_env(tb_home: Path, tmp_path: Path) -> dict[str, str]:
    """A `testbed` on PATH (this checkout), a state home with one provisioned testbed 'lab1' of two hosts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "testbed"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m testbed \"$@\"\n")
    exe.chmod(0o755)
    st = Store(tb_home / ".testbed" / "state.db")
    st.upsert_testbed("lab1", "lab", None, "up", {})
    st.set_hosts("lab1", [Host(name="gpu-a", address="10.0.0.1"), Host(name="gpu-b", address="10.0.0.2")])
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
            "TESTBED_HOME": str(tb_home / ".testbed")}


def _bash(env: dict[str, str], cwd: Path, *words: str) -> list[str]:
    script = ('eval "$(_TESTBED_COMPLETE=source_bash testbed)"\n'
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              '_testbed_completion testbed; printf "%s\\n" "${COMPREPLY[@]}"\n')
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if ln]


def test_bash_completes_commands_options_and_names(shell_env: dict[str, str], tb_home: Path) -> None:
    assert "provision" in _bash(shell_env, tb_home, "testbed", "pro")
    assert _bash(shell_env, tb_home, "testbed", "run", "mpi") == ["mpi-hello"]
    assert "--dry-run" in _bash(shell_env, tb_home, "testbed", "run", "mpi-hello", "--dr")
    assert _bash(shell_env, tb_home, "testbed", "setup", "local", "--profile", "local-s") == ["local-suites"]
    assert {"lab1", "local"} <= set(_bash(shell_env, tb_home, "testbed", "destroy", "l"))  # state and specs
    assert _bash(shell_env, tb_home, "testbed", "ssh", "lab1", "gpu") == ["gpu-a", "gpu-b"]  # hosts from state


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (make deps installs it)")
def test_zsh_completes_through_its_own_completion_system(shell_env: dict[str, str], tb_home: Path) -> None:
    """zsh runs the generated completion function; ``_arguments`` (what it hands the candidates to) prints them."""
    script = ('autoload -U compinit && compinit -u -D\n'
              'eval "$(_TESTBED_COMPLETE=source_zsh testbed)"\n'
              "print -r -- ${_comps[testbed]}\n"
              '_arguments() { print -r -- "$@" }\n'
              "words=(testbed ssh lab1 gpu); CURRENT=4; _testbed_completion\n"
              "words=(testbed run fault); CURRENT=3; _testbed_completion\n")
    r = subprocess.run(["zsh", "-f", "-c", script], env=shell_env, cwd=tb_home, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "_testbed_completion"  # registered with compdef for the testbed command
    assert '"gpu-a"' in lines[1] and '"gpu-b"' in lines[1]
    assert '"fault-drill"' in r.stdout


def test_completion_never_breaks_the_prompt(shell_env: dict[str, str], tb_home: Path) -> None:
    (tb_home / ".testbed" / "state.db").write_bytes(b"not a database")  # damaged state: complete nothing
    assert _bash(shell_env, tb_home, "testbed", "ssh", "lab1", "gpu") == []


def test_help_shows_flags_as_flags(shell_env: dict[str, str], tb_home: Path) -> None:
    r = subprocess.run(["testbed", "run", "--help"], env={**shell_env, "COLUMNS": "100"}, cwd=tb_home,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0
    assert "<bool>" not in r.stdout and "--dry-run" in r.stdout and "<list[str]>" not in r.stdout
    assert re.search(r"--param\s+-p\s+TEXT", r.stdout), r.stdout


def test_fault_names_complete_from_the_suite_on_the_command_line(shell_env: dict[str, str], tb_home: Path) -> None:
    """`run SUITE --fault <TAB>` offers that suite's faults (and `plan` alike); a fault already given is not
    offered again; with no suite (or an unknown one) nothing is offered."""
    every = ["kill-host", "kill-rank", "kill-rank-at"]  # experiments/fault-drill/suite.yml's faults
    assert _bash(shell_env, tb_home, "testbed", "run", "fault-drill", "--fault", "") == every
    assert _bash(shell_env, tb_home, "testbed", "run", "fault-drill", "--fault", "kill-h") == ["kill-host"]
    assert _bash(shell_env, tb_home, "testbed", "plan", "fault-drill", "--fault", "k") == every
    assert _bash(shell_env, tb_home, "testbed", "run", "--on", "local", "fault-drill", "--fault", "kill-rank",
                 "--fault", "k") == ["kill-host", "kill-rank-at"]
    assert _bash(shell_env, tb_home, "testbed", "run", "no-such-suite", "--fault", "k") == []
