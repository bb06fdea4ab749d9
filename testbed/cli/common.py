"""What every command module of the CLI shares: the console, JSON output, the state store (from
``testbed.cli.output``, which does not import Typer) and the ``--json`` option."""

from __future__ import annotations

from typing import Annotated

import typer

from testbed.cli.output import console, escape, existing_store, print_json, store

__all__ = ["JsonOpt", "console", "escape", "existing_store", "print_json", "store"]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
