"""Chameleon Cloud: a lease of bare-metal nodes, a server on each, a floating IP each, through python-chi.

provision: lease dates and credentials checked (no network) -> lease with a node reservation (+ reserved
floating IPs), its id recorded at once -> wait ACTIVE (Blazar takes minutes) -> the testbed's key pair -> one
server per node on the reservation, each id recorded the moment nova returns it -> wait ACTIVE (bare metal: 10-20
minutes) -> a floating IP per server (recorded, then bound) -> wait until SSH answers (the base class: a real
handshake, host keys pinned, a login) -> hosts in state (user from the spec: ``cc``). Running it again reuses
what exists (by recorded id, else by name). Every wait polls with the base's :class:`Pacer` and says how
long it has waited; a status that can never turn into the one waited for fails at once.

destroy (:mod:`testbed.providers.chameleon.release`): floating IPs, servers, the lease and the key pair, each
row removed once the cloud says it is gone, so a destroy that fails half-way can simply be run again.

python-chi lives behind :mod:`testbed.providers.chameleon.chi` and is imported only when a method needs it.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from testbed import remote
from testbed.capabilities import BakesImages, Capability, Extends, Repairs
from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.hosts import Host
from testbed.paths import IMAGE_RECORD
from testbed.providers.base import AgentSwitch, Made, Progress, Provider, _quiet
from testbed.providers.chameleon import lease as leases
from testbed.providers.chameleon import release as releases
from testbed.providers.chameleon import switch
from testbed.providers.chameleon.cloud import REPORT_EVERY, SERVER_STUCK, SSH_PORT, Cloud, _clock
from testbed.providers.chameleon.settings import ChameleonSettings
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.providers.chameleon.chi import Chi
    from testbed.spec import TestbedSpec
    from testbed.state import Store


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


class ChameleonProvider(Provider, Extends, Repairs, AgentSwitch, BakesImages):
    """Bare-metal nodes on a Chameleon lease."""

    # images: a Glance image of a server, made by Nova's createImage where it snapshots (bake_refusal)
    lacking = {Capability.KILL_HOST: "testbed does not drive a bare-metal node's power (Ironic)",
               Capability.CUT_NETWORK: "testbed does not change a bare-metal node's ports (Neutron)"}
    repair_how = "replaced by a new server on the same lease"
    kind = "chameleon"

    image_timeout: float = 3600.0  # a snapshot's upload (a bare-metal disk takes minutes)

    _renewed: set[str]  # hosts whose server was (re)created by this provision

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress = _quiet):
        super().__init__(spec, store, progress)
        # the site's side (names, connection, errors, pacing): what the lease, release and switch steps take
        self.cloud = Cloud(spec, store, lambda line: self.progress(line), self.recorded)

    @property
    def settings(self) -> ChameleonSettings:
        return self.cloud.settings

    @property
    def lease_name(self) -> str:
        return self.cloud.lease_name

    @property
    def prefix(self) -> str:
        return self.cloud.prefix

    # provision ----------------------------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse bad lease dates, then missing credentials, before any request."""
        leases.dates(self.cloud, new=not self.store.resources(self.name, "lease"))
        self.cloud.api = self.cloud.connect()

    def info(self) -> dict[str, Any]:
        return {"site": self.settings.site, "lease_name": self.lease_name}

    def create(self, public_key: str | None) -> Made:
        """Lease, key pair, servers, floating IPs; ids recorded as they come back; what exists is reused."""
        assert public_key is not None
        api = self.cloud.api or self.cloud.connect()
        self._renewed = set()
        lease = leases.ensure_lease(self.cloud, api)
        self._ensure_keypair(api, public_key)
        servers = self._ensure_servers(api, lease)
        details = self._wait_servers(api, servers)
        addresses = self._ensure_addresses(api, lease, servers, details)
        private = {h: (self._server_ips(details[h], "fixed") or [""])[0] for h in servers}
        return Made(self._hosts(servers, addresses, private), renewed=self._renewed)

    def interrupted(self) -> TestbedError:
        return TestbedError(f"provision of '{self.name}' interrupted; recorded so far: {self.recorded()}",
                            where=self.cloud.where("testbed", f"lease {self.lease_name}"),
                            fix=f"run 'testbed destroy {self.name}' to release them (a lease costs "
                                f"allocation hours), or 'testbed provision {self.name}' to resume",
                            code=Exit.INTERRUPTED)

    def _ensure_keypair(self, api: Chi, public_key: str) -> None:
        self.store.add_resource(self.name, "keypair", self.cloud.keypair_name)  # the name is the id
        with self.cloud.step("uploading the key pair", f"key pair {self.cloud.keypair_name}"):
            api.keypair_ensure(self.cloud.keypair_name, public_key)

    def _ensure_servers(self, api: Chi, lease: dict[str, Any]) -> dict[str, str]:
        """One server per host on the node reservation; host -> server id (each recorded as it comes back)."""
        s = self.settings
        rid = leases.reservation(lease, "physical:host")
        if rid is None:
            raise TestbedError(f"lease {self.lease_name} has no node reservation",
                               where=self.cloud.where("blazar", f"lease {lease['id']}"),
                               fix=f"run 'testbed destroy {self.name}', then provision again")
        recorded = {r["info"].get("host"): r["id"] for r in self.store.resources(self.name, "server")}
        with self.cloud.step("listing servers", f"servers {self.prefix}-*"):
            existing = {x.get("name"): x for x in api.servers_named(self.prefix + "-")}
        out: dict[str, str] = {}
        for host in self.cloud.host_names():
            name = self.cloud.server_name(host)
            sid = recorded.get(host)
            srv = None
            if sid:
                with self.cloud.step("looking up a server", f"server {name} ({sid})"):
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
                releases.delete_servers(self.cloud, api, {sid: name})
                sid = None
            if sid is None:
                booted = self.booted_image()
                image = str(booted["location"]) if booted else s.image  # an image of the set-up: its name
                self.progress(f"server {name}: creating ({image}, {s.flavor})")
                with self.cloud.step(f"creating server {name} ({len(out)} of {s.count} made so far)", f"server {name}"):
                    sid = api.server_create(name, reservation_id=rid, image=image, flavor=s.flavor,
                                            key_name=self.cloud.keypair_name, network=s.network)
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
        pause = self.cloud.backoff(deadline)
        pending = dict(servers)
        done: dict[str, dict[str, Any]] = {}
        seen: dict[str, str] = {}
        last_report = start
        while True:
            for host, sid in list(pending.items()):
                name = self.cloud.server_name(host)
                where = self.cloud.where("nova", f"server {name} ({sid})")
                with self.cloud.step("waiting for a server", f"server {name} ({sid})"):
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
                names = ", ".join(f"{self.cloud.server_name(h)} ({seen.get(h)})" for h in pending)
                raise TestbedError(f"{plural(len(pending), 'server')} not ACTIVE after {s.server_timeout} s: {names}",
                                   where=self.cloud.where("nova", f"reservation of lease {self.lease_name}"),
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
                    raise TestbedError(f"server {self.cloud.server_name(host)} has no fixed IPv4 address",
                                       where=self.cloud.where("nova", f"server {servers[host]}"),
                                       fix=f"check provider.network ({s.network}); destroy and provision again")
                out[host] = fixed[0]
            return out
        fip_rid = leases.reservation(lease, "virtual:floatingip") if s.reserve_floating_ips else None
        recorded = {r["info"].get("host"): r for r in self.store.resources(self.name, "fip")}
        used = {r["id"] for r in recorded.values()}
        out = {}
        for host, sid in servers.items():
            name = self.cloud.server_name(host)
            thing = f"floating IP for {name}"
            fip = None
            r = recorded.get(host)
            if r:
                with self.cloud.step("looking up a floating IP", thing):
                    fip = api.fip_get(r["id"])
                if fip is None:
                    self.store.remove_resource(self.name, "fip", r["id"])
            if fip is None:
                bound = self._server_ips(details[host], "floating")
                if bound:  # bound by an interrupted run before its id was recorded
                    with self.cloud.step("looking up a floating IP", thing):
                        found = api.fips(floating_ip_address=bound[0])
                    fip = found[0] if found else None
            if fip is None and fip_rid:
                with self.cloud.step("listing the lease's floating IPs", thing):
                    free = [f for f in api.fips() if f"reservation:{fip_rid}" in (f.get("tags") or [])
                            and not f.get("port_id") and f["id"] not in used]
                if not free:
                    raise TestbedError(f"the lease's reserved floating IPs are all in use or missing ({thing})",
                                       where=self.cloud.where("neutron", f"reservation {fip_rid}"),
                                       fix=f"run 'testbed destroy {self.name}', then provision again")
                fip = free[0]
            if fip is None:
                with self.cloud.step(f"allocating a floating IP for {name}", thing):
                    fip = api.fip_allocate(description=f"testbed {self.prefix} {host}")
            used.add(fip["id"])
            self.store.add_resource(self.name, "fip", fip["id"], host=host, address=fip["floating_ip_address"],
                                    reserved=bool(fip_rid))
            if not fip.get("port_id"):
                with self.cloud.step(f"attaching floating IP {fip['floating_ip_address']} to {name}", thing):
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
                     facts={"server_id": servers[host], "server_name": self.cloud.server_name(host),
                            "site": s.site, "node_type": s.node_type, "image": s.image,
                            **({"private_address": fixed} if (fixed := (private or {}).get(host)) else {})})
                for i, host in enumerate(self.cloud.host_names())]

    def ssh_fix(self, h: Host) -> str:
        return (f"a node can take minutes after ACTIVE to start sshd: run 'testbed provision {self.name}' again to "
                f"keep waiting (or raise provider.ssh_timeout); check that the image ({self.settings.image}) runs "
                f"sshd; 'testbed destroy {self.name}' releases everything")

    def discard(self, host: Host) -> list[str]:
        """Replace a failed host's server: delete it (its node goes back to the lease's reservation); ``create``
        makes a new one on the same lease and binds the host's floating IP to it again."""
        api = self.cloud.api or self.cloud.connect()
        servers = {r["id"]: r["info"].get("name") or self.cloud.server_name(host.name)
                   for r in self.store.resources(self.name, "server") if r["info"].get("host") == host.name}
        if servers:
            self.progress(f"{host.name}: deleting server {', '.join(servers.values())} to replace it")
            releases.delete_servers(self.cloud, api, servers)
        return [host.name]

    def repair_fix(self, h: Host) -> str:
        return (f"'testbed provision {self.name} --repair {h.name}' again (a new server takes 10-20 min); if the "
                "lease has no free node left, extend or make a new lease; 'testbed destroy "
                f"{self.name}' releases everything")

    # destroy ------------------------------------------------------------------------------------------
    def release(self) -> None:
        """Release floating IPs, servers, the lease and the key pair; safe to run again."""
        releases.release(self.cloud)

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
        first = self.cloud.host_names()[0]
        name = f"testbed-{self.name}-{profile or 'base'}"
        return TestbedError(
            f"cannot bake an image of '{self.name}': {s.site} is a bare-metal site and its nodes (Ironic, flavor "
            f"{s.flavor}) have no Nova snapshot (createImage); nothing was asked of the site or the hosts",
            where=self.cloud.where("nova", f"testbed {self.name}"),
            fix=f"make the image on the node with Chameleon's cc-snapshot, which asks for your Chameleon username "
                f"and password: 'testbed ssh {self.name} {first}', then 'sudo cc-snapshot {name}' (it uploads the "
                f"image {name} to {s.site}'s Glance in minutes); boot new testbeds from it with provider.image: "
                f"{name} in their spec (their set-up runs over it and finds little to change). Or rely on the "
                f"content address: an unchanged 'testbed setup {self.name}' is skipped")

    def bake_image(self, host: str, key: str, record: str,
                   note: Callable[[str, str], None] | None = None) -> dict[str, Any]:
        """Write ``record`` on ``host``, then Nova's createImage of its server (a private image in the project) and
        wait until Glance has it ``active`` (queued, saving: the disk's upload; killed: it failed)."""
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
        api = self.cloud.connect()
        with self.cloud.step("making an image of the server (createImage)", f"server {self.cloud.server_name(host)}"):
            iid = api.server_create_image(sid, name, {"testbed_key": key, "testbed_host": host})
        if note is not None:
            note(iid, name)
        deadline = time.monotonic() + self.image_timeout
        pause = self.cloud.backoff(deadline)
        status = ""
        while True:  # bounded by the deadline
            with self.cloud.step("waiting for the image", f"image {name} ({iid})"):
                img = api.image_get(iid)
            if img is None:
                raise TestbedError(
                    f"the site deleted the image {name} of {host} before it was saved: its compute driver did not "
                    "snapshot the server", where=self.cloud.where("nova", f"server {self.cloud.server_name(host)}"),
                    fix="bare-metal nodes (Ironic) have no Nova snapshot: run 'sudo cc-snapshot' on the host, or "
                        f"skip images: 'testbed setup {self.name}' is skipped by its content address when unchanged")
            if img.get("status") != status:
                status = str(img.get("status"))
                self.progress(f"image {name}: {status}")
                pause.reset()
            if status == "active":
                break
            if status in ("killed", "deleted", "pending_delete", "deactivated"):
                raise TestbedError(f"the image {name} of {host} ended {status}", where=self.cloud.where("glance", iid),
                                   fix=f"testbed image prune {iid}; then 'testbed image bake {self.name}' again")
            if time.monotonic() >= deadline:
                raise TestbedError(f"the image {name} of {host} was still {status} after {int(self.image_timeout)} s",
                                   where=self.cloud.where("glance", iid),
                                   fix=f"it is recorded: 'testbed image list' shows it; 'testbed image prune {iid}' "
                                       "deletes it")
            pause.sleep()
        return {"id": iid, "location": name, "size": int(img.get("size") or 0),
                "info": {"status": status, "site": self.settings.site, "visibility": img.get("visibility"),
                         "node_type": self.settings.node_type}}

    def delete_image(self, image: Mapping[str, Any]) -> None:
        api = self.cloud.connect()
        with self.cloud.step("deleting an image", f"image {image.get('location')} ({image['id']})"):
            api.image_delete(str(image["id"]))

    def describe(self, now: datetime | None = None) -> dict[str, Any]:
        """Lease end from state (no network), with a warning when it is less than an hour away."""
        return leases.describe(self.cloud, now)

    def extend(self, hours: float) -> str:
        """Move the lease end ``hours`` later (blazar PUT /leases/{id}); returns the new end (ISO, UTC)."""
        return leases.extend(self.cloud, hours)

    # the dead-man's switch, the ledger (testbed.providers.chameleon.switch) ------------------------------
    def check_switch(self, expiry: Expiry) -> None:
        self.cloud.lease_end_cap = expiry.expire_at
        switch.check(self.cloud, expiry)

    def switch_release(self, expiry: Expiry) -> dict[str, Any]:
        return switch.release_plan(self.cloud, expiry)

    def disarm_switch(self) -> None:
        """The agents stopped, then their credential deleted (the lease end stays: Blazar's own switch)."""
        super().disarm_switch()
        if self.store.resources(self.name, switch.APP_CRED):
            failures: list[str] = []
            switch.revoke(self.cloud, self.cloud.api or self.cloud.connect(), failures)
            if failures:
                raise TestbedError("; ".join(failures), where=self.cloud.where("keystone", "application credentials"),
                                   fix=f"run the command again, or delete the credentials named {self.prefix}-"
                                       "deadman-* in the dashboard (Identity > Application Credentials)")

    def hours_short_of(self, at: float) -> float:
        return switch.hours_short_of(self.cloud, at)

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        return switch.cost(self.cloud, prices)

    def planned_cost(self, prices: dict[str, Any], hosts: int) -> dict[str, Any] | None:
        return switch.planned_cost(self.cloud, prices, hosts)

    def lease_left(self, now: float) -> tuple[float | None, str]:
        return switch.lease_left(self.cloud, now)

    def orphans(self) -> list[dict[str, Any]]:
        return switch.orphans(self.cloud)

    def reported_states(self) -> dict[str, str] | None:
        """Up (ACTIVE), gone (no server), or the server's status in lower case (error, shutoff, ...), per host."""
        return {h.name: h.state for h in self.refresh()}

    def refresh(self) -> list[Host]:
        """Hosts with their servers' real state (network)."""
        hosts = self.store.hosts(self.name)
        if not hosts:
            return hosts
        api = self.cloud.connect()
        for h in hosts:
            sid = h.facts.get("server_id")
            if not sid:
                continue
            with self.cloud.step("reading a server", f"server {h.facts.get('server_name', h.name)}"):
                srv = api.server_get(str(sid))
            h.state = "gone" if srv is None else ("up" if srv.get("status") == "ACTIVE"
                                                  else str(srv.get("status", "unknown")).lower())
            self.store.set_host_state(self.name, h.name, h.state)
        return hosts
