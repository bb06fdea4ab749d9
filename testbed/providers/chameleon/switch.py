"""A Chameleon testbed's dead-man's switch, cost and orphans.

The lease end is Blazar's own switch: a new lease ends no later than the expiry. For the idle limit, and to release
at the deadline rather than at the next whole lease end, the hosts' agent holds an application credential made for
this testbed alone: keystone ``access_rules`` allow exactly ``DELETE`` of this lease (reservation), these servers
(compute) and these floating IPs (network), and, only when the spec says ``expire_images: true``, the Glance images
this testbed baked that no other testbed boots from (image); nothing else, not even a GET, and it expires a day
after the testbed's deadline. Keystone lets only a password/OIDC login or an *unrestricted* application credential
create one.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from testbed.errors import TestbedError, UsageError
from testbed.expiry import iso
from testbed.providers.chameleon import chi
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.providers.chameleon.chi import Chi
    from testbed.providers.chameleon.cloud import Cloud

APP_CRED = "app-credential"
MARGIN = 86400.0  # the credential outlives the deadline by a day (a late agent can still release)


def check(c: Cloud, e: Expiry) -> None:
    """Refuse, before anything is made, credentials that cannot make the switch's credential."""
    creds = chi.credentials_from_env(site=c.settings.site)
    if creds.auth_type != "v3applicationcredential":
        return
    api = c.api = c.api or c.connect()
    cid = creds.fields.get("application_credential_id", "")
    with c.step("reading your application credential", f"application credential {cid}"):
        own = api.app_cred_get(cid) if cid else None
    if own is not None and not own.get("unrestricted"):
        raise UsageError("the dead-man's switch needs a credential of its own (allowed only to delete this "
                         "testbed's lease, servers and floating IPs), and keystone lets a restricted application "
                         "credential create none",
                         where=c.where("keystone", f"application credential {cid}"),
                         fix="create an application credential with 'unrestricted' ticked (or source the "
                             "project's openrc) for this command; or drop --expire and idle_after")


def _target(endpoint: str, suffix: str) -> tuple[str, str]:
    """(URL, path an access rule must match) of ``suffix`` under a catalog endpoint. keystonemiddleware matches a
    rule against the request's whole path (``request.path``: SCRIPT_NAME + PATH_INFO), which is the URL's path."""
    url = endpoint + suffix
    return url, urlsplit(url).path


def release_plan(c: Cloud, e: Expiry) -> dict[str, Any]:
    """Make this testbed's credential (recorded at once) and the agent's release requests."""
    api = c.api or c.connect()
    leases = [r["id"] for r in c.store.resources(c.name, "lease")]
    servers = [r["id"] for r in c.store.resources(c.name, "server")]
    fips = [r["id"] for r in c.store.resources(c.name, "fip") if not r["info"].get("reserved")]
    with c.step("reading the service catalog", "keystone catalog"):
        blazar, nova, neutron = (api.endpoint(t) for t in ("reservation", "compute", "network"))
    targets = [("reservation", *_target(blazar, f"/leases/{x}")) for x in leases]
    targets += [("compute", *_target(nova, f"/servers/{x}")) for x in servers]
    targets += [("network", *_target(neutron, f"/v2.0/floatingips/{x}")) for x in fips]
    if c.spec.expire_images:  # told to: the images this testbed baked that no other testbed boots from
        baked = [r["id"] for r in c.store.expiring_images(c.name, c.kind)]
        if baked:
            with c.step("reading the service catalog", "keystone catalog"):
                glance = api.endpoint("image")
            targets += [("image", *_target(glance, f"/v2/images/{x}")) for x in baked]
    rules = [{"service": svc, "method": "DELETE", "path": path} for svc, _, path in targets]
    lease_end = _lease_end(c)
    until = max(x for x in (e.expire_at, lease_end, time.time()) if x is not None) + MARGIN
    old = [r["id"] for r in c.store.resources(c.name, APP_CRED)]
    with c.step("creating the dead-man's switch credential", f"application credential {c.prefix}-deadman"):
        cred = api.app_cred_create(f"{c.prefix}-deadman-{int(time.time())}", access_rules=rules,
                                   expires_at=datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%dT%H:%M:%S"),
                                   description=f"testbed {c.name}: may only delete its lease, servers, floating IPs")
    c.store.add_resource(c.name, APP_CRED, str(cred["id"]), name=cred.get("name"), expires=iso(until))
    for cid in old:  # the previous arming's credential: its agent is replaced
        _delete_cred(c, api, cid)
    return {"auth": {"type": "keystone", "auth_url": api.auth_url, "id": cred["id"], "secret": cred["secret"]},
            "requests": [["DELETE", url] for _, url, _ in targets]}


def _delete_cred(c: Cloud, api: Chi, cid: str) -> None:
    with c.step("deleting the dead-man's switch credential", f"application credential {cid}"):
        api.app_cred_delete(cid)
    c.store.remove_resource(c.name, APP_CRED, cid)


def revoke(c: Cloud, api: Chi, failures: list[str]) -> None:
    """Delete the switch's credentials (destroy)."""
    for r in c.store.resources(c.name, APP_CRED):
        try:
            _delete_cred(c, api, r["id"])
        except TestbedError as err:
            failures.append(err.what)


def _lease_end(c: Cloud) -> float | None:
    end = c.store.testbed_info(c.name).get("lease_end")
    if not end:
        return None
    return datetime.strptime(end, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def hours_short_of(c: Cloud, at: float) -> float:
    """Hours the lease must grow to last until ``at`` (0: it already does), rounded up to the minute."""
    end = _lease_end(c)
    if end is None or end >= at:
        return 0.0
    return round((at - end) / 3600 + 1 / 60, 4)


def cost(c: Cloud, table: dict[str, Any]) -> dict[str, Any] | None:
    """Service units per hour: 1 SU per bare-metal node-hour, for the servers held (else the lease's nodes)."""
    leases = c.store.resources(c.name, "lease")
    if not leases:
        return None
    nodes = len(c.store.resources(c.name, "server")) or c.settings.count
    su = float((table.get("chameleon") or {}).get("su_per_node_hour") or 1.0)
    return {"per_hour": nodes * su, "unit": "SU", "since": leases[0]["created"],
            "basis": f"{plural(nodes, 'node')} x {su:g} SU/node-hour ({c.settings.node_type})"}


def planned_cost(c: Cloud, table: dict[str, Any], hosts: int) -> dict[str, Any]:
    """SUs per hour of the servers held, else of the nodes a lease would hold (the spec's count, or the hosts a
    suite asks for when more)."""
    nodes = len(c.store.resources(c.name, "server")) or max(c.settings.count, hosts)
    su = float((table.get("chameleon") or {}).get("su_per_node_hour") or 1.0)
    return {"per_hour": nodes * su, "unit": "SU",
            "basis": f"{plural(nodes, 'node')} x {su:g} SU/node-hour ({c.settings.node_type})"}


def lease_left(c: Cloud, now: float) -> tuple[float | None, str]:
    """Seconds to the lease's end (as recorded); not provisioned yet: the lease the spec asks for."""
    end = _lease_end(c)
    if end is not None:
        info = c.store.testbed_info(c.name)
        return end - now, f"its lease end at {info.get('lease_end')}"
    if c.store.testbed(c.name) is None and not c.settings.end:
        return c.settings.hours * 3600, f"its spec's lease of {c.settings.hours:g} h (not provisioned yet)"
    return None, "no lease end recorded"


def orphans(c: Cloud) -> list[dict[str, Any]]:
    """Leases, servers and floating IPs named for this testbed at the site that state does not record."""
    api = c.connect()
    known = {r["id"] for r in c.store.resources(c.name)}
    recorded = c.store.testbed(c.name) is not None

    def fix(cli: str) -> str:  # a recorded testbed's destroy adopts them by name; else the OpenStack client
        return f"testbed destroy {c.name} (it adopts them by name)" if recorded else cli

    out: list[dict[str, Any]] = []
    with c.step("listing leases", f"lease {c.lease_name}"):
        out += [{"kind": "lease", "id": x["id"], "release": fix(f"openstack reservation lease delete {x['id']}")}
                for x in api.leases_named(c.lease_name)
                if x["id"] not in known and x.get("status") not in ("TERMINATED", "DELETED")]
    with c.step("listing servers", f"servers {c.prefix}-*"):
        out += [{"kind": "server", "id": str(x["id"]), "release": fix(f"openstack server delete {x['id']}")}
                for x in api.servers_named(c.prefix + "-") if str(x["id"]) not in known]
    with c.step("listing floating IPs", f"floating IPs of {c.prefix}"):
        out += [{"kind": "fip", "id": f["id"], "release": fix(f"openstack floating ip delete {f['id']}")}
                for f in api.fips()
                if str(f.get("description") or "").startswith(f"testbed {c.prefix} ") and f["id"] not in known]
    return out
