"""The CLI's fast path (``testbed.cli.fast``) parses the hot command lines exactly as the Typer app does, hands
every other spelling to it, and prints the root help byte for byte as Typer renders it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import fast

ROOT = Path(__file__).resolve().parents[1]


def _typer_params(argv: list[str]) -> dict[str, Any]:
    """The parameters Typer's own parser gives the command of ``argv``."""
    from typer.main import get_command

    from testbed.cli.typer_app import app

    root = get_command(app)
    with root.make_context("testbed", list(argv), resilient_parsing=True) as ctx:
        sub = root.get_command(ctx, argv[0])
        assert sub is not None
        with sub.make_context(argv[0], list(argv[1:]), parent=ctx) as sctx:
            return dict(sctx.params)


@pytest.mark.parametrize("argv", [
    ["status"], ["status", "local"], ["status", "local", "--json"], ["status", "--probe", "tb", "--json"],
    ["exec", "local", "--", "true"], ["exec", "local", "--json", "--", "echo", "a b"],
    ["exec", "--hosts", "node1,node2", "local", "--", "hostname"], ["exec", "local", "-H", "work*", "--", "x"],
    ["exec", "local", "--timeout", "2.5", "--hosts=node1", "--", "sleep", "1"],
    ["exec", "local", "--timeout=30", "--", "--hosts", "-x"],
])
def test_fast_parse_agrees_with_typer(argv: list[str]) -> None:
    ours = fast._parse_status(argv[1:]) if argv[0] == "status" else fast._parse_exec(argv[1:])
    assert ours is not None, argv
    theirs = _typer_params(argv)
    if argv[0] == "status":
        assert ours == (theirs["target"], theirs["probe"], theirs["json_out"])
    else:
        assert ours == (theirs["name"], list(theirs["command"]), theirs["hosts"], theirs["timeout"],
                        theirs["json_out"])


@pytest.mark.parametrize("argv", [
    ["status", "a", "b"], ["status", "--no-such-option"], ["status", "--help"], ["status", "--json=1"],
    ["exec", "local", "true"], ["exec", "local", "--"], ["exec", "--", "true"], ["exec", "local", "--help", "--", "x"],
    ["exec", "local", "--timeout", "abc", "--", "x"], ["exec", "local", "--timeout", "-1", "--", "x"],
    ["exec", "local", "--hosts", "--", "x"], ["exec", "local", "-Hnode1", "--", "x"], ["exec", "a", "b", "--", "x"],
    ["exec", "local", "--timeout", "1", "--timeout", "2", "--", "x"], ["--help", "status"], ["list"], [],
])
def test_other_spellings_go_to_typer(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "_help", lambda: pytest.fail("help answered by the fast path"))
    assert fast.run(argv) is None


def _help_run(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", "--help"], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def test_root_help_is_typers_and_cached_per_terminal(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "90",
           "TESTBED_HOME": str(tmp_path / ".testbed")}
    code = ("import sys; from testbed.cli.typer_app import app; "
            "app(args=['--help'], standalone_mode=False, prog_name='testbed')")
    typer_out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=120, check=True).stdout
    first, second = _help_run(env, tmp_path), _help_run(env, tmp_path)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout == typer_out and "provision" in typer_out
    cached = list((tmp_path / "cache" / "testbed").glob("help-*.txt"))
    assert len(cached) == 1 and cached[0].read_text() == typer_out
    wide = _help_run({**env, "COLUMNS": "150"}, tmp_path)  # another width: another rendering, its own entry
    assert wide.returncode == 0 and wide.stdout != typer_out
    assert len(list((tmp_path / "cache" / "testbed").glob("help-*.txt"))) == 2


def test_hot_commands_import_neither_pydantic_nor_rich(tmp_path: Path) -> None:
    """``status`` (the ledger and one testbed) and ``exec`` stay free of the heavy imports that made start-up slow:
    Typer, pydantic (spec and run models) and Rich; a lab host whose ssh is ``true`` answers at once."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ssh").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "ssh").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tmp_path / "home"),
           "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    setup = ("from testbed import ssh; from testbed.hosts import Host; from testbed.state import Store; "
             "st = Store.open_default(); st.upsert_testbed('lab1', 'lab', None, 'up', {}); "
             "hs = [Host(name='h1', address='127.0.0.1')]; st.set_hosts('lab1', hs); ssh.write_ssh_config('lab1', hs)")
    subprocess.run([sys.executable, "-c", setup], env=env, cwd=tmp_path, check=True, timeout=60)
    for argv in (["status"], ["status", "--json"], ["exec", "lab1", "--", "true"]):
        code = (f"import sys; from testbed.cli import fast; rc = fast.run({argv!r}); sys.stdout.flush(); "
                "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'pydantic', 'rich')); "
                "print('HEAVY', heavy, rc, file=sys.stderr)")
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
        assert "HEAVY [] 0" in r.stderr, (argv, r.stdout, r.stderr)
        assert ("lab1" in r.stdout) if argv[0] == "status" else ("1/1 host ok" in r.stdout), (argv, r.stdout)


def test_plain_output_colours_wraps_and_never_reads_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from testbed.cli.output import Plain

    class Tty(io.StringIO):
        encoding = "utf-8"

        def isatty(self) -> bool:
            return True

    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "40")
    tty = Tty()
    out = Plain(tty)
    assert out.colour and out.width == 40
    out.rule(("node0", None), ("ok", "green"), ("0.10 s", None))
    out.write("[red]not markup[/red]")
    first, second = tty.getvalue().splitlines()
    assert first.startswith("node0  \x1b[32mok\x1b[0m  0.10 s ─") and len(first) == 40 + len("\x1b[32m\x1b[0m")
    assert second == "[red]not markup[/red]"  # a user's text is printed as it is
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Plain(Tty()).colour
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not Plain(Tty()).colour
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert Plain(io.StringIO()).colour  # forced even when not a terminal
    monkeypatch.delenv("FORCE_COLOR")
    pipe = io.StringIO()
    out = Plain(pipe)
    assert not out.colour and out.line_char == "-"  # no encoding known: ASCII
    out.table("t", ("name", "words"), [["a", "one two three four five six seven eight nine ten eleven"],
                                       ["b\nsecond line", "x"]])
    lines = pipe.getvalue().splitlines()
    assert lines[0] == "t" and all(len(ln) <= 40 for ln in lines[1:])
    assert len({len(ln) for ln in lines[1:]}) == 1  # every row as wide as the box
    body = "\n".join(lines)
    assert "second line" in body and "eleven" in body and "one two" in body
