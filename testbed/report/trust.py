"""A results folder is untrusted input: a manifest's fields are checked for type and range before its run is
reported (:func:`manifest_problems`), and two folders claiming one run id are named, never both reported as runs
(:func:`duplicated`). Each problem names the field and what is wrong with it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any, TypeVar

T = TypeVar("T")

EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
"""No run of this tool started before this; a timestamp before it is damage or forgery."""
FUTURE_SLACK = timedelta(days=1)
"""How far past this machine's clock a timestamp may lie (another host's clock is a little off)."""
MAX_SIZE = 1 << 50
"""A collected file over a pebibyte is no file of a run."""
EXIT_RANGE = range(-255, 256)
"""Exit codes: 0-255, and minus a signal number for a process killed by one."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")


def manifest_problems(m: dict[str, Any], now: datetime | None = None) -> list[str]:
    """What is out of type or range in manifest ``m`` (empty: nothing), each naming its field."""
    now = now or datetime.now(UTC)
    out = [f"{k} is {_shown(m[k])}, not a name" for k in ("run_id", "suite") if k in m and not _is_name(m[k])]
    out += [f"{k} is {_shown(m[k])}, not text" for k in ("status", "reason", "campaign", "testbed_version")
            if m.get(k) is not None and not isinstance(m[k], str)]
    if "params" in m and not isinstance(m["params"], dict):
        out.append(f"params is {_shown(m['params'])}, not a mapping")
    times = {k: _time(m.get(k), k, now, out) for k in ("started", "ended")}
    if times["started"] and times["ended"] and times["ended"] < times["started"]:
        out.append(f"ended ({m['ended']}) is before started ({m['started']}): a negative duration")
    for i, h in enumerate(_items(m, "hosts", out)):
        if not isinstance(h, dict) or not _is_name(h.get("name")):
            out.append(f"hosts[{i}] has no usable host name ({_shown(h.get('name') if isinstance(h, dict) else h)})")
            continue
        codes = [("exit_code", h.get("exit_code"))] + [
            (f"ranks[{j}].exit_code", r.get("exit_code")) for j, r in enumerate(h.get("ranks") or [])
            if isinstance(r, dict)]
        out += [f"hosts[{i}].{k} is {_shown(c)}, out of range (an exit code is -255 to 255)"
                for k, c in codes if c is not None and not (type(c) is int and c in EXIT_RANGE)]
    for i, f in enumerate(_items(m, "files", out)):
        out += [f"files[{i}]: {p}" for p in _file_problems(f)]
    for i, e in enumerate(_items(m, "events", out)):
        if isinstance(e, dict):
            _time(e.get("ts"), f"events[{i}].ts", now, out)
    return out


def _file_problems(f: object) -> list[str]:
    if not isinstance(f, dict):
        return [f"{_shown(f)} is not a file record"]
    out = []
    size = f.get("size")
    if size is not None and not (type(size) is int and 0 <= size <= MAX_SIZE):
        out.append(f"size {_shown(size)} is out of range (0 to {MAX_SIZE} bytes)")
    if f.get("sha256") is not None and not (isinstance(f["sha256"], str) and _HEX64.match(f["sha256"])):
        out.append(f"sha256 {_shown(f['sha256'])} is not a sha256")
    path = f.get("path")
    if not isinstance(path, str) or not path or PurePosixPath(path).is_absolute() or ".." in path.split("/"):
        out.append(f"path {_shown(path)} is not a path inside its host's folder")
    if "host" in f and not _is_name(f["host"]):
        out.append(f"host {_shown(f['host'])} is not a host name")
    return out


def _items(m: dict[str, Any], key: str, out: list[str]) -> list[Any]:
    v = m.get(key)
    if v is not None and not isinstance(v, list):
        out.append(f"{key} is {_shown(v)}, not a list")
        return []
    return v or []


def _time(v: object, field: str, now: datetime, out: list[str]) -> datetime | None:
    """``v`` (ISO 8601) as a time; a problem appended when it is no time, or far in the past or future."""
    if v is None:
        return None
    try:
        t = datetime.fromisoformat(str(v).replace("Z", "+00:00")) if isinstance(v, str) else None
    except ValueError:
        t = None
    if t is None:
        out.append(f"{field} is {_shown(v)}, not an ISO 8601 time")
        return None
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    if t < EARLIEST or t > now + FUTURE_SLACK:
        out.append(f"{field} ({v}) is {'before 2000' if t < EARLIEST else 'in the future'}")
        return None
    return t


def _is_name(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 200 and bool(_NAME.match(v))


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def duplicated(claims: Iterable[tuple[str, T]]) -> dict[str, list[T]]:
    """Run id -> the folders (two or more) claiming it, from (run id, folder) pairs."""
    seen: dict[str, list[T]] = {}
    for run_id, folder in claims:
        seen.setdefault(run_id, []).append(folder)
    return {k: v for k, v in seen.items() if len(v) > 1}
