"""Where things live: the state home (.testbed/) and the shipped resource folders.

Resource folders (playbooks, inventories, templates, experiments) are searched in the user's working
directory first, then in the installed package (``testbed/_data``), then in the source checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

RESOURCE_KINDS = ("playbooks", "inventories", "templates", "experiments")
PACKAGE_DIR = Path(__file__).resolve().parent
# in a results folder, next to the file it belongs to: what an interrupted collect received (never a result)
PARTIAL_DIR = ".testbed-partial"


def home() -> Path:
    """The state directory: ``$TESTBED_HOME`` or ``./.testbed``; created 0700."""
    p = Path(os.environ.get("TESTBED_HOME") or Path.cwd() / ".testbed").absolute()
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def testbed_dir(name: str) -> Path:
    """Per-testbed files: keys, known_hosts, ssh_config, inventory, provider scratch."""
    p = home() / "testbeds" / name
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def resource_dirs(kind: str) -> list[Path]:
    """Folders holding ``kind`` resources, highest priority first (cwd overrides the package)."""
    if kind not in RESOURCE_KINDS:
        raise ValueError(kind)
    candidates = [Path.cwd() / kind, PACKAGE_DIR / "_data" / kind, PACKAGE_DIR.parent / kind]
    seen: list[Path] = []
    for c in candidates:
        c = c.resolve()
        if c.is_dir() and c not in seen:
            seen.append(c)
    return seen


def find_resource(kind: str, relpath: str) -> Path | None:
    """The first ``kind/relpath`` found, cwd first."""
    for d in resource_dirs(kind):
        p = d / relpath
        if p.exists():
            return p
    return None


def list_resources(kind: str, pattern: str = "*.yml") -> dict[str, Path]:
    """Name (stem) -> path of every resource, cwd entries overriding packaged ones."""
    found: dict[str, Path] = {}
    for d in reversed(resource_dirs(kind)):
        for p in sorted(d.glob(pattern)):
            found[p.stem] = p
    return dict(sorted(found.items()))
