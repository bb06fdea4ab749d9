"""The full Typer app: every command module adds its verbs here. Built on first use (``testbed.cli.app``), so
the command lines that ``testbed.cli.fast`` answers never import Typer."""

from __future__ import annotations

import os
import re
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


_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": "BOOLEAN", "file": "PATH",
          "dir": "PATH"}


def _plain_types() -> None:
    """Help that names values plainly, as Click does: a flag as a flag (never ``--detach <bool>``), an option's
    value as TEXT, INTEGER, FLOAT or PATH (never ``<list[str]>``), an argument by its name in capitals (SUITE,
    [TARGET], [RUNS]...) without a type."""
    from typer.core import TyperArgument, TyperOption

    typed = TyperOption.display_type_rich

    def option_type(self: TyperOption, ctx: Any) -> str | None:
        if self.metavar is not None:
            return str(self.metavar)
        if self.is_flag:
            return None
        label = str(typed(self, ctx) or "").strip("<>").removesuffix("...")
        while label.startswith("list[") and label.endswith("]"):  # repeatable: the option's help says so
            label = label[5:-1]
        return _TYPES.get(label, label.upper().replace("|", " | ") if label.isidentifier() else label) or None

    def usage_name(self: TyperArgument) -> str:
        return (self.display_name_raw if self.required else f"[{self.display_name_raw}]") + \
            ("..." if self.nargs != 1 else "")

    TyperOption.display_type_rich = option_type  # type: ignore[method-assign]
    TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
    TyperArgument.display_name_raw = property(  # type: ignore[assignment,method-assign]
        lambda self: str(self.metavar or (self.name or "").upper()))
    TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


_plain_types()


def _version(value: bool) -> None:
    if value:
        from testbed.cli.fast import version_line

        typer.echo(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
          version: Annotated[bool, typer.Option("--version", help="Print the installed version and exit.",
                                                callback=_version, is_eager=True)] = False) -> None:
    from testbed import cli

    cli._debug = debug or bool(os.environ.get("TESTBED_DEBUG"))


_RST = re.compile(r"``(.+?)``")
_TICKS = re.compile(r"(?<![`\w])`([^`\n]+)`(?![`\w])")
_STARTS_PARAGRAPH = re.compile(r"(Example|Examples|Exit|Note):\s|[-*] ")


def plain_help(text: str) -> str:
    """A docstring as help prose: RST ``literals`` as plain words and `quotes` as 'quotes', each paragraph one
    line (the source's hard line breaks joined: the terminal wraps it), 'Example:' and list items paragraphs of
    their own, and square brackets kept (they are text, not Rich markup)."""
    paragraphs: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        current: list[str] = []
        for line in block.splitlines():
            line = line.strip()
            if current and _STARTS_PARAGRAPH.match(line):
                paragraphs.append(" ".join(current))
                current = []
            if line:
                current.append(line)
        if current:
            paragraphs.append(" ".join(current))
    out = "\n\n".join(paragraphs)
    out = _TICKS.sub(r"'\1'", _RST.sub(r"\1", out))
    return out.replace("[", "\\[")


def _plain_help_everywhere() -> None:
    """Every command's and parameter's help made plain (:func:`plain_help`) where Typer builds them, so that a
    docstring's line breaks and literals never reach the screen."""
    from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

    for cls, attrs in ((TyperCommand, ("help", "short_help")), (TyperGroup, ("help", "short_help")),
                       (TyperOption, ("help",)), (TyperArgument, ("help",))):
        init = cls.__init__

        def plain_init(self: Any, *args: Any, __init: Any = init, __attrs: tuple[str, ...] = attrs,
                       **kwargs: Any) -> None:
            __init(self, *args, **kwargs)
            for attr in __attrs:
                value = getattr(self, attr, None)
                if isinstance(value, str) and value:
                    setattr(self, attr, plain_help(value))

        cls.__init__ = plain_init  # type: ignore[method-assign]


_plain_help_everywhere()


def _register() -> None:
    """Each command module adds its verbs, in the order `testbed --help` lists them."""
    from testbed.cli import collect as cli_collect
    from testbed.cli import images as cli_images
    from testbed.cli import reproduce as cli_reproduce
    from testbed.cli import runs as cli_runs
    from testbed.cli import testbeds, tools

    testbeds.register(app, list_app)
    cli_images.register(app)
    cli_runs.register(app, list_app)
    cli_collect.register(app)
    cli_reproduce.register(app)
    tools.register(app)
    app.add_typer(list_app, name="list")


_register()
