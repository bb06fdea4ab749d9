"""A fake Chameleon site (keystone, blazar, nova, neutron, glance) over HTTP on 127.0.0.1 for python-chi.

One ``ThreadingHTTPServer`` on an ephemeral port; keystone's catalog points every service back at it under a
prefix (``/identity/v3``, ``/reservation/v1``, ``/compute/v2.1``, ``/network``, ``/image``). It behaves like
the real services where testbed depends on them, errors included, in each service's own error body format:

- leases go PENDING -> STARTING -> ACTIVE after ``lease_polls`` GETs (``lease_error``: -> ERROR); a lease
  reserving more nodes than ``hosts_available`` fails like Blazar ("Not enough hosts available", 500) and one
  reserving more floating IPs than the pool holds fails with "Not enough floating IPs available" (400);
  reserved floating IPs appear in neutron, tagged ``reservation:<id>``, once the lease is ACTIVE, and go with it;
- servers go BUILD -> ACTIVE after ``build_polls`` GETs (``stuck_build``: names that never leave BUILD);
  ``fail_server_create`` (1-based ordinals of POST /servers) answer nova's 500; ``quota_instances`` gives
  nova's 403 "Quota exceeded for instances"; a server on a reservation without a free node goes to ERROR
  ("No valid host was found"); a deleted server lingers ``delete_polls`` GETs, then 404s;
- floating IPs come from ``fip_pool`` (addresses); an empty pool answers neutron's 409 IpAddressGenerationFailure.

Its servers "answer SSH": binding a floating IP calls ``ssh_hook(address, public_key)`` (the server's key pair),
and unbinding or deleting it calls ``ssh_hook(address, None)``; tests map each pool address to a real sshd.
Inventories (``leases``, ``servers``, ``fips``, ``keypairs``) let tests assert that nothing leaked, and
``requests`` logs every (method, path).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LEASE_FMT = "%Y-%m-%dT%H:%M:%S.%f"
BLAZAR_FMT = "%Y-%m-%d %H:%M"
NOVA_FMT = "%Y-%m-%dT%H:%M:%SZ"

Reply = tuple[int, Any]


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _id() -> str:
    return str(uuid.uuid4())


def fingerprint(public_key: str) -> str:
    """Nova's (md5) key fingerprint, as python-chi compares it."""
    raw = base64.b64decode(public_key.strip().split()[1].encode())
    h = hashlib.md5(raw).hexdigest()
    return ":".join(h[i:i + 2] for i in range(0, len(h), 2))


class FakeChameleon:
    """The fake site; ``start()`` it, point OS_* at ``env()``, inspect its inventories, ``stop()`` it."""

    def __init__(self, *, region: str = "CHI@UC", project: str = "CHI-123456", fip_pool: Iterable[str] = (),
                 ssh_hook: Callable[[str, str | None], None] | None = None, lease_polls: int = 2,
                 build_polls: int = 2, delete_polls: int = 1, hosts_available: int = 8):
        self.region = region
        self.project = project
        self.app_cred = ("app-cred-id", "app-cred-secret")
        self.password = ("alice", "s3cret")
        self.fip_pool = list(fip_pool)
        self.ssh_hook = ssh_hook
        self.lease_polls = lease_polls
        self.build_polls = build_polls
        self.delete_polls = delete_polls
        self.hosts_available = hosts_available
        # failure knobs
        self.lease_error = False
        self.fail_server_create: set[int] = set()
        self.quota_instances: int | None = None
        self.stuck_build: set[str] = set()
        self.cascade_servers = False  # real Blazar deletes a lease's servers at its end; off: testbed must
        self.extend_conflict = False
        # inventories
        self.leases: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, dict[str, Any]] = {}
        self.fips: dict[str, dict[str, Any]] = {}
        self.keypairs: dict[str, dict[str, Any]] = {}
        self.ports: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.tokens: set[str] = set()
        self._server_posts = 0
        self._next_ip = 10
        self.lock = threading.RLock()
        self.net_shared = {"id": "net-sharednet1", "name": "sharednet1", "router:external": False}
        self.net_public = {"id": "net-public", "name": "public", "router:external": True}
        self.flavors = [{"id": "flavor-baremetal", "name": "baremetal"}]
        self.images = [self._image("CC-Ubuntu22.04"), self._image("CC-Ubuntu20.04")]
        self.httpd: ThreadingHTTPServer | None = None

    # lifecycle --------------------------------------------------------------------------------------
    def start(self) -> FakeChameleon:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                return None

            def _go(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                status, payload, headers = fake.handle(method, self.path, body, dict(self.headers))
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if payload is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._go("GET")

            def do_POST(self) -> None:
                self._go("POST")

            def do_PUT(self) -> None:
                self._go("PUT")

            def do_DELETE(self) -> None:
                self._go("DELETE")

            def do_PATCH(self) -> None:
                self._go("PATCH")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="fake-chameleon").start()
        return self

    def stop(self) -> None:
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    @property
    def base(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def env(self, auth: str = "appcred") -> dict[str, str]:
        """OS_* variables as a Chameleon openrc would set them for this site."""
        common = {"OS_AUTH_URL": f"{self.base}/identity/v3", "OS_REGION_NAME": self.region,
                  "OS_INTERFACE": "public", "OS_IDENTITY_API_VERSION": "3"}
        if auth == "password":
            return {**common, "OS_AUTH_TYPE": "v3password", "OS_USERNAME": self.password[0],
                    "OS_PASSWORD": self.password[1], "OS_PROJECT_NAME": self.project,
                    "OS_USER_DOMAIN_NAME": "Default", "OS_PROJECT_DOMAIN_NAME": "chameleon"}
        return {**common, "OS_AUTH_TYPE": "v3applicationcredential",
                "OS_APPLICATION_CREDENTIAL_ID": self.app_cred[0],
                "OS_APPLICATION_CREDENTIAL_SECRET": self.app_cred[1]}

    def leaked(self) -> dict[str, int]:
        """What is still held: leases, servers, floating IPs (the things that cost money)."""
        with self.lock:
            return {"leases": len(self.leases), "servers": len(self.servers), "fips": len(self.fips)}

    # dispatch ---------------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any, dict]:
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self.lock:
            self.requests.append((method, path))
            if path.startswith("/identity"):
                return self._keystone(method, path, body)
            token = headers.get("X-Auth-Token") or headers.get("x-auth-token")
            if token not in self.tokens:
                return 401, {"error": {"code": 401, "title": "Unauthorized",
                                       "message": "The request you have made requires authentication."}}, {}
            for prefix, fn in (("/reservation/v1", self._blazar), ("/compute", self._nova),
                               ("/network", self._neutron), ("/image", self._glance)):
                if path.startswith(prefix):
                    status, payload = fn(method, path[len(prefix):] or "/", query, body)
                    return status, payload, {}
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}, {}

    # keystone ---------------------------------------------------------------------------------------
    def _keystone(self, method: str, path: str, body: Any) -> tuple[int, Any, dict]:
        if method == "GET" and path in ("/identity", "/identity/v3"):
            return 200, {"version": {"id": "v3.14", "status": "stable", "links": [
                {"rel": "self", "href": f"{self.base}/identity/v3/"}]}}, {}
        if method != "POST" or path != "/identity/v3/auth/tokens":
            return 404, {"error": {"code": 404, "title": "Not Found", "message": "not found"}}, {}
        ident = (body or {}).get("auth", {}).get("identity", {})
        ok = False
        if "application_credential" in ident.get("methods", []):
            ac = ident.get("application_credential", {})
            ok = (ac.get("id"), ac.get("secret")) == self.app_cred
        elif "password" in ident.get("methods", []):
            u = ident.get("password", {}).get("user", {})
            ok = (u.get("name"), u.get("password")) == self.password
        if not ok:
            return 401, {"error": {"code": 401, "title": "Unauthorized",
                                   "message": "The request you have made requires authentication."}}, {}
        token = "tok-" + uuid.uuid4().hex
        self.tokens.add(token)

        def svc(kind: str, name: str, url: str) -> dict[str, Any]:
            return {"type": kind, "name": name, "id": name, "endpoints": [
                {"id": f"{name}-{i}", "interface": i, "region": self.region, "region_id": self.region, "url": url}
                for i in ("public", "internal", "admin")]}

        b = self.base
        catalog = [svc("identity", "keystone", f"{b}/identity/v3"), svc("reservation", "blazar", f"{b}/reservation/v1"),
                   svc("compute", "nova", f"{b}/compute/v2.1"), svc("network", "neutron", f"{b}/network"),
                   svc("image", "glance", f"{b}/image")]
        now = _now()
        tok = {"token": {"methods": ident.get("methods", []), "expires_at": "2099-01-01T00:00:00.000000Z",
                         "issued_at": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                         "roles": [{"id": "r1", "name": "member"}],
                         "user": {"id": "u1", "name": "alice", "domain": {"id": "default", "name": "Default"}},
                         "project": {"id": "p1", "name": self.project, "domain": {"id": "d1", "name": "chameleon"}},
                         "catalog": catalog}}
        return 201, tok, {"X-Subject-Token": token}

    # blazar -----------------------------------------------------------------------------------------
    @staticmethod
    def _blazar_error(code: int, message: str) -> Reply:
        return code, {"error_code": code, "error_message": message, "error_name": code}

    def _lease_view(self, lease: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in lease.items() if not k.startswith("_")}

    def _hosts_in_use(self) -> int:
        return sum(r["max"] for le in self.leases.values() for r in le["reservations"]
                   if r["resource_type"] == "physical:host" and le["status"] not in ("ERROR", "TERMINATED"))

    def _advance_lease(self, lease: dict[str, Any]) -> None:
        if lease["status"] not in ("PENDING", "STARTING"):
            return
        if datetime.strptime(lease["start_date"], LEASE_FMT) > _now() + timedelta(minutes=1):
            return  # a future lease waits for its start
        lease["_polls"] += 1
        if lease["_polls"] < self.lease_polls:
            lease["status"] = "STARTING" if lease["_polls"] > 0 else "PENDING"
            return
        if self.lease_error:
            lease["status"] = "ERROR"
            lease["status_reason"] = "Failed to allocate hosts: no valid host in aggregate"
            return
        lease["status"] = "ACTIVE"
        for r in lease["reservations"]:
            r["status"] = "active"
            if r["resource_type"] == "virtual:floatingip":
                for addr in lease["_fip_addresses"]:
                    fid = _id()
                    self.fips[fid] = self._fip_json(fid, addr, tags=["blazar", f"reservation:{r['id']}"])

    def _blazar(self, method: str, path: str, query: dict[str, str], body: Any) -> Reply:
        m = re.fullmatch(r"/leases(?:/([^/]+))?", path)
        if not m:
            return self._blazar_error(404, f"Resource {path} not found")
        lid = m.group(1)
        if lid is None and method == "GET":
            return 200, {"leases": [self._lease_view(x) for x in self.leases.values()]}
        if lid is None and method == "POST":
            return self._lease_create(body or {})
        lease = self.leases.get(lid or "")
        if lease is None:
            return self._blazar_error(404, f"Object with {{'lease_id': '{lid}'}} not found")
        if method == "GET":
            self._advance_lease(lease)
            return 200, {"lease": self._lease_view(lease)}
        if method == "PUT":
            end = (body or {}).get("end_date")
            if not end:
                return self._blazar_error(400, "Malformed parameter end_date")
            if self.extend_conflict:
                return self._blazar_error(500, "Not enough hosts available")
            lease["end_date"] = datetime.strptime(end, BLAZAR_FMT).strftime(LEASE_FMT)
            lease["updated_at"] = _now().strftime("%Y-%m-%d %H:%M:%S")
            return 200, {"lease": self._lease_view(lease)}
        if method == "DELETE":
            self._lease_delete(lease)
            return 204, None
        return self._blazar_error(405, "Method not allowed")

    def _lease_create(self, body: dict[str, Any]) -> Reply:
        name = body.get("name")
        if not name or not body.get("end_date") or not body.get("reservations"):
            return self._blazar_error(400, "Lease name, end date and reservations are required")
        now = _now()
        try:
            start = now if body.get("start_date") in (None, "now") else datetime.strptime(body["start_date"],
                                                                                        BLAZAR_FMT)
            end = datetime.strptime(body["end_date"], BLAZAR_FMT)
        except ValueError as e:
            return self._blazar_error(400, f"Malformed parameter date: {e}")
        if end <= start:
            return self._blazar_error(400, "End date must be later than start date")
        lid = _id()
        reservations, fip_addresses = [], []
        for req in body["reservations"]:
            r = {**req, "id": _id(), "lease_id": lid, "status": "pending", "created_at": now.isoformat()}
            if req.get("resource_type") == "physical:host":
                if self._hosts_in_use() + int(req.get("max", 1)) > self.hosts_available:
                    return self._blazar_error(500, "Not enough hosts available")
            elif req.get("resource_type") == "virtual:floatingip":
                amount = int(req.get("amount", 1))
                if amount > len(self.fip_pool):
                    return self._blazar_error(400, "Not enough floating IPs available")
                fip_addresses += [self.fip_pool.pop(0) for _ in range(amount)]
            else:
                return self._blazar_error(400, f"Unsupported resource type {req.get('resource_type')}")
            reservations.append(r)
        lease = {"id": lid, "name": name, "status": "PENDING", "user_id": "u1", "project_id": "p1",
                 "start_date": start.strftime(LEASE_FMT), "end_date": end.strftime(LEASE_FMT),
                 "created_at": now.strftime("%Y-%m-%d %H:%M:%S"), "updated_at": None, "trust_id": _id(),
                 "reservations": reservations, "events": [], "degraded": False, "status_reason": None,
                 "_polls": -1, "_fip_addresses": fip_addresses}
        self.leases[lid] = lease
        return 201, {"lease": self._lease_view(lease)}

    def _lease_delete(self, lease: dict[str, Any]) -> None:
        rids = {r["id"] for r in lease["reservations"]}
        for fid, f in list(self.fips.items()):
            if any(f"reservation:{rid}" in f["tags"] for rid in rids):
                self._fip_release(fid)
        self.fip_pool += [a for a in lease["_fip_addresses"] if a not in self.fip_pool]
        if self.cascade_servers:
            for sid, s in list(self.servers.items()):
                if s["_reservation"] in rids:
                    self._server_gone(sid)
        self.leases.pop(lease["id"], None)

    # nova -------------------------------------------------------------------------------------------
    @staticmethod
    def _nova_error(code: int, kind: str, message: str) -> Reply:
        return code, {kind: {"code": code, "message": message}}

    def _server_view(self, s: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in s.items() if not k.startswith("_")}
        addrs = []
        for p in self.ports.values():
            if p["device_id"] == s["id"]:
                addrs.append({"addr": p["fixed_ips"][0]["ip_address"], "version": 4, "OS-EXT-IPS:type": "fixed",
                              "OS-EXT-IPS-MAC:mac_addr": p["mac_address"]})
                for f in self.fips.values():
                    if f["port_id"] == p["id"]:
                        addrs.append({"addr": f["floating_ip_address"], "version": 4,
                                      "OS-EXT-IPS:type": "floating", "OS-EXT-IPS-MAC:mac_addr": p["mac_address"]})
        out["addresses"] = {s["_network"]: addrs} if addrs else {}
        return out

    def _nova(self, method: str, path: str, query: dict[str, str], body: Any) -> Reply:
        if path in ("/", ""):
            return 200, {"versions": [self._nova_version()]}
        if not path.startswith("/v2.1"):
            return self._nova_error(404, "itemNotFound", "not found")
        path = path[len("/v2.1"):] or "/"
        if path == "/" and method == "GET":
            return 200, {"version": self._nova_version()}
        if path == "/flavors/detail" or path == "/flavors":
            return 200, {"flavors": [self._flavor_json(f) for f in self.flavors]}
        m = re.fullmatch(r"/flavors/([^/]+)(/os-extra_specs)?", path)
        if m:
            f = next((x for x in self.flavors if x["id"] == m.group(1)), None)
            if f is None:
                return self._nova_error(404, "itemNotFound", f"Flavor {m.group(1)} could not be found.")
            return 200, ({"extra_specs": {}} if m.group(2) else {"flavor": self._flavor_json(f)})
        if path.startswith("/os-keypairs"):
            return self._keypairs(method, path, body)
        if path == "/servers" and method == "POST":
            return self._server_create(body or {})
        if path in ("/servers/detail", "/servers") and method == "GET":
            out = [self._server_view(s) for s in self.servers.values()]
            if "name" in query:
                out = [s for s in out if re.search(query["name"], s["name"])]
            return 200, {"servers": out}
        m = re.fullmatch(r"/servers/([^/]+)", path)
        if m:
            s = self.servers.get(m.group(1))
            if s is None:
                return self._nova_error(404, "itemNotFound", f"Instance {m.group(1)} could not be found.")
            if method == "GET":
                if s["_deleting"] is not None:
                    if s["_deleting"] <= 0:
                        self._server_gone(s["id"])
                        return self._nova_error(404, "itemNotFound", f"Instance {m.group(1)} could not be found.")
                    s["_deleting"] -= 1
                elif s["status"] == "BUILD":
                    s["_polls"] += 1
                    if s["_polls"] >= self.build_polls and not self._is_stuck(s["name"]):
                        s["status"], s["OS-EXT-STS:vm_state"] = "ACTIVE", "active"
                        s["OS-EXT-STS:power_state"] = 1
                return 200, {"server": self._server_view(s)}
            if method == "DELETE":
                if s["_deleting"] is None:
                    s["_deleting"] = self.delete_polls
                    s["OS-EXT-STS:task_state"] = "deleting"
                return 204, None
        return self._nova_error(404, "itemNotFound", f"no route {method} {path}")

    def _is_stuck(self, name: str) -> bool:
        return "*" in self.stuck_build or any(name == x or name.endswith("-" + x) for x in self.stuck_build)

    def _keypairs(self, method: str, path: str, body: Any) -> Reply:
        m = re.fullmatch(r"/os-keypairs(?:/([^/]+))?", path)
        assert m
        name = m.group(1)
        if name is None and method == "GET":
            return 200, {"keypairs": [{"keypair": {k: v for k, v in kp.items() if k in ("name", "public_key",
                                                                                      "fingerprint", "type")}}
                                      for kp in self.keypairs.values()]}
        if name is None and method == "POST":
            kp = (body or {}).get("keypair", {})
            if not kp.get("name") or not kp.get("public_key"):
                return self._nova_error(400, "badRequest", "Keypair data is invalid: name and public_key required")
            if kp["name"] in self.keypairs:
                return self._nova_error(409, "conflictingRequest", f"Key pair '{kp['name']}' already exists.")
            rec = {"name": kp["name"], "public_key": kp["public_key"], "fingerprint": fingerprint(kp["public_key"]),
                   "type": kp.get("type", "ssh"), "user_id": "u1", "created_at": _now().isoformat(),
                   "deleted": False, "deleted_at": None, "updated_at": None, "id": len(self.keypairs) + 1}
            self.keypairs[kp["name"]] = rec
            return 200, {"keypair": rec}
        kp = self.keypairs.get(name or "")
        if kp is None:
            return self._nova_error(404, "itemNotFound", f"Keypair {name} not found for user u1")
        if method == "GET":
            return 200, {"keypair": kp}
        if method == "DELETE":
            self.keypairs.pop(kp["name"])
            return 202, None
        return self._nova_error(405, "badMethod", "not allowed")

    def _server_create(self, body: dict[str, Any]) -> Reply:
        self._server_posts += 1
        req = body.get("server") or {}
        hints = body.get("OS-SCH-HNT:scheduler_hints") or body.get("os:scheduler_hints") or {}
        if self._server_posts in self.fail_server_create:
            return self._nova_error(500, "computeFault", "Unexpected API Error. Please report this at "
                                    "http://bugs.launchpad.net/nova/ and attach the Nova API log if possible.\n"
                                    "<class 'nova.exception_Remote.InstanceBuildError_Remote'>")
        live = [s for s in self.servers.values() if s["_deleting"] is None]
        if self.quota_instances is not None and len(live) + 1 > self.quota_instances:
            return self._nova_error(403, "forbidden", f"Quota exceeded for instances: Requested 1, but already "
                                    f"used {len(live)} of {self.quota_instances} instances")
        if req.get("key_name") and req["key_name"] not in self.keypairs:
            return self._nova_error(400, "badRequest", "Invalid key_name provided.")
        image = next((i for i in self.images if i["id"] == req.get("imageRef")), None)
        if image is None:
            return self._nova_error(400, "badRequest", "Can not find requested image")
        flavor = next((f for f in self.flavors if f["id"] == req.get("flavorRef")), None)
        if flavor is None:
            return self._nova_error(400, "badRequest", f"Flavor {req.get('flavorRef')} could not be found.")
        nets = [n.get("uuid") for n in req.get("networks") or []]
        if nets and nets[0] != self.net_shared["id"]:
            return self._nova_error(400, "badRequest", f"Network {nets[0]} could not be found.")
        rid = hints.get("reservation")
        status, fault = "BUILD", None
        res = next((r for le in self.leases.values() for r in le["reservations"]
                    if r["id"] == rid and le["status"] == "ACTIVE" and r["resource_type"] == "physical:host"), None)
        used = sum(1 for s in live if s["_reservation"] == rid)
        if res is None or used >= int(res.get("max", 1)):
            status = "ERROR"
            fault = {"code": 500, "message": "No valid host was found. There are not enough hosts available.",
                     "created": _now().strftime(NOVA_FMT)}
        sid = _id()
        now = _now().strftime(NOVA_FMT)
        srv = {"id": sid, "name": req.get("name"), "status": status, "hostId": uuid.uuid4().hex, "created": now,
               "updated": now, "key_name": req.get("key_name"), "image": {"id": image["id"]},
               "flavor": {"original_name": flavor["name"], "vcpus": 48, "ram": 196608, "disk": 240,
                          "ephemeral": 0, "swap": 0, "extra_specs": {}},
               "host_status": "UP", "locked": False, "locked_reason": None, "metadata": {},
               "tenant_id": "p1", "user_id": "u1", "OS-EXT-STS:task_state": None,
               "OS-EXT-STS:vm_state": "building" if status == "BUILD" else "error",
               "OS-EXT-STS:power_state": 0, "OS-EXT-AZ:availability_zone": "nova", "OS-DCF:diskConfig": "MANUAL",
               "accessIPv4": "", "accessIPv6": "", "config_drive": "", "progress": 0, "links": [],
               "security_groups": [{"name": "default"}], "tags": [], "description": None,
               "os-extended-volumes:volumes_attached": [], "trusted_image_certificates": None,
               "OS-SRV-USG:launched_at": None, "OS-SRV-USG:terminated_at": None,
               "_network": self.net_shared["name"], "_reservation": rid, "_polls": 0, "_deleting": None}
        if fault:
            srv["fault"] = fault
        self.servers[sid] = srv
        if status == "BUILD":
            pid = _id()
            self._next_ip += 1
            self.ports[pid] = {"id": pid, "device_id": sid, "device_owner": "compute:nova", "status": "ACTIVE",
                               "network_id": self.net_shared["id"],
                               "mac_address": f"fa:16:3e:00:00:{self._next_ip:02x}",
                               "fixed_ips": [{"subnet_id": "subnet-shared",
                                              "ip_address": f"10.140.81.{self._next_ip}"}],
                               "name": "", "admin_state_up": True, "tenant_id": "p1", "project_id": "p1",
                               "tags": []}
        return 202, {"server": {"id": sid, "links": [], "OS-DCF:diskConfig": "MANUAL",
                                "security_groups": [{"name": "default"}], "adminPass": "x"}}

    def _server_gone(self, sid: str) -> None:
        for pid, p in list(self.ports.items()):
            if p["device_id"] == sid:
                for f in self.fips.values():
                    if f["port_id"] == pid:  # neutron disassociates a floating IP whose port goes away
                        self._unbind(f)
                self.ports.pop(pid)
        self.servers.pop(sid, None)

    def _nova_version(self) -> dict[str, Any]:
        return {"id": "v2.1", "status": "CURRENT", "version": "2.96", "min_version": "2.1",
                "updated": "2013-07-23T11:33:21Z",
                "links": [{"rel": "self", "href": f"{self.base}/compute/v2.1/"}],
                "media-types": [{"base": "application/json",
                                 "type": "application/vnd.openstack.compute+json;version=2.1"}]}

    @staticmethod
    def _flavor_json(f: dict[str, Any]) -> dict[str, Any]:
        return {"id": f["id"], "name": f["name"], "ram": 196608, "vcpus": 48, "disk": 240, "swap": 0,
                "OS-FLV-EXT-DATA:ephemeral": 0, "OS-FLV-DISABLED:disabled": False, "rxtx_factor": 1.0,
                "os-flavor-access:is_public": True, "description": None, "extra_specs": {}, "links": []}

    # neutron ----------------------------------------------------------------------------------------
    @staticmethod
    def _neutron_error(code: int, kind: str, message: str) -> Reply:
        return code, {"NeutronError": {"type": kind, "message": message, "detail": ""}}

    def _net_json(self, n: dict[str, Any]) -> dict[str, Any]:
        return {**n, "status": "ACTIVE", "shared": True, "admin_state_up": True, "subnets": [],
                "tenant_id": "admin", "project_id": "admin", "mtu": 1500, "tags": [], "description": ""}

    def _fip_json(self, fid: str, addr: str, *, tags: list[str] | None = None,
                  description: str = "") -> dict[str, Any]:
        now = _now().strftime(NOVA_FMT)
        return {"id": fid, "floating_ip_address": addr, "floating_network_id": self.net_public["id"],
                "port_id": None, "fixed_ip_address": None, "status": "DOWN", "router_id": None,
                "tenant_id": "p1", "project_id": "p1", "description": description, "tags": tags or [],
                "created_at": now, "updated_at": now, "revision_number": 0, "port_details": None}

    def _unbind(self, f: dict[str, Any]) -> None:
        if f["port_id"] and self.ssh_hook:
            self.ssh_hook(f["floating_ip_address"], None)
        f.update(port_id=None, fixed_ip_address=None, status="DOWN", router_id=None)

    def _fip_release(self, fid: str) -> None:
        f = self.fips.pop(fid)
        self._unbind(f)
        if not any("reservation:" in t for t in f["tags"]):
            self.fip_pool.append(f["floating_ip_address"])

    def _neutron(self, method: str, path: str, query: dict[str, str], body: Any) -> Reply:
        if path in ("/", ""):
            return 200, {"versions": [{"id": "v2.0", "status": "CURRENT",
                                       "links": [{"rel": "self", "href": f"{self.base}/network/v2.0/"}]}]}
        if path.startswith("/v2.0"):
            path = path[len("/v2.0"):]
        if path in ("", "/"):
            return 200, {"resources": []}
        if path == "/networks":
            nets = [self._net_json(n) for n in (self.net_shared, self.net_public)]
            if "name" in query:
                nets = [n for n in nets if n["name"] == query["name"]]
            return 200, {"networks": nets}
        m = re.fullmatch(r"/networks/([^/]+)", path)
        if m:
            n = next((x for x in (self.net_shared, self.net_public) if x["id"] == m.group(1)), None)
            if n is None:
                return self._neutron_error(404, "NetworkNotFound", f"Network {m.group(1)} could not be found.")
            return 200, {"network": self._net_json(n)}
        if path == "/ports":
            ports = [p for p in self.ports.values()
                     if all(str(p.get(k)) == v for k, v in query.items() if k in ("device_id", "network_id"))]
            return 200, {"ports": ports}
        if path == "/floatingips" and method == "GET":
            fl = [f for f in self.fips.values()
                  if all(str(f.get(k)) == v for k, v in query.items()
                         if k in ("floating_ip_address", "port_id", "description", "id"))]
            return 200, {"floatingips": fl}
        if path == "/floatingips" and method == "POST":
            req = (body or {}).get("floatingip", {})
            if req.get("floating_network_id") != self.net_public["id"]:
                return self._neutron_error(404, "ExternalGatewayForFloatingIPNotFound",
                                           f"External network {req.get('floating_network_id')} is not reachable.")
            if not self.fip_pool:
                return self._neutron_error(409, "IpAddressGenerationFailure",
                                           f"No more IP addresses available on network {self.net_public['id']}.")
            fid = _id()
            self.fips[fid] = self._fip_json(fid, self.fip_pool.pop(0), description=req.get("description", ""))
            return 201, {"floatingip": self.fips[fid]}
        m = re.fullmatch(r"/floatingips/([^/]+)", path)
        if m:
            f = self.fips.get(m.group(1))
            if f is None:
                return self._neutron_error(404, "FloatingIPNotFound", f"Floating IP {m.group(1)} could not be found")
            if method == "GET":
                return 200, {"floatingip": f}
            if method == "DELETE":
                self._fip_release(f["id"])
                return 204, None
            if method == "PUT":
                req = (body or {}).get("floatingip", {})
                port_id = req.get("port_id")
                if port_id is None:
                    self._unbind(f)
                    return 200, {"floatingip": f}
                port = self.ports.get(port_id)
                if port is None:
                    return self._neutron_error(404, "PortNotFound", f"Port {port_id} could not be found.")
                if f["port_id"] and f["port_id"] != port_id:
                    return self._neutron_error(409, "FloatingIPPortAlreadyAssociated",
                                               f"Cannot associate floating IP {f['floating_ip_address']} "
                                               f"({f['id']}) with port {port_id}: already associated")
                f.update(port_id=port_id, fixed_ip_address=port["fixed_ips"][0]["ip_address"], status="ACTIVE",
                         router_id="router-1")
                srv = self.servers.get(port["device_id"])
                kp = self.keypairs.get(srv["key_name"]) if srv and srv.get("key_name") else None
                if self.ssh_hook:
                    self.ssh_hook(f["floating_ip_address"], kp["public_key"] if kp else None)
                return 200, {"floatingip": f}
        return self._neutron_error(404, "HTTPNotFound", f"no route {method} {path}")

    # glance -----------------------------------------------------------------------------------------
    def _image(self, name: str) -> dict[str, Any]:
        iid = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
        return {"id": iid, "name": name, "status": "active", "visibility": "public", "protected": False,
                "os_hidden": False, "owner": "admin", "disk_format": "qcow2", "container_format": "bare",
                "size": 4294967296, "virtual_size": None, "min_disk": 0, "min_ram": 0, "checksum": None,
                "os_hash_algo": None, "os_hash_value": None, "tags": [], "created_at": "2024-01-01T00:00:00Z",
                "updated_at": "2024-01-01T00:00:00Z", "self": f"/v2/images/{iid}", "file": f"/v2/images/{iid}/file",
                "schema": "/v2/schemas/image"}

    def _glance(self, method: str, path: str, query: dict[str, str], body: Any) -> Reply:
        if path in ("/", ""):
            return 200, {"versions": [{"id": "v2.16", "status": "CURRENT",
                                       "links": [{"rel": "self", "href": f"{self.base}/image/v2/"}]}]}
        if path == "/v2/images":
            imgs = [i for i in self.images if "name" not in query or i["name"] == query["name"]]
            return 200, {"images": imgs, "schema": "/v2/schemas/images", "first": "/v2/images"}
        if path == "/v2/schemas/image":
            return 200, {"name": "image", "properties": {k: {} for k in self.images[0]},
                         "additionalProperties": {"type": "string"}, "links": []}
        m = re.fullmatch(r"/v2/images/([^/]+)", path)
        if m:
            img = next((i for i in self.images if i["id"] == m.group(1)), None)
            if img is None:
                return 404, {"code": 404, "title": "Not Found", "message": f"No image found with ID {m.group(1)}"}
            return 200, img
        return 404, {"code": 404, "title": "Not Found", "message": f"no route {method} {path}"}


class LoopbackSshd:
    """Real sshd daemons on loopback addresses (127.x.y.z:22, root needed): the fake's servers "answer SSH".

    Each daemon runs in its own mount namespace where ``/etc/passwd`` also lists ``user`` (Chameleon's ``cc``),
    so the account exists for sshd only, never on this machine. Its AuthorizedKeysFile is written by
    :meth:`hook` (pass it as the fake's ``ssh_hook``): binding a floating IP installs the server's key pair, as
    cloud-init would; unbinding removes it. ``addresses`` are what the fake hands out as floating IPs (the one
    mapping to change when the fake's servers become local-testbed hosts). Stop by PID file.
    """

    def __init__(self, count: int = 3, *, user: str = "cc", uid: int = 2999):
        import tempfile
        from pathlib import Path

        # sshd reads AuthorizedKeysFile as the user: the folder must be traversable (pytest's tmp is 0700)
        self.dir = Path(tempfile.mkdtemp(prefix="tb-chameleon-sshd-"))
        self.dir.chmod(0o755)
        self.count = count
        self.user = user
        self.uid = uid
        self.addresses: list[str] = []

    @staticmethod
    def _free(address: str) -> bool:
        import socket

        with socket.socket() as s:
            try:
                s.bind((address, 22))
                return True
            except OSError:
                return False

    def _pick(self) -> list[str]:
        import random

        for _ in range(50):
            net = f"127.{random.randint(64, 250)}.{random.randint(1, 250)}"
            addrs = [f"{net}.{i + 1}" for i in range(self.count)]
            if all(self._free(a) for a in addrs):
                return addrs
        raise RuntimeError("no free loopback addresses for sshd")

    def start(self) -> LoopbackSshd:
        import os
        import subprocess
        import time

        os.makedirs("/run/sshd", exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        home = self.dir / f"home-{self.user}"
        home.mkdir(exist_ok=True)
        os.chown(home, self.uid, self.uid)
        passwd = self.dir / "passwd"
        group = self.dir / "group"
        with open("/etc/passwd") as f:
            passwd.write_text(f.read().rstrip("\n") + f"\n{self.user}:x:{self.uid}:{self.uid}::{home}:/bin/sh\n")
        with open("/etc/group") as f:
            group.write_text(f.read().rstrip("\n") + f"\n{self.user}:x:{self.uid}:\n")
        self.addresses = self._pick()
        for addr in self.addresses:
            d = self.dir / addr
            d.mkdir(exist_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_ed25519")],
                           check=True, capture_output=True)
            self.hook(addr, None)
            (d / "sshd_config").write_text("\n".join([
                "Port 22", f"ListenAddress {addr}", f"HostKey {d / 'host_ed25519'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}", "StrictModes no", "UsePAM no",
                f"PidFile {d / 'sshd.pid'}", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "MaxStartups 100:30:200",
                "UseDNS no", "PrintMotd no", ""]))
            script = (f"mount --bind {passwd} /etc/passwd && mount --bind {group} /etc/group && "
                      f"exec /usr/sbin/sshd -f {d / 'sshd_config'} -E {d / 'sshd.log'}")
            subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], check=True,
                           capture_output=True, timeout=20)
        deadline = time.monotonic() + 10
        for addr in self.addresses:
            while self._free(addr) and time.monotonic() < deadline:
                time.sleep(0.05)
        return self

    def hook(self, address: str, public_key: str | None) -> None:
        """The fake's ssh_hook: install (or remove) the key allowed to log in at ``address``."""
        if address in self.addresses:
            p = self.dir / address / "authorized_keys"
            p.write_text((public_key + "\n") if public_key else "")
            p.chmod(0o644)

    def reset(self) -> None:
        for addr in self.addresses:
            self.hook(addr, None)

    def stop(self) -> None:
        import os
        import signal

        for addr in self.addresses:
            pidfile = self.dir / addr / "sshd.pid"
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)
