"""Giving a Chameleon testbed back: floating IPs (never through chi's ``Server.delete()``, which leaks them),
servers, the lease and the key pair.

404 counts as gone; a resource row is removed only once the cloud says it is gone, so a destroy that fails
half-way can simply be run again; resources an interrupted provision made before their id came back are found by
name and released too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from testbed.errors import TestbedError
from testbed.providers.chameleon import ChameleonProvider

if TYPE_CHECKING:
    from testbed.providers.chameleon_chi import Chi


def release(p: ChameleonProvider) -> None:
    """Release floating IPs, servers, the lease and the key pair; safe to run again."""
    if not p.store.resources(p.name) and p.store.testbed(p.name) is None:
        return  # nothing was ever made (or it is all gone already): no credentials needed
    try:
        api = p._connect()
    except TestbedError:
        if p.store.resources(p.name):
            raise  # recorded resources need the API: refuse before any request
        p.progress(f"{p.name}: nothing recorded and no credentials; skipped the search by name")
        return
    if p.store.testbed(p.name) is not None:
        p.store.set_testbed_status(p.name, "destroying")
    failures: list[str] = []
    try:
        _adopt_by_name(p, api)
        _destroy_fips(p, api, failures)
        servers = {r["id"]: r["info"].get("name", r["id"]) for r in p.store.resources(p.name, "server")}
        delete_servers(p, api, servers, failures)
        _destroy_leases(p, api, failures)
        _destroy_fips(p, api, failures, after_lease=True)
        for r in p.store.resources(p.name, "keypair"):
            try:
                with p._step("deleting the key pair", f"key pair {r['id']}"):
                    api.keypair_delete(r["id"])
                p.store.remove_resource(p.name, "keypair", r["id"])
            except TestbedError as e:
                failures.append(e.what)
    except KeyboardInterrupt:
        raise TestbedError(f"destroy of '{p.name}' interrupted; still recorded: {p.recorded()}",
                           where=p._where("testbed", f"lease {p.lease_name}"),
                           fix=f"run 'testbed destroy {p.name}' again", code=130) from None
    except TestbedError as e:
        failures.append(e.what)
    if failures:
        p.store.set_testbed_status(p.name, "destroy-failed")
        raise TestbedError(f"destroy of '{p.name}' left {p.recorded()}: " + "; ".join(failures),
                           where=p._where("API", f"testbed {p.name}"),
                           fix=f"run 'testbed destroy {p.name}' again; if it keeps failing, delete the "
                               "recorded ids in the Chameleon dashboard")
    p.progress(f"{p.name}: lease, servers and floating IPs released")


def _adopt_by_name(p: ChameleonProvider, api: Chi) -> None:
    """Record resources an interrupted run made before their ids came back (found by name)."""
    with p._step("listing leases", f"lease {p.lease_name}"):
        for x in api.leases_named(p.lease_name):
            if x.get("status") not in ("TERMINATED", "DELETED"):
                p.store.add_resource(p.name, "lease", x["id"], name=x.get("name"))
    known = {r["id"] for r in p.store.resources(p.name, "server")}
    with p._step("listing servers", f"servers {p.prefix}-*"):
        for x in api.servers_named(p.prefix + "-"):
            if str(x["id"]) not in known:
                p.store.add_resource(p.name, "server", str(x["id"]), name=x.get("name"),
                                        host=str(x.get("name", ""))[len(p.prefix) + 1:])
    known = {r["id"] for r in p.store.resources(p.name, "fip")}
    with p._step("listing floating IPs", f"floating IPs of {p.prefix}"):
        for f in api.fips():
            if str(f.get("description") or "").startswith(f"testbed {p.prefix} ") and f["id"] not in known:
                p.store.add_resource(p.name, "fip", f["id"], address=f.get("floating_ip_address"))


def _destroy_fips(p: ChameleonProvider, api: Chi, failures: list[str], after_lease: bool = False) -> None:
    for r in p.store.resources(p.name, "fip"):
        thing = f"floating IP {r['info'].get('address', '')} ({r['id']})"
        try:
            if after_lease:  # reserved ones the lease took with it
                with p._step("checking a floating IP", thing):
                    gone = api.fip_get(r["id"]) is None
                if gone:
                    p.store.remove_resource(p.name, "fip", r["id"])
                else:
                    failures.append(f"{thing} still exists")
                continue
            with p._step("releasing a floating IP", thing):
                api.fip_delete(r["id"])
            p.store.remove_resource(p.name, "fip", r["id"])
        except TestbedError as e:
            if r["info"].get("reserved") and not after_lease:
                continue  # a reserved IP may refuse deletion: the lease releases it
            failures.append(e.what)


def delete_servers(p: ChameleonProvider, api: Chi, servers: dict[str, str], failures: list[str] | None = None) -> None:
    """Delete servers (id -> name) and wait until nova no longer knows them; rows removed as they go."""
    pending = {}
    for sid, name in servers.items():
        try:
            with p._step("deleting a server", f"server {name} ({sid})"):
                sent = api.server_delete(sid)
        except TestbedError as e:
            if failures is None:
                raise
            failures.append(e.what)
            continue
        if sent:
            pending[sid] = name
        else:
            p.store.remove_resource(p.name, "server", sid)
    deadline = time.monotonic() + p.destroy_timeout
    while pending:
        for sid, name in list(pending.items()):
            with p._step("waiting for a server to go", f"server {name} ({sid})"):
                srv = api.server_get(sid)
            if srv is None or str(srv.get("status", "")).upper() == "DELETED":
                p.store.remove_resource(p.name, "server", sid)
                pending.pop(sid)
        if not pending:
            return
        if time.monotonic() >= deadline:
            what = f"server(s) still deleting after {int(p.destroy_timeout)} s: {', '.join(pending.values())}"
            if failures is None:
                raise TestbedError(what, where=p._where("nova", "servers"),
                                   fix=f"run 'testbed destroy {p.name}' again later")
            failures.append(what)
            return
        p._sleep(deadline)


def _destroy_leases(p: ChameleonProvider, api: Chi, failures: list[str]) -> None:
    pending = []
    for r in p.store.resources(p.name, "lease"):
        thing = f"lease {r['info'].get('name') or p.lease_name} ({r['id']})"
        try:
            with p._step("deleting the lease", thing):
                sent = api.lease_delete(r["id"])
        except TestbedError as e:
            failures.append(e.what)
            continue
        if sent:
            pending.append(r["id"])
        else:
            p.store.remove_resource(p.name, "lease", r["id"])
    deadline = time.monotonic() + p.destroy_timeout
    while pending:
        for lid in list(pending):
            with p._step("waiting for the lease to go", f"lease {lid}"):
                lease = api.lease_get(lid)
            if lease is None or lease.get("status") in ("TERMINATED", "DELETED"):
                p.store.remove_resource(p.name, "lease", lid)
                pending.remove(lid)
        if not pending:
            return
        if time.monotonic() >= deadline:
            failures.append(f"lease(s) still deleting after {int(p.destroy_timeout)} s: {', '.join(pending)}")
            return
        p._sleep(deadline)
