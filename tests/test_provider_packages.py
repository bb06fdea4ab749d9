"""Providers are packages without import rings, and their settings are pure data.

The graph is read from the source (ast): every ``import`` and ``from ... import`` of a testbed module, those inside
functions included, those under ``if TYPE_CHECKING:`` left out (they never run). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, and importing a module imports its packages first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURE = {"testbed.errors", "testbed.distribution", "testbed.paths", "testbed.textfmt", "testbed.yamlfile",
        "testbed.exitcodes", "testbed.quoting"}  # the last two: an enum, and quoting rules (standard library only)
"""What a settings module may reach in testbed besides other settings modules: no provider code."""
SETTINGS = {"testbed.providers.base_settings", "testbed.providers.kinds", "testbed.providers.registration"}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the testbed package under ``root``, by dotted name."""
    out = {}
    for p in (root / "testbed").rglob("*.py"):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (all depths), skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def _with_packages(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between testbed modules, the top-level names of other packages each module imports)."""
    mods = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    outside: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if t.split(".")[0] != "testbed":
                    outside[mod].add(t.split(".")[0])
                    continue
                edges[mod].update(x for x in _with_packages(t) if x in mods and x != mod)
    return edges, outside


def rings(edges: dict[str, set[str]], within: str) -> list[list[str]]:
    """The strongly connected components of more than one module among the modules under ``within`` (Tarjan)."""
    nodes = [m for m in edges if m == within or m.startswith(within + ".")]
    sub = {m: sorted(x for x in edges[m] if x in nodes) for m in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of provider modules (tens)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sub[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(sub):
        if v not in index:
            visit(v)
    return out


def reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """What importing ``start`` may import, lazily or not (``testbed``'s own lazy attributes left out: they run
    only when someone asks ``testbed.Testbed``)."""
    seen, todo = {start}, [start]
    while todo:
        v = todo.pop()
        for w in edges[v] if v != "testbed" else ():
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_import_ring_among_provider_modules() -> None:
    edges, _ = graph(ROOT)
    found = rings(edges, "testbed.providers")
    assert not found, "import rings among provider modules: " + "; ".join(" <-> ".join(r) for r in found)


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones() -> None:
    """The check itself: the ring modules import the Cloud lazily nowhere, but the provider's lazy imports count."""
    edges, _ = graph(ROOT)
    assert "testbed.providers.chameleon.lease" in edges["testbed.providers.chameleon.provider"]
    assert "testbed.deadman" in edges["testbed.providers.base"]  # imported inside a method
    assert "testbed.spec" not in edges["testbed.providers.base"]  # only under TYPE_CHECKING
    assert rings({"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": set()}, "a") == [["a.x", "a.y"]]


def test_each_provider_is_a_package_with_its_settings_beside_it() -> None:
    from testbed.providers import PROVIDERS

    for kind, where in PROVIDERS.items():
        mod, _ = where.split(":")
        pkg = mod.removesuffix(".provider")
        assert mod.endswith(".provider"), (kind, mod)
        assert (ROOT / Path(*pkg.split("."), "settings.py")).is_file(), kind


def test_settings_modules_are_pure_data() -> None:
    """A spec's settings import no provider code and no SDK: pydantic, the standard library and a few light
    testbed modules, lazy imports included."""
    edges, outside = graph(ROOT)
    settings = SETTINGS | {m for m in edges if m.startswith("testbed.providers.") and m.endswith(".settings")}
    assert len(settings) == len(SETTINGS) + 5
    allowed_pkgs = {m for m in edges if m.startswith("testbed.providers") and m.count(".") <= 2
                    and modules(ROOT)[m].name == "__init__.py"}
    for m in sorted(settings):
        bad = reach(edges, m) - settings - PURE - allowed_pkgs - {"testbed"}
        assert not bad, f"{m} reaches {sorted(bad)}"
        sdk = outside[m] - {"pydantic", "__future__"} - set(sys.stdlib_module_names)
        assert not sdk, f"{m} imports {sorted(sdk)}"


def test_loading_a_spec_loads_no_provider() -> None:
    """What start-up pays for: ``testbed.spec`` loads every kind's settings and not one provider module."""
    code = ("import sys, testbed.spec; "
            "bad = [m for m in sys.modules if m.startswith('testbed.providers.') and not m.endswith('settings') "
            "and m.count('.') > 2 or m in ('testbed.providers.base', 'testbed.ssh', 'testbed.hosts') "
            "or m.startswith(('chi', 'openstack', 'google', 'grpc'))]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
