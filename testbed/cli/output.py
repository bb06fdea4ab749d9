"""Console, JSON output and the state store for the command bodies, importable without Typer (the hot
commands in ``testbed.cli.hot`` run without it)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from testbed.state import Store


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def store() -> Store:
    from testbed.state import Store

    return Store.open_default()


def escape(s: str) -> str:
    """``s`` with Rich markup made inert (a user's text never styles or hides part of a message)."""
    from rich.markup import escape as rich_escape

    return rich_escape(s)
