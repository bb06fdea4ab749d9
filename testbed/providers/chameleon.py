"""Chameleon Cloud: a lease of bare-metal nodes, a server on each, a floating IP each, through python-chi.

provision: lease dates and credentials checked (no network) -> lease with a node reservation (+ reserved
floating IPs), its id recorded at once -> wait ACTIVE (Blazar takes minutes) -> the testbed's key pair -> one
server per node on the reservation, each id recorded the moment nova returns it -> wait ACTIVE (bare metal: 10-20
minutes) -> a floating IP per server (recorded, then bound) -> wait until SSH answers (the base class: a real
handshake, host keys pinned, a login) -> hosts in state (user from the spec: ``cc``). Running it again reuses
what exists (by recorded id, else by name). Every wait polls with the base's :class:`Pacer` and says how
long it has waited; a status that can never turn into the one waited for fails at once.

destroy (:mod:`testbed.providers.chameleon_release`): floating IPs, servers, the lease and the key pair, each
row removed once the cloud says it is gone, so a destroy that fails half-way can simply be run again.

python-chi lives behind :mod:`testbed.providers.chameleon_chi` and is imported only when a method needs it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from testbed import paths
from testbed.errors import TestbedError
from testbed.hosts import Host
from testbed.providers.base import Made, Pacer, Provider
from testbed.providers.settings import ChameleonSettings
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.providers.chameleon_chi import ApiError, Chi
    from testbed.spec import TestbedSpec

BLAZAR_FMT = "%Y-%m-%d %H:%M"
LEASE_JSON_FMT = "%Y-%m-%dT%H:%M:%S.%f"
# Blazar's lease statuses (blazar.status.LeaseStatus): stable PENDING, ACTIVE, TERMINATED, ERROR; transitional
# CREATING, STARTING, UPDATING, TERMINATING, DELETING. A deleted lease is gone (404), never "DELETED".
LEASE_GONE = ("TERMINATED", "TERMINATING", "DELETING")
# nova statuses (nova.api.openstack.common._STATE_MAP) a server being built never leaves by itself
SERVER_STUCK = ("SHUTOFF", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED", "RESCUE", "SOFT_DELETED",
                "DELETED")
SSH_PORT = 22
REPORT_EVERY = 30.0  # seconds between "still waiting" progress lines
WARN_BEFORE_END = timedelta(hours=1)
BACKOFF = 1.5  # each poll waits this much longer than the last, up to BACKOFF_CAP x the first
BACKOFF_CAP = 6.0
JITTER = 0.2  # +-20 %: many testbeds polling one site do not fall into step


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _parse_lease_time(value: str) -> datetime:
    """Blazar's lease times (naive UTC): '2026-11-22T01:41:00.000000' or '2026-11-22 01:41'."""
    for fmt in (LEASE_JSON_FMT, "%Y-%m-%dT%H:%M:%S", BLAZAR_FMT, "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(value.rstrip("Z"), fmt)
        except ValueError:
            continue
    raise ValueError(f"not a lease time: {value!r}")


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(secs: float) -> str:
    """A duration for progress lines: '45s', '3m 05s', '1h 02m'."""
    secs = int(max(0, secs))
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m {secs % 60:02d}s"
    return f"{secs // 3600}h {secs % 3600 // 60:02d}m"


def _span(td: timedelta) -> str:
    secs = int(td.total_seconds())
    sign = "-" if secs < 0 else ""
    secs = abs(secs)
    h, m = secs // 3600, (secs % 3600) // 60
    return f"{sign}{h}h {m:02d}m" if h else f"{sign}{m}m"


def snapshots(site: str, flavor: str) -> bool:
    """Whether Nova can snapshot (createImage) a server of ``flavor`` at ``site``: not on a bare-metal site.

    Chameleon's bare-metal sites (CHI@TACC, CHI@UC, CHI@NCAR, ...; chi-in-a-box sites are named the same way) run
    their servers on Ironic nodes with the ``baremetal`` flavor. Nova's Ironic driver has no ``snapshot``
    (openstack/nova nova/virt/ironic/driver.py defines none; the base ``ComputeDriver.snapshot`` in
    nova/virt/driver.py raises NotImplementedError), so after createImage's 202 the compute manager's
    ``snapshot_instance`` fails and its ``delete_image_on_error`` decorator deletes the queued image
    (nova/compute/manager.py): Glance then answers 404 for it. Chameleon's route is ``cc-snapshot``, run on the node
    (ChameleonCloud/cc-snapshot: ``sudo cc-snapshot [snapshot_name]`` tars the root file system into a qcow2 and
    uploads it to the site's Glance with the user's own credentials, asked for on its terminal unless OS_TOKEN or
    OS_USERNAME/OS_PASSWORD are set; it runs only where the node's vendor data names a site, tacc or uc). Decided
    from the spec (site, flavor), so it is known before any request. Not from the lease: Blazar's ``physical:host``
    reservations, the only kind this provider makes, reserve KVM hypervisors as well as Ironic nodes; and
    Chameleon's own KVM site (KVM@TACC) reserves flavors (``flavor:instance``, python-chi's
    ``add_flavor_reservation``), which this provider does not lease, so it cannot provision there: what snapshots is
    a KVM cloud with host reservations under another name.
    """
    return not site.upper().startswith("CHI@") and flavor != "baremetal"


def auth_fix(kind: str, source: str, site: str) -> str:
    """What to do when the site refuses credentials of auth type ``kind`` (read from ``source``)."""
    if kind == "v3applicationcredential":
        return (f"the application credential ({source}) may have expired or been deleted, or be another "
                f"site's: create one in the {site} dashboard (Identity > Application Credentials) and source "
                "its openrc (or use its clouds.yaml)")
    if kind == "v3oidcpassword":
        return ("check your Chameleon CLI password (the openrc asks for it) and the openrc's OS_USERNAME and "
                f"OS_PROJECT_ID; or create an application credential in the {site} dashboard and source its "
                "openrc")
    if kind == "v3oidcaccesstoken":
        return ("the access token has expired (they last minutes) or the Hub could not renew it: in Chameleon's "
                "JupyterHub, log in again (File > Hub Control Panel > Stop My Server, then start it); "
                "elsewhere, export a fresh OS_ACCESS_TOKEN, or create an application credential in the "
                f"{site} dashboard and source its openrc")
    return f"source a fresh openrc for {site}; credentials belong to one site"


class ChameleonProvider(Provider):
    """Bare-metal nodes on a Chameleon lease."""

    costs_money = True
    capabilities = frozenset({"extend", "repair", "expire"})
    repair_how = "replaced by a new server on the same lease"
    kind = "chameleon"
    poll_interval: float = 5.0  # the first pause between status polls; backoff takes it to 30 s (tests lower it)
    destroy_timeout: float = 900.0  # waiting for deletions to finish
    http_timeout: float = 60.0  # every single HTTP request

    images_why = ""  # a Glance image of a server, made by Nova's createImage where it snapshots (bake_refusal)
    image_timeout: float = 3600.0  # a snapshot's upload (a bare-metal disk takes minutes)

    # names --------------------------------------------------------------------------------------------
    @property
    def settings(self) -> ChameleonSettings:
        p = self.spec.provider
        assert isinstance(p, ChameleonSettings)
        return p

    @property
    def tag(self) -> str:
        """Short hash of the state home: two checkouts in one project never share names."""
        return hashlib.sha256(str(paths.state_home()).encode()).hexdigest()[:6]

    @property
    def prefix(self) -> str:
        return f"tb-{self.name}-{self.tag}"

    @property
    def lease_name(self) -> str:
        return self.prefix

    @property
    def keypair_name(self) -> str:
        return self.prefix

    def host_names(self) -> list[str]:
        return [f"node{i}" for i in range(self.settings.count)]

    def server_name(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    # plumbing -----------------------------------------------------------------------------------------
    def _connect(self) -> Chi:
        """Credentials from the environment (a clear error before any request), then python-chi."""
        from testbed.providers import chameleon_chi

        creds = chameleon_chi.credentials_from_env(site=self.settings.site)
        self._auth = (creds.auth_type, creds.source)
        return chameleon_chi.Chi(creds, site=self.settings.site, project=self.settings.project,
                                 http_timeout=self.http_timeout)

    def _where(self, service: str, thing: str) -> str:
        return f"Chameleon {self.settings.site}, {service}: {thing}"

    _auth: tuple[str, str] = ("", "")  # the credentials' auth type and where they came from

    def _auth_fix(self) -> str:
        kind, source = self._auth
        return auth_fix(kind, source, self.settings.site)

    def _error(self, e: ApiError, doing: str, thing: str) -> TestbedError:
        """One clear message for a failed call: what happened, where, what to do."""
        s = self.settings
        m = e.message
        low = m.lower()
        where = self._where(e.service or "API", thing)
        status = f"HTTP {e.status}" if e.status else "no answer"
        after = (f"run 'testbed destroy {self.name}' to release what was made (ids are recorded), "
                 f"or 'testbed provision {self.name}' to retry (what exists is reused)")
        if e.kind == "hub":
            from testbed.providers.chameleon_chi import HUB_FIX

            return TestbedError(f"no fresh access token while {doing}: {m}", where=self._where("JupyterHub", thing),
                                fix=HUB_FIX)
        if e.kind == "auth":
            return TestbedError(f"Chameleon refused the credentials while {doing} ({status}: {m})", where=where,
                                fix=self._auth_fix())
        if e.kind == "connect":
            return TestbedError(f"cannot reach Chameleon while {doing}: {m}", where=where,
                                fix="check OS_AUTH_URL and your network connection, then retry")
        if e.kind == "endpoint":
            return TestbedError(f"Chameleon's catalog has no {e.service or 'service'} endpoint for {s.site}: {m}",
                                where=where, fix=f"check that OS_AUTH_URL is the keystone of {s.site} and that "
                                                 "provider.site matches OS_REGION_NAME")
        if "quota" in low or e.status == 413 or "overlimit" in low or "over limit" in low:
            return TestbedError(f"quota exceeded while {doing} ({status}: {m})", where=where,
                                fix=f"{after}; free servers or floating IPs in the project, or ask the PI for a "
                                    "larger quota")
        if "not enough floating ips available" in low:  # blazar's floating IP plugin: none free for the period
            return TestbedError(f"the floating-IP pool is empty for the lease period: Chameleon has no "
                                f"{s.count} reservable floating IPs free then, while {doing} ({status}: {m})",
                                where=where,
                                fix="pick other dates (provider.start/end/hours), or set provider.floating_ips: "
                                    "false (fixed IPs, reachable only from inside Chameleon)")
        if "no more ip addresses" in low:  # neutron: the public network is out of addresses
            return TestbedError(f"the floating-IP pool is empty while {doing} ({status}: {m})", where=where,
                                fix=f"{after}; wait for addresses to free up, or set provider.floating_ips: "
                                    "false (fixed IPs, reachable only from inside Chameleon)")
        if "not enough hosts available" in low or "not enough resources available" in low:
            return TestbedError(f"no {s.count} free {s.node_type} {'node' if s.count == 1 else 'nodes'} for the lease "
                                f"period while {doing} ({status}: {m})", where=where,
                                fix="pick other dates (provider.start/end/hours), fewer nodes or another "
                                    f"node_type (check its spelling); see availability in the {s.site} host "
                                    "calendar")
        if "maximum lease duration" in low:  # Chameleon's enforcement (MaxLeaseDurationFilter)
            return TestbedError(f"the lease is longer than Chameleon allows while {doing} ({status}: {m})",
                                where=where, fix="shorten provider.hours (or start/end) to 7 days at most; "
                                                 f"'testbed extend {self.name}' adds time later")
        if "invalid lease status" in low:  # blazar: the lease is in a transitional status
            return TestbedError(f"Blazar refused {doing}: the lease is changing status (starting, updating or "
                                f"being deleted) ({status}: {m})", where=where,
                                fix="wait a minute and run the command again")
        if e.service == "blazar" and e.status in (400, 403) and "lease" in doing:
            # e.g. Chameleon's allocation check (blazar's ExternalServiceFilter), whose words vary
            return TestbedError(f"Blazar refused {doing} ({status}: {m})", where=where,
                                fix="Chameleon refuses a lease the project's allocation cannot pay for (node-hours "
                                    "x nodes): check its remaining SUs and end date on chameleoncloud.org, or "
                                    "ask for a shorter lease or fewer nodes")
        return TestbedError(f"{doing} failed ({status}: {m})", where=where, fix=after)

    @contextmanager
    def _step(self, doing: str, thing: str) -> Iterator[None]:
        """Turn an ApiError inside into one TestbedError naming what was being done to what."""
        from testbed.providers.chameleon_chi import ApiError

        try:
            yield
        except ApiError as e:
            raise self._error(e, doing, thing) from None

    def backoff(self, deadline: float) -> Pacer:
        """The pauses of one wait that ends at ``deadline`` (monotonic)."""
        return Pacer(self.poll_interval, deadline, cap=self.poll_interval * BACKOFF_CAP, multiplier=BACKOFF,
                     jitter=JITTER)

    # provision ----------------------------------------------------------------------------------------
    _api: Chi | None = None
    lease_end_cap: float | None = None  # a new lease ends no later than this (epoch): the testbed's expiry
    _renewed: set[str]  # hosts whose server was (re)created by this provision

    def preflight(self) -> None:
        """Refuse bad lease dates, then missing credentials, before any request."""
        from testbed.providers import chameleon_lease

        chameleon_lease.dates(self, new=not self.store.resources(self.name, "lease"))
        self._api = self._connect()

    def info(self) -> dict[str, Any]:
        return {"site": self.settings.site, "lease_name": self.lease_name}

    def create(self, public_key: str | None) -> Made:
        """Lease, key pair, servers, floating IPs; ids recorded as they come back; what exists is reused."""
        assert public_key is not None
        api = self._api or self._connect()
        self._renewed = set()
        from testbed.providers import chameleon_lease

        lease = chameleon_lease.ensure_lease(self, api)
        self._ensure_keypair(api, public_key)
        servers = self._ensure_servers(api, lease)
        details = self._wait_servers(api, servers)
        addresses = self._ensure_addresses(api, lease, servers, details)
        private = {h: (self._server_ips(details[h], "fixed") or [""])[0] for h in servers}
        return Made(self._hosts(servers, addresses, private), renewed=self._renewed)

    def interrupted(self) -> TestbedError:
        return TestbedError(f"provision of '{self.name}' interrupted; recorded so far: {self.recorded()}",
                            where=self._where("testbed", f"lease {self.lease_name}"),
                            fix=f"run 'testbed destroy {self.name}' to release them (a lease costs "
                                f"allocation hours), or 'testbed provision {self.name}' to resume", code=130)

    def _ensure_keypair(self, api: Chi, public_key: str) -> None:
        self.store.add_resource(self.name, "keypair", self.keypair_name)  # the name is the id
        with self._step("uploading the key pair", f"key pair {self.keypair_name}"):
            api.keypair_ensure(self.keypair_name, public_key)

    def _ensure_servers(self, api: Chi, lease: dict[str, Any]) -> dict[str, str]:
        """One server per host on the node reservation; host -> server id (each recorded as it comes back)."""
        s = self.settings
        from testbed.providers import chameleon_lease

        rid = chameleon_lease.reservation(lease, "physical:host")
        if rid is None:
            raise TestbedError(f"lease {self.lease_name} has no node reservation",
                               where=self._where("blazar", f"lease {lease['id']}"),
                               fix=f"run 'testbed destroy {self.name}', then provision again")
        recorded = {r["info"].get("host"): r["id"] for r in self.store.resources(self.name, "server")}
        with self._step("listing servers", f"servers {self.prefix}-*"):
            existing = {x.get("name"): x for x in api.servers_named(self.prefix + "-")}
        out: dict[str, str] = {}
        for host in self.host_names():
            name = self.server_name(host)
            sid = recorded.get(host)
            srv = None
            if sid:
                with self._step("looking up a server", f"server {name} ({sid})"):
                    srv = api.server_get(sid)
                if srv is None:
                    self.store.remove_resource(self.name, "server", sid)
                    sid = None
            if sid is None and name in existing:
                srv = existing[name]
                sid = str(srv["id"])
                self.store.add_resource(self.name, "server", sid, host=host, name=name)
            if srv is not None and sid is not None and srv.get("status") in ("ERROR", "DELETED", "SOFT_DELETED"):
                self.progress(f"server {name}: in {srv.get('status')}, replacing it")
                self._delete_servers(api, {sid: name})
                sid = None
            if sid is None:
                booted = self.booted_image()
                image = str(booted["location"]) if booted else s.image  # an image of the set-up: its name
                self.progress(f"server {name}: creating ({image}, {s.flavor})")
                with self._step(f"creating server {name} ({len(out)} of {s.count} made so far)", f"server {name}"):
                    sid = api.server_create(name, reservation_id=rid, image=image, flavor=s.flavor,
                                            key_name=self.keypair_name, network=s.network)
                self.store.add_resource(self.name, "server", sid, host=host, name=name)  # before waiting
                self._renewed.add(host)
            out[host] = sid
        return out

    def _wait_servers(self, api: Chi, servers: dict[str, str]) -> dict[str, dict[str, Any]]:
        """Poll nova (with backoff) until every server is ACTIVE; fail at once on ERROR or a status a build
        never leaves (SHUTOFF, DELETED...), and after provider.server_timeout."""
        s = self.settings
        start = time.monotonic()
        deadline = start + s.server_timeout
        pause = self.backoff(deadline)
        pending = dict(servers)
        done: dict[str, dict[str, Any]] = {}
        seen: dict[str, str] = {}
        last_report = start
        while True:
            for host, sid in list(pending.items()):
                name = self.server_name(host)
                where = self._where("nova", f"server {name} ({sid})")
                with self._step("waiting for a server", f"server {name} ({sid})"):
                    srv = api.server_get(sid)
                if srv is None:
                    raise TestbedError(f"server {name} disappeared while building", where=where,
                                       fix=f"run 'testbed provision {self.name}' again to replace it")
                status = str(srv.get("status") or "UNKNOWN").upper()
                task = srv.get("OS-EXT-STS:task_state")
                shown = f"{status} ({task})" if task and status == "BUILD" else status
                if status == "ACTIVE":
                    done[host] = srv
                    pending.pop(host)
                    self.progress(f"server {name}: ACTIVE after {_clock(time.monotonic() - start)}")
                elif status == "ERROR":
                    fault = (srv.get("fault") or {}).get("message") or "nova gives no reason"
                    raise TestbedError(f"server {name} went to ERROR: {fault}", where=where,
                                       fix=f"run 'testbed provision {self.name}' to replace it, or 'testbed destroy "
                                           f"{self.name}'; 'No valid host' means the reservation has no free node")
                elif status in SERVER_STUCK:
                    raise TestbedError(f"server {name} is {status} while building: it will not become ACTIVE by "
                                       "itself", where=where,
                                       fix=f"run 'testbed destroy {self.name}' and provision again (someone or "
                                           "something changed the server outside testbed)")
                elif seen.get(host) != shown:
                    self.progress(f"server {name}: {shown}")
                seen[host] = shown
            if not pending:
                return done
            now = time.monotonic()
            if now >= deadline:
                names = ", ".join(f"{self.server_name(h)} ({seen.get(h)})" for h in pending)
                raise TestbedError(f"{plural(len(pending), 'server')} not ACTIVE after {s.server_timeout} s: {names}",
                                   where=self._where("nova", f"reservation of lease {self.lease_name}"),
                                   fix=f"bare metal takes 10-20 min to deploy: run 'testbed provision {self.name}' "
                                       "again to keep waiting (or raise provider.server_timeout); "
                                       f"'testbed destroy {self.name}' releases everything")
            if now - last_report >= REPORT_EVERY:
                waiting = ", ".join(f"{h} {seen.get(h)}" for h in pending)
                self.progress(f"servers: {len(done)} of {len(servers)} ACTIVE after {_clock(now - start)} (gives up "
                              f"at {_clock(s.server_timeout)}); waiting for {waiting}")
                last_report = now
            pause.sleep()

    @staticmethod
    def _server_ips(srv: dict[str, Any], kind: str) -> list[str]:
        out = []
        for addrs in (srv.get("addresses") or {}).values():
            for a in addrs:
                if a.get("OS-EXT-IPS:type") == kind and a.get("version", 4) == 4:
                    out.append(a["addr"])
        return out

    def _ensure_addresses(self, api: Chi, lease: dict[str, Any], servers: dict[str, str],
                          details: dict[str, dict[str, Any]]) -> dict[str, str]:
        """host -> address to SSH to: a floating IP per server (recorded, then bound), else its fixed IP."""
        s = self.settings
        if not s.floating_ips:
            out = {}
            for host in servers:
                fixed = self._server_ips(details[host], "fixed")
                if not fixed:
                    raise TestbedError(f"server {self.server_name(host)} has no fixed IPv4 address",
                                       where=self._where("nova", f"server {servers[host]}"),
                                       fix=f"check provider.network ({s.network}); destroy and provision again")
                out[host] = fixed[0]
            return out
        from testbed.providers import chameleon_lease

        fip_rid = chameleon_lease.reservation(lease, "virtual:floatingip") if s.reserve_floating_ips else None
        recorded = {r["info"].get("host"): r for r in self.store.resources(self.name, "fip")}
        used = {r["id"] for r in recorded.values()}
        out = {}
        for host, sid in servers.items():
            name = self.server_name(host)
            thing = f"floating IP for {name}"
            fip = None
            r = recorded.get(host)
            if r:
                with self._step("looking up a floating IP", thing):
                    fip = api.fip_get(r["id"])
                if fip is None:
                    self.store.remove_resource(self.name, "fip", r["id"])
            if fip is None:
                bound = self._server_ips(details[host], "floating")
                if bound:  # bound by an interrupted run before its id was recorded
                    with self._step("looking up a floating IP", thing):
                        found = api.fips(floating_ip_address=bound[0])
                    fip = found[0] if found else None
            if fip is None and fip_rid:
                with self._step("listing the lease's floating IPs", thing):
                    free = [f for f in api.fips() if f"reservation:{fip_rid}" in (f.get("tags") or [])
                            and not f.get("port_id") and f["id"] not in used]
                if not free:
                    raise TestbedError(f"the lease's reserved floating IPs are all in use or missing ({thing})",
                                       where=self._where("neutron", f"reservation {fip_rid}"),
                                       fix=f"run 'testbed destroy {self.name}', then provision again")
                fip = free[0]
            if fip is None:
                with self._step(f"allocating a floating IP for {name}", thing):
                    fip = api.fip_allocate(description=f"testbed {self.prefix} {host}")
            used.add(fip["id"])
            self.store.add_resource(self.name, "fip", fip["id"], host=host, address=fip["floating_ip_address"],
                                    reserved=bool(fip_rid))
            if not fip.get("port_id"):
                with self._step(f"attaching floating IP {fip['floating_ip_address']} to {name}", thing):
                    fip = api.fip_bind(fip["id"], sid)
            self.progress(f"{host}: floating IP {fip['floating_ip_address']}")
            out[host] = str(fip["floating_ip_address"])
        return out

    def _hosts(self, servers: dict[str, str], addresses: dict[str, str],
               private: dict[str, str] | None = None) -> list[Host]:
        """The hosts; ``private``: each server's fixed IP (what the nodes reach each other at)."""
        s = self.settings
        return [Host(name=host, address=addresses[host], port=SSH_PORT, user=self.spec.user,
                     groups=self.spec.groups_for(host, i),
                     facts={"server_id": servers[host], "server_name": self.server_name(host),
                            "site": s.site, "node_type": s.node_type, "image": s.image,
                            **({"private_address": fixed} if (fixed := (private or {}).get(host)) else {})})
                for i, host in enumerate(self.host_names())]

    def ssh_fix(self, h: Host) -> str:
        return (f"a node can take minutes after ACTIVE to start sshd: run 'testbed provision {self.name}' again to "
                f"keep waiting (or raise provider.ssh_timeout); check that the image ({self.settings.image}) runs "
                f"sshd; 'testbed destroy {self.name}' releases everything")

    def discard(self, host: Host) -> list[str]:
        """Replace a failed host's server: delete it (its node goes back to the lease's reservation); ``create``
        makes a new one on the same lease and binds the host's floating IP to it again."""
        api = self._api or self._connect()
        servers = {r["id"]: r["info"].get("name") or self.server_name(host.name)
                   for r in self.store.resources(self.name, "server") if r["info"].get("host") == host.name}
        if servers:
            self.progress(f"{host.name}: deleting server {', '.join(servers.values())} to replace it")
            self._delete_servers(api, servers)
        return [host.name]

    def repair_fix(self, h: Host) -> str:
        return (f"'testbed provision {self.name} --repair {h.name}' again (a new server takes 10-20 min); if the "
                "lease has no free node left, extend or make a new lease; 'testbed destroy "
                f"{self.name}' releases everything")

    # destroy ------------------------------------------------------------------------------------------
    def release(self) -> None:
        """Release floating IPs, servers, the lease and the key pair; safe to run again."""
        from testbed.providers import chameleon_release

        chameleon_release.release(self)

    def _delete_servers(self, api: Chi, servers: dict[str, str], failures: list[str] | None = None) -> None:
        """Delete servers (id -> name) and wait until nova no longer knows them; rows removed as they go."""

        from testbed.providers import chameleon_release

        chameleon_release.delete_servers(self, api, servers, failures)

    # status, extend, refresh --------------------------------------------------------------------------
    # images: Nova's createImage of a server, a private Glance image ---------------------------------
    @classmethod
    def base_image(cls, spec: TestbedSpec) -> str:
        """The site, its base image and the node type: an image baked on one node type (its architecture, its
        drivers) is never booted on another, so a lease's reservation always fits the images it boots."""
        p = spec.provider
        assert isinstance(p, ChameleonSettings)
        return f"chameleon {p.site} {p.image} {p.node_type}"

    def bake_refusal(self, profile: str | None = None) -> TestbedError | None:
        """A bare-metal site's refusal (:func:`snapshots`): what, where, and cc-snapshot as the way round."""
        s = self.settings
        if snapshots(s.site, s.flavor):
            return None
        first = self.host_names()[0]
        name = f"testbed-{self.name}-{profile or 'base'}"
        return TestbedError(
            f"cannot bake an image of '{self.name}': {s.site} is a bare-metal site and its nodes (Ironic, flavor "
            f"{s.flavor}) have no Nova snapshot (createImage); nothing was asked of the site or the hosts",
            where=self._where("nova", f"testbed {self.name}"),
            fix=f"make the image on the node with Chameleon's cc-snapshot, which asks for your Chameleon username "
                f"and password: 'testbed ssh {self.name} {first}', then 'sudo cc-snapshot {name}' (it uploads the "
                f"image {name} to {s.site}'s Glance in minutes); boot new testbeds from it with provider.image: "
                f"{name} in their spec (their set-up runs over it and finds little to change). Or rely on the "
                f"content address: an unchanged 'testbed setup {self.name}' is skipped")

    def bake_image(self, host: str, key: str, record: str,
                   note: Callable[[str, str], None] | None = None) -> dict[str, Any]:
        """Write ``record`` on ``host``, then Nova's createImage of its server (a private image in the project) and
        wait until Glance has it ``active`` (queued, saving: the disk's upload; killed: it failed)."""
        from testbed import remote
        from testbed.paths import IMAGE_RECORD

        refused = self.bake_refusal()
        if refused is not None:  # before the record is written or nova asked
            raise refused
        sid = next((r["id"] for r in self.store.resources(self.name, "server") if r["info"].get("host") == host),
                   None)
        if sid is None:
            raise TestbedError(f"no server is recorded for {host}", where=f"testbed {self.name}",
                               fix=f"testbed provision {self.name}")
        write = (f'mkdir -p "$HOME/{os.path.dirname(IMAGE_RECORD)}" && printf %s {shlex.quote(record)} > '
                 f'"$HOME/{IMAGE_RECORD}" && sync')
        res = remote.run(self.name, [host], write, timeout=60)[0]
        if not res.ok:
            raise TestbedError(f"could not write the image's record on {host}: {res.error or res.stderr.strip()}",
                               where=f"testbed {self.name}: {host}", fix=f"testbed status {self.name} --probe")
        name = f"testbed-{key[:12]}"
        api = self._connect()
        with self._step("making an image of the server (createImage)", f"server {self.server_name(host)}"):
            iid = api.server_create_image(sid, name, {"testbed_key": key, "testbed_host": host})
        if note is not None:
            note(iid, name)
        deadline = time.monotonic() + self.image_timeout
        pause = self.backoff(deadline)
        status = ""
        while True:  # bounded by the deadline
            with self._step("waiting for the image", f"image {name} ({iid})"):
                img = api.image_get(iid)
            if img is None:
                raise TestbedError(
                    f"the site deleted the image {name} of {host} before it was saved: its compute driver did not "
                    "snapshot the server", where=self._where("nova", f"server {self.server_name(host)}"),
                    fix="bare-metal nodes (Ironic) have no Nova snapshot: run 'sudo cc-snapshot' on the host, or "
                        f"skip images: 'testbed setup {self.name}' is skipped by its content address when unchanged")
            if img.get("status") != status:
                status = str(img.get("status"))
                self.progress(f"image {name}: {status}")
                pause.reset()
            if status == "active":
                break
            if status in ("killed", "deleted", "pending_delete", "deactivated"):
                raise TestbedError(f"the image {name} of {host} ended {status}", where=self._where("glance", iid),
                                   fix=f"testbed image prune {iid}; then 'testbed image bake {self.name}' again")
            if time.monotonic() >= deadline:
                raise TestbedError(f"the image {name} of {host} was still {status} after {int(self.image_timeout)} s",
                                   where=self._where("glance", iid),
                                   fix=f"it is recorded: 'testbed image list' shows it; 'testbed image prune {iid}' "
                                       "deletes it")
            pause.sleep()
        return {"id": iid, "location": name, "size": int(img.get("size") or 0),
                "info": {"status": status, "site": self.settings.site, "visibility": img.get("visibility"),
                         "node_type": self.settings.node_type}}

    def delete_image(self, image: dict[str, Any]) -> None:
        api = self._connect()
        with self._step("deleting an image", f"image {image.get('location')} ({image['id']})"):
            api.image_delete(str(image["id"]))

    def describe(self, now: datetime | None = None) -> dict[str, Any]:
        """Lease end from state (no network), with a warning when it is less than an hour away."""
        from testbed.providers import chameleon_lease

        return chameleon_lease.describe(self, now)

    def extend(self, hours: float) -> str:
        """Move the lease end ``hours`` later (blazar PUT /leases/{id}); returns the new end (ISO, UTC)."""
        from testbed.providers import chameleon_lease

        return chameleon_lease.extend(self, hours)

    # the dead-man's switch, the ledger (testbed.providers.chameleon_switch) ------------------------------
    def check_switch(self, expiry: Expiry) -> None:
        from testbed.providers import chameleon_switch

        self.lease_end_cap = expiry.expire_at
        chameleon_switch.check(self, expiry)

    def switch_release(self, expiry: Expiry) -> dict[str, Any]:
        from testbed.providers import chameleon_switch

        return chameleon_switch.release_plan(self, expiry)

    def disarm_switch(self) -> None:
        """The agents stopped, then their credential deleted (the lease end stays: Blazar's own switch)."""
        super().disarm_switch()
        from testbed.providers import chameleon_switch

        if self.store.resources(self.name, chameleon_switch.APP_CRED):
            failures: list[str] = []
            chameleon_switch.revoke(self, self._api or self._connect(), failures)
            if failures:
                raise TestbedError("; ".join(failures), where=self._where("keystone", "application credentials"),
                                   fix=f"run the command again, or delete the credentials named {self.prefix}-"
                                       "deadman-* in the dashboard (Identity > Application Credentials)")

    def hours_short_of(self, at: float) -> float:
        from testbed.providers import chameleon_switch

        return chameleon_switch.hours_short_of(self, at)

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        from testbed.providers import chameleon_switch

        return chameleon_switch.cost(self, prices)

    def planned_cost(self, prices: dict[str, Any], hosts: int) -> dict[str, Any] | None:
        from testbed.providers import chameleon_switch

        return chameleon_switch.planned_cost(self, prices, hosts)

    def lease_left(self, now: float) -> tuple[float | None, str]:
        from testbed.providers import chameleon_switch

        return chameleon_switch.lease_left(self, now)

    def orphans(self) -> list[dict[str, Any]]:
        from testbed.providers import chameleon_switch

        return chameleon_switch.orphans(self)

    def reported_states(self) -> dict[str, str] | None:
        """Up (ACTIVE), gone (no server), or the server's status in lower case (error, shutoff, ...), per host."""
        return {h.name: h.state for h in self.refresh()}

    def refresh(self) -> list[Host]:
        """Hosts with their servers' real state (network)."""
        hosts = self.store.hosts(self.name)
        if not hosts:
            return hosts
        api = self._connect()
        for h in hosts:
            sid = h.facts.get("server_id")
            if not sid:
                continue
            with self._step("reading a server", f"server {h.facts.get('server_name', h.name)}"):
                srv = api.server_get(str(sid))
            h.state = "gone" if srv is None else ("up" if srv.get("status") == "ACTIVE"
                                                  else str(srv.get("status", "unknown")).lower())
            self.store.set_host_state(self.name, h.name, h.state)
        return hosts
