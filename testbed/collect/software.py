"""The run's software for the manifest (its Python and pip freeze), kept per host between collects.

A pip freeze costs seconds of CPU on a busy host; the fingerprint of what it depends on (``facts.sh
--fingerprint``: the interpreter, the folders on its path and its site folders with their ``.pth``, ``.egg-link``
and ``*-info`` entries, the git state of editable installs) costs milliseconds and comes back with the first
host's listing. The freeze is reused only while that fingerprint is the same (an install, an upgrade or a commit
in an editable checkout changes it), so the manifest still describes the host as it is. The cache lives in the
testbed's folder of the state home (never under results/) and goes with the testbed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.collect import manifest as mf

if TYPE_CHECKING:
    from testbed.state import Store

CACHE = "collect-software.json"
KEPT = ("@P ", "@Z ")  # what is cached: the Python and its freeze (commits are read live, they are cheap)


def cache_path(store: Store, testbed: str) -> Path:
    """``<state home>/testbeds/<testbed>/collect-software.json``."""
    return Path(store.path).parent / "testbeds" / testbed / CACHE


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # nested past Python's depth too
        return {}
    return data if isinstance(data, dict) else {}


def cached(store: Store, testbed: str, host: str, python: str, fingerprint: str | None) -> list[str] | None:
    """The software lines (``@P``, ``@Z``) gathered from ``host`` for ``python`` when its fingerprint was
    ``fingerprint``; None when not cached, or the fingerprint is empty or another."""
    if not fingerprint:
        return None
    entry = (_load(cache_path(store, testbed)).get(host) or {}).get(python)
    if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
        return None
    lines = entry.get("lines")
    return [str(ln) for ln in lines] if isinstance(lines, list) else None


def remember(store: Store, testbed: str, host: str, python: str, lines: list[str]) -> bool:
    """Keep the software lines of a gather (``facts.sh --python``) under the fingerprint it printed before the
    freeze; False (nothing kept) when it printed no fingerprint or no Python."""
    fingerprint = mf.parse_fact_lines([ln for ln in lines if ln.startswith("@Y ")])[1].get("_fingerprint")
    kept = [ln for ln in lines if ln.startswith(KEPT)]
    if not fingerprint or not any(ln.startswith("@P ") for ln in kept):
        return False
    path = cache_path(store, testbed)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = _load(path)
    hosts: dict[str, Any] = data[host] if isinstance(data.get(host), dict) else {}
    # credentials in URLs never kept (the manifest masks them again with the controller's secrets)
    hosts[python] = {"fingerprint": fingerprint, "lines": mf.redact(kept, [])}
    data[host] = hosts
    tmp = path.with_name(f".{CACHE}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.chmod(0o600)
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written only costs the next collect a freeze
        tmp.unlink(missing_ok=True)
        return False
    return True
