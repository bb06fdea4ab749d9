"""Paths reach ssh_config, inventories and command lines quoted for their format, or are refused (issue 42, "a
path becomes a command"): a state home whose path holds a line break once wrote a ProxyCommand into the
testbed's ssh_config, which ran on this machine. Read back by the real OpenSSH (``ssh -G``), shlex and rsync."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed import paths, quoting, remote, ssh
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


# pieces of a path that each format reads in its own way; a path is one to six of them
PIECES = [" ", "'", '"', "#", "%", "%C", "=", "\n", "\r", "\t", "\x01", "\x7f", "~", "-", "\\", "$", "${X}", "{{",
          "{%", "{#", "\udcff", "é", "a", ",", ":"]
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)
SETTINGS = settings(max_examples=int(os.environ.get("TB_PROPERTY_EXAMPLES", "60")), deadline=None,
                    derandomize=not os.environ.get("TB_PROPERTY_RANDOM"), database=None)
PATH_KEYS = ("identityfile", "userknownhostsfile", "controlpath", "identityagent", "user")


def _unwritable(text: str, *, ansible: bool = False) -> bool:
    """Whether the test expects ``text`` refused (its own list, not testbed's): a control character, bytes that
    are not UTF-8, a double quote or backslash (read differently by OpenSSH before and since 8.7), ``${``;
    for Ansible, template markers."""
    if any(ord(c) < 32 or ord(c) == 127 or 0xDC80 <= ord(c) <= 0xDCFF for c in text):
        return True
    return '"' in text or "\\" in text or "${" in text or (ansible and any(m in text for m in ("{{", "{%", "{#")))


def _named(value: str, message: str) -> bool:
    """Whether ``message`` names ``value`` (as it is, or with its control characters escaped)."""
    return value in message or ascii(value)[1:-1] in message


def _ssh_g(cfg: Path, host: str) -> dict[str, list[str]]:
    """What the real OpenSSH reads from ``cfg`` for ``host`` (ssh -G: nothing is connected)."""
    r = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, stdin=subprocess.DEVNULL,
                       timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    got: dict[str, list[str]] = {}
    for line in os.fsdecode(r.stdout).splitlines():
        k, _, v = line.partition(" ")
        got.setdefault(k, []).append(v)
    return got


def _written(home: Path, host: Host) -> tuple[Path, dict[str, Any]]:
    """The ssh_config and inventory of testbed 'tb' for ``host`` with its state home at ``home`` (its control
    folder in /tmp removed again)."""
    with paths.at_home(home):
        try:
            return ssh.write_ssh_config("tb", [host]), ssh.inventory("tb", [host])
        finally:
            shutil.rmtree(ssh.control_dir("tb", make=False), ignore_errors=True)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """ssh -G of a config written for plain paths: every directive but the paths' must read the same."""
    d = tmp_path_factory.mktemp("plain")
    cfg, _ = _written(d / ".testbed", Host("node0", "10.0.0.1", port=2222, user="alice", key=str(d / "key")))
    return {k: v for k, v in _ssh_g(cfg, "node0").items() if k not in PATH_KEYS}


@SETTINGS
@given(folder=TEXTS, key=TEXTS)
def test_paths_read_back_by_openssh_and_shlex_or_are_refused(baseline: dict[str, list[str]], folder: str,
                                                              key: str) -> None:
    """A state home and a key file with any of PIECES in their paths: either OpenSSH reads the generated
    ssh_config back as exactly those paths (and nothing else changed: no directive added), and Ansible's shlex
    split of ``ansible_ssh_common_args`` gives the exact path, or the path is refused with a TestbedError that
    names it."""
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        home = Path(d) / folder / ".testbed"
        key_file = os.path.abspath(os.path.expanduser(key))  # a relative key is the working folder's
        try:
            cfg, inv = _written(home, Host("node0", "10.0.0.1", port=2222, user="alice", key=key))
        except TestbedError as e:
            msg = e.render()
            if _unwritable(str(home), ansible=True):
                assert "state home" in msg and _named(str(home), msg), msg
            else:
                assert _unwritable(key_file), f"refused a writable key {key_file!r}: {msg}"
                assert "key file" in msg and _named(key_file, msg), msg
            return
        assert not _unwritable(str(home), ansible=True) and not _unwritable(key_file), cfg.read_text()
        got = _ssh_g(cfg, "node0")
        assert got["identityfile"] == [key_file.replace("%", "%%")]  # ssh -G shows it before its expansion
        assert got["userknownhostsfile"] == [str(home / "testbeds" / "tb" / "known_hosts")]
        assert got["controlpath"][0].startswith(f"/tmp/tbcm-{os.getuid()}-") and got["user"] == ["alice"]
        assert {k: v for k, v in got.items() if k not in PATH_KEYS} == baseline
        assert shlex.split(inv["all"]["vars"]["ansible_ssh_common_args"]) == ["-F", str(cfg)]
        assert inv["all"]["vars"]["ansible_ssh_private_key_file"] == str(home / "testbeds" / "tb" / "id_ed25519")


@SETTINGS
@given(text=TEXTS)
def test_values_from_a_users_config_read_back_or_are_refused(text: str, tmp_path_factory: pytest.TempPathFactory,
                                                             baseline: dict[str, list[str]]) -> None:
    """A lab host's login user, IdentityFile and IdentityAgent (as the user's own config gives them) holding any
    of PIECES: read back by OpenSSH as exactly that text, or refused naming it."""
    home = tmp_path_factory.mktemp("user") / ".testbed"
    agent, ident = f"/agent/{text}", f"/id/{text}"
    host = Host("node0", "10.0.0.1", port=2222, user=text, facts={"ssh": {"identities": [ident],
                                                                         "identity_agent": agent}})
    bad = _unwritable(text) or "%" in text  # a User with '%' is refused too: newer OpenSSH expands it
    try:
        cfg, _ = _written(home, host)
    except TestbedError as e:
        assert bad, f"refused {text!r}: {e.render()}"
        assert _named(text, e.render()), e.render()
        return
    assert not bad, cfg.read_text()
    got = _ssh_g(cfg, "node0")
    assert got["user"] == [text]
    assert got["identityfile"][0] == ident and got["identityagent"] == [agent]
    assert got.pop("identitiesonly") == ["no"]  # the user's keys and agent are offered, as their ssh would
    assert {k: v for k, v in got.items() if k not in PATH_KEYS} == {k: v for k, v in baseline.items()
                                                                     if k != "identitiesonly"}


def test_rsync_hands_ssh_the_exact_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rsync splits its ``-e`` itself (its own quoting, no shell): with a state home full of quotes, spaces, '#',
    '%' and '=', the ssh that real rsync starts (a stand-in on PATH that records its argv) gets the exact
    ssh_config path."""
    dump = tmp_path / "argv.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                 f"open({str(dump)!r}, 'w').write(json.dumps(sys.argv[1:]))\nsys.exit(255)\n")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    home = tmp_path / "a b'c #d %e =f ''" / ".testbed"
    with paths.at_home(home):
        res = remote.rsync("tb", "node0", "/x", tmp_path / "out", idle=20)
        assert not res.ok
        assert json.loads(dump.read_text())[:2] == ["-F", str(ssh.ssh_config_path("tb"))]


@pytest.mark.parametrize("text", ["/x\0y", "/x\ny", "/x\ry", "/x\x1by", "/x\x7fy"])
def test_control_characters_never_reach_ssh_config(text: str) -> None:
    """Every C0 control character and DEL (NUL too, which no path can hold) is refused by name."""
    with pytest.raises(ValueError, match=r"line break|carriage return|NUL|control character"):
        quoting.ssh_arg(text, tokens=True, path=True)


def test_a_working_folder_with_a_line_break_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no TESTBED_HOME the state home is the working folder's: a line break there is refused by name, and
    ``--help`` still answers."""
    folder = tmp_path / "w\nProxyCommand x"
    folder.mkdir()
    monkeypatch.delenv("TESTBED_HOME", raising=False)
    monkeypatch.chdir(folder)
    with pytest.raises(TestbedError, match="working folder") as e:
        paths.state_home()
    assert e.value.where == "the working folder" and e.value.code == 2
    r = subprocess.run([sys.executable, "-m", "testbed", "--help"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
