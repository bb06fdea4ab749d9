"""The ``testbed`` command line: one thin command per verb; the work lives in the stages, which return data
that the command modules render (``testbeds``, ``runs``, ``collect``, ``tools``, ``setup_view``; shared
helpers in ``common``).

Every command line is parsed by the one Typer app, ``testbed.cli.typer_app``, which imports a command's module
only when that command runs (``testbed status`` loads the testbed commands and nothing else). Heavy imports
(Ansible, cloud SDKs, matplotlib, Rich) happen inside the commands that need them. Every failure a user can hit
is a TestbedError rendered as one message (what, where, what to do) with exit code 1, or 2 for bad input;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from testbed.cli import grammar
from testbed.cli.output import console, escape
from testbed.errors import TestbedError, UsageError
from testbed.exitcodes import Exit

if TYPE_CHECKING:
    from pathlib import Path


def __getattr__(name: str) -> Any:
    """``app``: the Typer app (``testbed.cli.typer_app.app``), imported on first use."""
    if name == "app":
        # lazy: start-up (testbed status and exec load this module)
        from testbed.cli import typer_app

        return typer_app.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# entry point ----------------------------------------------------------------------------------------
def main() -> None:
    """Console-script entry: run the app and turn every error into one message and an exit code."""
    _lazy_stdlib()
    _sane_columns()
    _refuse_undecodable_argv()
    if _stdout_closed():  # nothing could be shown: refused before any work, not a silent success
        sys.stderr.write("error: standard output is closed: testbed cannot print what it does (run it with "
                         "stdout open, or redirect it: > /dev/null)\n")
        sys.exit(Exit.FAILED)
    try:
        fresh = not _state_home().exists()  # a refused command leaves a folder with no state as it found it
    except TestbedError:
        fresh = False  # a state home testbed refuses: the command that needs it says so (--help still works)
    # lazy: start-up (testbed status and exec load this module)
    from testbed.cli.starting import Starting

    starting = Starting.maybe(sys.argv)  # on a terminal: no silent start, however slow the imports
    try:
        rc = _run_refusing_cleanly(fresh)
        if starting is not None:
            starting.stop()
        sys.stdout.flush()  # a reader gone before the end (| head) is seen here, not at the interpreter's exit
    except _click_exceptions()[0] as exc:  # Typer/Click's own usage errors, in our one-message format
        e: Any = exc  # a click.UsageError (format_message, ctx), whichever Click Typer brought
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `testbed`: the help, as asked for
            sys.stdout.write(e.format_message() + "\n")
            sys.exit(Exit.OK)
        cmd = e.ctx.command_path if e.ctx is not None else "testbed"
        err = UsageError(e.format_message(), where=f"command line ({cmd})", fix=f"see '{cmd} --help'")
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(err.render())}")
        sys.exit(Exit.USAGE)
    except _click_exceptions()[1]:
        console(stderr=True).print("[yellow]interrupted[/yellow]")
        sys.exit(Exit.INTERRUPTED)
    except TestbedError as e:
        if _tracebacks():
            import traceback

            traceback.print_exc()
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(e.render())}")
        sys.exit(e.code)
    except KeyboardInterrupt:
        console(stderr=True).print("[yellow]interrupted[/yellow]")
        sys.exit(Exit.INTERRUPTED)
    except BrokenPipeError:  # the reader of stdout went away (| head): quiet, as a tool killed by SIGPIPE
        _drop_stdout()
        sys.exit(EXIT_PIPE)
    except OSError as e:  # this machine refused (a name too long, no space, no permission): not a bug
        if _tracebacks():
            raise
        what = e.strerror or str(e) or type(e).__name__
        oserr = TestbedError(f"{what}" + (f": {e.filename}" if e.filename else ""),
                           where=str(e.filename) if e.filename else "this machine",
                           fix="check that path (its length, permissions and the free space), then retry; "
                               "--debug shows where it happened")
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(oserr.render())}")
        sys.exit(Exit.FAILED)
    except Exception as e:  # a bug: still one line unless --debug
        if _tracebacks():
            raise
        console(stderr=True).print(f"[bold red]internal error:[/bold red] {type(e).__name__}: {escape(str(e))}\n"
                                   "  fix:   run again with --debug for the traceback and report it")
        sys.exit(Exit.FAILED)
    sys.exit(rc if isinstance(rc, int) else 0)


def _refuse_undecodable_argv() -> None:
    """An argument whose bytes are not UTF-8 (Python keeps them as lone surrogates, which no file, shell command
    or message can hold) is refused before any work, naming it."""
    for i, arg in enumerate(sys.argv[1:], start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            sys.stderr.write(f"error: argument {i} ({shown}) is not UTF-8 text\n  where: command line\n"
                             "  fix:   give names, paths and values in UTF-8 (rename a file whose name is not)\n")
            sys.exit(Exit.USAGE)


EXIT_PIPE = Exit.FAILED
"""Exit code when stdout's reader went away (``testbed list runs | head -1``), with nothing on stderr: what
Python's documentation advises and what Rich (which writes most of the output) does itself, so every command
ends alike; not 0, since the output was not all read, so ``set -o pipefail`` sees it."""
MIN_COLUMNS = 20
"""A ``COLUMNS`` below this (0, or a width no table fits) is ignored: the terminal's width, else 80, is used."""


def _sane_columns() -> None:
    """Drop a ``COLUMNS`` that would print nothing or next to nothing (Rich prints nothing at width 0)."""
    import os

    cols = os.environ.get("COLUMNS")
    if cols is not None and (not cols.strip().isdigit() or int(cols) < MIN_COLUMNS):
        del os.environ["COLUMNS"]


def _stdout_closed() -> bool:
    """Whether standard output is closed (``>&-``): no stream, or no open file descriptor behind it."""
    import os

    if sys.stdout is None or getattr(sys.stdout, "closed", False):
        return True
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (captured output): open
        return False
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again on the broken pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _lazy_stdlib(names: tuple[str, ...] = ("inspect",)) -> None:
    """Stdlib modules that the hot commands import without using, loaded when first used rather than when
    imported (importlib's LazyLoader, as Mercurial's demandimport): ``dataclasses`` imports ``inspect`` (a third
    of ``testbed exec``'s start-up) and touches it only for a class without a docstring."""
    import importlib.util

    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def _state_home() -> Path:
    # lazy: start-up (testbed status and exec load this module)
    from testbed import paths

    return paths.state_home()


def _tracebacks() -> bool:
    """--debug (or TESTBED_DEBUG) on the command line that ran, whichever parsed it."""
    app = sys.modules.get("testbed.cli.typer_app")
    return grammar.tracebacks or bool(app is not None and app.tracebacks)


def _run_refusing_cleanly(fresh: bool) -> object:
    """The command (a hot one by :mod:`testbed.cli.grammar`, else by the Typer app); when it fails in a folder
    that had no state, the state it created with nothing recorded is removed again (``provision nosuch`` or
    ``run … --on nosuch`` leave no ``.testbed/`` behind)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.errors import front_door
    from testbed.paths import one_command

    try:
        # fixes name commands and flags (the API's name methods and arguments); suites named by path: this command's
        with front_door("cli"), one_command():
            rc = grammar.run(sys.argv[1:])
            if rc is None:
                # lazy: start-up (testbed status and exec load this module)
                from testbed.cli import typer_app

                rc = typer_app.app(standalone_mode=False, prog_name="testbed")
    except BaseException:
        if fresh:
            # lazy: start-up (testbed status and exec load this module)
            from testbed.state import discard_if_unused

            discard_if_unused(_state_home())
        raise
    if fresh and isinstance(rc, int) and rc != 0:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.state import discard_if_unused

        discard_if_unused(_state_home())
    return rc


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """Usage-error and abort classes of the Click that Typer uses: recent Typer vendors its own
    (``typer._click``), older ones use ``click``."""
    import importlib

    usage: list[type[BaseException]] = []
    aborts: list[type[BaseException]] = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        if mod.split(".")[0] not in sys.modules:
            continue
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        for name, bucket in (("UsageError", usage), ("Abort", aborts)):
            cls = getattr(m, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                bucket.append(cls)
    return tuple(usage), tuple(aborts)
