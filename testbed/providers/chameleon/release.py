"""Giving a Chameleon testbed back: floating IPs (never through chi's ``Server.delete()``, which leaks them),
servers, the lease and the key pair.

404 counts as gone; a resource row is removed only once the cloud says it is gone, so a destroy that fails
half-way can simply be run again; resources an interrupted provision made before their id came back are found by
name and released too. A lease or server that turns ERROR while being deleted is reported at once, never waited
on until the timeout.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.providers.chameleon import switch
from testbed.providers.chameleon.cloud import REPORT_EVERY, Cloud, _clock
from testbed.providers.chameleon.lease import failure as lease_failure

if TYPE_CHECKING:
    from testbed.providers.chameleon.chi import Chi


def release(c: Cloud) -> None:
    """Release floating IPs, servers, the lease and the key pair; safe to run again."""
    if not c.store.resources(c.name) and c.store.testbed(c.name) is None:
        return  # nothing was ever made (or it is all gone already): no credentials needed
    try:
        api = c.connect()
    except TestbedError:
        if c.store.resources(c.name):
            raise  # recorded resources need the API: refuse before any request
        c.progress(f"{c.name}: nothing recorded and no credentials; skipped the search by name")
        return
    if c.store.testbed(c.name) is not None:
        c.store.set_testbed_status(c.name, "destroying")
    failures: list[str] = []
    try:
        _adopt_by_name(c, api)
        _destroy_fips(c, api, failures)
        servers = {r["id"]: r["info"].get("name", r["id"]) for r in c.store.resources(c.name, "server")}
        delete_servers(c, api, servers, failures)
        _destroy_leases(c, api, failures)
        _destroy_fips(c, api, failures, after_lease=True)
        switch.revoke(c, api, failures)  # the dead-man's switch's credential
        for r in c.store.resources(c.name, "keypair"):
            try:
                with c.step("deleting the key pair", f"key pair {r['id']}"):
                    api.keypair_delete(r["id"])
                c.store.remove_resource(c.name, "keypair", r["id"])
                c.progress(f"key pair {r['id']}: deleted")
            except TestbedError as e:
                failures.append(e.what)
    except KeyboardInterrupt:
        raise TestbedError(f"destroy of '{c.name}' interrupted; still recorded: {c.recorded()}",
                           where=c.where("testbed", f"lease {c.lease_name}"),
                           fix=f"run 'testbed destroy {c.name}' again", code=Exit.INTERRUPTED) from None
    except TestbedError as e:
        failures.append(e.what)
    if failures:
        c.store.set_testbed_status(c.name, "destroy-failed")
        stuck = [r["id"] for r in c.store.resources(c.name, "lease")]
        help_desk = (f"; a lease in ERROR can be deleted again, but if it stays in ERROR ask the Chameleon help "
                     f"desk to delete it ({', '.join(stuck)}): until then it may hold its nodes and charge your "
                     "allocation" if any("ERROR" in f for f in failures) and stuck else "")
        raise TestbedError(f"destroy of '{c.name}' left {c.recorded()}: " + "; ".join(failures),
                           where=c.where("API", f"testbed {c.name}"),
                           fix=f"run 'testbed destroy {c.name}' again; if it keeps failing, delete the "
                               f"recorded ids in the Chameleon dashboard{help_desk}")
    c.progress(f"{c.name}: lease, servers and floating IPs released")


def _adopt_by_name(c: Cloud, api: Chi) -> None:
    """Record resources an interrupted run made before their ids came back (found by name)."""
    with c.step("listing leases", f"lease {c.lease_name}"):
        for x in api.leases_named(c.lease_name):
            if x.get("status") not in ("TERMINATED", "DELETED"):
                c.store.add_resource(c.name, "lease", x["id"], name=x.get("name"))
    known = {r["id"] for r in c.store.resources(c.name, "server")}
    with c.step("listing servers", f"servers {c.prefix}-*"):
        for x in api.servers_named(c.prefix + "-"):
            if str(x["id"]) not in known:
                c.store.add_resource(c.name, "server", str(x["id"]), name=x.get("name"),
                                        host=str(x.get("name", ""))[len(c.prefix) + 1:])
    known = {r["id"] for r in c.store.resources(c.name, "fip")}
    with c.step("listing floating IPs", f"floating IPs of {c.prefix}"):
        for f in api.fips():
            if str(f.get("description") or "").startswith(f"testbed {c.prefix} ") and f["id"] not in known:
                c.store.add_resource(c.name, "fip", f["id"], address=f.get("floating_ip_address"))


def _destroy_fips(c: Cloud, api: Chi, failures: list[str], after_lease: bool = False) -> None:
    for r in c.store.resources(c.name, "fip"):
        thing = f"floating IP {r['info'].get('address', '')} ({r['id']})"
        try:
            if after_lease:  # reserved ones the lease took with it
                with c.step("checking a floating IP", thing):
                    gone = api.fip_get(r["id"]) is None
                if gone:
                    c.store.remove_resource(c.name, "fip", r["id"])
                else:
                    failures.append(f"{thing} still exists")
                continue
            with c.step("releasing a floating IP", thing):
                api.fip_delete(r["id"])
            c.store.remove_resource(c.name, "fip", r["id"])
            c.progress(f"{thing}: released")
        except TestbedError as e:
            if r["info"].get("reserved") and not after_lease:
                continue  # a reserved IP may refuse deletion: the lease releases it
            failures.append(e.what)


def delete_servers(c: Cloud, api: Chi, servers: dict[str, str], failures: list[str] | None = None) -> None:
    """Delete servers (id -> name) and wait (with backoff) until nova no longer knows them; rows removed as they
    go. A server that turns ERROR instead is reported at once (its fault), not waited on."""
    pending = {}
    for sid, name in servers.items():
        try:
            with c.step("deleting a server", f"server {name} ({sid})"):
                sent = api.server_delete(sid)
        except TestbedError as e:
            if failures is None:
                raise
            failures.append(e.what)
            continue
        if sent:
            pending[sid] = name
            c.progress(f"server {name}: delete requested")
        else:
            c.store.remove_resource(c.name, "server", sid)
    start = time.monotonic()
    deadline = start + c.destroy_timeout
    pause = c.backoff(deadline)
    problems: list[str] = []
    total, told = len(pending), start
    while pending:
        for sid, name in list(pending.items()):
            with c.step("waiting for a server to go", f"server {name} ({sid})"):
                srv = api.server_get(sid)
            status = "" if srv is None else str(srv.get("status", "")).upper()
            if srv is None or status == "DELETED":
                c.store.remove_resource(c.name, "server", sid)
                pending.pop(sid)
                c.progress(f"server {name}: deleted after {_clock(time.monotonic() - start)}")
            elif status == "ERROR" and not srv.get("OS-EXT-STS:task_state"):  # nova gave up deleting it
                fault = (srv.get("fault") or {}).get("message") or "nova gives no reason"
                problems.append(f"server {name} ({sid}) went to ERROR while being deleted: {fault}")
                pending.pop(sid)
        if pending and time.monotonic() >= deadline:
            problems.append(f"server(s) still deleting after {int(c.destroy_timeout)} s: "
                            f"{', '.join(pending.values())}")
            break
        if pending and time.monotonic() - told >= REPORT_EVERY:
            told = time.monotonic()
            c.progress(f"servers: {total - len(pending)} of {total} deleted after {_clock(told - start)} (gives up "
                       f"after {_clock(c.destroy_timeout)})")
        if pending:
            pause.sleep()
    if problems and failures is None:
        raise TestbedError("; ".join(problems), where=c.where("nova", "servers"),
                           fix=f"run 'testbed destroy {c.name}' again (nova retries the delete)")
    if failures is not None:
        failures.extend(problems)


def _destroy_leases(c: Cloud, api: Chi, failures: list[str]) -> None:
    """DELETE each lease, then wait (with backoff) until Blazar no longer knows it. Blazar ends a lease inside
    the DELETE call; when that call fails or times out the lease is looked at: gone is done, DELETING is waited
    on, ERROR (it could not end the lease cleanly) is reported at once."""
    pending: dict[str, str] = {}
    for r in c.store.resources(c.name, "lease"):
        thing = f"lease {r['info'].get('name') or c.lease_name} ({r['id']})"
        try:
            with c.step("deleting the lease", thing):
                state = "deleting" if api.lease_delete(r["id"]) else "gone"
        except TestbedError as e:
            state = _after_failed_delete(c, api, r["id"], thing, e.what, failures)
        if state == "deleting":
            pending[r["id"]] = thing
            c.progress(f"{thing}: delete requested")
        elif state == "gone":
            c.store.remove_resource(c.name, "lease", r["id"])
            c.progress(f"{thing}: deleted")
    start = time.monotonic()
    deadline = start + c.destroy_timeout
    pause = c.backoff(deadline)
    told = start
    while pending:
        for lid, thing in list(pending.items()):
            with c.step("waiting for the lease to go", thing):
                lease = api.lease_get(lid)
            status = "" if lease is None else str(lease.get("status", "")).upper()
            if lease is None:
                c.store.remove_resource(c.name, "lease", lid)
                pending.pop(lid)
                c.progress(f"{thing}: deleted after {_clock(time.monotonic() - start)}")
            elif status != "DELETING":  # DELETING's only way on is ERROR (blazar.status.LeaseStatus)
                failures.append(f"{thing} went to {status or 'an unknown status'} while being deleted "
                                f"({lease_failure(lease)})")
                pending.pop(lid)
        if pending and time.monotonic() >= deadline:
            failures.append(f"lease(s) still deleting after {int(c.destroy_timeout)} s: {', '.join(pending.values())}")
            return
        if pending and time.monotonic() - told >= REPORT_EVERY:
            told = time.monotonic()
            c.progress(f"{', '.join(pending.values())}: Blazar still deleting after {_clock(told - start)} (gives up "
                       f"after {_clock(c.destroy_timeout)})")
        if pending:
            pause.sleep()


def _after_failed_delete(c: Cloud, api: Chi, lid: str, thing: str, what: str,
                         failures: list[str]) -> str:
    """A lease DELETE answered with an error; what the lease shows then: 'deleting' (Blazar is still at it:
    wait), 'gone', or 'failed' (recorded in ``failures``)."""
    try:
        with c.step("looking at the lease after a failed delete", thing):
            lease = api.lease_get(lid)
    except TestbedError as e:
        failures.append(f"{what}; then {e.what}")
        return "failed"
    if lease is None:
        return "gone"
    status = str(lease.get("status", "")).upper()
    if status == "DELETING":
        c.progress(f"{thing}: Blazar is still deleting it ({what}); waiting")
        return "deleting"
    if status == "ERROR":
        failures.append(f"{thing} went to ERROR while being deleted: Blazar could not end it cleanly ({what})")
    else:
        failures.append(f"{what} (the lease is {status})")
    return "failed"
