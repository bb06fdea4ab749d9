"""Why a collected run did not succeed: the failing rank and the last lines of its collected stderr.

The failing rank is the one the run's first ``failed`` event names, else the first rank the manifest records as
failed (then timed-out, then any other end that is not a success). Its ``<host>/rank<K>.err`` (its ``.out`` when
the error stream is empty) is read from the run folder; every line shown is scrubbed of the controller's secret
values, of ``user:pass@`` in URLs and of the values of secret-looking ``NAME=value`` assignments
(``testbed.collect.manifest.redact``), so a report never shows a secret the run printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed.collect.manifest import MASK, SECRET_NAME, redact, secret_values
from testbed.report.rundir import RunDir

if TYPE_CHECKING:
    from pathlib import Path

TAIL_LINES = 5
TAIL_BYTES = 64 * 1024
LINE_CHARS = 240
SUCCESS = "succeeded"
NOT_ENDED = ("pending", "running")
_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)(?P<sep>\s*[=:]\s*)(?P<value>\"[^\"]*\"|'[^']*'|\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@dataclass
class Cause:
    """What made a run fail: where (host, rank), how (status, exit code, reason) and its stderr's last lines."""

    status: str
    reason: str | None = None
    host: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    stream: str | None = None  # "stderr" or "stdout": where ``tail`` comes from
    file: str | None = None  # that file, relative to the run folder
    tail: list[str] = field(default_factory=list)
    note: str | None = None  # why there is no tail (a log that was not collected, an empty one)

    @property
    def where(self) -> str:
        if self.host is None:
            return ""
        return f"{self.host} rank {self.rank}" if self.rank is not None else self.host

    def summary(self) -> str:
        """One line: where, how, and the last line of the log (the line a person reads first)."""
        how = self.status + (f" (exit {self.exit_code})" if self.exit_code not in (None, 0) else "")
        head = f"{self.where} {how}" if self.where else how
        if self.tail:
            return f"{head}: {self.tail[-1]}"
        return f"{head}: {self.reason}" if self.reason else head

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "host": self.host, "rank": self.rank,
                "exit_code": self.exit_code, "stream": self.stream, "file": self.file, "tail": self.tail,
                "note": self.note, "summary": self.summary()}


def failed(status: object) -> bool:
    """Whether a run with this status ended without succeeding (pending, running or unknown: not failed)."""
    return isinstance(status, str) and bool(status) and status != SUCCESS and status not in NOT_ENDED


def run_cause(run: RunDir, lines: int = TAIL_LINES, secrets: list[str] | None = None) -> Cause | None:
    """The cause of ``run``'s failure from its manifest and collected logs; None when it did not fail."""
    status = run.manifest.get("status")
    if not failed(status):
        return None
    reason = run.manifest.get("reason")
    cause = Cause(str(status), str(reason) if reason else None)
    where = _failing_rank(run)
    if where is None:
        return _scrub(cause, secrets)
    cause.host, cause.rank, cause.exit_code, rank_reason = where
    cause.reason = cause.reason or rank_reason
    if cause.rank is None:
        return _scrub(cause, secrets)
    for stream, suffix in (("stderr", "err"), ("stdout", "out")):
        path = run.path / cause.host / f"rank{cause.rank}.{suffix}"
        if not path.is_file():
            if stream == "stderr":
                cause.note = f"{run.rel(path)} was not collected"
            continue
        tail = _tail(path, lines)
        if tail:
            cause.stream, cause.file, cause.tail = stream, run.rel(path), tail
            cause.note = None if stream == "stderr" else f"{cause.host}/rank{cause.rank}.err is empty"
            break
        cause.note = cause.note or f"{run.rel(path)} is empty"
    return _scrub(cause, secrets)


def _failing_rank(run: RunDir) -> tuple[str, int | None, int | None, str | None] | None:
    """(host, rank, exit code, reason) of the rank that failed first."""
    ranks: list[dict[str, Any]] = []
    for h in run.host_records():
        for r in h.get("ranks") or []:
            if isinstance(r, dict):
                ranks.append({**r, "host": h.get("name")})
    for e in run.events:
        d = e.get("detail")
        if e.get("kind") == "failed" and isinstance(d, dict) and e.get("host"):
            rank = d.get("rank") if isinstance(d.get("rank"), int) else None
            rec = next((r for r in ranks if r["host"] == e["host"] and r.get("rank") == rank), {})
            return str(e["host"]), rank, rec.get("exit_code"), str(d.get("reason") or "") or None
    for wanted in (("failed",), ("timed-out",), None):
        for r in ranks:
            st = r.get("status")
            if r.get("host") and (st in wanted if wanted else failed(st)):
                rank = r.get("rank") if isinstance(r.get("rank"), int) else None
                return str(r["host"]), rank, r.get("exit_code"), r.get("reason")
    for h in run.host_records():  # a manifest without ranks: the first host that did not succeed
        if h.get("name") and (failed(h.get("status")) or h.get("exit_code") not in (0, None)):
            return str(h["name"]), None, h.get("exit_code"), None
    return None


def _tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-blank lines of a text file (its last 64 KiB), each cut to a readable length."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read()
    except OSError:
        return []
    text = _ANSI.sub("", data.decode("utf-8", errors="replace"))
    out = [ln.rstrip() for ln in text.split("\n") if ln.strip()]
    if size > TAIL_BYTES and out:
        out = out[1:]  # the first line read may be cut
    return [ln if len(ln) <= LINE_CHARS else ln[:LINE_CHARS - 1] + "…" for ln in out[-lines:]]


def redact_line(line: str, secrets: list[str]) -> str:
    """``line`` with secret values, URL credentials and secret-looking assignments masked."""
    line = str(redact(line, secrets))

    def mask(m: re.Match[str]) -> str:
        return f"{m['name']}{m['sep']}{MASK}" if SECRET_NAME.search(m["name"]) else m[0]

    return _ASSIGN.sub(mask, line)


def _scrub(cause: Cause, secrets: list[str] | None) -> Cause:
    found = secret_values() if secrets is None else secrets
    cause.tail = [redact_line(ln, found) for ln in cause.tail]
    if cause.reason:
        cause.reason = redact_line(cause.reason, found)
    return cause
