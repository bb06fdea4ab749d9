"""A fake Chameleon site (keystone + an OpenID Connect provider, blazar, nova, neutron, glance) over HTTP on
127.0.0.1 for python-chi.

One ``ThreadingHTTPServer`` on an ephemeral port; keystone's catalog points every service back at it under a
prefix (``/identity/v3``, ``/reservation/v1``, ``/compute/v2.1``, ``/network``, ``/image``; ``/oidc`` is the
site's Keycloak). It answers as the real services do where testbed depends on them, refusals included, each in
its own error body format. Sources: ChameleonCloud/blazar (branch chameleoncloud/2023.1: ``api/v1/utils.py``,
``manager/service.py``, ``manager/exceptions.py``, ``status.py``, ``enforcement/``, ``plugins/``), keystone
(``auth/core.py``, ``exception.py``), keystoneauth1 (``identity/v3/oidc.py``, ``federation.py``), nova
(``api/openstack/common.py``, ``views/servers.py``), neutron and neutron-lib (``db/l3_db.py``, ``exceptions``).

- keystone: application credentials (which may not ask for a scope: 401), passwords, token rescoping and the
  OpenID Connect password flow of Chameleon's openrc files (``v3oidcpassword``: discovery document, token
  endpoint, ``OS-FEDERATION`` auth, then a project-scoped token) and the access token that Chameleon's JupyterHub
  hands a notebook (``v3oidcaccesstoken``: ``POST /v3/OS-FEDERATION/identity_providers/{idp}/protocols/{protocol}/
  auth`` with ``Authorization: Bearer <access token>`` -> an unscoped token, rescoped to the project with the
  ``token`` method, as the Identity API reference gives it; an expired access token answers 401 from the OIDC
  module in front of keystone); wrong secrets answer 401. Application
  credentials are made, read and deleted under ``/v3/users/{id}/application_credentials`` (keystone/api/users.py:
  403 for a token of a restricted credential -- ``app_cred_unrestricted`` is False by default, as in keystone --
  and for another user; 400 for a bad body; an expired one cannot log in); a token of a credential with
  ``access_rules`` reaches only the requests a rule names, matched as keystonemiddleware's
  ``validate_allowed_request`` does (method, service type, the request's whole path, ``*``/``**``/``{tag}``),
  else 401 "Token authorization failed";
- blazar: a lease is PENDING, STARTING after its first look, ACTIVE after ``lease_polls`` GETs (``lease_error``:
  ERROR, its start_lease event ERROR and its host reservation 'error' -- Blazar keeps no reason on the lease;
  ``lease_degraded``: ACTIVE with ``degraded`` and the reservation's ``missing_resources`` set). Requests are
  checked as the manager checks them: missing parameters (400), bad or past dates (400), unknown resource types,
  not enough hosts of the node type (500 "Not enough hosts available") or floating IPs (500 "Not enough floating
  IPs available"), Chameleon's 7-day maximum (403 on create, 400 on update), its allocation check
  (``allocation_refusal``: 400 with the service's words), "Invalid lease status." (500) for a lease in a
  transitional status. DELETE is synchronous (200 ``{}``); ``lease_delete_error`` leaves the lease in
  ERROR with the manager's "Failed to cleanly end lease" (500); ``lease_delete_polls`` makes the DELETE time out
  in the RPC layer (500 "Internal Server Error") while the lease stays DELETING for that many GETs, then goes
  (or, with ``lease_delete_error``, turns ERROR). Reserved floating IPs appear in neutron, tagged
  ``blazar`` and ``reservation:<id>``, once the lease is ACTIVE, and go with it;
- nova: servers go BUILD (task states scheduling, networking, spawning) -> ACTIVE after ``build_polls`` GETs
  (``stuck_build``: names that never leave BUILD; ``fail_build``: name -> the fault message it ends in ERROR
  with); ``fail_server_create`` (1-based ordinals of POST /servers) answer 500; ``quota_instances`` gives 403
  "Quota exceeded for instances"; a server on a reservation without a free node goes to ERROR ("No valid host
  was found"); faults show only on ERROR/DELETED servers, without details for code 500; a deleted server lingers
  ``delete_polls`` GETs, then 404s (``fail_server_delete``: names whose first delete ends in ERROR);
- neutron: floating IPs come from ``fip_pool``; an empty pool answers 409 IpAddressGenerationFailure,
  ``quota_fips`` 409 OverQuota; a floating IP moves to another port on request (409 only when that port already
  has one);
- quotas as the APIs give them: nova ``GET /limits`` (absolute ``maxTotalInstances``/``totalInstancesUsed``,
  ``maxTotalCores``/``totalCoresUsed``; -1 is no limit) and neutron ``GET /v2.0/quotas/{project}/details.json``
  (``floatingip``: used, limit, reserved), from ``quota_instances`` and ``quota_fips``;
- JupyterHub's REST API as python-chi asks it for a fresh access token (``GET /hub/api/users/{name}`` with
  ``Authorization: token <JUPYTERHUB_API_TOKEN>``: the user model with ``auth_state.access_token`` and
  ``expires_at``, which jupyterhub-chameleon keeps renewed); ``jupyter_env()`` is what a notebook server of
  Chameleon's JupyterHub starts with (jupyterhub-chameleon's ``openstack_oauth.py``).

- images (nova's createImage, glance v2), as nova's ``_create_image`` and ``compute.api.snapshot`` and glance
  answer: ``POST /servers/{id}/action {"createImage": ...}`` is 202, the image id in the body at microversion
  2.45 and later (``{"image_id": ...}``), in a ``Location`` header before; 404 for an unknown server, 409 for a
  server not ACTIVE/STOPPED/PAUSED/SUSPENDED or busy (``task_state``); the image is made ``private`` to the project
  (the requester owns the server), ``image_type`` snapshot, and goes queued -> saving -> active over
  ``snapshot_polls`` GETs (``kill_snapshot``: it ends ``killed``) on a KVM site only (``region`` ``KVM@...``:
  ``snapshots``). By default the fake is a bare-metal site (CHI@UC) and does what nova does over Ironic, whose
  driver has no ``snapshot`` (nova/virt/ironic/driver.py; the base ComputeDriver.snapshot raises
  NotImplementedError): createImage still answers 202 and glance holds the image ``queued``; the compute
  manager's ``snapshot_instance`` then fails, its ``delete_image_on_error`` deletes the image and
  ``reverts_task_state`` clears the server's task_state (it stays ACTIVE: a fault shows only on ERROR servers),
  so the next GET of the image is a 404 and the server takes a new createImage; ``quota_images`` is
  glance's ``image_count_total``: glance's 413 reaches nova's API untranslated (500 computeFault). A server made
  from an image that is not active is refused (400 "Image ... is not active."). ``snapshot_hook(address, id)``
  runs when the disk is captured (saving), ``boot_hook(address, id)`` when a server made from a snapshot gets its
  floating IP (before ``ssh_hook``): tests keep a real host's disk as the image and boot a host from it.

Its servers "answer SSH": binding a floating IP calls ``ssh_hook(address, public_key)`` (the server's key pair),
and unbinding or deleting it calls ``ssh_hook(address, None)``; tests map each pool address to a real sshd.
``host`` is the address it listens on (a local testbed's bridge address, so that its hosts reach it);
``settle()`` lets time pass (deletes nova accepted finish with no one polling).
Inventories (``leases``, ``servers``, ``fips``, ``keypairs``, ``app_creds``) let tests assert that nothing leaked,
``requests`` logs every (method, path) and ``on_request(method, path)`` runs before each answer goes out.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LEASE_FMT = "%Y-%m-%dT%H:%M:%S.%f"  # oslo jsonutils' datetime format, as Blazar's JSON carries them
BLAZAR_FMT = "%Y-%m-%d %H:%M"
NOVA_FMT = "%Y-%m-%dT%H:%M:%SZ"
MAX_LEASE_SECONDS = 7 * 24 * 3600  # Chameleon's max_lease_duration (blazar enforcement MaxLeaseDurationFilter)
TRANSITIONAL = ("CREATING", "STARTING", "UPDATING", "TERMINATING", "DELETING")  # blazar.status.LeaseStatus

Reply = tuple[int, Any]


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _page(title: str, detail: str) -> str:
    """An error page as webob renders one for glance (HTML; glanceclient strips the tags)."""
    return (f"<html>\n <head>\n  <title>{title}</title>\n </head>\n <body>\n  <h1>{title}</h1>\n  {detail}<br /><br />"
            "\n\n\n\n </body>\n</html>")


def _id() -> str:
    return str(uuid.uuid4())


def fingerprint(public_key: str) -> str:
    """Nova's (md5) key fingerprint, as python-chi compares it."""
    raw = base64.b64decode(public_key.strip().split()[1].encode())
    h = hashlib.md5(raw).hexdigest()
    return ":".join(h[i:i + 2] for i in range(0, len(h), 2))


def _node_type(resource_properties: str) -> str | None:
    """The ``$node_type`` a host reservation asks for (python-chi writes ["==", "$node_type", T], or an "and")."""
    try:
        rp = json.loads(resource_properties) if resource_properties else []
    except ValueError:
        return None
    stack: list[Any] = [rp]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            if len(x) == 3 and x[:2] == ["==", "$node_type"]:
                return str(x[2])
            stack.extend(x)
    return None


def _path_matches(request_path: str, pattern: str) -> bool:
    """keystonemiddleware.auth_token._path_matches: {tag} and * match one segment, ** any rest."""
    regex = ""
    for m in re.finditer(r"(?P<tag>{[^}]*})|(?P<wild>\*(?=$|[^\*]))|(?P<rec>\*\*)|(?P<lit>[^{}\*])", pattern):
        if m.group("tag") or m.group("wild"):
            regex += r"[^\/]+"
        elif m.group("rec"):
            regex += ".*"
        else:
            regex += re.escape(m.group("lit"))
    return re.match(f"^{regex}$", request_path) is not None


KVM_FLAVORS = ("m1.small", "m1.medium", "m1.large", "m1.xlarge")  # KVM@TACC's general-purpose sizes


def kvm_site(region: str) -> bool:
    """Whether ``region`` names a KVM site (``KVM@...``), whose servers are VMs nova can snapshot; every other
    site is bare metal, as Chameleon's CHI@TACC, CHI@UC and the rest are. A test that needs snapshots says so by
    its site's name (and a KVM flavor in its spec). The fake's Blazar still takes ``physical:host`` reservations
    there: what it models is a KVM cloud with host reservations (upstream Blazar's host plugin reserves KVM
    hypervisors), not KVM@TACC itself, which reserves flavors (``flavor:instance``)."""
    return region.upper().startswith("KVM@")


class FakeChameleon:
    """The fake site; ``start()`` it, point OS_* at ``env()``, inspect its inventories, ``stop()`` it."""

    def __init__(self, *, region: str = "CHI@UC", project: str = "CHI-123456", fip_pool: Iterable[str] = (),
                 ssh_hook: Callable[[str, str | None], None] | None = None, lease_polls: int = 2,
                 build_polls: int = 2, delete_polls: int = 1, hosts_available: int = 8, host: str = "127.0.0.1"):
        self.host = host  # where it listens (a local testbed's bridge address lets its hosts reach it)
        self.region = region
        self.project = project
        self.project_id = "5d6a2b0c1f2e4c4b9d1e6a7b8c9d0e1f"
        self.app_cred = ("app-cred-id", "app-cred-secret")
        self.app_cred_unrestricted = False  # keystone's default for a new application credential
        self.app_creds: dict[str, dict[str, Any]] = {}  # credentials made through the API (id -> record)
        self.token_creds: dict[str, str] = {}  # token -> the application credential it was issued for
        self.password = ("alice", "s3cret")
        self.oidc_user = ("alice@example.edu", "cli-s3cret")  # the Chameleon login and its CLI password
        self.oidc_client = "keystone-uc-prod"
        self.fip_pool = list(fip_pool)
        self.ssh_hook = ssh_hook
        self.lease_polls = lease_polls
        self.build_polls = build_polls
        self.delete_polls = delete_polls
        self.node_types = {t: hosts_available for t in ("compute_skylake", "compute_zen3", "compute_cascadelake_r")}
        self.max_lease_seconds = MAX_LEASE_SECONDS
        self.update_window: int | None = None  # MaxLeaseUpdateWindowFilter: extend only this close to the end
        # failure knobs
        self.lease_error = False
        self.lease_degraded = False
        self.lease_delete_error = False
        self.lease_delete_polls = 0
        self.extend_conflict: bool | str = False  # True or "hosts": no hosts after the end; "fips": no addresses
        self.allocation_refusal: str | None = None  # the allocation service's 403 message (ExternalServiceFilter)
        self.fail_server_create: set[int] = set()
        self.quota_instances: int | None = None
        self.quota_fips: int | None = None
        self.stuck_build: set[str] = set()
        self.fail_build: dict[str, str] = {}
        self.fail_server_delete: set[str] = set()
        self.skew = 0.0  # seconds the site's clock is ahead of this machine's (advance())
        self.cascade_servers = False  # real Blazar deletes a lease's servers at its end; off: testbed must
        self.on_request: Callable[[str, str], None] | None = None
        # the compute driver snapshots servers only on a KVM site: on a bare-metal site (CHI@..., Ironic) nova's
        # Ironic driver has no snapshot and the compute manager deletes the queued image (see _advance_snapshot)
        self.snapshots = kvm_site(region)
        self.snapshot_polls = 2
        self.kill_snapshot = False
        self.quota_images: int | None = None  # glance's image_count_total for the project
        self.snapshot_hook: Callable[[str, str], None] | None = None
        self.boot_hook: Callable[[str, str], None] | None = None
        self._headers: dict[str, str] = {}
        # inventories
        self.leases: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, dict[str, Any]] = {}
        self.fips: dict[str, dict[str, Any]] = {}
        self.keypairs: dict[str, dict[str, Any]] = {}
        self.ports: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.tokens: dict[str, str | None] = {}  # keystone token -> project id (None: unscoped)
        self.oidc_tokens: dict[str, float] = {}  # Keycloak access token -> when it expires (epoch)
        self.hub_user = "alice"  # JupyterHub: the notebook's user and the server's API token
        self.hub_token = "hub-" + uuid.uuid4().hex
        self.hub_requests = 0
        self._server_posts = 0
        self._next_ip = 10
        self.lock = threading.RLock()
        self.net_shared = {"id": "net-sharednet1", "name": "sharednet1", "router:external": False}
        self.net_public = {"id": "net-public", "name": "public", "router:external": True}
        # a bare-metal site has the one flavor of its Ironic nodes; a KVM site the sizes of its VMs
        self.flavors = ([{"id": f"flavor-{n}", "name": n} for n in KVM_FLAVORS] if kvm_site(region)
                        else [{"id": "flavor-baremetal", "name": "baremetal"}])
        self.images = [self._image("CC-Ubuntu22.04"), self._image("CC-Ubuntu20.04")]
        self.httpd: ThreadingHTTPServer | None = None
        self.crashes: list[str] = []  # tracebacks of requests the fake (or a hook) failed on; each answered 500

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
                try:
                    status, payload, headers = fake.handle(method, self.path, body, dict(self.headers), raw)
                except Exception:  # a bug here or in a test's hook: a 500, as a service's own bug gives, kept
                    fake.crashes.append(f"{method} {self.path}: {traceback.format_exc()}")
                    sys.stderr.write(f"fake Chameleon crashed on {fake.crashes[-1]}")
                    status, payload, headers = (*fake._internal_error(), {})
                text = isinstance(payload, str)  # an error page as webob writes one (glance)
                data = b"" if payload is None else payload.encode() if text else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if payload is not None:
                    self.send_header("Content-Type", "text/html; charset=UTF-8" if text else "application/json")
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

        self.httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name="fake-chameleon").start()
        return self

    def stop(self) -> None:
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    @property
    def base(self) -> str:
        assert self.httpd is not None
        return f"http://{self.host}:{self.httpd.server_address[1]}"

    def env(self, auth: str = "appcred") -> dict[str, str]:
        """OS_* variables as the site's own downloads set them: ``appcred`` (an application credential's
        openrc), ``oidc`` (the project's OpenStack RC file, v3oidcpassword), ``password`` (plain keystone)."""
        common = {"OS_AUTH_URL": f"{self.base}/identity/v3", "OS_REGION_NAME": self.region,
                  "OS_INTERFACE": "public", "OS_IDENTITY_API_VERSION": "3"}
        if auth == "password":
            return {**common, "OS_AUTH_TYPE": "v3password", "OS_USERNAME": self.password[0],
                    "OS_PASSWORD": self.password[1], "OS_PROJECT_NAME": self.project,
                    "OS_USER_DOMAIN_NAME": "Default", "OS_PROJECT_DOMAIN_NAME": "chameleon"}
        if auth == "oidc":
            return {**common, "OS_AUTH_TYPE": "v3oidcpassword", "OS_PROJECT_ID": self.project_id,
                    "OS_USERNAME": self.oidc_user[0], "OS_PASSWORD": self.oidc_user[1], "OS_PROTOCOL": "openid",
                    "OS_IDENTITY_PROVIDER": "chameleon",
                    "OS_DISCOVERY_ENDPOINT": f"{self.base}/oidc/.well-known/openid-configuration",
                    "OS_CLIENT_ID": self.oidc_client, "OS_ACCESS_TOKEN_TYPE": "access_token",
                    "OS_CLIENT_SECRET": "none"}
        return {**common, "OS_AUTH_TYPE": "v3applicationcredential",
                "OS_APPLICATION_CREDENTIAL_ID": self.app_cred[0],
                "OS_APPLICATION_CREDENTIAL_SECRET": self.app_cred[1]}

    def access_token(self, ttl: float = 300) -> str:
        """A Keycloak access token for the user, valid ``ttl`` seconds (negative: already expired)."""
        at = "oidc-" + uuid.uuid4().hex
        with self.lock:
            self.oidc_tokens[at] = time.time() + ttl
        return at

    def jupyter_env(self, *, token_ttl: float = 300) -> dict[str, str]:
        """The environment of a notebook server on Chameleon's JupyterHub: the OS_* variables jupyterhub-chameleon
        sets (its access token valid ``token_ttl`` seconds; OS_PROJECT_NAME is the project's charge code) and the
        JUPYTERHUB_* variables every JupyterHub single-user server gets."""
        return {"OS_AUTH_URL": f"{self.base}/identity/v3", "OS_INTERFACE": "public", "OS_IDENTITY_API_VERSION": "3",
                "OS_ACCESS_TOKEN": self.access_token(token_ttl), "OS_IDENTITY_PROVIDER": "chameleon",
                "OS_PROTOCOL": "openid", "OS_AUTH_TYPE": "v3oidcaccesstoken", "OS_PROJECT_DOMAIN_NAME": "chameleon",
                "OS_REGION_NAME": self.region, "OS_PROJECT_NAME": self.project,
                "JUPYTERHUB_API_URL": f"{self.base}/hub/api", "JUPYTERHUB_API_TOKEN": self.hub_token,
                "JUPYTERHUB_USER": self.hub_user}

    def _hub(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any, dict]:
        """JupyterHub's REST API, the one call python-chi makes: the user model with its auth_state (a fresh
        access token, as jupyterhub-chameleon keeps it)."""
        self.hub_requests += 1
        auth = headers.get("Authorization") or headers.get("authorization") or ""
        if auth.split(" ", 1)[-1] != self.hub_token:
            return 403, {"status": 403, "message": "Forbidden"}, {}
        if method != "GET" or path != f"/hub/api/users/{self.hub_user}":
            return 404, {"status": 404, "message": "Not Found"}, {}
        at = self.access_token(300)
        return 200, {"kind": "user", "name": self.hub_user, "admin": False, "servers": {},
                     "auth_state": {"access_token": at, "expires_at": int(self.oidc_tokens[at]),
                                    "refresh_token": "r-" + uuid.uuid4().hex, "is_federated": True}}, {}

    def clouds_yaml(self, cloud: str = "chameleon") -> str:
        """The clouds.yaml the dashboard offers with a new application credential (auth_url without /v3)."""
        return (f"clouds:\n  {cloud}:\n    auth:\n      auth_url: {self.base}/identity\n"
                f"      application_credential_id: \"{self.app_cred[0]}\"\n"
                f"      application_credential_secret: \"{self.app_cred[1]}\"\n"
                f"    region_name: \"{self.region}\"\n    interface: \"public\"\n    identity_api_version: 3\n"
                "    auth_type: \"v3applicationcredential\"\n")

    def node_failed(self, address: str, message: str = "Baremetal node failed: power lost") -> str:
        """The bare-metal node behind floating IP ``address`` failed: its server goes to ERROR with a fault, as
        nova shows a server whose node Ironic reports failed (``vm_state`` error). Returns the server's id."""
        with self.lock:
            for sid, s in self.servers.items():
                view = self._server_view(s)
                if any(a["addr"] == address for net in view["addresses"].values() for a in net):
                    s.update(status="ERROR", fault={"code": 500, "created": _now().strftime(NOVA_FMT),
                                                    "message": message})
                    s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:task_state"] = "error", None
                    return sid
        raise KeyError(address)

    def leaked(self) -> dict[str, int]:
        """What is still held: leases (a TERMINATED one holds nothing), servers, floating IPs (the things that
        cost money)."""
        with self.lock:
            return {"leases": sum(1 for x in self.leases.values() if x["status"] != "TERMINATED"),
                    "servers": len(self.servers), "fips": len(self.fips)}

    def advance(self, seconds: float) -> None:
        """The site's clock moves on: leases past their end are ended at the next request."""
        self.skew += seconds

    def _end_due_leases(self) -> None:
        """Blazar's end_lease event at a lease's end_date: the host plugin deletes the instances on the reserved
        hosts, the floating-IP plugin takes its addresses back, the lease is TERMINATED (and stays listed)."""
        now = _now() + timedelta(seconds=self.skew)
        for lease in list(self.leases.values()):
            if lease["status"] != "ACTIVE" or datetime.strptime(lease["end_date"], LEASE_FMT) > now:
                continue
            rids = {r["id"] for r in lease["reservations"]}
            for fid, f in list(self.fips.items()):
                if any(f"reservation:{rid}" in f["tags"] for rid in rids):
                    self._fip_release(fid)
            for sid, srv in list(self.servers.items()):
                if srv["_reservation"] in rids:
                    self._server_gone(sid)
            lease["status"] = "TERMINATED"
            self._event(lease, "end_lease")["status"] = "DONE"
            for r in lease["reservations"]:
                r["status"] = "deleted"

    def settle(self) -> None:
        """Time passes: every server nova accepted a delete for finishes deleting (as it does with no one polling;
        ``fail_server_delete`` still applies on the next GET)."""
        with self.lock:
            for s in list(self.servers.values()):
                if s["_deleting"] is not None and not self._matches(s["name"], self.fail_server_delete):
                    self._server_gone(s["id"])

    # dispatch ---------------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: Any, headers: dict[str, str],
               raw: bytes = b"") -> tuple[int, Any, dict]:
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self.lock:
            self.requests.append((method, path))
            self._end_due_leases()
            reply = self._route(method, path, query, body, headers, raw)
            if self.on_request:
                self.on_request(method, path)
            return reply

    def _route(self, method: str, path: str, query: dict[str, str], body: Any, headers: dict[str, str],
               raw: bytes) -> tuple[int, Any, dict]:
        if path.startswith("/oidc"):
            return self._oidc(method, path, raw, headers)
        if path.startswith("/hub/api"):
            return self._hub(method, path, headers)
        if path.startswith("/identity"):
            return self._keystone(method, path, body, headers)
        token = headers.get("X-Auth-Token") or headers.get("x-auth-token")
        if token not in self.tokens or self.tokens[token] is None:  # an unscoped token reaches no service
            return 401, {"error": {"code": 401, "title": "Unauthorized",
                                   "message": "The request you have made requires authentication."}}, {}
        for prefix, fn, service in (("/reservation/v1", self._blazar, "reservation"),
                                    ("/compute", self._nova, "compute"), ("/network", self._neutron, "network"),
                                    ("/image", self._glance, "image")):
            if path.startswith(prefix):
                if not self._allowed(token, method, service, path):  # keystonemiddleware's access rules
                    return 401, {"error": {"code": 401, "title": "Unauthorized",
                                           "message": "Token authorization failed"}}, {}
                self._headers = {k.lower(): v for k, v in headers.items()}
                reply = fn(method, path[len(prefix):] or "/", query, body)
                return (reply[0], reply[1], reply[2] if len(reply) > 2 else {})
        return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}, {}

    # keystone ---------------------------------------------------------------------------------------
    @staticmethod
    def _unauthorized(message: str = "The request you have made requires authentication.") -> tuple[int, Any, dict]:
        return 401, {"error": {"code": 401, "title": "Unauthorized", "message": message}}, {
            "WWW-Authenticate": 'Keystone uri="http://127.0.0.1"'}

    def _keystone(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any, dict]:
        if method == "GET" and path in ("/identity", "/identity/v3"):
            return 200, {"version": {"id": "v3.14", "status": "stable", "links": [
                {"rel": "self", "href": f"{self.base}/identity/v3/"}]}}, {}
        m = re.fullmatch(r"/identity/v3/OS-FEDERATION/identity_providers/([^/]+)/protocols/([^/]+)/auth", path)
        if m and method in ("GET", "POST"):
            return self._federated(m.group(1), m.group(2), headers)
        m = re.fullmatch(r"/identity/v3/users/([^/]+)/application_credentials(?:/([^/]+))?", path)
        if m:
            return self._app_creds_api(method, m.group(1), m.group(2), body, headers)
        if method != "POST" or path != "/identity/v3/auth/tokens":
            return 404, {"error": {"code": 404, "title": "Not Found",
                                   "message": "The resource could not be found."}}, {}
        auth = (body or {}).get("auth", {})
        ident = auth.get("identity", {})
        methods = ident.get("methods", [])
        scope = auth.get("scope")
        project: str | None = None
        if "application_credential" in methods:
            if scope is not None:  # keystone.auth.core: the credential's own project is the scope
                return self._unauthorized("Error authenticating with application credential: "
                                          "Application credentials cannot request a scope.")
            ac = ident.get("application_credential", {})
            made = self.app_creds.get(str(ac.get("id")))
            if made is not None:  # one made through the API: its secret, its expiry
                if ac.get("secret") != made["secret"]:
                    return self._unauthorized()
                if made.get("expires_at") and datetime.strptime(made["expires_at"][:19], "%Y-%m-%dT%H:%M:%S") < _now():
                    return self._unauthorized("The request you have made requires authentication.")
            elif (ac.get("id"), ac.get("secret")) != self.app_cred:
                return self._unauthorized()
            project = self.project_id
            status, payload, hdrs = self._token(methods, project)
            self.token_creds[hdrs["X-Subject-Token"]] = str(ac.get("id"))
            return status, payload, hdrs
        elif "password" in methods:
            u = ident.get("password", {}).get("user", {})
            if (u.get("name"), u.get("password")) != self.password:
                return self._unauthorized()
        elif "token" in methods:
            if ident.get("token", {}).get("id") not in self.tokens:
                return self._unauthorized()
        else:
            return self._unauthorized()
        if scope is not None:
            p = scope.get("project") or {}
            if p.get("id") != self.project_id and p.get("name") != self.project:
                return self._unauthorized()  # no role on that project
            project = self.project_id
        return self._token(methods, project)

    # application credentials (keystone/api/users.py; access rules as keystonemiddleware enforces them) ---------
    def _cred_record(self, cid: str) -> dict[str, Any] | None:
        if cid == self.app_cred[0]:
            return {"id": cid, "name": "user-credential", "unrestricted": self.app_cred_unrestricted,
                    "access_rules": None, "expires_at": None, "project_id": self.project_id, "roles": []}
        return self.app_creds.get(cid)

    def _allowed(self, token: str, method: str, service: str, path: str) -> bool:
        """keystonemiddleware's validate_allowed_request: a token of a credential with access rules may make only
        the requests a rule names (method, service type, the request's whole path; * and ** wildcards)."""
        cred = self._cred_record(self.token_creds.get(token, ""))
        rules = cred.get("access_rules") if cred else None
        if rules is None:
            return True
        return any(r["method"] == method and r["service"] == service and _path_matches(path, r["path"])
                   for r in rules)

    def _app_creds_api(self, method: str, user: str, cid: str | None, body: Any,
                       headers: dict[str, str]) -> tuple[int, Any, dict]:
        token = headers.get("X-Auth-Token") or headers.get("x-auth-token") or ""
        if self.tokens.get(token) is None:
            return self._unauthorized()
        own = self._cred_record(self.token_creds.get(token, ""))
        restricted = own is not None and not own.get("unrestricted")
        forbidden = (403, {"error": {"code": 403, "title": "Forbidden", "message": "You are not authorized to "
                                     "perform the requested action: Using method 'application_credential' is not "
                                     "allowed for managing additional application credentials."}}, {})
        if user != "u1":
            return 403, {"error": {"code": 403, "title": "Forbidden", "message": "You are not authorized to "
                                   "perform the requested action: Cannot create an application credential for "
                                   "another user."}}, {}
        if cid is None and method == "POST":
            if restricted:
                return forbidden
            req = (body or {}).get("application_credential") or {}
            if not isinstance(req.get("name"), str) or not req["name"]:
                return 400, {"error": {"code": 400, "title": "Bad Request",
                                       "message": "Invalid input for field 'name': 'name' is a required property"}}, {}
            rules = req.get("access_rules")
            for r in rules or []:
                if (r.get("method") not in ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")
                        or not str(r.get("path", "")).startswith("/") or not r.get("service")):
                    return 400, {"error": {"code": 400, "title": "Bad Request",
                                           "message": f"Invalid input for field 'access_rules': {r}"}}, {}
            new = {"id": uuid.uuid4().hex, "name": req["name"], "description": req.get("description"),
                   "secret": "sec-" + uuid.uuid4().hex, "unrestricted": bool(req.get("unrestricted", False)),
                   "expires_at": req.get("expires_at"), "project_id": self.project_id, "user_id": "u1",
                   "roles": [{"id": "r1", "name": "member"}],
                   "access_rules": None if rules is None else [{**r, "id": uuid.uuid4().hex} for r in rules]}
            self.app_creds[new["id"]] = new
            return 201, {"application_credential": new}, {}
        if cid is None and method == "GET":
            return 200, {"application_credentials": [
                {k: v for k, v in c.items() if k != "secret"} for c in self.app_creds.values()]}, {}
        rec = self._cred_record(cid or "")
        if rec is None:
            return 404, {"error": {"code": 404, "title": "Not Found",
                                   "message": f"Could not find application credential: {cid}."}}, {}
        if method == "GET":
            return 200, {"application_credential": {k: v for k, v in rec.items() if k != "secret"}}, {}
        if method == "DELETE":
            if restricted:
                return forbidden
            self.app_creds.pop(cid or "", None)
            return 204, None, {}
        return 405, {"error": {"code": 405, "title": "Method Not Allowed", "message": "Method not allowed"}}, {}

    def _token(self, methods: list[str], project: str | None) -> tuple[int, Any, dict]:
        token = "tok-" + uuid.uuid4().hex
        self.tokens[token] = project

        def svc(kind: str, name: str, url: str) -> dict[str, Any]:
            return {"type": kind, "name": name, "id": name, "endpoints": [
                {"id": f"{name}-{i}", "interface": i, "region": self.region, "region_id": self.region, "url": url}
                for i in ("public", "internal", "admin")]}

        b = self.base
        now = _now()
        tok: dict[str, Any] = {"methods": methods, "expires_at": "2099-01-01T00:00:00.000000Z",
                               "issued_at": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"), "audit_ids": ["a1"],
                               "user": {"id": "u1", "name": "alice", "domain": {"id": "d1", "name": "chameleon"}}}
        if project is not None:
            tok["roles"] = [{"id": "r1", "name": "member"}]
            tok["project"] = {"id": project, "name": self.project, "domain": {"id": "d1", "name": "chameleon"}}
            tok["catalog"] = [svc("identity", "keystone", f"{b}/identity/v3"),
                              svc("reservation", "blazar", f"{b}/reservation/v1"),
                              svc("compute", "nova", f"{b}/compute/v2.1"), svc("network", "neutron", f"{b}/network"),
                              svc("image", "glance", f"{b}/image")]
        return 201, {"token": tok}, {"X-Subject-Token": token}

    def _federated(self, idp: str, protocol: str, headers: dict[str, str]) -> tuple[int, Any, dict]:
        """keystone's OS-FEDERATION auth: an OpenID Connect bearer token -> an unscoped token."""
        if idp != "chameleon":
            return 404, {"error": {"code": 404, "title": "Not Found",
                                   "message": f"Could not find Identity Provider: {idp}."}}, {}
        if protocol != "openid":
            return 404, {"error": {"code": 404, "title": "Not Found",
                                   "message": f"Could not find federated protocol {protocol} for Identity "
                                              f"Provider: {idp}."}}, {}
        bearer = (headers.get("Authorization") or headers.get("authorization") or "").removeprefix("Bearer ")
        if self.oidc_tokens.get(bearer, 0.0) < time.time():  # unknown or expired: mod_auth_openidc refuses it
            return self._unauthorized()
        return self._token(["openid"], None)

    def _oidc(self, method: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any, dict]:
        """The site's Keycloak: the discovery document and the token endpoint (password grant)."""
        if method == "GET" and path == "/oidc/.well-known/openid-configuration":
            return 200, {"issuer": f"{self.base}/oidc", "token_endpoint": f"{self.base}/oidc/token",
                         "authorization_endpoint": f"{self.base}/oidc/auth",
                         "grant_types_supported": ["authorization_code", "implicit", "refresh_token", "password",
                                                   "client_credentials",
                                                   "urn:ietf:params:oauth:grant-type:device_code"]}, {}
        if method == "POST" and path == "/oidc/token":
            form = {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}
            client = form.get("client_id")
            basic = headers.get("Authorization") or headers.get("authorization") or ""
            if basic.startswith("Basic "):
                client = base64.b64decode(basic[6:]).decode(errors="replace").split(":", 1)[0]
            if client != self.oidc_client:
                return 401, {"error": "invalid_client", "error_description": "Invalid client credentials"}, {}
            if form.get("grant_type") != "password":
                return 400, {"error": "unsupported_grant_type", "error_description": "Unsupported grant_type"}, {}
            if (form.get("username"), form.get("password")) != self.oidc_user:
                return 401, {"error": "invalid_grant", "error_description": "Invalid user credentials"}, {}
            at = "oidc-" + uuid.uuid4().hex
            self.oidc_tokens[at] = time.time() + 300
            return 200, {"access_token": at, "expires_in": 300, "refresh_expires_in": 1800,
                         "refresh_token": "r-" + uuid.uuid4().hex, "token_type": "Bearer",
                         "id_token": "i-" + uuid.uuid4().hex, "not-before-policy": 0,
                         "session_state": _id(), "scope": form.get("scope", "openid")}, {}
        return 404, {"error": "not_found"}, {}

    # blazar -----------------------------------------------------------------------------------------
    @staticmethod
    def _blazar_error(code: int, message: str) -> Reply:
        """blazar.api.v1.utils.render_error_message (error_name is the code, or INTERNAL_SERVER_ERROR)."""
        return code, {"error_code": code, "error_message": message, "error_name": code}

    @staticmethod
    def _internal_error() -> Reply:
        return 500, {"error_code": 500, "error_message": "Internal Server Error",
                     "error_name": "INTERNAL_SERVER_ERROR"}

    def _lease_view(self, lease: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in lease.items() if not k.startswith("_")}

    def _hosts_in_use(self, node_type: str | None) -> int:
        return sum(r["max"] for le in self.leases.values() for r in le["reservations"]
                   if r["resource_type"] == "physical:host" and le["status"] not in ("ERROR", "TERMINATED")
                   and _node_type(r.get("resource_properties", "")) == node_type)

    def _event(self, lease: dict[str, Any], kind: str) -> dict[str, Any]:
        return next(e for e in lease["events"] if e["event_type"] == kind)

    def _advance_lease(self, lease: dict[str, Any]) -> None:
        if lease["_deleting"] is not None:  # the manager is still ending it (the DELETE timed out in RPC)
            lease["_deleting"] -= 1
            if lease["_deleting"] <= 0:
                if self.lease_delete_error:
                    lease["status"] = "ERROR"
                    lease["_deleting"] = None
                else:
                    self._lease_gone(lease)
            return
        if lease["status"] not in ("PENDING", "STARTING"):
            return
        if datetime.strptime(lease["start_date"], LEASE_FMT) > _now() + timedelta(minutes=1):
            return  # a future lease waits for its start
        lease["_polls"] += 1
        start = self._event(lease, "start_lease")
        if lease["_polls"] < self.lease_polls:
            lease["status"] = "STARTING" if lease["_polls"] > 0 else "PENDING"
            start["status"] = "IN_PROGRESS" if lease["_polls"] > 0 else "UNDONE"
            return
        if self.lease_error:  # _basic_action: the event and the failing reservation in error, no reason kept
            lease["status"] = "ERROR"
            start["status"] = "ERROR"
            for r in lease["reservations"]:
                if r["resource_type"] == "physical:host":
                    r["status"] = "error"
            return
        lease["status"] = "ACTIVE"
        start["status"] = "DONE"
        for r in lease["reservations"]:
            r["status"] = "active"
            if r["resource_type"] == "virtual:floatingip":
                for addr in lease["_fip_addresses"]:
                    fid = _id()
                    self.fips[fid] = self._fip_json(fid, addr, tags=["blazar", f"reservation:{r['id']}"])
        if self.lease_degraded:
            lease["degraded"] = True
            for r in lease["reservations"]:
                if r["resource_type"] == "physical:host":
                    r["missing_resources"] = True

    def _blazar(self, method: str, path: str, query: dict[str, str], body: Any) -> Reply:
        m = re.fullmatch(r"/leases(?:/([^/]+))?", path)
        if not m:
            return 404, {"error_code": 404, "error_message": "Not Found", "error_name": 404}
        lid = m.group(1)
        if lid is None and method == "GET":
            return 200, {"leases": [self._lease_view(x) for x in self.leases.values()]}
        if lid is None and method == "POST":
            return self._lease_create(body or {})
        lease = self.leases.get(lid or "")
        if lease is None:  # api.v1.validation.check_exists
            return self._blazar_error(404, f"Object with {{'lease_id': '{lid}'}} not found")
        if method == "GET":
            self._advance_lease(lease)
            if lease["id"] not in self.leases:
                return self._blazar_error(404, f"Object with {{'lease_id': '{lid}'}} not found")
            return 200, {"lease": self._lease_view(lease)}
        if method == "PUT":
            return self._lease_update(lease, body or {})
        if method == "DELETE":
            return self._lease_delete(lease)
        return 405, {"error_code": 405, "error_message": "Method Not Allowed", "error_name": 405}

    def _dates(self, start_s: Any, end_s: Any) -> tuple[datetime, datetime, datetime] | Reply:
        """manager.service._parse_lease_dates: 'now' or '%Y-%m-%d %H:%M'; now is rounded to the minute."""
        now = _now().replace(second=0, microsecond=0)
        out = []
        for v in (start_s, end_s):
            if v == "now":
                out.append(now)
                continue
            try:
                out.append(datetime.strptime(str(v), BLAZAR_FMT))
            except ValueError:
                return self._blazar_error(400, f"{v} is an invalid date. Required format: {BLAZAR_FMT}")
        return out[0], out[1], now

    def _lease_create(self, body: dict[str, Any]) -> Reply:
        missing = [k for k in ("name", "start_date", "end_date") if k not in body]
        if missing:
            return self._blazar_error(400, f"Missing parameter {', '.join(missing)}")
        reqs = body.get("reservations") or []
        for req in reqs:
            if "resource_type" not in req:
                return self._blazar_error(400, "Missing parameter resource_type")
        got = self._dates(body["start_date"], body["end_date"])
        if len(got) == 2:
            return got  # type: ignore[return-value]
        start, end, now = got  # type: ignore[misc]
        if start < now:
            return self._blazar_error(400, "Start date must be later than current date")
        if end <= start:
            return self._blazar_error(400, "End date must be later than start date.")
        lid = _id()
        stamp = _now().strftime(LEASE_FMT)
        reservations, fip_addresses = [], []
        for req in reqs:
            rtype = req["resource_type"]
            base = {"id": _id(), "lease_id": lid, "resource_id": _id(), "resource_type": rtype, "status": "pending",
                    "missing_resources": False, "resources_changed": False, "created_at": stamp,
                    "updated_at": None}
            if rtype == "physical:host":
                for k in ("min", "max", "hypervisor_properties", "resource_properties"):
                    if k not in req:
                        return self._blazar_error(400, f"Missing parameter {k}")
                try:
                    lo, hi = int(req["min"]), int(req["max"])
                except (TypeError, ValueError):
                    return self._blazar_error(400, "Malformed parameter min")
                if lo > hi:
                    return self._blazar_error(400, "Invalid values for min/max of hosts. Max must be equal to or "
                                                   "larger than min.")
                ntype = _node_type(req["resource_properties"])
                if self._hosts_in_use(ntype) + hi > self.node_types.get(ntype or "", 0):
                    return self._blazar_error(500, "Not enough hosts available")
                reservations.append({**base, "hypervisor_properties": req["hypervisor_properties"],
                                     "resource_properties": req["resource_properties"], "before_end": "default",
                                     "min": lo, "max": hi})
            elif rtype == "virtual:floatingip":
                for k in ("network_id", "amount"):
                    if k not in req:
                        return self._blazar_error(400, f"Missing parameter {k}")
                amount = int(req["amount"])
                if amount > len(self.fip_pool):
                    return self._blazar_error(500, "Not enough floating IPs available")
                fip_addresses += [self.fip_pool.pop(0) for _ in range(amount)]
                reservations.append({**base, "network_id": req["network_id"], "amount": amount})
            else:
                return self._blazar_error(500, f"The {rtype} resource type is not supported")
        if (end - start).total_seconds() > self.max_lease_seconds:
            self.fip_pool[:0] = fip_addresses
            # enforcement.check_create's MaxLeaseDurationException, re-raised by create_lease as NotAuthorized
            return self._blazar_error(403, f"Lease duration of {int((end - start).total_seconds())} seconds must be "
                                           f"less than or equal to the maximum lease duration of "
                                           f"{self.max_lease_seconds} seconds.")
        if self.allocation_refusal is not None:  # enforcement/filters/external_service_filter.py: 400
            self.fip_pool[:0] = fip_addresses
            return self._blazar_error(400, self.allocation_refusal)
        events = [{"id": _id(), "lease_id": lid, "event_type": kind, "time": t.strftime(LEASE_FMT),
                   "status": "UNDONE", "created_at": stamp, "updated_at": None}
                  for kind, t in (("start_lease", start), ("end_lease", end))]
        lease = {"id": lid, "name": body["name"], "status": "PENDING", "degraded": False, "user_id": "u1",
                 "project_id": self.project_id, "start_date": start.strftime(LEASE_FMT),
                 "end_date": end.strftime(LEASE_FMT), "created_at": stamp, "updated_at": None, "trust_id": _id(),
                 "reservations": reservations, "events": events, "_polls": -1, "_fip_addresses": fip_addresses,
                 "_deleting": None}
        self.leases[lid] = lease
        return 201, {"lease": self._lease_view(lease)}

    def _lease_update(self, lease: dict[str, Any], body: dict[str, Any]) -> Reply:
        """manager.service.update_lease for a new end date (or a new name)."""
        if lease["status"] in TRANSITIONAL:  # lease_status decorator: X -> UPDATING is not a valid transition
            return self._blazar_error(500, "Invalid lease status.")
        if set(body) == {"name"}:
            lease["name"] = body["name"]
            return 200, {"lease": self._lease_view(lease)}
        old_start = datetime.strptime(lease["start_date"], LEASE_FMT)
        old_end = datetime.strptime(lease["end_date"], LEASE_FMT)
        got = self._dates(body.get("start_date", old_start.strftime(BLAZAR_FMT)),
                          body.get("end_date", old_end.strftime(BLAZAR_FMT)))
        if len(got) == 2:
            return got  # type: ignore[return-value]
        start, end, now = got  # type: ignore[misc]
        if old_start < now and start != old_start.replace(second=0, microsecond=0):
            return self._blazar_error(400, "Cannot modify the start date of already started leases")
        if old_end < now:
            return self._blazar_error(400, "Terminated leases can only be renamed")
        if end < now or end < start:
            return self._blazar_error(400, "End date must be later than current and start date")
        if end > old_end or start < old_start:  # MaxLeaseDurationFilter.check_update
            counted_from = old_start
            if self.update_window is not None:  # reservation_extension_window: counted from the current end
                if now < old_end - timedelta(seconds=self.update_window):
                    return self._blazar_error(400, f"Lease can only be extended within {self.update_window} seconds "
                                                   "of the leases current end time.")
                counted_from = old_end
            if (end - counted_from).total_seconds() > self.max_lease_seconds:
                return self._blazar_error(400, f"Lease duration of {int((end - counted_from).total_seconds())} "
                                               "seconds must be less than or equal to the maximum lease duration "
                                               f"of {self.max_lease_seconds} seconds.")
        if self.extend_conflict in (True, "hosts"):  # the host plugin's update_reservation
            return self._blazar_error(500, "Not enough hosts available")
        if self.extend_conflict == "fips":  # the floating IP plugin's _update_allocations
            return self._blazar_error(500, "Not enough floating IPs available")
        lease["end_date"] = end.strftime(LEASE_FMT)
        self._event(lease, "end_lease")["time"] = end.strftime(LEASE_FMT)
        lease["updated_at"] = _now().strftime(LEASE_FMT)
        return 200, {"lease": self._lease_view(lease)}

    def _lease_delete(self, lease: dict[str, Any]) -> Reply:
        """manager.service.delete_lease (an RPC call): DELETING, then gone, or ERROR when it cannot end cleanly."""
        if lease["status"] == "DELETING":  # DELETING -> DELETING is not a valid transition
            return self._blazar_error(500, "Invalid lease status.")
        lease["status"] = "DELETING"
        if self.lease_delete_polls > 0:  # the manager keeps working after the API's RPC call timed out
            lease["_deleting"] = self.lease_delete_polls
            return self._internal_error()
        if self.lease_delete_error:
            lease["status"] = "ERROR"
            return self._blazar_error(500, "Failed to cleanly end lease %(lease_id)s")
        self._lease_gone(lease)
        return 200, {}

    def _lease_gone(self, lease: dict[str, Any]) -> None:
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
        out = {k: v for k, v in s.items() if not k.startswith("_") and k != "fault"}
        if s["status"] in ("ERROR", "DELETED") and s.get("fault"):  # views.servers: fault only then, and
            out["fault"] = {k: v for k, v in s["fault"].items() if k != "details" or s["fault"]["code"] != 500}
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
        if path == "/limits" and method == "GET":  # nova api/openstack/compute/views/limits.py (2.57+)
            live = [s for s in self.servers.values() if s["_deleting"] is None]
            cap = -1 if self.quota_instances is None else self.quota_instances
            return 200, {"limits": {"rate": [], "absolute": {
                "maxTotalInstances": cap, "totalInstancesUsed": len(live), "maxTotalCores": -1,
                "totalCoresUsed": 48 * len(live), "maxTotalRAMSize": -1, "totalRAMUsed": 196608 * len(live),
                "maxTotalKeypairs": 100, "maxServerMeta": 128, "maxServerGroups": 10, "maxServerGroupMembers": 10,
                "totalServerGroupsUsed": 0}}}
        if path == "/servers" and method == "POST":
            return self._server_create(body or {})
        if path in ("/servers/detail", "/servers") and method == "GET":
            out = [self._server_view(s) for s in self.servers.values()]
            if "name" in query:
                out = [s for s in out if re.search(query["name"], s["name"])]
            return 200, {"servers": out}
        m = re.fullmatch(r"/servers/([^/]+)/action", path)
        if m and method == "POST" and isinstance(body, dict) and "createImage" in body:
            return self._create_image(m.group(1), body["createImage"])
        m = re.fullmatch(r"/servers/([^/]+)", path)
        if m:
            s = self.servers.get(m.group(1))
            if s is None:
                return self._nova_error(404, "itemNotFound", f"Instance {m.group(1)} could not be found.")
            if method == "GET":
                if s["_deleting"] is not None:
                    if s["_deleting"] <= 0:
                        if self._matches(s["name"], self.fail_server_delete):  # once: a second delete works
                            self.fail_server_delete = {x for x in self.fail_server_delete
                                                       if not self._matches(s["name"], {x})}
                            s.update(status="ERROR", _deleting=None)
                            s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:task_state"] = "error", None
                            s["fault"] = {"code": 500, "created": _now().strftime(NOVA_FMT),
                                          "message": "Failed to terminate instance: Timeout reached while waiting "
                                                     "for callback for node"}
                            return 200, {"server": self._server_view(s)}
                        self._server_gone(s["id"])
                        return self._nova_error(404, "itemNotFound", f"Instance {m.group(1)} could not be found.")
                    s["_deleting"] -= 1
                elif s["status"] == "BUILD":
                    self._advance_build(s)
                return 200, {"server": self._server_view(s)}
            if method == "DELETE":
                if s["_deleting"] is None:
                    s["_deleting"] = self.delete_polls
                    s["OS-EXT-STS:task_state"] = "deleting"
                return 204, None
        return self._nova_error(404, "itemNotFound", f"no route {method} {path}")

    def _advance_build(self, s: dict[str, Any]) -> None:
        if s["_no_host"]:
            s.update(status="ERROR", fault={"code": 500, "created": _now().strftime(NOVA_FMT),
                                            "message": "No valid host was found. There are not enough hosts "
                                                       "available."})
            s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:task_state"] = "error", None
            return
        s["_polls"] += 1
        stages = ("scheduling", "networking", "spawning")
        s["OS-EXT-STS:task_state"] = stages[min(s["_polls"], len(stages) - 1)]
        if s["_polls"] < self.build_polls or self._is_stuck(s["name"]):
            return
        fault = next((msg for k, msg in self.fail_build.items() if self._matches(s["name"], {k})), None)
        if fault is not None:  # e.g. the deploy failed on every node nova retried
            s.update(status="ERROR", fault={"code": 500, "created": _now().strftime(NOVA_FMT), "message": fault,
                                            "details": "Traceback (most recent call last): ..."})
            s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:task_state"] = "error", None
            return
        s["status"], s["OS-EXT-STS:vm_state"], s["OS-EXT-STS:task_state"] = "ACTIVE", "active", None
        s["OS-EXT-STS:power_state"] = 1
        s["OS-SRV-USG:launched_at"] = _now().strftime("%Y-%m-%dT%H:%M:%S.000000")

    @staticmethod
    def _matches(name: str, which: Iterable[str]) -> bool:
        return any(x == "*" or name == x or name.endswith("-" + x) for x in which)

    def _is_stuck(self, name: str) -> bool:
        return self._matches(name, self.stuck_build)
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
        if image["status"] != "active":  # nova.exception.ImageNotActive
            return self._nova_error(400, "badRequest", f"Image {image['id']} is not active.")
        flavor = next((f for f in self.flavors if f["id"] == req.get("flavorRef")), None)
        if flavor is None:
            return self._nova_error(400, "badRequest", f"Flavor {req.get('flavorRef')} could not be found.")
        nets = [n.get("uuid") for n in req.get("networks") or []]
        if nets and nets[0] != self.net_shared["id"]:
            return self._nova_error(400, "badRequest", f"Network {nets[0]} could not be found.")
        rid = hints.get("reservation")
        status, no_host = "BUILD", False
        res = next((r for le in self.leases.values() for r in le["reservations"]
                    if r["id"] == rid and le["status"] == "ACTIVE" and r["resource_type"] == "physical:host"), None)
        used = sum(1 for s in live if s["_reservation"] == rid)
        if res is None or used >= int(res.get("max", 1)):
            no_host = True  # accepted (202), then the scheduler finds no host: ERROR on the first look
        sid = _id()
        now = _now().strftime(NOVA_FMT)
        srv = {"id": sid, "name": req.get("name"), "status": status, "hostId": uuid.uuid4().hex, "created": now,
               "updated": now, "key_name": req.get("key_name"), "image": {"id": image["id"]},
               "flavor": {"original_name": flavor["name"], "vcpus": 48, "ram": 196608, "disk": 240,
                          "ephemeral": 0, "swap": 0, "extra_specs": {}},
               "host_status": "UP", "locked": False, "locked_reason": None, "metadata": {},
               "tenant_id": "p1", "user_id": "u1", "OS-EXT-STS:task_state": "scheduling",
               "OS-EXT-STS:vm_state": "building",
               "OS-EXT-STS:power_state": 0, "OS-EXT-AZ:availability_zone": "nova", "OS-DCF:diskConfig": "MANUAL",
               "accessIPv4": "", "accessIPv6": "", "config_drive": "", "progress": 0, "links": [],
               "security_groups": [{"name": "default"}], "tags": [], "description": None,
               "os-extended-volumes:volumes_attached": [], "trusted_image_certificates": None,
               "OS-SRV-USG:launched_at": None, "OS-SRV-USG:terminated_at": None,
               "_network": self.net_shared["name"], "_reservation": rid, "_polls": 0, "_deleting": None,
               "_no_host": no_host}
        self.servers[sid] = srv
        if not no_host:
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
        m = re.fullmatch(r"/quotas/([^/]+)/details(?:\.json)?", path)
        if m and method == "GET":  # neutron quota details: per resource used, limit, reserved (-1: unlimited)
            if m.group(1) != self.project_id:
                return self._neutron_error(403, "HTTPForbidden", "Non-admin is not authorized to access quotas "
                                                                 "for another project")
            return 200, {"quota": {
                "floatingip": {"used": len(self.fips), "reserved": 0,
                               "limit": -1 if self.quota_fips is None else self.quota_fips},
                "network": {"used": 0, "reserved": 0, "limit": 100}, "port": {"used": len(self.ports),
                                                                              "reserved": 0, "limit": 500}}}
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
            net = req.get("floating_network_id")
            if net not in (self.net_public["id"], self.net_shared["id"]):
                return self._neutron_error(404, "NetworkNotFound", f"Network {net} could not be found.")
            if net != self.net_public["id"]:  # l3_db._create_floatingip
                return self._neutron_error(400, "BadRequest", f"Bad floatingip request: Network {net} is not a "
                                                              "valid external network.")
            if self.quota_fips is not None and len(self.fips) >= self.quota_fips:
                return self._neutron_error(409, "OverQuota", "Quota exceeded for resources: ['floatingip'].")
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
                other = next((x for x in self.fips.values() if x["port_id"] == port_id and x is not f), None)
                if other is not None:  # l3_db._check_and_get_fip_assoc; moving f from another port is allowed
                    return self._neutron_error(409, "FloatingIPPortAlreadyAssociated",
                                               f"Cannot associate floating IP {f['floating_ip_address']} ({f['id']}) "
                                               f"with port {port_id} using fixed IP "
                                               f"{port['fixed_ips'][0]['ip_address']}, as that fixed IP already has "
                                               f"a floating IP on external network {self.net_public['id']}.")
                if f["port_id"] and f["port_id"] != port_id:
                    self._unbind(f)
                f.update(port_id=port_id, fixed_ip_address=port["fixed_ips"][0]["ip_address"], status="ACTIVE",
                         router_id="router-1")
                srv = self.servers.get(port["device_id"])
                kp = self.keypairs.get(srv["key_name"]) if srv and srv.get("key_name") else None
                made_from = next((i for i in self.images if srv and i["id"] == srv["image"]["id"]), None)
                if self.boot_hook and made_from and made_from.get("image_type") == "snapshot":
                    self.boot_hook(f["floating_ip_address"], made_from["id"])
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
            if img is not None and method == "GET" and img.get("image_type") == "snapshot":
                img = self._advance_snapshot(img)
            if img is None:  # glance's errors are webob's HTML pages (glanceclient reads them so)
                return 404, _page("404 Not Found", f"No image found with ID {m.group(1)}")
            if method == "DELETE":
                if img["owner"] != self.project_id:
                    return 403, _page("403 Forbidden", "You are not permitted to delete this image.")
                self.images.remove(img)
                return 204, None
            return 200, {k: v for k, v in img.items() if not k.startswith("_")}
        return 404, {"code": 404, "title": "Not Found", "message": f"no route {method} {path}"}

    def _create_image(self, sid: str, req: Any) -> Reply:
        """nova's servers._create_image over compute.api.snapshot: the image entry made in glance (queued), the
        server's task_state image_snapshot_pending, 202 with the id as the microversion says."""
        s = self.servers.get(sid)
        if s is None or s["_deleting"] is not None:
            return self._nova_error(404, "itemNotFound", f"Instance {sid} could not be found.")
        if not isinstance(req, dict) or not isinstance(req.get("name"), str) or not req["name"].strip():
            return self._nova_error(400, "badRequest", "Invalid input for field/attribute createImage. Value: "
                                    f"{json.dumps(req)}. 'name' is a required property")
        vm = s["OS-EXT-STS:vm_state"]
        if vm not in ("active", "stopped", "paused", "suspended"):
            return self._nova_error(409, "conflictingRequest", f"Cannot 'createImage' instance {sid} while it is in "
                                    f"vm_state {vm}")
        if s["OS-EXT-STS:task_state"] is not None:
            return self._nova_error(409, "conflictingRequest", f"Cannot 'createImage' instance {sid} while it is in "
                                    f"task_state {s['OS-EXT-STS:task_state']}")
        mine = [i for i in self.images if i["owner"] == self.project_id]
        if self.quota_images is not None and len(mine) + 1 > self.quota_images:
            return self._nova_error(500, "computeFault", "Unexpected API Error. Please report this at "
                                    "http://bugs.launchpad.net/nova/ and attach the Nova API log if possible.\n"
                                    "<class 'glanceclient.exc.HTTPOverLimit'>")
        iid = str(uuid.uuid4())
        now = _now().strftime(NOVA_FMT)
        img = {**self._image(req["name"]), "id": iid, "status": "queued", "visibility": "private",
               "owner": self.project_id, "disk_format": None, "container_format": None, "size": None,
               "created_at": now, "updated_at": now, "self": f"/v2/images/{iid}", "file": f"/v2/images/{iid}/file",
               "image_type": "snapshot", "instance_uuid": sid, "user_id": "u1", "base_image_ref": s["image"]["id"],
               **{str(k): str(v) for k, v in (req.get("metadata") or {}).items()}, "_polls": 0}
        self.images.append(img)
        s["OS-EXT-STS:task_state"] = "image_snapshot_pending"
        version = self._headers.get("x-openstack-nova-api-version") or \
            self._headers.get("openstack-api-version", "compute 2.1").split()[-1]
        major, _, minor = version.partition(".")
        if (int(major), int(minor or 0)) >= (2, 45):
            return 202, {"image_id": iid}
        return 202, None, {"Location": f"{self.base}/image/v2/images/{iid}"}

    def _advance_snapshot(self, img: dict[str, Any]) -> dict[str, Any] | None:
        """One GET's worth of a snapshot's progress (queued -> saving -> active); None once nova deleted it."""
        srv = self.servers.get(img["instance_uuid"])
        if img["status"] in ("active", "killed"):
            return img
        img["_polls"] += 1
        if not self.snapshots:  # the driver raised NotImplementedError: delete_image_on_error removed the image
            self.images.remove(img)
            if srv is not None:
                srv["OS-EXT-STS:task_state"] = None
            return None
        if img["status"] == "queued":
            img["status"] = "saving"
            if srv is not None:
                srv["OS-EXT-STS:task_state"] = "image_uploading"
                port = next((pid for pid, p in self.ports.items() if p["device_id"] == srv["id"]), None)
                fip = next((f for f in self.fips.values() if port and f["port_id"] == port), None)
                if self.snapshot_hook and fip:
                    self.snapshot_hook(fip["floating_ip_address"], img["id"])
        elif img["_polls"] > self.snapshot_polls:
            if self.kill_snapshot:
                img["status"] = "killed"
            else:
                img.update(status="active", size=10 << 30, disk_format="qcow2", container_format="bare",
                           checksum=hashlib.md5(img["id"].encode()).hexdigest())
            if srv is not None:
                srv["OS-EXT-STS:task_state"] = None
        img["updated_at"] = _now().strftime(NOVA_FMT)
        return img


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
