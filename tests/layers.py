"""The package's floors and its import graph, read from the source (every import, lazy ones included).

The rules (docs/architecture.md): a module imports only from its own floor or the floors below it, and no two
modules import each other, directly or round a ring, except the type-only ring of ``report/`` (imports under
``if TYPE_CHECKING:`` are not edges). ``python -m tests.layers`` prints the graph's rings and upward imports.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOORS: list[tuple[str, list[str]]] = [  # bottom first: a module's floor is the first whose prefix names it
    ("core", []),  # everything not named below: errors, paths, yamlfile, spec, state, records, ssh, remote, ...
    ("providers", ["testbed.providers", "testbed.resolved", "testbed.deadman"]),
    ("setup/run", ["testbed.setup", "testbed.sources", "testbed.run", "testbed.lint"]),
    ("collect", ["testbed.collect"]),
    ("report", ["testbed.report", "testbed.results"]),
    ("services", ["testbed.services", "testbed.ledger", "testbed.watchdog", "testbed.rehearse", "testbed.reproduce",
                  "testbed.check"]),
    ("front doors", ["testbed.cli", "testbed.__main__", "testbed.handle"]),
]
FRONT = "testbed"  # the package itself is the Python API's front door (testbed.open)
CORE_DATA = ("testbed.providers.kinds", "testbed.providers.base_settings",  # pure data the spec reads:
             "testbed.providers", "testbed.providers.registration")  # the registry, and each provider's
REGISTRATION_DEPTH = 3  # package __init__ (testbed.providers.<kind>: its Registration), which loading a spec runs
SETTINGS_SUFFIX = ".settings"  # testbed.providers.<kind>.settings: pure data too


@functools.cache
def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in (root / "testbed").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def floor(mod: str) -> int:
    """The floor of ``mod`` (0: core)."""
    if mod == FRONT:
        return len(FLOORS) - 1
    registration = mod.startswith("testbed.providers.") and mod.count(".") + 1 == REGISTRATION_DEPTH and \
        modules().get(mod, Path()).name == "__init__.py"
    if mod in CORE_DATA or registration or (mod.startswith("testbed.providers.") and mod.endswith(SETTINGS_SUFFIX)):
        return 0
    found = 0
    for i, (_, prefixes) in enumerate(FLOORS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            found = i
    return found


def edges(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {imported testbed module: line of its first import}; TYPE_CHECKING blocks left out."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: dict[str, dict[str, int]] = defaultdict(dict)
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                r = resolve(t) if t.startswith("testbed") else None
                if r and r != m:
                    out[m].setdefault(r, node.lineno)
                for pkg_of in _packages_run(r, m, mods) if r else []:
                    out[m].setdefault(pkg_of, node.lineno)
    return out


def _packages_run(target: str, importer: str, mods: dict[str, Path]) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs first (``testbed.setup`` for
    ``testbed.setup.profiles``), but for the importer's own packages, which are loaded already."""
    parts = target.split(".")
    up = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [p for p in up if p in mods and not (importer == p or importer.startswith(p + "."))]


def rings(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(set(graph) | {t for ts in graph.values() for t in ts}):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def upward(graph: dict[str, dict[str, int]], root: Path = ROOT) -> list[str]:
    """Each import from a lower floor to a higher one, as ``file:line: a (floor) imports b (floor)``."""
    mods = modules(root)
    return [f"{mods[m].relative_to(root)}:{line}: {m} ({FLOORS[floor(m)][0]}) imports {t} ({FLOORS[floor(t)][0]})"
            for m, ts in sorted(graph.items()) for t, line in sorted(ts.items()) if floor(t) > floor(m)]


if __name__ == "__main__":
    g = edges(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print(f"{len(modules())} modules, {sum(len(t) for t in g.values())} imports between them")
    for r in sorted(rings(g), key=len, reverse=True):
        print(f"ring of {len(r)}: {' '.join(r)}")
    for line in upward(g):
        print(line)
