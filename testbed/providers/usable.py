"""Whether each provider can be used from here (``testbed check``, as SkyPilot's ``sky check``).

Per provider kind: its extra installed, credentials found (and where), accepted by the service's own auth
endpoint when it answers (a Keystone token for Chameleon, one authenticated list call for the TPU API), the
project, region, zone or allocation in use, and quotas where the API gives them; for the local provider root,
its tools and network namespaces. Every row says what was checked; a row that could not be checked says why and
counts as not ok. Nothing here writes state or prints: it returns :class:`Report` records for the CLI.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.distribution import install_command
from testbed.errors import TestbedError, has_module
from testbed.providers import REGISTRY

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec

KINDS = tuple(REGISTRY)
HTTP_TIMEOUT = 15.0  # one auth or list request of a check


@dataclass
class Row:
    """One thing checked: ``ok`` None means it could not be checked (``detail`` says why)."""

    check: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True  # a required row that is not ok makes the provider unusable

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "required": self.required, "detail": self.detail,
                "fix": self.fix}


@dataclass
class Report:
    """What was checked for one provider (for one testbed's settings when ``testbed`` is set)."""

    provider: str
    testbed: str | None = None
    rows: list[Row] = field(default_factory=list)
    context: dict[str, str] = field(default_factory=dict)  # site, region, project, zone, auth type, ...

    @property
    def usable(self) -> bool:
        return all(r.ok is True for r in self.rows if r.required)

    @property
    def failed(self) -> Row | None:
        """The first required row that is not ok."""
        return next((r for r in self.rows if r.required and r.ok is not True), None)

    def add(self, check: str, ok: bool | None, detail: str, fix: str = "", *, required: bool = True) -> Row:
        row = Row(check, ok, detail, fix if ok is not True else "", required)
        self.rows.append(row)
        return row

    def failure(self, check: str, e: TestbedError) -> Row:
        return self.add(check, False, e.what, e.fix or "")

    def to_json(self) -> dict[str, Any]:
        bad = self.failed
        return {"provider": self.provider, "testbed": self.testbed, "usable": self.usable,
                "reason": f"{bad.check}: {bad.detail}" if bad else None, "fix": bad.fix if bad else None,
                "context": self.context, "checks": [r.to_json() for r in self.rows]}


def check(kind: str, spec: TestbedSpec | None = None, *, quotas: bool = True) -> Report:
    """Check provider ``kind`` with ``spec``'s settings (None: the provider's defaults and the environment)."""
    mod_name, name = REGISTRY[kind].check_path.split(":")  # the kind's own check, in its package
    fn = getattr(importlib.import_module(mod_name), name)
    rep = Report(kind, spec.name if spec else None)
    fn(rep, spec, quotas)
    return rep


def version(dist: str) -> str:
    """``dist`` and its installed version."""
    from importlib import metadata

    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


def extra_installed(rep: Report) -> bool:
    """Whether the extra ``rep``'s provider needs is installed (a row saying so either way)."""
    reg = REGISTRY[rep.provider].extra
    assert reg is not None, rep.provider
    extra, modules, dist = reg
    missing = [m for m in modules if not has_module(m)]
    if missing:
        rep.add("extra", False, f"the '{extra}' extra is not installed (no module {', '.join(missing)})",
                f"{install_command(extra)} (in the environment testbed runs from)")
        return False
    rep.add("extra", True, f"'{extra}' installed ({version(dist)})")
    return True
