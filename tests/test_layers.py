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


def test_a_package_init_that_an_import_runs_is_an_edge(tmp_path: Path) -> None:
    """``from testbed.setup.profiles import x`` runs ``testbed/setup/__init__.py`` first: when that imports the
    importer back, it is a ring at import time (sources -> setup -> setup.address -> sources was one)."""
    pkg = tmp_path / "testbed"
    for rel, text in {"__init__.py": "", "sources.py": "from testbed.setup.profiles import load\n",
                      "setup/__init__.py": "from testbed.setup import address\n",
                      "setup/address.py": "def f():\n    from testbed.sources import g\n",
                      "setup/profiles.py": "from testbed.setup import address\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    g = layers.edges(tmp_path)
    assert "testbed.setup" in g["testbed.sources"] and "testbed.setup" not in g["testbed.setup.profiles"]
    assert layers.rings(g) == [["testbed.setup", "testbed.setup.address", "testbed.setup.profiles", "testbed.sources"]]

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


def test_every_import_made_inside_a_function_says_why() -> None:
    """testbed's own modules are imported at the top of a file; one imported inside a function is there for a
    measured reason (the start-up of ``testbed status`` and ``exec``), said by a ``# lazy:`` comment over its block."""
    import ast
    import re

    from layers import ROOT

    silent = []
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        lines = path.read_text().split("\n")
        for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                own = (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("testbed")) or \
                    (isinstance(node, ast.Import) and any(a.name.startswith("testbed") for a in node.names))
                if not own:
                    continue
                i = node.lineno - 2  # the line above, past the imports of the same block
                while i >= 0 and re.match(r"\s*(from testbed\S* import|import testbed)", lines[i]):
                    i -= 1
                if i < 0 or "# lazy:" not in lines[i]:
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not silent, "imports inside functions without a '# lazy:' reason: " + ", ".join(sorted(set(silent)))
