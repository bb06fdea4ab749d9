"""The layer rules, read from the source: no import from a lower floor to a higher one and no import ring
(lazy imports count; ``if TYPE_CHECKING:`` imports do not). docs/architecture.md lists the floors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import layers


def test_no_module_imports_from_a_higher_floor() -> None:
    bad = layers.upward(layers.edges())
    assert not bad, "imports against the floors (docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_ring() -> None:
    found = layers.rings(layers.edges())
    assert not found, "import rings: " + "; ".join(" -> ".join(r) for r in found)


def test_the_check_sees_a_lazy_upward_import_and_a_ring(tmp_path: Path) -> None:
    """The rules fail on what they must: an import inside a function, from a stage up to the CLI, and a ring."""
    pkg = tmp_path / "testbed"
    for rel, text in {"__init__.py": "", "state.py": "def f():\n    from testbed.cli import main\n",
                      "cli/__init__.py": "def main(): ...\n", "run/__init__.py": "",
                      "run/a.py": "from testbed.run import b\n", "run/b.py": "import testbed.run.a\n",
                      "run/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from testbed import cli\n"
                      }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    g = layers.edges(tmp_path)
    assert "testbed.cli" in g["testbed.state"] and "testbed.cli" not in g.get("testbed.run.c", {})
    assert layers.floor("testbed.state") < layers.floor("testbed.cli")
    assert layers.rings(g) == [["testbed.run.a", "testbed.run.b"]]


def test_module_names_say_which_module_they_are() -> None:
    """No two modules share a name (``state``, ``remote``, ``check`` and ``campaign`` each named two), except where a
    folder is a set of one shape: ``cli/`` (a module per command), a provider's package (``provider``,
    ``settings``, ``usable``, ...) and the per-artifact parsers and reporters of ``report/parsers`` and
    ``report/suites``."""
    from collections import defaultdict

    from layers import ROOT

    by_name: dict[str, list[str]] = defaultdict(list)
    for p in sorted((ROOT / "testbed").rglob("*.py")):
        rel = p.relative_to(ROOT / "testbed")
        shaped = rel.parts[0] == "cli" or (rel.parts[0] == "providers" and len(rel.parts) == 3) or \
            rel.parts[:2] in (("report", "parsers"), ("report", "suites"))
        if p.name != "__init__.py" and "__pycache__" not in rel.parts and not shaped:
            by_name[p.stem].append(str(rel))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}
