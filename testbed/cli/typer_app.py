"""The full Typer app: every command module adds its verbs here. Built on first use (``testbed.cli.app``), so
the command lines that ``testbed.cli.fast`` answers never import Typer."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

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
    from testbed import cli

    cli._debug = debug or bool(os.environ.get("TESTBED_DEBUG"))


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
