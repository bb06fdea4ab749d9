"""The hot commands (``status``, ``exec``) started without importing Typer, by the grammar Typer itself gives them.

Typer alone costs about 0.1 s of CPU at start-up. The one definition of the command line stays the Typer app
(``testbed.cli.typer_app``): :func:`write` reads the Click parameters that app builds
for each hot command and writes them to ``hot_grammar.json`` beside this file, with a checksum of the modules that
define them. :func:`run` reads that table, refuses it when those modules have changed since, and parses only
what it is sure Click parses the same way: known options (``--opt VALUE``, ``--opt=VALUE``, flags), positional
arguments, ``--``. Anything else (``--help``, an unknown or clustered option, a missing argument, a value to
convert other than a plain decimal, shell completion) returns None and goes to the Typer app unchanged, which
also words every usage error. ``tests/test_cli_fast.py`` checks the table against the app and the parse against
Click's own on a corpus of spellings.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TABLE = HERE / "hot_grammar.json"
# command -> the Typer-free body its Typer command calls with the same keyword arguments (testbed.cli.hot)
BODIES = {"status": "status", "exec": "exec_"}
ROOT_FLAGS = ("--debug",)  # root options before the command that the fast path takes (the others: Typer's)
_DECIMAL = re.compile(r"\d+(\.\d+)?")  # parsed alike by Click's int/float and by Typer's coercion
tracebacks = False  # --debug (or TESTBED_DEBUG) on a command line this module ran: testbed.cli.main shows them


def _sources() -> list[Path]:
    """The modules whose text shapes the hot commands' parameters."""
    return [HERE / n for n in ("typer_app.py", "common.py", "testbeds.py")]


def checksum() -> int:
    crc = 0
    for f in _sources():
        crc = zlib.crc32(f.read_bytes(), crc)
    return crc


def generate() -> dict[str, Any]:
    """The table, read from the Typer app's Click commands (imports Typer)."""
    import typer.main

    # lazy: start-up (testbed status and exec load this module)
    from testbed.cli import typer_app

    group: Any = typer.main.get_command(typer_app.app)
    table: dict[str, Any] = {"checksum": checksum(), "commands": {}}
    for name in BODIES:
        cmd = group.get_command(None, name)
        params = []
        for p in cmd.params:
            kind = "option" if p.param_type_name == "option" else "argument"
            if getattr(p, "count", False) or getattr(p, "envvar", None) or getattr(p, "is_eager", False) \
                    or (p.multiple and kind == "option"):
                raise ValueError(f"{name}: parameter {p.name} has a form the fast path does not take")
            tname = _type_name(p)
            params.append({"name": p.name, "kind": kind, "opts": list(p.opts), "secondary": list(p.secondary_opts),
                           "flag": bool(getattr(p, "is_flag", False)), "nargs": p.nargs, "type": tname,
                           "required": bool(p.required), "default": p.default if kind == "option" else None})
        table["commands"][name] = {"params": params, "interspersed": cmd.allow_interspersed_args}
    return table


def _type_name(p: object) -> str:
    """text, integer or float where a value is taken as it is written (Typer's annotation, else Click's type);
    anything else (a parser, bounds, a path, a choice) is 'other', which the fast path leaves to Typer."""
    desc = getattr(p, "type_descriptor", None)
    if desc is None:
        return str(getattr(getattr(p, "type", None), "name", "other")).lower()
    info = desc.parameter_info
    if getattr(info, "parser", None) or getattr(info, "click_type", None) or getattr(info, "min", None) is not None \
            or getattr(info, "max", None) is not None or getattr(desc, "file_annotation", None) is not None:
        return "other"
    ann = desc.annotation
    return {str: "text", list[str]: "text", int: "integer", float: "float", bool: "boolean"}.get(ann, "other")


def _value(spec: dict[str, Any], raw: str) -> Any:
    """A value as Click and Typer give it; KeyError where the fast path is not sure."""
    t = spec["type"]
    if t == "text":
        raw.encode("utf-8")  # a surrogate-escaped byte of the command line: Typer's to judge (UnicodeError)
        return raw
    if t in ("float", "integer") and _DECIMAL.fullmatch(raw):
        return float(raw) if t == "float" else int(raw)
    raise KeyError(raw)


def parse(table: dict[str, Any], argv: list[str]) -> tuple[str, dict[str, Any], bool] | None:
    """(command, its parameters by name, --debug) for ``argv``, or None: let Typer parse it."""
    debug = False
    while argv[:1] and argv[0] in ROOT_FLAGS:
        debug, argv = True, argv[1:]
    if not argv or argv[0] not in table["commands"]:
        return None
    spec = table["commands"][argv[0]]
    if not spec["interspersed"]:
        return None
    opts = {o: p for p in spec["params"] if p["kind"] == "option" for o in p["opts"] + p["secondary"]}
    args = [p for p in spec["params"] if p["kind"] == "argument"]
    values: dict[str, Any] = {p["name"]: p["default"] for p in spec["params"] if p["kind"] == "option"}
    positional: list[str] = []
    rest = argv[1:]
    try:
        while rest:
            tok, rest = rest[0], rest[1:]
            if tok == "--":
                positional += rest
                break
            if not tok.startswith("-") or tok == "-":
                positional.append(tok)
                continue
            name, eq, attached = tok.partition("=") if tok.startswith("--") else (tok, "", "")
            p = opts[name]  # KeyError: not an option of this command (--help too): Typer's
            if p["flag"]:
                if eq:
                    return None
                values[p["name"]] = name in p["opts"]
            elif eq:
                values[p["name"]] = _value(p, attached)
            elif rest:
                values[p["name"]], rest = _value(p, rest[0]), rest[1:]
            else:
                return None
        for p in args:
            if p["nargs"] == -1:
                later = args[args.index(p) + 1:]
                if any(q["nargs"] != 1 for q in later):
                    return None
                cut = len(positional) - len(later)
                if cut < 0:
                    return None
                take, positional = positional[:cut], positional[cut:]
                if p["required"] and not take:
                    return None
                values[p["name"]] = [_value(p, v) for v in take]
            elif positional:
                values[p["name"]], positional = _value(p, positional[0]), positional[1:]
            elif p["required"]:
                return None
            else:
                values[p["name"]] = None
    except (KeyError, UnicodeError):
        return None
    if positional:
        return None
    return argv[0], values, debug


def run(argv: list[str], load: Callable[[], dict[str, Any] | None] | None = None) -> int | None:
    """The exit code of a hot command line, run by its body; None: give it to the Typer app."""
    if "_TESTBED_COMPLETE" in os.environ:
        return None
    table = (load or _load)()
    got = parse(table, list(argv)) if table else None
    if got is None:
        return None
    global tracebacks
    name, values, debug = got
    tracebacks = debug or bool(os.environ.get("TESTBED_DEBUG"))
    # lazy: start-up (testbed status and exec load this module)
    from testbed.cli import hot

    rc = getattr(hot, BODIES[name])(**values)
    return rc if isinstance(rc, int) else 0


def _load() -> dict[str, Any] | None:
    try:
        table = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return None
    return table if table.get("checksum") == checksum() else None  # edited since: Typer's


def write() -> None:
    """Write the table again from the Typer app: ``python -c 'from testbed.cli import grammar; grammar.write()'``
    after changing a hot command, its options or the modules of :func:`_sources`."""
    TABLE.write_text(json.dumps(generate(), indent=1) + "\n")
