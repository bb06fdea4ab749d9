"""Exit statuses come from one enum (testbed.exitcodes.Exit): no number is written where a command ends, and the
docs list every status with its meaning."""

from __future__ import annotations

import ast
from pathlib import Path

from testbed.exitcodes import Exit
from testbed.records import OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
# standalone scripts placed on hosts: they run without the package
STANDALONE = {"testbed/scripts", "testbed/providers/local/init.py"}


def _literal_exits(path: Path) -> list[str]:
    """``sys.exit(N)``, ``typer.Exit(N)``, ``SystemExit(N)`` and ``code=N`` with a number written in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = [a for a in node.args[:1] if name in ("exit", "Exit", "SystemExit")]
        args += [k.value for k in node.keywords if k.arg == "code"]
        if any(isinstance(a, ast.Constant) and isinstance(a.value, int) and not isinstance(a.value, bool)
               for a in args):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}")
    return found


def test_no_exit_status_is_written_as_a_number() -> None:
    files = [p for p in (ROOT / "testbed").rglob("*.py")
             if not any(str(p.relative_to(ROOT)).startswith(s) for s in STANDALONE)]
    found = [hit for p in files for hit in _literal_exits(p)]
    assert not found, "use testbed.exitcodes.Exit: " + ", ".join(found)


def test_the_scan_finds_a_number_where_it_is_written(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import sys, typer\nsys.exit(3)\nraise typer.Exit(1)\nE(code=130)\nsys.exit(Exit.OK)\n")
    assert [h.rsplit(":", 1)[1] for h in _literal_exits(probe)] == ["2", "3", "4"]


def test_run_outcomes_and_the_docs_use_the_enum() -> None:
    assert all(isinstance(v, Exit) for v in OUTCOMES.values())
    docs = (ROOT / "docs" / "commands.md").read_text()
    for e in Exit:
        assert f"{e.value} {e.name.lower().replace('_', ' ')}" in docs, f"docs/commands.md does not list {e}"
