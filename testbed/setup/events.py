"""What a set-up did: ansible-runner's events folded into per-host counts (``EventAggregator``), and the
``SetupResult`` that ``apply`` returns.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.textfmt import size

EventHandler = Callable[[dict[str, Any]], object]

_COUNTED = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped")
FINISHED_TASK = "testbed: play finished on this host"
"""The play's last task (``post_tasks``, no module run on the host): a host that reached it ran the whole play.
One whose play stopped (its own failure, unreachable, a failure elsewhere that ended the play for it: a ``run_once``
task, ``any_errors_fatal``, ``max_fail_percentage``) never reaches it, and is never recorded as set up."""
KEPT_EVENTS = (*_COUNTED, "runner_on_start", "runner_on_async_poll", "runner_on_async_failed", "playbook_on_stats",
         "playbook_on_task_start", "playbook_on_play_start", "runner_item_on_failed")


# --- results ---------------------------------------------------------------------------------------------
@dataclass
class HostSetupResult:
    """Counts of one host's task results and its first error."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    error: str | None = None
    error_task: str | None = None
    changed_tasks: list[str] = field(default_factory=list)  # what changed: "role : task (path)", at most MAX_CHANGES
    unchanged: bool = False  # skipped: its recorded set-up address matched, Ansible did not run on it
    stopped: bool = False  # Ansible ran on it, but its play ended before the last task (not recorded as set up)

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        if self.stopped:
            return "stopped"
        if self.unchanged:
            return "unchanged"
        return "changed" if self.changed else "ok"


@dataclass
class SetupResult:
    """Outcome of one ``apply``: per-host counts, first errors, time and Ansible's exit code."""

    testbed: str
    plan: str
    roles: list[str]
    check: bool
    rc: int
    status: str
    elapsed: float
    hosts: dict[str, HostSetupResult]
    artifact_dir: str | None = None
    error: str | None = None
    ran: bool = True  # Ansible ran (on the hosts not in ``unchanged``)
    verify: bool = False  # every host ran whatever its record said
    unchanged: list[str] = field(default_factory=list)  # hosts skipped: their recorded address matched
    reasons: dict[str, str] = field(default_factory=dict)  # why each host that ran was not skipped
    unfinished: list[str] = field(default_factory=list)  # hosts where an earlier set-up did not finish (their pending
    # mark): they ran again, and what changed there is not drift
    drift: dict[str, list[str]] = field(default_factory=dict)  # --verify: hosts whose record matched yet Ansible
    # changed something (a change behind testbed's back), with what changed
    probe_seconds: float = 0.0  # the round trip reading every host's record
    partial: dict[str, str] = field(default_factory=dict)  # hosts that held the set-up's work already (booted from
    # its image, or only the testbed's hosts changed), with why: only ``partial_roles`` ran there
    partial_roles: list[str] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)  # roles of the plan a user's folder overrides: the
    # folder used instead of the shipped role of that name
    direct: bool = False  # ``partial_roles`` applied by testbed over SSH, not Ansible (:mod:`testbed.setup.direct`)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and all(h.failed == 0 and h.unreachable == 0 and not h.stopped
                                    for h in self.hosts.values())

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["changed_total"] = self.changed
        d["elapsed"] = round(self.elapsed, 2)
        d["probe_seconds"] = round(self.probe_seconds, 3)
        for name, h in self.hosts.items():
            d["hosts"][name]["status"] = h.status
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# --- events ----------------------------------------------------------------------------------------------
def first_line_error(res: dict[str, Any]) -> str:
    """A short human error from a task result (msg plus the tail of stderr)."""
    msg = str(res.get("msg") or "").strip()
    stderr = str(res.get("stderr") or res.get("module_stderr") or "").strip()
    stdout = str(res.get("stdout") or res.get("module_stdout") or "").strip()
    if (res.get("results") and not msg.strip(" .")) or msg.startswith(("One or more items failed",
                                                                        "All items completed")):
        for item in res.get("results") or []:  # the first item that failed or could not reach its host
            if isinstance(item, dict) and (item.get("failed") or item.get("unreachable")):
                return first_line_error(item)
    parts = [msg] if msg else []
    tail = stderr or (stdout if res.get("rc") not in (None, 0) else "")
    if tail:
        lines = tail.splitlines()
        parts.append(" | ".join(lines[-4:]))
    if res.get("rc") not in (None, 0) and "rc=" not in msg:
        parts.append(f"rc={res.get('rc')}")
    return "; ".join(parts)[:1500] or "failed"


MAX_CHANGES = 50


def change_label(task: str, role: str, res: dict[str, Any]) -> str:
    """``role : task (path)``: what one changed task result changed, for humans (no file contents)."""
    where = res.get("dest") or res.get("path") or res.get("name") if isinstance(res, dict) else None
    label = f"{role} : {task}" if role and not task.startswith(f"{role} :") else task
    return f"{label} ({where})" if isinstance(where, str) and where.startswith(("/", "~")) else label


# --- downloads on the controller ---------------------------------------------------------------------------
DOWNLOAD_EVENT = "testbed_download"  # what apply sends while a role downloads on the controller (pip's raw bar)


@dataclass
class Download:
    """Where a download on the controller stands, read from pip's output (``--progress-bar raw``)."""

    file: str | None = None  # the file being downloaded now
    done: int = 0  # its bytes so far
    total: int | None = None  # its size, when pip knows it
    files_done: int = 0
    bytes_before: int = 0  # the finished files' bytes
    at: float = 0.0  # monotonic time of this reading
    verb: str = "downloading"  # "copying": the push role's rsync to the hosts (see :func:`read_copies`)

    @property
    def bytes_all(self) -> int:
        return self.bytes_before + self.done


def read_download(text: str) -> Download | None:
    """pip's output so far as one :class:`Download` (None when it downloaded nothing yet)."""
    d: Download | None = None
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("Downloading "):
            d = d or Download()
            if d.file is not None:  # the previous file ended (pip prints no line for it with -d)
                d.files_done += 1
                d.bytes_before += d.total or d.done
            d.file, d.done, d.total = ln.removeprefix("Downloading ").split(" (")[0].rsplit("/", 1)[-1], 0, None
        elif ln.startswith("Progress ") and d is not None:
            parts = ln.split()
            if len(parts) == 4 and parts[1].isdigit() and parts[3].isdigit():
                d.done, d.total = int(parts[1]), int(parts[3])
    return d


_PROGRESS2 = re.compile(r"^\s*([\d,.]+)\s+(\d+)%")  # rsync --info=progress2: bytes so far, percent of the whole


def read_copies(texts: Sequence[str]) -> Download | None:
    """The push role's copies to the hosts so far (one text per host: its label line, then rsync's output) as one
    :class:`Download` over every host: bytes so far and their size (None before any byte moved, and when every file
    was there already)."""
    done, total, label, seen = 0, 0, "files", 0
    for text in texts:
        first, _, rest = text.partition("\n")
        label = first.strip() or label
        last = None
        for ln in re.split(r"[\r\n]", rest):
            last = _PROGRESS2.match(ln) or last
        if last is None:
            continue
        seen += 1
        n, pct = int(re.sub(r"\D", "", last.group(1)) or 0), int(last.group(2))
        done += n
        total += n * 100 // pct if pct else n
    if not seen or not total:  # nothing moved yet, or nothing to move (every file there already)
        return None
    return Download(file=f"{label} to {len(texts)} host{'s' if len(texts) != 1 else ''}", done=done,
                    total=max(total, done) or None, verb="copying")


def describe_download(now: Download, first: Download | None) -> str:
    """One line: the file, bytes of its size, the rate since ``first`` and the time left for this file."""
    line = f"{now.verb} {now.file}: {size(now.done)}"
    if now.total:
        line += f" of {size(now.total)}"
    if first is not None and now.at > first.at and now.bytes_all > first.bytes_all:
        rate = (now.bytes_all - first.bytes_all) / (now.at - first.at)
        line += f", {size(rate)}/s"
        if now.total and now.total > now.done:
            line += f", {int((now.total - now.done) / rate) + 1} s left"
    if now.files_done:
        line += f" ({now.files_done} file{'s' if now.files_done != 1 else ''}, {size(now.bytes_before)} done)"
    return line


class EventAggregator:
    """Folds ansible-runner events into per-host counts, current task and first error (thread-safe)."""

    def __init__(self, hosts: list[str]):
        self.lock = threading.Lock()
        self.hosts: dict[str, HostSetupResult] = {h: HostSetupResult(h) for h in hosts}
        self.current: dict[str, str] = {h: "waiting" for h in hosts}
        self.polls: dict[str, int] = {}
        self.task = ""
        self.play = ""
        self.tasks_started = 0
        self.stats_seen = False
        self.finished: set[str] = set()  # hosts that reached FINISHED_TASK: their whole play ran
        self.started = time.monotonic()
        self.download: Download | None = None  # the controller's download now, and the first reading of it
        self.download_first: Download | None = None

    def _host(self, name: str) -> HostSetupResult:
        if name not in self.hosts:
            self.hosts[name] = HostSetupResult(name)
            self.current[name] = "waiting"
        return self.hosts[name]

    def handle(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event", "")
        d = ev.get("event_data") or {}
        host = d.get("host") or d.get("remote_addr")
        task = str(d.get("task") or "").strip()
        with self.lock:
            if kind == DOWNLOAD_EVENT:
                self.download = Download(**ev["download"])
                self.download_first = self.download_first or self.download
            elif kind == "playbook_on_play_start":
                self.play = str(d.get("play") or "")
            elif kind == "playbook_on_task_start":
                self.task = task
                self.download = self.download_first = None
                self.tasks_started += 1
            elif kind == "runner_on_start" and host:
                self._host(host)
                self.current[host] = task
                self.polls.pop(host, None)
            elif kind == "runner_on_async_poll" and host:
                self.polls[host] = self.polls.get(host, 0) + 1
            elif kind == "playbook_on_stats":
                self._stats(d)
            elif kind in _COUNTED and host and not self.stats_seen:
                h = self._host(host)
                res = d.get("res") or {}
                if kind == "runner_on_ok":
                    if task == FINISHED_TASK and not d.get("role"):
                        self.finished.add(host)
                    h.ok += 1
                    h.changed += bool(res.get("changed"))
                    if res.get("changed") and len(h.changed_tasks) < MAX_CHANGES:
                        h.changed_tasks.append(change_label(task, str(d.get("role") or ""), res))
                elif kind == "runner_on_skipped":
                    h.skipped += 1
                elif kind == "runner_on_unreachable":
                    h.unreachable += 1
                    h.error = h.error or first_line_error(res)
                    h.error_task = h.error_task or task
                elif kind == "runner_on_failed":
                    if d.get("ignore_errors"):
                        h.ignored += 1
                    else:
                        h.failed += 1
                        h.error = h.error or first_line_error(res)
                        h.error_task = h.error_task or task
                self.current[host] = task
            if kind == "runner_on_async_failed" and host:
                h = self._host(host)
                h.error = h.error or first_line_error(d.get("res") or {})
                h.error_task = h.error_task or task

    def _stats(self, d: dict[str, Any]) -> None:
        """Ansible's own final counts replace the running ones."""
        self.stats_seen = True
        keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        seen: set[str] = set()
        for k in keys:
            seen |= set((d.get(k) or {}).keys())
        for name in seen:
            h = self._host(name)
            for src, dst in keys.items():
                setattr(h, dst, int((d.get(src) or {}).get(name, 0)))
        for name in self.hosts:
            self.current[name] = "done"

    def snapshot(self) -> tuple[dict[str, HostSetupResult], dict[str, str], dict[str, int], str]:
        with self.lock:
            return ({k: HostSetupResult(**asdict(v)) for k, v in self.hosts.items()}, dict(self.current),
                    dict(self.polls), self.task)

    def download_line(self) -> str | None:
        """The controller's download as one line, while a task downloads."""
        with self.lock:
            return describe_download(self.download, self.download_first) if self.download else None
