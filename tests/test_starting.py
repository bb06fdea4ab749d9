"""The first second of a command on a terminal: a live 'starting' line while the command has written nothing,
cleared at its first write; nothing of it off a terminal."""

from __future__ import annotations

import io
import sys
import time

import pytest

from testbed.cli import starting


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_start_shows_a_live_line_that_the_first_write_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    out, err = Tty(), Tty()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(starting, "DELAY", 0.05)
    monkeypatch.setattr(starting, "TICK", 0.05)
    s = starting.Starting.maybe(["testbed", "destroy", "local", "--yes"])
    assert s is not None
    time.sleep(0.3)
    print("destroyed")  # the command's first word
    shown = err.getvalue()
    assert "… testbed destroy local: starting (0 s)" in shown and shown.endswith("\r\x1b[2K"), shown
    assert out.getvalue() == "destroyed\n" and sys.stdout is out and sys.stderr is err  # streams handed back
    time.sleep(0.15)
    assert err.getvalue() == shown  # the line never comes back


def test_a_quick_command_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    s = starting.Starting.maybe(["testbed", "status"])
    assert s is not None
    sys.stderr.write("ok\n")
    assert err.getvalue() == "ok\n"


@pytest.mark.parametrize("argv", [["testbed"], ["testbed", "run", "--help"]])
def test_not_for_help_or_a_bare_testbed(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "stderr", Tty())
    assert starting.Starting.maybe(argv) is None


def test_not_off_a_terminal_nor_for_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert starting.Starting.maybe(["testbed", "status"]) is None
    monkeypatch.setattr(sys, "stderr", Tty())
    monkeypatch.setenv("_TESTBED_COMPLETE", "complete_bash")
    assert starting.Starting.maybe(["testbed", "status"]) is None
