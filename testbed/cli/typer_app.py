"""The ``testbed`` command line, defined once: the root Typer app, its options, and :data:`COMMANDS`, the table of
its commands and the modules that define them. Every command line is parsed by this one definition.

A command's module is imported, and its Click command built, only when that command is looked up
(:class:`LazyGroup`): ``testbed status`` imports ``testbed.cli.testbeds`` and none of the run, collect or image
modules; the root ``--help`` looks up every command. Each module adds its verbs with ``register(app)`` (or
``register(app, list_app)``) and never imports this module or the ``testbed.cli`` package.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from testbed.exitcodes import Exit

# name: the modules whose register() defines it, in the order `testbed --help` lists them
COMMANDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("provision", "status", "destroy", "setup", "exec", "ssh", "extend", "forget-host"),
                    ("testbed.cli.testbeds",)),
    **dict.fromkeys(("run", "rehearse", "plan", "logs", "stop", "show"), ("testbed.cli.runs",)),
    **dict.fromkeys(("collect", "report"), ("testbed.cli.collect",)),
    "reproduce": ("testbed.cli.reproduce",),
    "new": ("testbed.cli.newsuite",),
    **dict.fromkeys(("check", "doctor", "demo"), ("testbed.cli.tools",)),
    "image": ("testbed.cli.images",),
    "list": ("testbed.cli.testbeds", "testbed.cli.runs"),
}
LIST_HELP = "List testbeds, suites, profiles or runs."

tracebacks = False  # --debug (or TESTBED_DEBUG) on the last command line parsed: testbed.cli.main shows them


def registered(modules: tuple[str, ...]) -> typer.Typer:
    """A Typer app holding what ``modules`` register: their commands, their groups, and ``list`` when they add
    to it."""
    app, list_app = typer.Typer(), typer.Typer(help=LIST_HELP, no_args_is_help=False)
    for name in modules:
        register = importlib.import_module(name).register
        if len(inspect.signature(register).parameters) == 2:  # register(app, list_app): it adds to `list`
            register(app, list_app)
        else:
            register(app)
    if list_app.registered_commands or list_app.registered_callback:
        app.add_typer(list_app, name="list")
    return app


def _build(name: str, markup: Any) -> Any:
    """The Click command (or group) ``name`` of :data:`COMMANDS`, built from its modules' definition."""
    from typer.main import get_command_from_info, get_group_from_info

    defined = registered(COMMANDS[name])
    for info in defined.registered_commands:
        if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:  # type: ignore[union-attr]
            return get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                         rich_markup_mode=markup)
    for group in defined.registered_groups:
        if group.name == name:
            return get_group_from_info(group, pretty_exceptions_short=app.pretty_exceptions_short,
                                       suggest_commands=app.suggest_commands, rich_markup_mode=markup)
    raise LookupError(f"{' and '.join(COMMANDS[name])} register no command '{name}' (testbed.cli.typer_app)")


class _Commands(MutableMapping[str, Any]):
    """The root group's commands: the names of :data:`COMMANDS`, each built on first access."""

    def __init__(self, markup: Any) -> None:
        self.markup = markup
        self.built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self.built:
            self.built[name] = _build(name, self.markup)
        return self.built[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        raise TypeError(f"add '{name}' to testbed.cli.typer_app.COMMANDS and its module's register()")

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"remove '{name}' from testbed.cli.typer_app.COMMANDS")

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS


class LazyGroup(TyperGroup):
    """The root group: lists the commands of :data:`COMMANDS` without importing them, and builds one (importing
    its module) only when it is looked up, by the parser, completion or help."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.commands:  # app.command() on the root: it would never be listed
            raise TypeError(f"add {', '.join(self.commands)} to testbed.cli.typer_app.COMMANDS instead")
        self.commands = _Commands(self.rich_markup_mode)


app = typer.Typer(
    name="testbed",
    help="Provision, set up, run, collect and report research artifacts on local, lab, Chameleon and TPU "
         "testbeds.\n\nExample: testbed provision local && testbed exec local -- hostname",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=True,  # --install-completion [bash|zsh|fish], --show-completion
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


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

_DECIMAL = {int: re.compile(r"\d+"), float: re.compile(r"\d+(\.\d+)?")}


def _plain_values() -> None:
    """Typer's value checks built when a value needs one, and values taken as they are where Typer's pydantic
    adapter would return them unchanged: a text for ``str`` (valid Unicode), texts for ``list[str]``, a plain
    decimal for ``int`` and ``float`` without bounds or a parser.

    Recent Typer checks each parameter's value with a pydantic TypeAdapter that it builds before looking at the
    value (even for an option left out); importing pydantic and building adapters is about 50 ms of each
    ``testbed status`` or ``exec``. Every other value, and every error message, is still the adapter's. A Typer
    without adapters (older, or changed) is left as it is."""
    try:
        from dataclasses import dataclass, field

        from typer import _coercion
        from typer.core import _TyperParameter
    except ImportError:
        return
    build = getattr(_coercion, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    original = getattr(_TyperParameter, "get_runtime_param", None)
    if build is None or base is None or original is None:
        return
    make: Any = build

    @dataclass(frozen=True)
    class Lazy(base):  # type: ignore[misc,valid-type]
        descriptor: Any = None
        plain: bool = False  # the fast paths apply (no parser, bounds or clamp)
        adapter: list[Any] = field(default_factory=list, compare=False)  # Typer's own, built on first need

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            ann = self.annotation
            if self.plain and ann is str and _text(value):
                return value
            if self.plain and ann == list[str] and isinstance(value, list | tuple) and all(_text(v) for v in value):
                return list(value)
            if self.plain and ann in _DECIMAL and isinstance(value, str) and _DECIMAL[ann].fullmatch(value):
                return ann(value)
            if not self.adapter:
                self.adapter.append(make(self.descriptor))
            return self.adapter[0]._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        desc = self.type_descriptor
        if self._runtime_param is None and getattr(desc, "file_annotation", None) is None:
            info = desc.parameter_info
            plain = getattr(info, "parser", None) is None and getattr(info, "click_type", None) is None and \
                (desc.annotation in (str, list[str]) or (desc.annotation in _DECIMAL and info.min is None
                                                         and info.max is None and not info.clamp))
            self._runtime_param = Lazy(parameter_info=info, annotation=desc.annotation, descriptor=desc,
                                       plain=plain)
        return original(self)

    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]


def _text(value: Any) -> bool:
    """``value`` is a str that is valid Unicode (what pydantic accepts as a str unchanged)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate-escaped byte of the command line: the adapter's to judge
        return False
    return True


_plain_values()


def version_line() -> str:
    """``testbed X.Y.Z``: the version in the package metadata of the distribution whose ``testbed`` command this
    is (found by its entry point, whatever the distribution is called); the source's own version when testbed
    runs from a checkout that was never installed."""
    from importlib import metadata
    from pathlib import Path

    for dist in metadata.distributions():
        try:
            eps = dist.entry_points
        except Exception:  # noqa: S112 (a broken distribution elsewhere in the environment is not ours)
            continue
        if any(ep.group == "console_scripts" and ep.value.replace(" ", "") == "testbed.cli:main" for ep in eps):
            name = dist.metadata["Name"] or "testbed"
            return f"testbed {dist.version}" + (f" (distribution {name})" if name != "testbed" else "")
    # lazy: testbed --help and completion load every command module
    from testbed.distribution import SOURCE_VERSION as __version__

    return f"testbed {__version__} (not installed: running from {Path(__file__).resolve().parents[2]})"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit(Exit.OK)


@app.callback()
def _root(ctx: typer.Context,
          debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
          version: Annotated[bool, typer.Option("--version", help="Print the installed version and exit.",
                                                callback=_version, is_eager=True)] = False) -> None:
    global tracebacks
    tracebacks = debug or bool(os.environ.get("TESTBED_DEBUG"))
    from contextlib import ExitStack

    # lazy: testbed --help and completion load every command module
    from testbed.errors import front_door
    from testbed.paths import one_command

    # also when the app is called in-process (tests): fixes name commands and flags, and the suite folders named
    # by path are this command's (a command line before it in this process named its own)
    doors = ExitStack()
    doors.enter_context(front_door("cli"))
    doors.enter_context(one_command())
    ctx.call_on_close(doors.close)


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
