"""A Chameleon testbed's lease (Blazar): made with a node reservation (and reserved floating IPs), waited on
until ACTIVE, described from state (its end, a warning before it), and extended.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from testbed.errors import TestbedError, UsageError
from testbed.providers.chameleon.chi import ApiError
from testbed.providers.chameleon.cloud import (
    BLAZAR_FMT,
    LEASE_GONE,
    REPORT_EVERY,
    WARN_BEFORE_END,
    Cloud,
    _clock,
    _iso,
    _parse_lease_time,
    _span,
    _utcnow,
)

if TYPE_CHECKING:
    from testbed.providers.chameleon.chi import ApiError, Chi


def dates(c: Cloud, *, new: bool = True) -> tuple[str, str]:
    """Blazar start ('now' or 'YYYY-MM-DD HH:MM') and end, UTC; refused (UsageError) where Blazar would refuse
    them: an end before the start and, for a lease still to be made (``new``), a start in the past."""
    s = c.settings
    where = f"{c.spec.source or 'inventory'}: provider.start/end"
    now = _utcnow().replace(second=0, microsecond=0)  # Blazar's 'now' (manager.service._parse_lease_dates)
    try:
        start_dt = now if s.start in (None, "now") else datetime.strptime(str(s.start), BLAZAR_FMT)
        end_dt = datetime.strptime(s.end, BLAZAR_FMT) if s.end else start_dt + timedelta(hours=s.hours)
    except ValueError as e:
        raise UsageError(f"bad lease date: {e}", where=where, fix="write 'now' or 'YYYY-MM-DD HH:MM' (UTC)") from None
    cap = c.lease_end_cap  # an expiry: Blazar's own lease end is the first switch
    if new and cap is not None:
        capped = datetime.fromtimestamp(cap, UTC).replace(tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1)
        end_dt = min(end_dt, max(capped, start_dt + timedelta(minutes=5)))  # Blazar wants a real span
    if end_dt <= start_dt + timedelta(minutes=1):
        raise UsageError(f"the lease would end ({end_dt:%Y-%m-%d %H:%M}) before it starts",
                         where=where, fix="make end later than start, or give provider.hours")
    if new and start_dt < now:
        raise UsageError(f"the lease would start in the past ({start_dt:%Y-%m-%d %H:%M} UTC; now is "
                         f"{now:%Y-%m-%d %H:%M}): Blazar refuses it", where=where,
                         fix="write start: now, or a later 'YYYY-MM-DD HH:MM' (UTC)")
    return ("now" if s.start in (None, "now") else start_dt.strftime(BLAZAR_FMT)), end_dt.strftime(BLAZAR_FMT)


def note_lease(c: Cloud, lease: dict[str, Any]) -> None:
    info: dict[str, Any] = {"lease_id": lease["id"], "lease_name": lease.get("name")}
    with_end = lease.get("end_date")
    if with_end:
        info["lease_end"] = _iso(_parse_lease_time(with_end))
    c.store.add_resource(c.name, "lease", lease["id"], name=lease.get("name"),
                            end=info.get("lease_end"))
    c.store.update_testbed_info(c.name, **info)


def ensure_lease(c: Cloud, api: Chi) -> dict[str, Any]:
    s = c.settings
    thing = f"lease {c.lease_name}"
    for r in c.store.resources(c.name, "lease"):
        with c.step("looking up the lease", thing):
            lease = api.lease_get(r["id"])
        if lease is None or lease.get("status") in LEASE_GONE:
            c.store.remove_resource(c.name, "lease", r["id"])
            continue
        note_lease(c, lease)
        c.progress(f"lease {c.lease_name}: reusing {lease['id']} ({lease.get('status')})")
        return wait_lease(c, api, lease)
    with c.step("looking up leases by name", thing):
        named = [x for x in api.leases_named(c.lease_name) if x.get("status") not in LEASE_GONE]
    for lease in named:  # made by an interrupted run before its id came back
        note_lease(c, lease)
    if named:
        c.progress(f"lease {c.lease_name}: adopting {named[0]['id']} ({named[0].get('status')})")
        return wait_lease(c, api, named[0])
    start, end = dates(c)
    fips = s.count if (s.floating_ips and s.reserve_floating_ips) else 0
    c.progress(f"lease {c.lease_name}: requesting {s.count} x {s.node_type}"
                  f"{f' + {fips} floating IPs' if fips else ''} at {s.site}, {start} to {end} UTC")
    with c.step("creating the lease", thing):
        lease = api.lease_create(c.lease_name, start=start, end=end, node_type=s.node_type,
                                 count=s.count, fips=fips)
    note_lease(c, lease)  # recorded before any waiting
    return wait_lease(c, api, lease)


def failure(lease: dict[str, Any]) -> str:
    """What a lease in ERROR shows of why (Blazar keeps no reason: only its events' and reservations' states)."""
    parts = [f"its {e.get('event_type', 'event')} event failed" for e in lease.get("events") or []
             if str(e.get("status", "")).upper() == "ERROR"]
    for r in lease.get("reservations") or []:
        if str(r.get("status", "")).lower() == "error":
            parts.append(f"its {r.get('resource_type', '')} reservation is in error")
        if r.get("missing_resources"):
            parts.append(f"its {r.get('resource_type', '')} reservation lost a resource Blazar could not replace")
    return "; ".join(parts) or "Blazar records no reason"


def wait_lease(c: Cloud, api: Chi, lease: dict[str, Any]) -> dict[str, Any]:
    """Poll the lease (with backoff) until ACTIVE; fail at once on ERROR, TERMINATED/DELETING, a start beyond the
    wait, and after provider.lease_timeout."""
    s = c.settings
    lid = lease["id"]
    thing = f"lease {c.lease_name} ({lid})"
    start = time.monotonic()
    deadline = start + s.lease_timeout
    pause = c.backoff(deadline)
    last_status, last_report = None, 0.0
    while True:
        status = str(lease.get("status") or "UNKNOWN").upper()
        now = time.monotonic()
        if status == "ACTIVE":
            note_lease(c, lease)
            c.progress(f"lease {c.lease_name}: ACTIVE until {lease.get('end_date', '?')[:16]} UTC")
            if lease.get("degraded"):
                c.progress(f"lease {c.lease_name}: degraded ({failure(lease)}): a reserved node failed; servers "
                           "may not find a free node ('No valid host')")
            return lease
        if status == "ERROR":
            raise TestbedError(
                f"lease {c.lease_name} went to ERROR ({failure(lease)})", where=c.where("blazar", thing),
                fix=f"run 'testbed destroy {c.name}' (it deletes the lease), then provision again; if it happens "
                    f"again, send the lease id {lid} to the Chameleon help desk, since Blazar shows users no reason")
        if status in LEASE_GONE:
            raise TestbedError(f"lease {c.lease_name} is {status} before it became ACTIVE",
                               where=c.where("blazar", thing),
                               fix=f"run 'testbed destroy {c.name}', then 'testbed provision {c.name}'")
        starts = lease.get("start_date")
        if starts and status == "PENDING":
            begin = _parse_lease_time(starts)
            if begin - _utcnow() > timedelta(seconds=max(0.0, deadline - now) + 60):
                raise TestbedError(f"lease {c.lease_name} is reserved but starts only at "
                                   f"{begin:%Y-%m-%d %H:%M} UTC", where=c.where("blazar", thing),
                                   fix=f"run 'testbed provision {c.name}' again after it starts (the lease "
                                       f"is recorded); 'testbed destroy {c.name}' cancels it")
        if status != last_status or now - last_report >= REPORT_EVERY:
            c.progress(f"lease {c.lease_name}: {status} after {_clock(now - start)} (Blazar takes minutes to start "
                       f"a lease; gives up at {_clock(s.lease_timeout)})")
            last_status, last_report = status, now
        if now >= deadline:
            raise TestbedError(f"lease {c.lease_name} is still {status} after {s.lease_timeout} s",
                               where=c.where("blazar", thing),
                               fix=f"run 'testbed provision {c.name}' again to keep waiting (or raise "
                                   f"provider.lease_timeout); 'testbed destroy {c.name}' releases it")
        pause.sleep()
        with c.step("waiting for the lease", thing):
            got = api.lease_get(lid)
        if got is None:
            raise TestbedError(f"lease {c.lease_name} disappeared while starting",
                               where=c.where("blazar", thing),
                               fix=f"run 'testbed destroy {c.name}', then provision again")
        lease = got


def reservation(lease: dict[str, Any], resource_type: str) -> str | None:
    for r in lease.get("reservations") or []:
        if r.get("resource_type") == resource_type:
            return str(r["id"])
    return None


def describe(c: Cloud, now: datetime | None = None) -> dict[str, Any]:
    """Lease end from state (no network), with a warning when it is less than an hour away."""
    info = c.store.testbed_info(c.name)
    out: dict[str, Any] = {"site": info.get("site", c.settings.site), "lease": info.get("lease_id"),
                           "lease_name": info.get("lease_name", c.lease_name)}
    end = info.get("lease_end")
    if not end:
        return out
    left = _parse_lease_time(end) - (now or _utcnow())
    out["lease_end"] = end
    out["remaining"] = _span(left)
    if left <= timedelta(0):
        out["warning"] = (f"the lease ended at {end}: its nodes are gone; run 'testbed destroy {c.name}' "
                          "and provision again")
    elif left < WARN_BEFORE_END:
        out["warning"] = (f"the lease ends in {_span(left)} ({end}): run 'testbed extend {c.name} "
                          "--hours N' or collect results now")
    return out


def extend(c: Cloud, hours: float) -> str:
    """Move the lease end ``hours`` later (blazar PUT /leases/{id}); returns the new end (ISO, UTC)."""
    if not hours or hours <= 0:
        raise UsageError(f"cannot extend by {hours} hours", where="--hours", fix="give a positive number")
    rows = c.store.resources(c.name, "lease")
    if not rows:
        raise TestbedError(f"testbed '{c.name}' has no lease recorded", where="state",
                           fix=f"run 'testbed provision {c.name}' first")
    api = c.connect()
    lid = rows[0]["id"]
    thing = f"lease {c.lease_name} ({lid})"
    with c.step("reading the lease", thing):
        lease = api.lease_get(lid)
    if lease is None or lease.get("status") in LEASE_GONE:
        raise TestbedError(f"lease {c.lease_name} is gone", where=c.where("blazar", thing),
                           fix=f"run 'testbed destroy {c.name}' and provision again")
    old = _parse_lease_time(lease["end_date"])
    new = old + timedelta(hours=hours)
    try:
        lease = api.lease_set_end(lid, new.strftime(BLAZAR_FMT))
    except ApiError as e:
        raise _extend_error(c, e, hours, thing) from None
    note_lease(c, lease)
    end = _iso(_parse_lease_time(lease["end_date"]))
    c.progress(f"lease {c.lease_name}: now ends {end} (was {_iso(old)})")
    return end


def _extend_error(c: Cloud, e: ApiError, hours: float, thing: str) -> TestbedError:
    """Why Blazar refused to move the lease end, told apart by its own messages (manager/exceptions.py,
    enforcement/exceptions.py): nodes taken, floating IPs taken, the 7-day limit, the extension window."""
    low = e.message.lower()
    where = c.where(e.service or "blazar", thing)
    said = f"(HTTP {e.status}: {e.message})" if e.status else f"({e.message})"
    if "not enough hosts available" in low or "not enough resources available" in low:
        return TestbedError(f"cannot extend lease {c.lease_name} by {hours:g} h: its nodes are reserved by "
                            f"someone else after the current end {said}", where=where,
                            fix="extend by fewer hours, or collect results and start a new lease")
    if "not enough floating ips available" in low:
        return TestbedError(f"cannot extend lease {c.lease_name} by {hours:g} h: its reserved floating IPs are "
                            f"reserved by someone else after the current end (the nodes would be free) {said}",
                            where=where,
                            fix="extend by fewer hours; or collect results and start a new lease, with "
                                "provider.floating_ips: false if addresses stay scarce")
    if "maximum lease duration" in low:
        return TestbedError(f"cannot extend lease {c.lease_name} by {hours:g} h: Chameleon allows 7 days at "
                            f"most (from the start, or from the current end within the extension window) {said}",
                            where=where,
                            fix="extend by fewer hours, or collect results and start a new lease")
    if "can only be extended within" in low:
        return TestbedError(f"cannot extend lease {c.lease_name} yet: Chameleon allows extensions only close to "
                            f"the lease end {said}", where=where,
                            fix=f"run 'testbed extend {c.name}' again nearer the end ('testbed status {c.name}' "
                                "shows it)")
    return c.error(e, f"extending the lease by {hours:g} h", thing)
