"""What every command module of the CLI shares: the console, JSON output, the state store (from
``testbed.cli.output``, which does not import Typer) and the ``--json`` option."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from testbed.cli.output import console, escape, existing_store, print_json, store

__all__ = ["JsonOpt", "console", "escape", "existing_store", "json_wanted", "print_json", "store"]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def json_wanted(ctx: typer.Context | None, json_out: bool) -> bool:
    """``--json`` given to this command or to a group above it (``testbed list --json suites``)."""
    level: Any = ctx
    while level is not None and not json_out:
        json_out = bool(level.params.get("json_out"))
        level = level.parent
    return json_out
