"""The README's local loop, each command as written, under a pseudo-terminal as a user sees it: no wait of more
than 2 s passes with nothing on the screen (a live line that keeps changing counts; silence does not). The loop
itself runs from a plain venv holding the wheel, in tests/test_wheel.py (:func:`readme_loop`).

The loop runs from a folder whose ``inventories/local.yml`` is the shipped one on a free subnet (the README's
override of a shipped spec), so it never clashes with other tests' local testbeds. ``rehearse`` is left to
``tests/test_rehearse.py``: the replica needs the artifact's source, which this machine can only give as a folder
(``--source``), and a full tesla set-up."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

from localbed import free_subnet

ROOT = Path(__file__).resolve().parents[1]
SILENCE = 2.0


@dataclass
class Watched:
    """One command under a pty: its exit status, seconds, and each silence over the bound (when it began, how long,
    what the screen said last)."""

    argv: list[str]
    rc: int | None = None
    seconds: float = 0.0
    silences: list[tuple[float, float, str]] = field(default_factory=list)
    output: str = ""


def watch(argv: list[str], cwd: Path, env: dict[str, str], limit: float = 600.0) -> Watched:
    """Run ``argv`` on a pseudo-terminal of 120x40 and time every gap between two pieces of output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    w = Watched(argv)
    t0 = last = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()
    try:
        while time.monotonic() - t0 < limit:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                chunk = b""
            now = time.monotonic()
            if not chunk:
                break
            if now - last > SILENCE:
                w.silences.append((round(last - t0, 1), round(now - last, 1), _screen(out)))
            last = now
            out += chunk
        else:
            os.killpg(p.pid, signal.SIGKILL)
        w.rc = p.wait(timeout=30)
    finally:
        os.close(master)
    end = time.monotonic()
    if end - last > SILENCE:
        w.silences.append((round(last - t0, 1), round(end - last, 1), _screen(out) + " <then it ended>"))
    w.seconds, w.output = round(end - t0, 1), out.decode(errors="replace")
    return w


def _screen(out: bytearray) -> str:
    """The last thing on the screen: the tail of the output with terminal escapes dropped."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out[-400:].decode(errors="replace"))
    return text.replace("\r", "\n").strip().splitlines()[-1:][0] if text.strip() else "(nothing yet)"


def local_loop() -> list[str]:
    """The command lines of the README's 'The local loop, step by step', comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The local loop, step by step", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "README.md: the local loop has no code block"
    return [ln.split("#", 1)[0].strip() for ln in block[1].splitlines() if ln.split("#", 1)[0].strip()]


def test_the_readme_local_loop_is_what_this_test_runs() -> None:
    loop = local_loop()
    assert loop[0] == "testbed provision local" and loop[-1] == "testbed destroy local", loop
    assert all(ln.startswith("testbed ") for ln in loop), loop


def readme_loop(exe: str, tmp_path: Path, env: dict[str, str]) -> list[Watched]:
    """Run the README's local loop with ``exe`` (a ``testbed`` executable) from ``tmp_path``: each command as
    written, under a pty; every command must exit 0 and none may be silent over the bound (asserted)."""
    shipped = (ROOT / "inventories" / "local.yml").read_text()
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "local.yml").write_text(
        re.sub(r"subnet: \S+", f"subnet: {free_subnet()}", shipped, count=1))
    env = {**env, "TESTBED_HOME": str(tmp_path / ".testbed"), "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    env.pop("NO_COLOR", None)
    ran: list[Watched] = []
    try:
        for line in local_loop():
            words = shlex.split(line)
            if words[1] == "rehearse":
                continue
            w = watch([exe, *words[1:]], tmp_path, env)
            ran.append(w)
            assert w.rc == 0, f"{line}: exit {w.rc}\n{w.output[-3000:]}"
    finally:
        subprocess.run([exe, "destroy", "local", "--yes"], cwd=tmp_path, env=env, capture_output=True, timeout=300,
                       check=False)
    silent = [f"{' '.join(w.argv[1:])}: {took} s of silence from {at} s, after '{said}'"
              for w in ran for at, took, said in w.silences]
    print("\n".join(f"{' '.join(w.argv[1:])}: {w.seconds} s" for w in ran))
    assert not silent, "\n".join(silent)
    return ran
