"""A fake Cloud TPU API (v2, REST/JSON) on 127.0.0.1 for the real google-cloud-tpu client.

Routes (sdks.md §3): nodes create/get/list/delete, queuedResources create/get/list/delete, operations get.
Errors are ``{"error": {"code", "message", "status"}}`` with the HTTP status the real service uses.

It behaves like the service over time: a node is CREATING for ``ready_after`` polls (GETs of the node or of its
operation) and then READY; a queued resource is WAITING_FOR_RESOURCES, then PROVISIONING, then ACTIVE over GETs
(its nodes appear READY then); deletes finish on the next poll. Faults, armed by tests:

- ``fail_next_create(429, "RESOURCE_EXHAUSTED", msg)``: the next create request is refused;
- ``fail_next_operation(code, msg)``: the next node create operation ends ``done`` with ``error`` (the node is
  left TERMINATED, as a failed create can leave one behind);
- ``stuck.add(node_id)``: that node stays CREATING and its operation never finishes;
- ``preempt(node_id)``: the node turns PREEMPTED (health UNHEALTHY_MAINTENANCE);
- ``fail_next(method, status)``: the next matching request answers that error (503, 403, 504, ...).

Workers "answer SSH": every worker's reachable address comes from ``worker_ip`` (one function: a stable slot in a
pool of loopback addresses per node id, where the tests run real sshd daemons); when a node becomes READY the keys
of its ``ssh-keys`` metadata are written to ``authorized_keys`` (as a TPU VM's guest agent would), or handed to
``authorized_keys(address, keys)`` when it is a callable (e.g. to install them on local-testbed hosts).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"

HTTP_OF = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
           "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500,
           "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
ROUTE = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+)/(nodes|queuedResources|operations)(?:/([^/:]+))?$")
DEFAULT_POOL = [f"127.0.20.{i}" for i in range(1, 17)]


def workers_for(accelerator_type: str) -> int:
    """Hosts in a slice: v2/v3/v4/v5p have 8 cores (4 chips) per host; v5e/v6e single host up to 8 chips."""
    m = re.match(r"^(v\d+[a-z]*|v5litepod|v6e)-(\d+)$", accelerator_type)
    if not m:
        raise ValueError(accelerator_type)
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


class ApiError(Exception):
    def __init__(self, status: str, message: str, code: int | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code or HTTP_OF[status]


class FakeTpuApi:
    """The fake service; ``endpoint`` is ``http://127.0.0.1:PORT`` once started."""

    def __init__(self, *, authorized_keys: Path | Callable[[str, list[str]], None] | None = None,
                 pool: list[str] | None = None, ready_after: int = 2, qr_waiting: int = 2, qr_provisioning: int = 1,
                 ip_for: Callable[[str, int], str] | None = None):
        self.authorized_keys = authorized_keys
        self.pool = list(pool or DEFAULT_POOL)
        self.ready_after = ready_after
        self.qr_waiting, self.qr_provisioning = qr_waiting, qr_provisioning
        self.ip_for = ip_for
        self.lock = threading.RLock()
        self.nodes: dict[str, dict[str, Any]] = {}  # full name -> {"json":..., "ticks":..., "op":...}
        self.qrs: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.stuck: set[str] = set()
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
                code, out = fake.handle(method, self.path, body)
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

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

    def fail_next(self, method: str, status: str, message: str = "", *, times: int = 1, path: str = "") -> None:
        """The next ``times`` requests of ``method`` (whose path contains ``path``) answer ``status``."""
        for _ in range(times):
            self._request_errors.append((method, path, ApiError(status, message or f"fake {status}")))

    def fail_next_operation(self, code: int = 13, message: str = "Internal error: TPU host failed to boot") -> None:
        self._op_errors.append((code, message))

    def preempt(self, node_id: str) -> None:
        with self.lock:
            rec = self._node_by_id(node_id)
            rec["json"]["state"] = "PREEMPTED"
            rec["json"]["health"] = "UNHEALTHY_MAINTENANCE"

    def node_ids(self) -> list[str]:
        with self.lock:
            return sorted(n.rsplit("/", 1)[1] for n in self.nodes)

    def qr_ids(self) -> list[str]:
        with self.lock:
            return sorted(n.rsplit("/", 1)[1] for n in self.qrs)

    def node(self, node_id: str) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self._node_by_id(node_id)["json"]))

    def api_requests(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.requests)

    def _node_by_id(self, node_id: str) -> dict[str, Any]:
        for name, rec in self.nodes.items():
            if name.rsplit("/", 1)[1] == node_id:
                return rec
        raise KeyError(node_id)

    # the one address mapping ------------------------------------------------------------------------
    def worker_ip(self, node_id: str, worker: int) -> str:
        """The address where worker ``worker`` of ``node_id`` answers SSH (stable across re-creation)."""
        if self.ip_for is not None:
            return self.ip_for(node_id, worker)
        if node_id not in self._slots:
            self._slots[node_id] = self._next_slot
            self._next_slot += workers_for(self._accel_of(node_id))
        i = self._slots[node_id] + worker
        if i >= len(self.pool):
            raise ApiError("RESOURCE_EXHAUSTED", "fake TPU API: no loopback address left for this worker")
        return self.pool[i]

    def _accel_of(self, node_id: str) -> str:
        return self._node_by_id(node_id)["json"]["acceleratorType"]

    # request dispatch -----------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.requests.append((method, url.path))
            try:
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
                return 200, fn(*args, query=query, body=body)
            except ApiError as e:
                return e.code, {"error": {"code": e.code, "message": e.message, "status": e.status}}

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

    # nodes ----------------------------------------------------------------------------------------
    def _create_error(self) -> None:
        if self._create_errors:
            raise self._create_errors.pop(0)

    def _make_node(self, parent: str, node_id: str, spec: dict[str, Any], state: str,
                   qr: str | None = None) -> dict[str, Any]:
        accel = spec.get("acceleratorType", "")
        try:
            workers_for(accel)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", f"Accelerator type \"{accel}\" is not available in zone") from None
        name = f"{parent}/nodes/{node_id}"
        node = {**spec, "name": name, "state": state, "health": "HEALTHY" if state == "READY" else None,
                "createTime": "2026-01-01T00:00:00Z", "apiVersion": "V2"}
        node = {k: v for k, v in node.items() if v is not None}
        if qr:
            node["queuedResource"] = qr
        rec = {"json": node, "ticks": self.ready_after, "op": None}
        self.nodes[name] = rec
        external = spec.get("networkConfig", {}).get("enableExternalIps", False)
        eps = []
        for k in range(workers_for(accel)):
            ip = self.worker_ip(node_id, k)
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
        """What the guest agent does on a TPU VM: the ``ssh-keys`` metadata become authorized keys."""
        if self.authorized_keys is None:
            return
        keys = [ln.split(":", 1)[1].strip() for ln in node.get("metadata", {}).get("ssh-keys", "").splitlines()
                if ":" in ln]
        if callable(self.authorized_keys):
            for ep in node.get("networkEndpoints", []):
                self.authorized_keys(ep.get("accessConfig", {}).get("externalIp") or ep["ipAddress"], keys)
            return
        old = self.authorized_keys.read_text().splitlines() if self.authorized_keys.exists() else []
        self.authorized_keys.write_text("\n".join(dict.fromkeys(old + keys)) + "\n")

    def _tick_node(self, rec: dict[str, Any]) -> None:
        """One poll of a CREATING node: it becomes READY (or its operation fails) after ``ready_after`` polls."""
        node = rec["json"]
        if node["state"] != "CREATING" or node["name"].rsplit("/", 1)[1] in self.stuck:
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
        node["state"] = "READY"
        node["health"] = "HEALTHY"
        self._install_keys(node)
        if op is not None:
            op.update(done=True, response={"@type": NODE_TYPE, **node})

    def _post_nodes(self, parent: str, *, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        node_id = query.get("nodeId", "")
        if not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", node_id):
            raise ApiError("INVALID_ARGUMENT", f"invalid node id '{node_id}'")
        if f"{parent}/nodes/{node_id}" in self.nodes:
            raise ApiError("ALREADY_EXISTS", f"node {node_id} already exists")
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
        name = f"{parent}/queuedResources/{qid}"
        if name in self.qrs:
            raise ApiError("ALREADY_EXISTS", f"queued resource {qid} already exists")
        self._create_error()
        specs = body.get("tpu", {}).get("nodeSpec", [])
        if not specs:
            raise ApiError("INVALID_ARGUMENT", "queued resource needs tpu.nodeSpec")
        for s in specs:
            if f"{s.get('parent', parent)}/nodes/{s.get('nodeId')}" in self.nodes:
                raise ApiError("ALREADY_EXISTS", f"node {s.get('nodeId')} already exists")
        qr = {**body, "name": name, "createTime": "2026-01-01T00:00:00Z",
              "state": {"state": "WAITING_FOR_RESOURCES"}}
        self.qrs[name] = {"json": qr, "gets": 0}
        op = self._new_op(parent, "create", name)
        op.update(done=True, response={"@type": QR_TYPE, **qr})  # the LRO ends at once; the state then advances
        return self._op_json(op)

    def _tick_qr(self, rec: dict[str, Any]) -> None:
        qr = rec["json"]
        st = qr["state"]["state"]
        if st not in ("WAITING_FOR_RESOURCES", "PROVISIONING"):
            return
        rec["gets"] += 1
        if rec["gets"] > self.qr_waiting + self.qr_provisioning:
            parent = qr["name"].split("/queuedResources/")[0]
            for s in qr["tpu"]["nodeSpec"]:
                self._make_node(s.get("parent", parent), s["nodeId"], s.get("node", {}), "READY", qr=qr["name"])
            qr["state"] = {"state": "ACTIVE"}
        elif rec["gets"] > self.qr_waiting:
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
