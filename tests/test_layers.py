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
