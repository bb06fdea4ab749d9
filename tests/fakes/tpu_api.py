"""A fake Cloud TPU API (v2, REST/JSON) on 127.0.0.1 for the real google-cloud-tpu client.

Routes (sdks.md §3): nodes create/get/list/delete, queuedResources create/get/list/delete, operations get.
Errors are ``{"error": {"code", "message", "status", "details"}}`` with the HTTP status the real service uses.
It follows the v2 reference (cloud.google.com/tpu/docs/reference/rest/v2) and the google-cloud-tpu types
(``google/cloud/tpu_v2/types/cloud_tpu.py``), refusals included:

- enums are answered as numbers when the client asks ``$alt=json;enum-encoding=int`` (it always does);
- a queued resource holds ONE node spec: ``nodeId`` for one node, or ``multisliceParams`` (``nodeCount`` > 1,
  ``nodeIdPrefix``, default the queued resource's id; nodes ``<prefix>-0`` ...) for several, never both;
  multislice is refused for v2/v3 (only v4 and later; github.com/AI-Hypercomputer/maxtext/issues/158);
- a queued resource is WAITING_FOR_RESOURCES, then PROVISIONING (its nodes CREATING), then ACTIVE (nodes READY);
  one past its ``queueingPolicy.validUntilDuration`` turns FAILED with ``failedData.error``, as one failed with
  ``fail_qr``; ``delete`` without ``force`` is refused while it has nodes (FAILED_PRECONDITION);
- ``networkConfig.network``/``subnetwork`` must exist (``networks``/``subnetworks``; a project may have no
  ``default`` network) and a subnetwork must be in the zone's region;
- the guest agent: once a node is READY each ``user:key`` line of its ``ssh-keys`` metadata becomes that user's
  authorized key, except for root (Compute Engine disables root login, cloud.google.com/compute/docs/connect/
  root-ssh) and when OS Login is on (``enable-oslogin`` metadata, node value over the project's
  ``project_os_login``; cloud.google.com/compute/docs/instances/ssh: "If you use OS Login, metadata SSH keys are
  disabled"). With ``require_os_login`` (the organization policy constraints/compute.requireOsLogin) a request
  that sets ``enable-oslogin`` false is refused (cloud.google.com/compute/docs/oslogin/manage-oslogin-in-an-org).

Over time: a node is CREATING for ``ready_after`` polls (GETs of the node or of its operation), then READY;
deletes finish on the next poll. Faults, armed by tests:

- ``fail_next_create(429, "RESOURCE_EXHAUSTED", msg)``: the next create request is refused;
- ``fail_next_operation(code, msg)``: the next node create operation ends ``done`` with ``error`` (the node is
  left TERMINATED, as a failed create can leave one behind);
- ``stuck.add(node_id)``: that node stays CREATING and its operation never finishes;
- ``become[node_id] = (state, description)``: a creating node ends in that state instead of READY;
- ``set_state(node_id, state)``: any node state (STOPPED, UNKNOWN, HIDDEN, REPAIRING...), now;
- ``preempt(node_id)``: the node turns PREEMPTED (health UNHEALTHY_MAINTENANCE);
- ``qr_stuck.add(qr_id)``: that queued resource never gets resources; ``fail_qr(qr_id, code, msg)`` fails it,
  ``suspend_qr(qr_id)``: the service suspends it (SUSPENDED, initiator SERVICE, its nodes deleted);
- ``fail_next(method, status, reason=...)``: the next matching request answers that error (503, 403, 504, ...).

IAM for the nodes' own service accounts: a node names one in ``serviceAccount`` (unknown: INVALID_ARGUMENT); the
metadata server (``/computeMetadata/v1/instance/service-accounts/default/token``, answered only with the
``Metadata-Flavor: Google`` header, to a caller at one of a READY node's worker addresses) hands out that account's
token; a request with such a token may do only what ``service_accounts[email]`` grants (permission, resource-name
prefix: a custom role with an IAM condition), else 403 PERMISSION_DENIED as the service words it. ``settle()`` lets
time pass (accepted deletes finish with no one polling their operations); ``host`` is the listening address.

Workers "answer SSH": every worker's reachable address comes from ``worker_ip`` (one function: a stable slot in a
pool of loopback addresses per node id, where the tests run real sshd daemons). Keys are installed in
``authorized_keys``: a directory (one file per user, sshd's ``AuthorizedKeysFile <dir>/%u``) or a callable
``(address, user, keys)`` (e.g. to make the user on local-testbed hosts).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"

HTTP_OF = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
           "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500,
           "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
ROUTE = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+)/(nodes|queuedResources|operations)(?:/([^/:]+))?$")
NODE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
def _free_loopback_net() -> str:
    """A 127.A.B net whose .1 has nothing on port 22: test processes side by side (parallel workers, two checkouts)
    each get their own workers' addresses, never another's sshd."""
    import random
    import socket

    for _ in range(100):
        net = f"127.{random.randint(21, 63)}.{random.randint(1, 250)}"
        with socket.socket() as s:
            try:
                s.bind((f"{net}.1", 22))
                return net
            except OSError:
                continue
    return "127.0.20"


# the workers' loopback net (TB_TPU_NET names one)
DEFAULT_POOL = [f"{os.environ.get('TB_TPU_NET') or _free_loopback_net()}.{i}" for i in range(1, 17)]

# enum numbers of google.cloud.tpu.v2 (cloud_tpu.proto): Node.State, Node.Health, Node.ApiVersion,
# QueuedResourceState.State and .StateInitiator
NODE_STATE = {"STATE_UNSPECIFIED": 0, "CREATING": 1, "READY": 2, "RESTARTING": 3, "REIMAGING": 4, "DELETING": 5,
              "REPAIRING": 6, "STOPPED": 8, "STOPPING": 9, "STARTING": 10, "PREEMPTED": 11, "TERMINATED": 12,
              "HIDING": 13, "HIDDEN": 14, "UNHIDING": 15, "UNKNOWN": 16}
HEALTH = {"HEALTH_UNSPECIFIED": 0, "HEALTHY": 1, "TIMEOUT": 3, "UNHEALTHY_TENSORFLOW": 4, "UNHEALTHY_MAINTENANCE": 5}
API_VERSION = {"API_VERSION_UNSPECIFIED": 0, "V1_ALPHA1": 1, "V1": 2, "V2_ALPHA1": 3, "V2": 4}
QR_STATE = {"STATE_UNSPECIFIED": 0, "CREATING": 1, "ACCEPTED": 2, "PROVISIONING": 3, "FAILED": 4, "DELETING": 5,
            "ACTIVE": 6, "SUSPENDING": 7, "SUSPENDED": 8, "WAITING_FOR_RESOURCES": 9}
INITIATOR = {"STATE_INITIATOR_UNSPECIFIED": 0, "USER": 1, "SERVICE": 2}


def workers_for(accelerator_type: str) -> int:
    """Hosts in a slice: v2/v3/v4/v5p have 8 cores (4 chips) per host; v5e/v6e single host up to 8 chips."""
    m = re.match(r"^(v\d+[a-z]*|v5litepod|v6e)-(\d+)$", accelerator_type)
    if not m:
        raise ValueError(accelerator_type)
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


def _duration(v: Any) -> float | None:
    """A protobuf Duration in JSON ("1800s", "0.5s") as seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(v or ""))
    return float(m.group(1)) if m else None


class ApiError(Exception):
    def __init__(self, status: str, message: str, code: int | None = None, reason: str = ""):
        super().__init__(message)
        self.status, self.message, self.code, self.reason = status, message, code or HTTP_OF[status], reason

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.reason:
            err["details"] = [{"@type": ERROR_INFO_TYPE, "reason": self.reason, "domain": "googleapis.com",
                               "metadata": {"service": "tpu.googleapis.com"}}]
        return {"error": err}


class FakeTpuApi:
    """The fake service; ``endpoint`` is ``http://127.0.0.1:PORT`` once started."""

    def __init__(self, *, authorized_keys: Path | Callable[[str, str, list[str]], None] | None = None,
                 pool: list[str] | None = None, ready_after: int = 2, qr_waiting: int = 2, qr_provisioning: int = 1,
                 ip_for: Callable[[str, int], str] | None = None, networks: dict[str, dict[str, str]] | None = None,
                 project_os_login: bool = False, require_os_login: bool = False, host: str = "127.0.0.1"):
        self.host = host  # where it listens (a local testbed's bridge address lets its hosts reach it)
        # IAM, as far as the nodes' own service accounts go: e-mail -> [(permission, resource name prefix)], the
        # grants of a custom role with an IAM condition on resource.name; tokens the metadata server handed out
        self.service_accounts: dict[str, list[tuple[str, str]]] = {}
        self.sa_tokens: dict[str, str] = {}
        self.authorized_keys = authorized_keys
        self.pool = list(pool or DEFAULT_POOL)
        self.ready_after = ready_after
        self.qr_waiting, self.qr_provisioning = qr_waiting, qr_provisioning
        self.ip_for = ip_for
        # network name -> {subnetwork name: region}; the auto-mode 'default' network has a 'default' subnetwork in
        # every region ("*")
        self.networks = networks if networks is not None else {"default": {"default": "*"}}
        self.project_os_login = project_os_login
        self.require_os_login = require_os_login
        self.lock = threading.RLock()
        self.nodes: dict[str, dict[str, Any]] = {}  # full name -> {"json":..., "ticks":..., "op":...}
        self.qrs: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[tuple[str, str, dict[str, Any]]] = []
        self.stuck: set[str] = set()
        self.qr_stuck: set[str] = set()
        self.become: dict[str, tuple[str, str]] = {}
        self._create_errors: list[ApiError] = []
        self._op_errors: list[tuple[int, str]] = []
        self._request_errors: list[tuple[str, str, ApiError]] = []
        self._slots: dict[str, int] = {}
        self._next_slot = 0
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None

    # lifecycle ------------------------------------------------------------------------------------
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                return None

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}") if n else {}
                code, out = fake.handle(method, self.path, body, headers=dict(self.headers),
                                        client=self.client_address[0])
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeTpuApi:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # test knobs and inventory ---------------------------------------------------------------------
    def fail_next_create(self, code: int = 429, status: str = "RESOURCE_EXHAUSTED", message: str = "") -> None:
        self._create_errors.append(ApiError(status, message or (
            "There is no more capacity in the zone; you can try in another zone where Cloud TPU Nodes are "
            "offered (see https://cloud.google.com/tpu/docs/regions)"), code))

    def fail_next(self, method: str, status: str, message: str = "", *, times: int = 1, path: str = "",
                  reason: str = "") -> None:
        """The next ``times`` requests of ``method`` (whose path contains ``path``) answer ``status``."""
        for _ in range(times):
            self._request_errors.append((method, path, ApiError(status, message or f"fake {status}", reason=reason)))

    def fail_next_operation(self, code: int = 13, message: str = "Internal error: TPU host failed to boot") -> None:
        self._op_errors.append((code, message))

    def preempt(self, node_id: str) -> None:
        self.set_state(node_id, "PREEMPTED", health="UNHEALTHY_MAINTENANCE")

    def set_state(self, node_id: str, state: str, *, health: str | None = None, description: str = "") -> None:
        assert state in NODE_STATE, state
        with self.lock:
            node = self._node_by_id(node_id)["json"]
            node["state"] = state
            if health:
                node["health"] = health
            if description:
                node["healthDescription"] = description

    def fail_qr(self, qr_id: str, code: int = 8, message: str = "") -> None:
        with self.lock:
            rec = self._qr_by_id(qr_id)
            self._qr_failed(rec, code, message or "There is no more capacity in the zone for the requested nodes")

    def suspend_qr(self, qr_id: str) -> None:
        """What the service does to a spot request whose nodes it reclaimed: nodes deleted, SUSPENDED."""
        with self.lock:
            rec = self._qr_by_id(qr_id)
            for n in [n for n, r in self.nodes.items() if r["json"].get("queuedResource") == rec["json"]["name"]]:
                del self.nodes[n]
            rec["json"]["state"] = {"state": "SUSPENDED", "suspendedData": {}, "stateInitiator": "SERVICE"}

    def node_ids(self) -> list[str]:
        with self.lock:
            return sorted(n.rsplit("/", 1)[1] for n in self.nodes)

    def qr_ids(self) -> list[str]:
        with self.lock:
            return sorted(n.rsplit("/", 1)[1] for n in self.qrs)

    def node(self, node_id: str) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self._node_by_id(node_id)["json"]))

    def qr(self, qr_id: str) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self._qr_by_id(qr_id)["json"]))

    def api_requests(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.requests)

    def _node_by_id(self, node_id: str) -> dict[str, Any]:
        for name, rec in self.nodes.items():
            if name.rsplit("/", 1)[1] == node_id:
                return rec
        raise KeyError(node_id)

    def _qr_by_id(self, qr_id: str) -> dict[str, Any]:
        for name, rec in self.qrs.items():
            if name.rsplit("/", 1)[1] == qr_id:
                return rec
        raise KeyError(qr_id)

    # the one address mapping ------------------------------------------------------------------------
    def worker_ip(self, node_id: str, worker: int, accelerator_type: str) -> str:
        """The address where worker ``worker`` of ``node_id`` answers SSH (stable across re-creation)."""
        if self.ip_for is not None:
            return self.ip_for(node_id, worker)
        if node_id not in self._slots:
            self._slots[node_id] = self._next_slot
            self._next_slot += workers_for(accelerator_type)
        i = self._slots[node_id] + worker
        if i >= len(self.pool):
            raise ApiError("RESOURCE_EXHAUSTED", "fake TPU API: no loopback address left for this worker")
        return self.pool[i]

    # request dispatch -----------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
               client: str = "") -> tuple[int, dict[str, Any]]:
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        as_int = "enum-encoding=int" in query.get("$alt", "")
        headers = {k.lower(): v for k, v in (headers or {}).items()}
        with self.lock:
            self.requests.append((method, url.path))
            self.bodies.append((method, url.path, json.loads(json.dumps(body))))
            if url.path.startswith("/computeMetadata/"):
                return self._metadata(method, url.path, headers, client)
            try:
                self._authorize(method, url.path, headers.get("authorization", ""))
                for i, (meth, part, err) in enumerate(self._request_errors):
                    if meth == method and part in url.path:
                        del self._request_errors[i]
                        raise err
                m = ROUTE.match(url.path)
                if not m:
                    raise ApiError("NOT_FOUND", f"no route {method} {url.path}")
                parent, coll, rid = m.groups()
                fn = getattr(self, f"_{method.lower()}_{coll}{'_one' if rid else ''}", None)
                if fn is None:
                    raise ApiError("NOT_FOUND", f"no route {method} {url.path}")
                args = (parent, rid) if rid else (parent,)
                out = fn(*args, query=query, body=body)
                return 200, _encode(out, as_int)
            except ApiError as e:
                return e.code, e.body()

    # the metadata server and IAM ------------------------------------------------------------------
    def _metadata(self, method: str, path: str, headers: dict[str, str], client: str) -> tuple[int, dict[str, Any]]:
        """A VM's metadata server: the token of the node's own service account, for the worker at ``client``."""
        if headers.get("metadata-flavor") != "Google":  # the real server refuses requests without the header
            return 403, {"error": "Missing required header: Metadata-Flavor: Google"}
        if method != "GET" or path != "/computeMetadata/v1/instance/service-accounts/default/token":
            return 404, {"error": f"no metadata at {path}"}
        for rec in self.nodes.values():
            node = rec["json"]
            ips = {ep.get("accessConfig", {}).get("externalIp") or ep["ipAddress"]
                   for ep in node.get("networkEndpoints", [])}
            if client in ips and node.get("state") in ("READY", "DELETING"):
                email = (node.get("serviceAccount") or {}).get("email") or "default-compute@developer"
                tok = f"ya29.fake-{next(self._ids)}"
                self.sa_tokens[tok] = email
                return 200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}
        return 404, {"error": f"{client} is no TPU VM of this project"}

    PERMISSIONS = {("GET", "nodes", False): "tpu.nodes.list", ("GET", "nodes", True): "tpu.nodes.get",
                   ("POST", "nodes", False): "tpu.nodes.create", ("DELETE", "nodes", True): "tpu.nodes.delete",
                   ("GET", "queuedResources", False): "tpu.queuedResources.list",
                   ("GET", "queuedResources", True): "tpu.queuedResources.get",
                   ("POST", "queuedResources", False): "tpu.queuedResources.create",
                   ("DELETE", "queuedResources", True): "tpu.queuedResources.delete",
                   ("GET", "operations", True): "tpu.operations.get"}

    def _authorize(self, method: str, path: str, authorization: str) -> None:
        """A service account's token may do only what its grants allow, on the resources they name
        (PERMISSION_DENIED as the service words it); the test's own anonymous client is the project owner."""
        tok = authorization.removeprefix("Bearer ").strip()
        if tok not in self.sa_tokens:
            return
        m = ROUTE.match(path)
        if not m:
            return
        parent, coll, rid = m.groups()
        perm = self.PERMISSIONS.get((method, coll, rid is not None), f"tpu.{coll}.{method.lower()}")
        resource = f"{parent}/{coll}/{rid}" if rid else parent
        grants = self.service_accounts.get(self.sa_tokens[tok], [])
        if not any(p == perm and resource.startswith(prefix) for p, prefix in grants):
            raise ApiError("PERMISSION_DENIED", f"Permission '{perm}' denied on resource "
                                                f"'//tpu.googleapis.com/{resource}' (or it may not exist).")

    def settle(self) -> None:
        """Time passes: every delete the service accepted finishes (as the real service's operations do with no
        one polling them)."""
        with self.lock:
            for op in self.ops.values():
                if not op["done"] and "delete" in op:
                    kind, name = op["delete"]
                    if kind == "node":
                        self.nodes.pop(name, None)
                    else:
                        self.qrs.pop(name, None)
                        for n in [n for n, r in self.nodes.items() if r["json"].get("queuedResource") == name]:
                            del self.nodes[n]
                    op["done"] = True

    def _new_op(self, parent: str, verb: str, target: str, **extra: Any) -> dict[str, Any]:
        name = f"{parent}/operations/operation-{next(self._ids)}"
        op = {"name": name, "verb": verb, "target": target, "done": False, **extra}
        self.ops[name] = op
        return op

    def _op_json(self, op: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": op["name"], "done": op["done"],
                               "metadata": {"@type": META_TYPE, "verb": op["verb"], "target": op["target"],
                                            "apiVersion": "v2"}}
        if op["done"]:
            if "error" in op:
                out["error"] = op["error"]
            else:
                out["response"] = op.get("response", {"@type": EMPTY_TYPE})
        return out

    # request checks ---------------------------------------------------------------------------------
    def _create_error(self) -> None:
        if self._create_errors:
            raise self._create_errors.pop(0)

    def _check_node_body(self, parent: str, spec: dict[str, Any]) -> None:
        """What the service refuses in a Node: an unknown accelerator, no runtime version, a bad label, a missing
        network, OS Login turned off against the organization policy."""
        accel = spec.get("acceleratorType", "")
        try:
            workers_for(accel)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", f"Accelerator type \"{accel}\" is not available in zone") from None
        if not spec.get("runtimeVersion"):
            raise ApiError("INVALID_ARGUMENT", "runtime_version is required")
        for k, v in spec.get("labels", {}).items():  # Google Cloud label rules
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v)):
                raise ApiError("INVALID_ARGUMENT", f"Invalid label '{k}': '{v}'")
        project = parent.split("/")[1]
        region = parent.rsplit("/", 1)[1].rsplit("-", 1)[0]
        nc = spec.get("networkConfig", {})
        net = (nc.get("network") or "default").rsplit("/", 1)[-1]
        if net not in self.networks:
            raise ApiError("INVALID_ARGUMENT", f"Network 'projects/{project}/global/networks/{net}' does not exist "
                                               f"in project {project}")
        sub_path = nc.get("subnetwork") or "default"
        sub = sub_path.rsplit("/", 1)[-1]
        m = re.match(r"^projects/[^/]+/regions/([^/]+)/subnetworks/", sub_path)
        sub_region = self.networks[net].get(sub)
        if sub_region is None:
            raise ApiError("INVALID_ARGUMENT", f"Subnetwork '{sub}' does not exist in network '{net}'")
        if (m and m.group(1) != region) or sub_region not in ("*", region):
            raise ApiError("INVALID_ARGUMENT", f"Subnetwork '{sub}' is not in region {region} of the TPU's zone")
        sa = (spec.get("serviceAccount") or {}).get("email")
        if sa and sa not in self.service_accounts:
            raise ApiError("INVALID_ARGUMENT", f"Service account {sa} does not exist in project {project}")
        oslogin = str(spec.get("metadata", {}).get("enable-oslogin", "")).lower()
        if self.require_os_login and oslogin in ("false", "0", "no", "n", "off"):
            raise ApiError("FAILED_PRECONDITION", f"Constraint constraints/compute.requireOsLogin violated for "
                                                  f"project {project}: enable-oslogin cannot be set to false")

    def _os_login(self, node: dict[str, Any]) -> bool:
        v = str(node.get("metadata", {}).get("enable-oslogin", "")).lower()
        if v in ("true", "1", "yes", "y", "on"):
            return True
        if v in ("false", "0", "no", "n", "off"):
            return False
        return self.project_os_login

    # nodes ----------------------------------------------------------------------------------------
    def _make_node(self, parent: str, node_id: str, spec: dict[str, Any], state: str,
                   qr: str | None = None, multislice: bool = False) -> dict[str, Any]:
        accel = spec.get("acceleratorType", "")
        name = f"{parent}/nodes/{node_id}"
        node = {**spec, "name": name, "state": state, "health": "HEALTHY" if state == "READY" else None,
                "createTime": "2026-01-01T00:00:00Z", "apiVersion": "V2", "id": str(1000 + next(self._ids))}
        node = {k: v for k, v in node.items() if v is not None}
        if qr:
            node["queuedResource"] = qr
            node["multisliceNode"] = multislice
        rec = {"json": node, "ticks": self.ready_after, "op": None}
        self.nodes[name] = rec
        external = spec.get("networkConfig", {}).get("enableExternalIps", False)
        eps = []
        for k in range(workers_for(accel)):
            ip = self.worker_ip(node_id, k, accel)
            if external:
                eps.append({"ipAddress": f"10.130.{len(self.nodes) % 250}.{k + 2}", "port": 8470,
                            "accessConfig": {"externalIp": ip}})
            else:  # no external IP: the internal one is where SSH answers
                eps.append({"ipAddress": ip, "port": 8470})
        node["networkEndpoints"] = eps
        if state == "READY":
            self._install_keys(node)
        return rec

    def _install_keys(self, node: dict[str, Any]) -> None:
        """What the guest agent does on a TPU VM: each ``user:key`` line of the ``ssh-keys`` metadata becomes an
        authorized key of that user; never root's; none at all under OS Login."""
        if self.authorized_keys is None or self._os_login(node):
            return
        by_user: dict[str, list[str]] = {}
        for ln in node.get("metadata", {}).get("ssh-keys", "").splitlines():
            user, sep, key = ln.partition(":")
            if sep and user.strip() and user.strip() != "root" and key.strip():
                by_user.setdefault(user.strip(), []).append(key.strip())
        for user, keys in by_user.items():
            if callable(self.authorized_keys):
                for ep in node.get("networkEndpoints", []):
                    self.authorized_keys(ep.get("accessConfig", {}).get("externalIp") or ep["ipAddress"], user, keys)
                continue
            f = self.authorized_keys / user
            old = f.read_text().splitlines() if f.exists() else []
            f.write_text("\n".join(dict.fromkeys(old + keys)) + "\n")

    def _tick_node(self, rec: dict[str, Any]) -> None:
        """One poll of a CREATING node: it becomes READY (or its operation fails) after ``ready_after`` polls."""
        node = rec["json"]
        nid = node["name"].rsplit("/", 1)[1]
        if node["state"] != "CREATING" or nid in self.stuck or rec.get("held"):
            return
        rec["ticks"] -= 1
        if rec["ticks"] > 0:
            return
        op = self.ops.get(rec["op"] or "")
        if rec.get("fail"):
            node["state"] = "TERMINATED"
            node["health"] = "UNHEALTHY_MAINTENANCE"
            if op is not None:
                op.update(done=True, error={"code": rec["fail"][0], "message": rec["fail"][1]})
            return
        if nid in self.become:
            node["state"], node["healthDescription"] = self.become.pop(nid)
            if op is not None:
                op.update(done=True, response={"@type": NODE_TYPE, **node})
            return
        node["state"] = "READY"
        node["health"] = "HEALTHY"
        self._install_keys(node)
        if op is not None:
            op.update(done=True, response={"@type": NODE_TYPE, **node})

    def _post_nodes(self, parent: str, *, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        node_id = query.get("nodeId", "")
        if not NODE_ID_RE.match(node_id) or len(node_id) > 63:
            raise ApiError("INVALID_ARGUMENT", f"invalid node id '{node_id}'")
        if f"{parent}/nodes/{node_id}" in self.nodes:
            raise ApiError("ALREADY_EXISTS", f"node {node_id} already exists")
        self._check_node_body(parent, body)
        self._create_error()
        rec = self._make_node(parent, node_id, body, "CREATING")
        if self._op_errors:
            rec["fail"] = self._op_errors.pop(0)
        op = self._new_op(parent, "create", rec["json"]["name"])
        rec["op"] = op["name"]
        return self._op_json(op)

    def _get_nodes(self, parent: str, **_: Any) -> dict[str, Any]:
        for rec in self.nodes.values():
            self._tick_node(rec)
        return {"nodes": [r["json"] for n, r in sorted(self.nodes.items()) if n.startswith(parent + "/")],
                "nextPageToken": ""}

    def _get_nodes_one(self, parent: str, rid: str, **_: Any) -> dict[str, Any]:
        rec = self.nodes.get(f"{parent}/nodes/{rid}")
        if rec is None:
            raise ApiError("NOT_FOUND", f"Resource '{parent}/nodes/{rid}' was not found")
        self._tick_node(rec)
        return rec["json"]

    def _delete_nodes_one(self, parent: str, rid: str, **_: Any) -> dict[str, Any]:
        name = f"{parent}/nodes/{rid}"
        rec = self.nodes.get(name)
        if rec is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        rec["json"]["state"] = "DELETING"
        return self._op_json(self._new_op(parent, "delete", name, delete=("node", name)))

    # queued resources -----------------------------------------------------------------------------
    def _post_queuedResources(self, parent: str, *, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        qid = query.get("queuedResourceId", "")
        if not re.fullmatch(r"[A-Za-z0-9_.~+%-]+", qid):
            raise ApiError("INVALID_ARGUMENT", f"invalid queued resource id '{qid}'")
        name = f"{parent}/queuedResources/{qid}"
        if name in self.qrs:
            raise ApiError("ALREADY_EXISTS", f"queued resource {qid} already exists")
        specs = body.get("tpu", {}).get("nodeSpec", [])
        if len(specs) != 1:
            raise ApiError("INVALID_ARGUMENT", f"a queued resource takes exactly one tpu.nodeSpec (got {len(specs)}); "
                                               "request several nodes with multisliceParams")
        spec = specs[0]
        if spec.get("parent", parent) != parent:
            raise ApiError("INVALID_ARGUMENT", "nodeSpec.parent must be the queued resource's parent")
        ms = spec.get("multisliceParams")
        if ("nodeId" in spec) == (ms is not None):
            raise ApiError("INVALID_ARGUMENT", "nodeSpec needs exactly one of node_id (one node) and "
                                               "multislice_params (several nodes)")
        node = spec.get("node", {})
        self._check_node_body(parent, node)
        if ms is not None:
            count = int(ms.get("nodeCount", 0))
            if count <= 1:
                raise ApiError("INVALID_ARGUMENT", f"multislice_params.node_count must be > 1 (got {count})")
            if re.match(r"^v[23]-", node.get("acceleratorType", "")):
                raise ApiError("INVALID_ARGUMENT", "Cloud TPU was unable to complete the operation. Please try "
                                                   "again, or contact support if the problem persists.")
            prefix = ms.get("nodeIdPrefix") or qid
            ids = [f"{prefix}-{i}" for i in range(count)]
        else:
            ids = [spec["nodeId"]]
        for nid in ids:
            if not NODE_ID_RE.match(nid) or len(nid) > 63:
                raise ApiError("INVALID_ARGUMENT", f"invalid node id '{nid}'")
            if f"{parent}/nodes/{nid}" in self.nodes:
                raise ApiError("ALREADY_EXISTS", f"node {nid} already exists")
        self._create_error()
        qr = {**body, "name": name, "createTime": "2026-01-01T00:00:00Z",
              "state": {"state": "WAITING_FOR_RESOURCES"}}
        self.qrs[name] = {"json": qr, "gets": 0, "ids": ids, "multislice": ms is not None, "t0": time.monotonic(),
                          "valid": _duration(body.get("queueingPolicy", {}).get("validUntilDuration"))}
        op = self._new_op(parent, "create", name)
        op.update(done=True, response={"@type": QR_TYPE, **qr})  # the LRO ends at once; the state then advances
        return self._op_json(op)

    def _qr_failed(self, rec: dict[str, Any], code: int, message: str) -> None:
        for n in [n for n, r in self.nodes.items() if r["json"].get("queuedResource") == rec["json"]["name"]]:
            del self.nodes[n]
        rec["json"]["state"] = {"state": "FAILED", "failedData": {"error": {"code": code, "message": message}}}

    def _tick_qr(self, rec: dict[str, Any]) -> None:
        qr = rec["json"]
        st = qr["state"]["state"]
        parent = qr["name"].split("/queuedResources/")[0]
        node = qr["tpu"]["nodeSpec"][0].get("node", {})
        if st == "WAITING_FOR_RESOURCES" and rec["valid"] is not None \
                and time.monotonic() - rec["t0"] > rec["valid"]:
            self._qr_failed(rec, 4, "The queued resource request could not be fulfilled before its valid until "
                                    "duration expired")
            return
        if st not in ("WAITING_FOR_RESOURCES", "PROVISIONING") or qr["name"].rsplit("/", 1)[1] in self.qr_stuck:
            return
        rec["gets"] += 1
        if rec["gets"] > self.qr_waiting + self.qr_provisioning:
            for nid in rec["ids"]:
                n = self.nodes.get(f"{parent}/nodes/{nid}")
                if n is None:
                    n = self._make_node(parent, nid, node, "CREATING", qr=qr["name"], multislice=rec["multislice"])
                n["held"] = False
                n["ticks"] = 1
                self._tick_node(n)
            qr["state"] = {"state": "ACTIVE"}
        elif rec["gets"] > self.qr_waiting and st == "WAITING_FOR_RESOURCES":
            for nid in rec["ids"]:  # selected: its nodes are being created
                n = self._make_node(parent, nid, node, "CREATING", qr=qr["name"], multislice=rec["multislice"])
                n["held"] = True
            qr["state"] = {"state": "PROVISIONING"}

    def _get_queuedResources(self, parent: str, **_: Any) -> dict[str, Any]:
        return {"queuedResources": [r["json"] for n, r in sorted(self.qrs.items()) if n.startswith(parent + "/")],
                "nextPageToken": ""}

    def _get_queuedResources_one(self, parent: str, rid: str, **_: Any) -> dict[str, Any]:
        rec = self.qrs.get(f"{parent}/queuedResources/{rid}")
        if rec is None:
            raise ApiError("NOT_FOUND", f"Resource '{parent}/queuedResources/{rid}' was not found")
        self._tick_qr(rec)
        return rec["json"]

    def _delete_queuedResources_one(self, parent: str, rid: str, *, query: dict[str, str],
                                    **_: Any) -> dict[str, Any]:
        name = f"{parent}/queuedResources/{rid}"
        rec = self.qrs.get(name)
        if rec is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        owned = [n for n, r in self.nodes.items() if r["json"].get("queuedResource") == name]
        # DeleteQueuedResourceRequest.force: without it, only once its nodes are gone (or ACCEPTED/FAILED/SUSPENDED)
        if owned and query.get("force", "").lower() != "true":
            raise ApiError("FAILED_PRECONDITION", f"queued resource {rid} still has nodes; delete them or use force")
        rec["json"]["state"] = {"state": "DELETING"}
        for n in owned:
            self.nodes[n]["json"]["state"] = "DELETING"
        return self._op_json(self._new_op(parent, "delete", name, delete=("qr", name)))

    # operations -----------------------------------------------------------------------------------
    def _get_operations_one(self, parent: str, rid: str, **_: Any) -> dict[str, Any]:
        op = self.ops.get(f"{parent}/operations/{rid}")
        if op is None:
            raise ApiError("NOT_FOUND", f"operation {rid} not found")
        if not op["done"]:
            if op["verb"] == "create" and op["target"] in self.nodes:
                self._tick_node(self.nodes[op["target"]])
            elif "delete" in op:
                kind, name = op["delete"]
                if kind == "node":
                    self.nodes.pop(name, None)
                else:
                    self.qrs.pop(name, None)
                    for n in [n for n, r in self.nodes.items() if r["json"].get("queuedResource") == name]:
                        del self.nodes[n]
                op["done"] = True
        return self._op_json(op)


def _encode(out: dict[str, Any], as_int: bool) -> dict[str, Any]:
    """The answer as the service writes it: enums by number when the client asked for enum-encoding=int."""
    out = json.loads(json.dumps(out))
    if not as_int:
        return out

    def node(n: dict[str, Any]) -> None:
        for key, table in (("state", NODE_STATE), ("health", HEALTH), ("apiVersion", API_VERSION)):
            if isinstance(n.get(key), str):
                n[key] = table[n[key]]

    def qr(q: dict[str, Any]) -> None:
        st = q.get("state")
        if isinstance(st, dict):
            if isinstance(st.get("state"), str):
                st["state"] = QR_STATE[st["state"]]
            if isinstance(st.get("stateInitiator"), str):
                st["stateInitiator"] = INITIATOR[st["stateInitiator"]]

    resp = out.get("response", out)
    if "nodes" in out:
        for n in out["nodes"]:
            node(n)
    elif "queuedResources" in out:
        for q in out["queuedResources"]:
            qr(q)
    elif str(resp.get("name", "")).split("/")[-2:-1] == ["nodes"]:
        node(resp)
    elif "/queuedResources/" in str(resp.get("name", "")):
        qr(resp)
    return out
