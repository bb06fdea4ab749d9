"""The part every report starts with (manifest summary) and the generic report's file table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from testbed.report.cause import Cause, run_cause
from testbed.report.model import Report
from testbed.report.rundir import REPORT_DIR, RunDir, event_time
from testbed.textfmt import clip, plural, words


def add_summary(run: RunDir, rep: Report) -> None:
    """Run, testbed, timing, parameters, hosts and events from the manifest."""
    m = run.manifest
    tb_raw = m.get("testbed")
    tb: dict[str, Any] = tb_raw if isinstance(tb_raw, dict) else {}
    rows: list[list[Any]] = [
        ["suite", run.suite],
        ["run id", run.run_id],
        ["testbed", tb.get("name")],
        ["provider", tb.get("provider")],
        ["started", m.get("started")],
        ["ended", m.get("ended")],
        ["duration (s)", _duration(m.get("started"), m.get("ended"))],
        ["testbed version", m.get("testbed_version")],
        ["status", m.get("status")],
        ["reason", m.get("reason")],
    ]
    reh = m.get("rehearsal")
    if isinstance(reh, dict):  # testbed rehearse: a local replica, probes for programs; never a result
        rep.heading("Rehearsal: not results")
        rep.text(f"This run is a rehearsal on a local replica of '{reh.get('like')}' (testbed rehearse): its numbers "
                 "are not the artifact's results. Steps skipped: "
                 + (", ".join(f"{k} ({v})" for k, v in (reh.get("skipped") or {}).items()) or "none")
                 + ". Ranks probed: " + (", ".join(map(str, reh.get("probed_ranks") or [])) or "none") + ".")
    status = m.get("status")
    rep.status = status if isinstance(status, str) else None
    rep.reason = str(m["reason"]) if m.get("reason") else None
    add_timeline(run, rep)
    rep.heading("Run")
    rep.table("run", ["field", "value"], [r for r in rows if r[1] is not None])
    cause = run_cause(run)
    if isinstance(status, str) and status not in ("pending", "running"):
        rep.check("run succeeded", status == "succeeded", check_detail(status, cause))
    if cause is not None:
        add_cause(rep, cause)
    if run.params:
        rep.table("params", ["parameter", "value"], [[k, _scalar(v)] for k, v in sorted(run.params.items())],
                  "Parameters")
    hosts = run.host_records()
    if hosts:
        rep.table("hosts", ["host", "address", "status", "exit_code"],
                  [[h.get("name"), h.get("address"), h.get("status"), h.get("exit_code")] for h in hosts], "Hosts")
    if run.events:
        rep.table("events", ["ts", "kind", "host", "detail"],
                  [[e.get("ts"), e.get("kind"), e.get("host"), _scalar(e.get("detail"))] for e in run.events],
                  "Events")
        for e in run.events:
            raw = e.get("detail")
            detail: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if e.get("kind") == "fault-missed":
                rep.check(f"fault '{detail.get('fault')}' fired", False, str(detail.get("reason") or "never fired"))
        add_recovery(run, rep)
        add_liveness(run, rep)
    rep.skip(run.notes)


TIMELINE_KINDS = ("started", "fault", "fault-missed", "failed", "host-lost", "host-back", "repairing", "repaired",
                  "recovery", "relaunched", "resumed", "stopping", "ended")
"""The events a reader wants first: what was injected, what broke, what was repaired, when it resumed."""


def add_timeline(run: RunDir, rep: Report) -> None:
    """The fault and recovery timeline (seconds from the first event) for the report's first screen."""
    rows: list[list[Any]] = []
    t0: float | None = None
    for e in run.events:
        kind, ts = e.get("kind"), event_time(e.get("ts"))
        if kind not in TIMELINE_KINDS or ts is None:
            continue
        t0 = ts if t0 is None else t0
        raw = e.get("detail")
        d: dict[str, Any] = raw if isinstance(raw, dict) else {}
        brief = next((words(d[k]) for k in ("fault", "summary", "why", "reason", "status", "note")
                      if d.get(k) not in (None, "", {}, [])), "")
        if kind == "resumed" and d.get("resumed_step") is not None:
            brief = f"from step {d['resumed_step']}" + (f" after {brief}" if brief else "")
        elif kind == "repaired" and e.get("host"):
            brief = f"{d.get('how') or 'brought back'} in {d.get('repair_seconds')} s" + (
                f", set up again in {d.get('setup_seconds')} s" if d.get("setup") else "")
        rows.append([round(ts - t0, 2), kind, e.get("host"), clip(brief, 80)])
    if any(r[1] not in ("started", "ended") for r in rows):  # a run without a fault has no timeline to show
        rep.table("timeline", ["t_seconds", "event", "host", "detail"], rows,
                  "Fault and recovery timeline (seconds from the first event)", lead=True)


def check_detail(status: str, cause: Cause | None) -> str:
    """The "run succeeded" check's detail: the status, its reason and the last line of the failing rank's log."""
    if cause is None:
        return status
    text = status + (f": {cause.reason}" if cause.reason else "")
    if cause.tail:
        text += f"; {cause.where} {cause.stream}: {cause.tail[-1]}"
    return text


def add_cause(rep: Report, cause: Cause) -> None:
    """Why the run failed: the failing rank, how it ended and the last lines of its collected stderr."""
    rep.cause = cause
    rep.heading("Why it failed")
    how = cause.status + (f" with exit {cause.exit_code}" if cause.exit_code not in (None, 0) else "")
    reason = cause.reason or ""
    if cause.where and reason.startswith(f"{cause.where}: "):  # the supervisor's reason names the rank again
        reason = reason[len(cause.where) + 2:]
    if reason in (f"exit {cause.exit_code}", cause.status):
        reason = ""
    rep.text((f"{cause.where} {how}" if cause.where else f"The run {how}") + (f": {reason}" if reason else "")
             + ".")
    if cause.tail:
        rep.text(f"The last lines of {cause.file} ({cause.stream}, secrets masked):")
        rep.code(cause.tail)
    if cause.note:
        rep.text(cause.note + ".")


RECOVERY_COLUMNS = ["attempt", "fault", "hosts_repaired", "detect_seconds", "drain_seconds", "repair_seconds",
                    "setup_seconds", "relaunch_seconds", "downtime_seconds", "resumed_from", "resumed_step",
                    "last_step", "steps_lost"]


def add_recovery(run: RunDir, rep: Report) -> None:
    """Each recovery's times (detection, repair, set-up, relaunch), the checkpoint it resumed from and the steps
    it redid; then the goodput against the run's pace without faults."""
    resumed = [e["detail"] for e in run.events if e.get("kind") == "resumed" and isinstance(e.get("detail"), dict)]
    if not resumed:
        return
    rep.heading("Recovery")
    rows = []
    for d in resumed:
        ck = d.get("checkpoint")
        where = f"{ck.get('host')}:{ck.get('file')}" if isinstance(ck, dict) else (d.get("why") or "none")
        rows.append([_scalar(d.get(c)) if c != "resumed_from" else where for c in RECOVERY_COLUMNS])
    rep.table("recovery", RECOVERY_COLUMNS, rows, "Recoveries: seconds from the fault (or failure) to each part")
    good = next((e["detail"] for e in run.events if e.get("kind") == "goodput" and isinstance(e.get("detail"), dict)),
                None)
    if good:
        cols = ["steps", "seconds", "steps_per_second", "fault_free_seconds", "fault_free_steps_per_second", "ratio"]
        rep.table("goodput", cols, [[good.get(c) for c in cols]],
                  "Goodput: useful steps per wall-clock second; the fault-free run is estimated from the run's own "
                  "start-up and pace between faults (ratio = fault-free time / real time)")


def add_liveness(run: RunDir, rep: Report) -> None:
    """Each host judged lost (the probes that found it lost, the bound they spanned) and each spell a host gave no
    answer without being judged lost (slow: a slow answer is not a lost host)."""
    rows, spells = [], []
    for e in run.events:
        raw = e.get("detail")
        d: dict[str, Any] = raw if isinstance(raw, dict) else {}
        probes = [p for p in d.get("probes") or [] if isinstance(p, dict)]
        found = ", ".join(f"{p.get('ssh')}" + (f"/{p['provider']}" if p.get("provider") else "") for p in probes)
        if e.get("kind") == "host-lost":
            span = round(probes[-1].get("at", 0) - probes[0].get("at", 0), 2) if probes else None
            rows.append([e.get("host"), e.get("ts"), len(probes), span, d.get("bound"), found, d.get("summary")])
        elif e.get("kind") == "host-back":
            spells.append([e.get("host"), e.get("ts"), d.get("seconds"), len(probes), found, d.get("summary")])
    if rows or spells:
        rep.heading("Hosts without an answer")
    if rows:
        rep.table("lost", ["host", "judged_at", "probes", "span_seconds", "bound_seconds", "results", "why"], rows,
                  "Hosts judged lost before any repair: probes in a row, spaced over the bound, each refused, with no "
                  "route, or the machine gone at the provider (ssh result/provider state)")
    if spells:
        rep.table("unanswered", ["host", "answered_at", "seconds", "probes", "results", "summary"], spells,
                  "Spells a host gave no answer and was not judged lost (a probe that times out is slow, not lost)")


def add_file_table(run: RunDir, rep: Report) -> None:
    """Files from the manifest (with checksums), else what is on disk under the host folders."""
    rep.heading("Files")
    listed = [f for f in run.manifest.get("files") or [] if isinstance(f, dict)]
    if listed:
        rows = [[f.get("host"), f.get("path"), f.get("size"), str(f.get("sha256") or "")[:16]] for f in listed]
    else:
        rows = []
        for p in sorted(run.path.rglob("*")):
            parts = p.relative_to(run.path).parts
            if p.is_file() and len(parts) > 1 and parts[0] != REPORT_DIR:
                rows.append([parts[0], "/".join(parts[1:]), p.stat().st_size, ""])
    rep.table("files", ["host", "path", "size", "sha256_prefix"], rows, "Collected files")


def add_host_check(run: RunDir, rep: Report) -> None:
    hosts = run.host_records()
    if not hosts:
        rep.check("hosts succeeded", None, "no hosts in the manifest")
        return
    bad = [str(h.get("name")) for h in hosts if h.get("exit_code") not in (0, None) or
           h.get("status") not in ("succeeded", None)]
    rep.check("hosts succeeded", not bad, f"failed: {', '.join(bad)}" if bad else f"{plural(len(hosts), 'host')} ok")


def generic(run: RunDir, rep: Report, own_tables: bool = False) -> None:
    """Report for a suite without its own reporter: the summary plus the file table (``own_tables``: the suite
    declares results tables, shown after)."""
    rep.text(f"Suite {run.suite!r} has no reporter; showing the manifest, the files and the suite's own results "
             "tables." if own_tables else
             f"No reporter is registered for suite {run.suite!r}; showing the manifest and files.")
    add_host_check(run, rep)
    add_file_table(run, rep)


def _duration(start: object, end: object) -> float | None:
    try:
        return round((datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds(), 3)
    except (TypeError, ValueError):
        return None


def _scalar(value: object) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):  # an event's details: key=value, each value in words (never a Python repr)
        return ", ".join(f"{k}={words(v)}" for k, v in value.items())
    return words(value)
