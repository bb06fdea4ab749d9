"""A collected run on disk: its manifest (read tolerantly) and its per-host files."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from testbed.errors import UsageError
from testbed.paths import MANIFEST, PARTIAL_DIR
from testbed.records import Manifest

REPORT_DIR = "report"


@dataclass
class RunDir:
    """``results/<suite>/<run-id>/`` with ``manifest.json`` and one folder per host."""

    path: Path
    manifest: Manifest = field(default_factory=lambda: Manifest())
    notes: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """Open a run folder; a missing or unreadable folder is a UsageError, a bad manifest a note."""
        path = Path(path)
        if not path.is_dir():
            raise UsageError(
                f"no run folder at {path}",
                where=str(path),
                fix="pass results/<suite>/<run-id> of a collected run (see `testbed collect`)",
            )
        try:
            list(path.iterdir())
        except OSError as exc:
            raise UsageError(f"cannot read run folder {path}: {exc.strerror}", where=str(path),
                             fix="check the folder's permissions") from exc
        run = cls(path)
        mpath = path / MANIFEST
        if mpath.is_file():
            try:
                data = json.loads(mpath.read_text(encoding="utf-8", errors="replace"))
                run.manifest = cast(Manifest, data) if isinstance(data, dict) else {}
                if not isinstance(data, dict):
                    run.notes.append("manifest.json: not a JSON object; ignored")
            except (OSError, ValueError, RecursionError) as exc:  # nested past Python's depth too
                run.notes.append(f"manifest.json: unreadable ({exc}); report built without it")
        else:
            run.notes.append("manifest.json: missing; suite taken from the folder name")
        return run

    @property
    def suite(self) -> str:
        suite = self.manifest.get("suite")
        return str(suite) if suite else self.path.parent.name

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def params(self) -> dict[str, Any]:
        params = self.manifest.get("params")
        return params if isinstance(params, dict) else {}

    @property
    def hosts(self) -> list[str]:
        """Host names from the manifest, else the run folder's subfolders (never ``report/``, nor ``.suite/``
        and the other dot folders: a host name never starts with a dot)."""
        names = [str(h.get("name")) for h in self._list("hosts") if isinstance(h, dict) and h.get("name")]
        if names:
            return names
        return sorted(p.name for p in self.path.iterdir()
                      if p.is_dir() and p.name != REPORT_DIR and not p.name.startswith("."))

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for e in self._list("events") if isinstance(e, dict)]

    def host_records(self) -> list[dict[str, Any]]:
        return [h for h in self._list("hosts") if isinstance(h, dict)]

    def files(self, pattern: str | re.Pattern[str]) -> list[tuple[str, Path]]:
        """(host, path) of every file under a host folder whose name matches ``pattern`` (a regex, fullmatch)."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        found: list[tuple[str, Path]] = []
        for host in self.hosts:
            hdir = self.path / host
            if not hdir.is_dir():
                continue
            for p in sorted(hdir.rglob("*")):
                # .testbed-partial/ holds what an interrupted collect received: never a result
                if p.is_file() and rx.fullmatch(p.name) and PARTIAL_DIR not in p.relative_to(hdir).parts:
                    found.append((host, p))
        return found

    def empty(self) -> str | None:
        """Why this folder holds no collected file (its manifest lists none, or no host folder holds a file),
        or None: a folder without files is never reported as a run."""
        listed = self.manifest.get("files")
        if isinstance(listed, list) and not listed:
            return "its manifest lists no collected file (collect fetched nothing of this run)"
        for dirpath, dirnames, filenames in os.walk(self.path):
            if Path(dirpath) == self.path:
                dirnames[:] = [d for d in dirnames if d != REPORT_DIR and not d.startswith(".")]
                filenames = [f for f in filenames if f != MANIFEST]
            dirnames[:] = [d for d in dirnames if d != PARTIAL_DIR]
            if filenames:
                return None
        return "no collected file in it (only a manifest)"

    def rel(self, path: Path) -> str:
        """A path shown relative to the run folder."""
        try:
            return str(path.relative_to(self.path))
        except ValueError:
            return str(path)

    def _list(self, key: str) -> list[Any]:
        value = self.manifest.get(key)
        return value if isinstance(value, list) else []


@dataclass
class Campaign:
    """The runs of one suite reported together; ``files`` looks through all of them."""

    suite: str
    runs: list[RunDir]
    out_dir: Path
    name: str = ""

    def files(self, pattern: str | re.Pattern[str]) -> list[tuple[RunDir, str, Path]]:
        """(run, host, path) of every matching file of every run (``RunDir.files`` per run)."""
        return [(run, host, path) for run in self.runs for host, path in run.files(pattern)]

    def rel(self, path: Path) -> str:
        """A path relative to the folder holding the runs."""
        for run in self.runs:
            if path.is_relative_to(run.path):
                return f"{run.run_id}/{run.rel(path)}"
        return str(path)


def event_time(ts: object) -> float | None:
    """An event's time as unix seconds: the manifest writes ISO 8601 (``...Z``); state keeps floats."""
    if isinstance(ts, int | float):
        return float(ts)
    if isinstance(ts, str):
        from datetime import datetime

        try:
            return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
