"""The command lines users type most, answered without importing Typer (about 0.2 s of start-up on 2 cores).

``run(argv)`` handles exactly these forms and returns an exit code, or None for anything else, which then goes
to the full Typer app unchanged (so every other spelling, ``--help`` of a command, a usage error and shell
completion behave as before):

- ``testbed --version``: the version of the installed distribution (its package metadata);
- ``testbed --help``: the root help as Typer renders it, kept in a cache keyed by everything that shapes it
  (the CLI's source files, the Typer and Rich installs, the terminal and the environment variables Rich and
  Typer read); a miss renders it through Typer and stores it;
- ``testbed [--debug] status [TARGET] [--json] [--probe]``;
- ``testbed [--debug] exec NAME [--hosts|-H H] [--timeout S] [--json] -- COMMAND...``.

The status and exec bodies are the ones the Typer commands call (``testbed.cli.hot``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"\d+(\.\d*)?|\.\d+")  # what both parsers read as the same float
# the environment variables that change how Rich and Typer render help (colour, width, terminal, encoding)
_RENDER_ENV = re.compile(r"COLUMNS|LINES|TERM|COLORTERM|NO_COLOR|FORCE_COLOR|PY_COLORS|CLICOLOR(_FORCE)?|"
                         r"TTY_COMPATIBLE|TTY_INTERACTIVE|TERMINAL_WIDTH|GITHUB_ACTIONS|PYTHONIOENCODING|LANG|"
                         r"LC_ALL|LC_CTYPE|JUPYTER_COLUMNS|JUPYTER_LINES|JPY_PARENT_PID|VSCODE_.*|"
                         r"DATABRICKS_RUNTIME_VERSION|_?TYPER_.*")


def run(argv: list[str]) -> int | None:
    """The exit code of ``testbed <argv>`` when it is one of the forms above; None: use the Typer app."""
    if "_TESTBED_COMPLETE" in os.environ:  # shell completion is Typer's
        return None
    args = list(argv)
    debug = args[:1] == ["--debug"]
    if debug:
        args = args[1:]
    if args == ["--help"] and not debug:
        return _help()
    if args == ["--version"]:
        sys.stdout.write(version_line() + "\n")
        return 0
    if args[:1] == ["status"]:
        st = _parse_status(args[1:])
        if st is None:
            return None
        _set_debug(debug)
        from testbed.cli import hot

        hot.status(*st)
        return 0
    if args[:1] == ["exec"]:
        ex = _parse_exec(args[1:])
        if ex is None:
            return None
        _set_debug(debug)
        from testbed.cli import hot

        return hot.exec_(*ex)
    return None


def version_line() -> str:
    """``testbed X.Y.Z``: the version in the package metadata of the distribution whose ``testbed`` command this
    is (found by its entry point, whatever the distribution is called); the source's own version when testbed
    runs from a checkout that was never installed."""
    from importlib import metadata

    for dist in metadata.distributions():
        try:
            eps = dist.entry_points
        except Exception:  # noqa: S112 (a broken distribution elsewhere in the environment is not ours)
            continue
        if any(ep.group == "console_scripts" and ep.value.replace(" ", "") == "testbed.cli:main" for ep in eps):
            name = dist.metadata["Name"] or "testbed"
            return f"testbed {dist.version}" + (f" (distribution {name})" if name != "testbed" else "")
    from testbed.distribution import SOURCE_VERSION as __version__

    return f"testbed {__version__} (not installed: running from {Path(__file__).resolve().parents[2]})"


def _set_debug(flag: bool) -> None:
    from testbed import cli

    cli._debug = flag or bool(os.environ.get("TESTBED_DEBUG"))  # what the Typer app's root callback does


def _parse_status(args: list[str]) -> tuple[str | None, bool, bool] | None:
    """(target, probe, json) of ``status``'s arguments, or None when anything is not the plain form."""
    target: str | None = None
    probe = json_out = False
    for a in args:
        if a == "--json":
            json_out = True
        elif a == "--probe":
            probe = True
        elif a.startswith("-") or target is not None:
            return None
        else:
            target = a
    return target, probe, json_out


def _parse_exec(args: list[str]) -> tuple[str, list[str], str | None, float | None, bool] | None:
    """(name, command, hosts, timeout, json) of ``exec``'s arguments, or None when not the plain form."""
    if "--" not in args:
        return None
    cut = args.index("--")
    opts, command = args[:cut], args[cut + 1:]
    if not command:
        return None
    name: str | None = None
    hosts: str | None = None
    timeout: float | None = None
    json_out = False
    i = 0
    while i < len(opts):  # bounded: i grows every pass
        a = opts[i]
        key, eq, val = a.partition("=")
        if a == "--json":
            json_out = True
        elif a in ("--hosts", "-H", "--timeout"):
            if i + 1 >= len(opts) or opts[i + 1].startswith("-"):
                return None
            key, val, i = a, opts[i + 1], i + 1
        elif not (eq and key in ("--hosts", "--timeout")):
            if a.startswith("-") or name is not None:
                return None
            name = a
            i += 1
            continue
        if key in ("--hosts", "-H"):
            if hosts is not None or not val:
                return None
            hosts = val
        elif key == "--timeout":
            if timeout is not None or not _NUMBER.fullmatch(val):
                return None
            timeout = float(val)
        i += 1
    if name is None:
        return None
    return name, command, hosts, timeout, json_out


# the root help ---------------------------------------------------------------------------------------
def _help() -> int:
    path = _help_cache_path()
    if path is not None:
        try:
            sys.stdout.write(path.read_text(encoding="utf-8"))
            sys.stdout.flush()
            return 0
        except OSError:
            pass
    from testbed.cli.typer_app import app

    tee = _Tee(sys.stdout)
    sys.stdout = tee  # type: ignore[assignment]
    try:
        rc = app(args=["--help"], standalone_mode=False, prog_name="testbed")
    finally:
        sys.stdout = tee.inner
    code = rc if isinstance(rc, int) else 0
    if code == 0 and path is not None and tee.text:
        _store(path, "".join(tee.text))
    return code


def _help_cache_path() -> Path | None:
    """Where the root help rendered for this install, terminal and environment is kept (None: no cache)."""
    import hashlib
    from importlib.util import find_spec

    h = hashlib.sha256(sys.version.encode())
    try:
        for f in sorted(Path(__file__).parent.glob("*.py")):  # the help text lives in the command modules
            st = f.stat()
            h.update(f"{f.name} {st.st_mtime_ns} {st.st_size}\n".encode())
        for mod in ("typer", "rich", "click"):
            spec = find_spec(mod)
            origin = spec.origin if spec is not None else None
            mtime = os.stat(origin).st_mtime_ns if origin else ""
            h.update(f"{mod} {origin} {mtime}\n".encode())
    except (OSError, ValueError, ImportError):
        return None
    size: Any = None
    for fd in (0, 1, 2):  # the streams Rich asks for the terminal size, in its order
        try:
            size = tuple(os.get_terminal_size(fd))
            break
        except (OSError, ValueError):
            continue
    ttys = tuple(_isatty(f) for f in (sys.stdin, sys.stdout, sys.stderr))
    env = sorted((k, v) for k, v in os.environ.items() if _RENDER_ENV.fullmatch(k))
    h.update(repr((size, ttys, sys.stdout.encoding, env)).encode())
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "testbed" / f"help-{h.hexdigest()[:32]}.txt"


def _isatty(f: Any) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _store(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a cache that cannot be written is simply not used."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


class _Tee:
    """A text stream that records what is written and passes it (and every other call) to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.text: list[str] = []

    def write(self, s: str) -> int:
        n: int = self.inner.write(s)  # first: Click probes with bytes and expects the TypeError
        self.text.append(s)
        return n

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self.inner, name)  # type: ignore[no-any-return]
