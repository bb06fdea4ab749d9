"""The architecture figures of docs/architecture.md, read from the source: functions and those with ``Any`` in
their signature, imports of testbed's own modules made inside functions, the import graph's rings and upward
imports (tests/layers.py's rules), and thread pools written outside the one fan-out (``testbed.remote.each``).

    python bench/architecture.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import layers  # noqa: E402


def _mentions_any(node: ast.AST | None) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(node))


def _bare_any(node: ast.AST | None) -> bool:
    """``Any`` other than as the values of a string-keyed mapping (``dict[str, Any]``, ``Mapping[str, Any]``: a
    JSON or YAML object as it was read)."""
    if node is None:
        return False
    shaped = {id(n.slice.elts[1]) for n in ast.walk(node) if isinstance(n, ast.Subscript)
              and isinstance(n.value, ast.Name) and n.value.id in ("dict", "Mapping")
              and isinstance(n.slice, ast.Tuple) and len(n.slice.elts) == 2
              and ast.unparse(n.slice.elts[0]) == "str" and ast.unparse(n.slice.elts[1]) == "Any"}
    return any(isinstance(n, ast.Name) and n.id == "Any" and id(n) not in shaped for n in ast.walk(node))


def _lazy_imports(tree: ast.AST, inside: bool = False) -> int:
    """Imports of testbed's modules made inside a function (each counted once, nested functions included)."""
    n = 0
    for child in ast.iter_child_nodes(tree):
        own = (isinstance(child, ast.ImportFrom) and (child.module or "").startswith("testbed")) or \
            (isinstance(child, ast.Import) and any(a.name.startswith("testbed") for a in child.names))
        n += int(inside and own)
        n += _lazy_imports(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))
    return n


def figures(root: Path = ROOT) -> dict[str, int]:
    """Counts over every module of the package."""
    out = {"modules": 0, "functions": 0, "functions with Any": 0, "  of them: Any beyond dict[str, Any]": 0,
           "in-function imports of testbed": 0,
           "thread pools outside remote.each": 0}
    for path in sorted((root / "testbed").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        out["modules"] += 1
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            out["functions"] += 1
            args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]
            anns = [fn.returns, *(a.annotation for a in args if a is not None)]
            if any(_mentions_any(x) for x in anns):
                out["functions with Any"] += 1
            if any(_bare_any(x) for x in anns):
                out["  of them: Any beyond dict[str, Any]"] += 1
        out["in-function imports of testbed"] += _lazy_imports(tree)
        text = path.read_text()
        if path.name != "remote.py":
            out["thread pools outside remote.each"] += text.count("ThreadPoolExecutor(")
    base = ast.parse((root / "testbed" / "providers" / "base.py").read_text())
    provider = next(n for n in base.body if isinstance(n, ast.ClassDef) and n.name == "Provider")
    out["methods of the provider base"] = sum(isinstance(n, ast.FunctionDef) for n in provider.body)
    caps = root / "testbed" / "capabilities.py"
    out["optional-operation interfaces"] = caps.read_text().count("\n@offer\n") if caps.is_file() else 0
    graph = layers.edges(root)
    out["import rings"] = len(layers.rings(graph))
    out["upward imports"] = len(layers.upward(graph, root))
    return out


if __name__ == "__main__":
    for k, v in figures().items():
        print(f"{k:36} {v:6,}")
