"""Paths reach ssh_config, inventories and command lines quoted for their format, or are refused (issue 42, "a
path becomes a command"): a state home whose path holds a line break once wrote a ProxyCommand into the
testbed's ssh_config, which ran on this machine. Read back by the real OpenSSH (``ssh -G``), shlex and rsync."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed import ssh
from testbed.errors import TestbedError
from testbed.hosts import Host


def test_a_state_home_with_a_line_break_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported attack: TESTBED_HOME='/tmp/x<newline>  ProxyCommand touch ...' is refused with one clear
    message naming TESTBED_HOME, before anything is written; no ProxyCommand reaches ssh, nothing runs."""
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / f"x\n  ProxyCommand touch {pwned} #"))
    monkeypatch.chdir(tmp_path)
    refused: TestbedError | None = None
    try:
        cfg = ssh.write_ssh_config("tb", [Host("node0", "127.0.0.1", port=1, key=str(tmp_path / "k"))])
    except TestbedError as e:
        refused = e
    else:
        subprocess.run(["ssh", "-F", str(cfg), "-o", "ConnectTimeout=2", "node0", "true"], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=30, check=False)
        assert not pwned.exists(), "the ProxyCommand written from the state home ran"
    assert refused is not None
    msg = refused.render()
    assert "TESTBED_HOME" in msg and "line break" in msg and "fix:" in msg, msg
