"""The ``testbed`` command line: one thin command per verb; the work lives in the stages, which return data
that the command modules render (``testbeds``, ``runs``, ``collect``, ``tools``, ``setup_view``; shared
helpers in ``common``).

Heavy imports (Ansible, cloud SDKs, matplotlib) happen inside the commands that need them, so
``testbed --help`` stays fast. Every failure a user can hit is a TestbedError rendered as one message
(what, where, what to do) with exit code 1, or 2 for bad input; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from testbed.cli.common import console, escape
from testbed.errors import TestbedError, UsageError

app = typer.Typer(
    name="testbed",
    help="Provision, set up, run, collect and report research artifacts on local, lab, Chameleon and TPU "
         "testbeds.\n\nExample: testbed provision local && testbed exec local -- hostname",
    no_args_is_help=True,
    add_completion=True,  # --install-completion [bash|zsh|fish], --show-completion
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
list_app = typer.Typer(help="List testbeds, suites, profiles or runs.", no_args_is_help=False)

_debug = False


def _flags_as_flags() -> None:
    """Typer prints a flag's type as if it took a value (``--detach <bool>``): show flags as flags."""
    from typer.core import TyperOption

    typed = TyperOption.display_type_rich

    def display(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and self.metavar is None else typed(self, ctx)

    TyperOption.display_type_rich = display  # type: ignore[method-assign]


_flags_as_flags()


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    global _debug
    _debug = debug or bool(os.environ.get("TESTBED_DEBUG"))


def _register() -> None:
    """Each command module adds its verbs, in the order `testbed --help` lists them."""
    from testbed.cli import collect as cli_collect
    from testbed.cli import runs as cli_runs
    from testbed.cli import testbeds, tools

    testbeds.register(app, list_app)
    cli_runs.register(app, list_app)
    cli_collect.register(app)
    tools.register(app)
    app.add_typer(list_app, name="list")


_register()


# entry point ----------------------------------------------------------------------------------------
def main() -> None:
    """Console-script entry: run the app and turn every error into one message and an exit code."""
    usage_errors, aborts = _click_exceptions()
    try:
        rc = app(standalone_mode=False, prog_name="testbed")
    except usage_errors as exc:  # Typer/Click's own usage errors, in our one-message format
        e: Any = exc  # a click.UsageError (format_message, ctx), whichever Click Typer brought
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `testbed`: the help, as asked for
            sys.stdout.write(e.format_message() + "\n")
            sys.exit(0)
        cmd = e.ctx.command_path if e.ctx is not None else "testbed"
        err = UsageError(e.format_message(), where=f"command line ({cmd})", fix=f"see '{cmd} --help'")
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(err.render())}")
        sys.exit(2)
    except aborts:
        console(stderr=True).print("[yellow]interrupted[/yellow]")
        sys.exit(130)
    except TestbedError as e:
        if _debug:
            import traceback

            traceback.print_exc()
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(e.render())}")
        sys.exit(e.code)
    except KeyboardInterrupt:
        console(stderr=True).print("[yellow]interrupted[/yellow]")
        sys.exit(130)
    except OSError as e:  # this machine refused (a name too long, no space, no permission): not a bug
        if _debug:
            raise
        what = e.strerror or str(e) or type(e).__name__
        oserr = TestbedError(f"{what}" + (f": {e.filename}" if e.filename else ""),
                           where=str(e.filename) if e.filename else "this machine",
                           fix="check that path (its length, permissions and the free space), then retry; "
                               "--debug shows where it happened")
        console(stderr=True).print(f"[bold red]error:[/bold red] {escape(oserr.render())}")
        sys.exit(1)
    except Exception as e:  # a bug: still one line unless --debug
        if _debug:
            raise
        console(stderr=True).print(f"[bold red]internal error:[/bold red] {type(e).__name__}: {escape(str(e))}\n"
                                   "  fix:   run again with --debug for the traceback and report it")
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """Usage-error and abort classes of the Click that Typer uses (recent Typer vendors its own)."""
    import importlib

    usage: list[type[BaseException]] = []
    aborts: list[type[BaseException]] = []
    for mod in ("typer._click.exceptions", "click.exceptions"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        for name, bucket in (("UsageError", usage), ("Abort", aborts)):
            cls = getattr(m, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                bucket.append(cls)
    return tuple(usage), tuple(aborts)
