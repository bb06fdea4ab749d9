"""No function of testbed/ is over 80 lines (``def`` to its last line, nested functions counted in their outer one).

An AST pass: each long function is named by file:line, so a split has somewhere to start.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIMIT = 80
ROOT = Path(__file__).resolve().parents[1]

KNOWN_LONG: set[str] = set()  # none left: a function over the limit is split, not listed here


def long_functions(source: str, path: str, limit: int = LIMIT) -> list[tuple[str, int, str, int]]:
    """(path, line, name, lines) of every function (method, nested one) of ``source`` over ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                out.append((path, node.lineno, node.name, lines))
    return sorted(out)


def _tree() -> list[tuple[str, int, str, int]]:
    out = []
    for p in sorted((ROOT / "testbed").rglob("*.py")):
        out += long_functions(p.read_text(), p.relative_to(ROOT).as_posix())
    return out


def test_no_function_is_over_80_lines() -> None:
    found = [f for f in _tree() if f"{f[0]}:{f[2]}" not in KNOWN_LONG]
    assert not found, "functions over 80 lines (split them into named steps):\n" + "\n".join(
        f"  {path}:{line} {name} ({n} lines)" for path, line, name, n in found)


def test_every_known_exception_is_still_long() -> None:
    long = {f"{f[0]}:{f[2]}" for f in _tree()}
    stale = sorted(KNOWN_LONG - long)
    assert not stale, f"no longer over {LIMIT} lines: remove from KNOWN_LONG: {', '.join(stale)}"


@pytest.mark.parametrize("body, found", [(LIMIT - 1, False), (LIMIT, True)])
def test_the_pass_counts_from_def_to_the_last_line(body: int, found: bool) -> None:
    """A def line and ``body`` lines: over the limit from LIMIT lines of body; a nested or async one counts."""
    inner = "    def inner():\n" + "        pass\n" * (body - 1)
    src = "class C:\n    async def m(self):\n" + "".join("    " + ln + "\n" for ln in inner.splitlines())
    got = long_functions(src, "x.py")
    assert bool(got) is found
    if found:
        assert got[0][:3] == ("x.py", 2, "m") and got[0][3] == LIMIT + 1
