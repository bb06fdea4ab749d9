"""The GCP TPU provider: TPU VMs and multi-host slices through google-cloud-tpu (``tpu_v2``, REST transport).

- Credentials: Application Default Credentials (``google.auth.default()``), never stored. Missing ADC is refused
  before any API call. ``provider.endpoint`` overrides the API endpoint (private endpoints, fakes); it must carry
  its scheme (``http://host:port`` or ``https://host``). With ``TESTBED_TPU_ANONYMOUS=1`` in the environment *and*
  an endpoint set, anonymous credentials are used instead (the test suite's fake TPU API); never otherwise.
- Nodes are named ``<testbed>-<i>``; with ``queued_resource: true`` one queued resource ``<testbed>-qr`` asks for
  all of them: ``node_id`` for one node, ``multislice_params`` (count, prefix ``<testbed>``) for several (v4 and
  later only); spot tier when ``spot``/``preemptible``; valid in the queue for ``create_timeout`` only, so a
  request given up on never turns into billing nodes later. Every id is written to state *before* the create
  call returns, so ``testbed destroy`` can always release a half-made testbed (a leaked TPU costs money).
- Every worker of a slice (``node.network_endpoints``; a v4-32 has 4) becomes a host ``<node>-w<k>`` reached on
  its external IP (internal with ``internal_ips``) as the spec's user (default ``tpu``; root is refused: TPU VMs
  disable root login). The testbed key goes in metadata ``ssh-keys``, with ``enable-oslogin=FALSE`` (OS Login
  ignores metadata keys). ``network``/``subnetwork`` choose the VPC (a project may have no ``default``).
- Waits poll with backoff and jitter (``Polling``), bounded by their deadline, with a progress line on every
  change and a heartbeat. A node in a state that never becomes READY (PREEMPTED, TERMINATED, UNKNOWN, STOPPED,
  HIDDEN...) fails the wait at once; a FAILED queued resource reports the service's own reason.
- A PREEMPTED, TERMINATED or UNKNOWN node is reported by ``refresh``/``status`` and ``provision`` recreates it
  (delete + create). ``destroy`` treats NotFound as gone and is safe to repeat.
- ``google.cloud.tpu_v2`` and ``google.auth`` are imported only inside methods.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from testbed.errors import TestbedError, UsageError, require_extra
from testbed.hosts import Host
from testbed.providers.base import Made, Progress, Provider, _quiet
from testbed.providers.gcp_tpu_errors import (
    ADC_FIX,
    api_error,
    is_already_exists,
    is_api_error,
    is_not_found,
    is_refusal,
)
from testbed.providers.gcp_tpu_wait import FAST_POLLING as FAST_POLLING
from testbed.providers.gcp_tpu_wait import Polling as Polling
from testbed.providers.gcp_tpu_wait import duration as duration
from testbed.providers.gcp_tpu_wait import pace
from testbed.providers.settings import TpuSettings
from testbed.textfmt import plural

EXTRA = "tpu"  # the pip extra that brings google-cloud-tpu (pyproject.toml)

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.spec import TestbedSpec
    from testbed.state import Store

NODE = "tpu-node"
QUEUED_RESOURCE = "tpu-queued-resource"
ANONYMOUS_ENV = "TESTBED_TPU_ANONYMOUS"
PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]

# Node.State (google.cloud.tpu.v2): what a wait does with each
RECREATE_STATES = {"PREEMPTED", "TERMINATED", "UNKNOWN"}  # never READY again; provision deletes and recreates them
HELD_STATES = {"STOPPED", "STOPPING", "HIDING", "HIDDEN"}  # never READY unless someone starts/unhides them
NEVER_READY = RECREATE_STATES | HELD_STATES | {"DELETING"}
WAIT_STATES = {"CREATING", "STARTING", "RESTARTING", "REPAIRING", "REIMAGING", "UNHIDING", "STATE_UNSPECIFIED"}
QR_WAIT_STATES = {"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "STATE_UNSPECIFIED"}
QR_BAD_STATES = {"FAILED", "SUSPENDING", "SUSPENDED"}
SINGLE_SLICE_ONLY = ("v2-", "v3-")  # multislice (several nodes in one queued resource) is v4 and later


def _state(obj: Any) -> str:
    st = getattr(obj, "state", None)
    return getattr(st, "name", None) or str(st or "STATE_UNSPECIFIED")


def node_trouble(node: Any) -> str:
    """The node's own account of what is wrong (health description, symptoms), or ''."""
    parts = [" ".join(str(getattr(node, "health_description", "") or "").split())]
    parts += [" ".join(str(getattr(s, "details", "") or "").split()) for s in getattr(node, "symptoms", [])]
    return "; ".join(p for p in parts if p)[:300]


class TpuProvider(Provider):
    costs_money = True
    capabilities = frozenset({"repair", "expire"})
    accelerator = "tpu"
    repair_how = "its node deleted and created again"
    kind = "gcp-tpu"
    images_why = ("TPU VMs boot a runtime version (a Google-managed image): the TPU API testbed uses (v2) has no field "
                  "for a custom image and no snapshot of a TPU VM's disk (custom OS images exist only in the alpha "
                  "API, built by hand for some TPU generations); an unchanged set-up is skipped by its content "
                  "address instead")

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress = _quiet, *,
                 polling: Polling | None = None):
        super().__init__(spec, store, progress)
        self.polling = polling or Polling()
        self._client: Any = None
        self._project: str | None = None

    # settings and names -----------------------------------------------------------------------------
    @property
    def settings(self) -> TpuSettings:
        assert isinstance(self.spec.provider, TpuSettings)
        return self.spec.provider

    @property
    def source(self) -> str:
        return self.spec.source or f"inventories/{self.name}.yml"

    def node_ids(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.settings.count)]

    @property
    def qr_id(self) -> str:
        return f"{self.name}-qr"

    @property
    def parent(self) -> str:
        return f"projects/{self._project or self.settings.project or '-'}/locations/{self.settings.zone}"

    def node_name(self, nid: str) -> str:
        return f"{self.parent}/nodes/{nid}"

    def qr_name(self, qid: str) -> str:
        return f"{self.parent}/queuedResources/{qid}"

    def _labels(self) -> dict[str, str]:
        return {"testbed": self.name, "managed-by": "testbed"}

    # connection -------------------------------------------------------------------------------------
    def _validate(self) -> None:
        """Checks that need no network: the endpoint's scheme, anonymous mode only with an endpoint."""
        ep = self.settings.endpoint
        if ep is not None and not (ep.startswith(("http://", "https://")) and len(ep.split("://", 1)[1]) > 0):
            raise UsageError(f"provider.endpoint '{ep}' has no scheme (or no host)",
                             where=f"{self.source}: provider.endpoint",
                             fix="write it with its scheme: http://127.0.0.1:8080 (plain HTTP, e.g. a fake) "
                                 "or https://tpu.googleapis.com")
        if os.environ.get(ANONYMOUS_ENV) == "1" and not ep:
            raise UsageError(f"{ANONYMOUS_ENV}=1 is only for a local or private endpoint, and none is set",
                             where=f"environment / {self.source}: provider.endpoint",
                             fix=f"unset {ANONYMOUS_ENV} to use Application Default Credentials")

    def _credentials(self) -> tuple[Any, str | None]:
        require_extra("google.cloud.tpu_v2", EXTRA, "the gcp-tpu provider (google-cloud-tpu)")
        if os.environ.get(ANONYMOUS_ENV) == "1" and self.settings.endpoint:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials(), None
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            creds, project = google.auth.default(scopes=SCOPES)
        except DefaultCredentialsError as e:
            first = " ".join(str(e).split())[:200]
            raise TestbedError(f"no Google Cloud credentials (Application Default Credentials): {first}",
                               where="this machine (ADC)", fix=ADC_FIX) from None
        return creds, project

    def project(self, adc_project: str | None) -> tuple[str, str]:
        """The GCP project to work in and where it came from: provider.project, else $GOOGLE_CLOUD_PROJECT, else
        the one Application Default Credentials name; refused (no request made) when none names one."""
        if self.settings.project:
            return self.settings.project, f"{self.source}: provider.project"
        if os.environ.get(PROJECT_ENV):
            return os.environ[PROJECT_ENV], PROJECT_ENV
        if adc_project:
            return adc_project, "Application Default Credentials (the key file's or gcloud's project)"
        raise UsageError(f"no GCP project for the TPU testbed: provider.project is not set and neither "
                         f"{PROJECT_ENV} nor Application Default Credentials name one",
                         where=f"{self.source}: provider.project",
                         fix=f"export {PROJECT_ENV}=<project id>, or set provider.project in {self.source}, or "
                             "'gcloud config set project <id>' before 'gcloud auth application-default login'")

    def client(self) -> Any:
        """The ``tpu_v2.TpuClient`` (REST transport), built once; ADC is checked before any API request."""
        if self._client is not None:
            return self._client
        self._validate()
        creds, adc_project = self._credentials()
        self._project, _ = self.project(adc_project)
        from google.api_core.client_options import ClientOptions
        from google.cloud import tpu_v2

        opts = ClientOptions(api_endpoint=self.settings.endpoint) if self.settings.endpoint else None
        self._client = tpu_v2.TpuClient(credentials=creds, transport="rest", client_options=opts)
        return self._client

    def _retry(self) -> Any:
        from google.api_core import exceptions as gexc
        from google.api_core import retry as gretry

        p = self.polling
        # reads only: a 503/500 or a rate limit (429) is asked again with api_core's jittered exponential backoff
        return gretry.Retry(predicate=gretry.if_exception_type(gexc.ServiceUnavailable, gexc.InternalServerError,
                                                               gexc.TooManyRequests),
                            initial=p.retry_initial, maximum=p.retry_maximum, multiplier=2, timeout=p.rpc_timeout)

    def _err(self, e: BaseException, action: str, where: str | None = None) -> TestbedError:
        ep = f" via {self.settings.endpoint}" if self.settings.endpoint else ""
        return api_error(e, action=action, where=(where or self.parent) + ep, testbed=self.name,
                         zone=self.settings.zone, accelerator=self.settings.accelerator_type)

    def _call(self, action: str, fn: Any, *args: Any, where: str | None = None, **kw: Any) -> Any:
        """One API call with a per-request timeout; library errors become one TestbedError."""
        try:
            return fn(*args, timeout=self.polling.rpc_timeout, **kw)
        except Exception as e:
            if is_api_error(e):
                raise self._err(e, action, where) from None
            raise

    def _get_or_none(self, fn: Any, name: str, what: str) -> Any | None:
        """A node or queued resource by full name, or None when it does not exist."""
        try:
            return fn(name=name, retry=self._retry(), timeout=self.polling.rpc_timeout)
        except Exception as e:
            if is_not_found(e):
                return None
            if is_api_error(e):
                raise self._err(e, f"read {what}", name) from None
            raise

    def _get_node(self, nid: str) -> Any | None:
        return self._get_or_none(self.client().get_node, self.node_name(nid), f"TPU node {nid}")

    def _get_qr(self, qid: str) -> Any | None:
        return self._get_or_none(self.client().get_queued_resource, self.qr_name(qid), f"queued resource {qid}")

    def _op_done(self, op: Any, what: str, where: str) -> bool:
        """Poll an operation once; True when done, a TestbedError when it ended in error."""
        try:
            done = op.done(retry=self._retry())
        except Exception as e:
            if is_api_error(e):
                raise self._err(e, f"follow the operation to {what}", where) from None
            raise
        if done and op.operation.error.code:
            from google.api_core import exceptions as gexc

            err = op.operation.error
            exc = gexc.from_grpc_status(err.code, err.message)
            mapped = self._err(exc, what, where)
            fix = mapped.fix
            if "ServerError" in {c.__name__ for c in type(exc).__mro__} or type(exc).__name__ == "Unknown":
                fix = (f"'testbed destroy {self.name}' deletes what the operation left behind; then 'testbed "
                       f"provision {self.name}' again (another zone if it repeats)")
            raise TestbedError(f"the operation to {what} ended in error: {type(exc).__name__}: "
                               f"{' '.join(err.message.split())[:300]}", where=mapped.where, fix=fix)
        return bool(done)

    # provision --------------------------------------------------------------------------------------
    def preflight(self) -> None:
        self._validate()
        s = self.settings
        why = s.refuse_user(self.spec.user)
        if why:
            raise UsageError(f"user '{self.spec.user}' cannot log in on a TPU VM: {why.split('; ')[0]}",
                             where=f"{self.source}: user",
                             fix="set 'user: tpu' (or any normal login name), or leave user out: the default is tpu")
        if s.queued_resource and s.count > 1 and s.accelerator_type.startswith(SINGLE_SLICE_ONLY):
            raise UsageError(
                f"a queued resource for {plural(s.count, 'node')} is a multislice request, which Cloud TPU offers for "
                f"v4 and later only, not {s.accelerator_type}", where=f"{self.source}: provider.queued_resource",
                fix="use count: 1 (a bigger slice such as v2-32 has several workers, each a host), queued_resource: "
                    "false (one create per node), or a v4 or later accelerator_type")
        self.client()  # refuses missing ADC / project before any API request

    def create(self, public_key: str | None) -> Made:
        """Every node (or one queued resource for all), READY; hosts of nodes made now are renewed."""
        assert public_key is not None
        if self.settings.queued_resource:
            from testbed.providers import gcp_tpu_queued

            nodes, renewed = gcp_tpu_queued.ensure_queued_resource(self, public_key)
        else:
            nodes, renewed = self._ensure_nodes(public_key)
        hosts = self._hosts(nodes)
        return Made(hosts, renewed={h.name for h in hosts if h.facts["node"] in renewed})

    def interrupted(self) -> TestbedError:
        n = len(self.store.resources(self.name))
        told = (f"{plural(n, 'TPU resource')} requested, possibly running (and billing)" if n
                else "no TPU resource was requested yet")
        return TestbedError(
            f"provisioning of TPU testbed '{self.name}' was interrupted; {told}",
            where=f"testbed {self.name} ({self.parent})",
            fix=f"'testbed destroy {self.name}' releases them, or 'testbed provision {self.name}' resumes", code=130)

    def info(self) -> dict[str, Any]:
        return self._info()

    def _info(self) -> dict[str, Any]:
        s = self.settings
        return {"project": self._project or s.project, "zone": s.zone, "accelerator_type": s.accelerator_type,
                "runtime_version": s.runtime_version, "count": s.count, "queued_resource": s.queued_resource,
                "spot": s.spot, "preemptible": s.preemptible, "endpoint": s.endpoint,
                "network": s.network or "default", "subnetwork": s.subnetwork or "default"}

    def _node_body(self, pub: str) -> Any:
        from google.cloud import tpu_v2

        s = self.settings
        return tpu_v2.Node(
            accelerator_type=s.accelerator_type, runtime_version=s.runtime_version,
            description=f"testbed {self.name}",
            network_config=tpu_v2.NetworkConfig(network=s.network or "", subnetwork=s.subnetwork or "",
                                                enable_external_ips=not s.internal_ips),
            scheduling_config=tpu_v2.SchedulingConfig(preemptible=s.preemptible, spot=s.spot),
            # the guest agent makes the user from ssh-keys; OS Login (project metadata) would ignore these keys, and
            # the node's own enable-oslogin overrides the project's
            metadata={"ssh-keys": f"{self.spec.user}:{pub}", "enable-oslogin": "FALSE"}, labels=self._labels(),
            # the dead-man's switch deletes the node with this account's token (testbed.providers.gcp_tpu_switch)
            service_account=tpu_v2.ServiceAccount(email=s.service_account, scope=SCOPES)
            if s.service_account else None)

    def _adopt_check(self, nid: str, node: Any) -> None:
        """Refuse to take over a node of the same name that another tool (or testbed) created."""
        recorded = {r["id"] for r in self.store.resources(self.name, NODE)}
        if nid not in recorded and dict(node.labels).get("testbed") != self.name:
            raise TestbedError(f"a TPU node named {nid} already exists and was not created by testbed '{self.name}'",
                               where=self.node_name(nid),
                               fix="delete it (gcloud compute tpus tpu-vm delete) or rename the testbed")

    def _ensure_nodes(self, pub: str) -> tuple[list[tuple[str, Any]], set[str]]:
        """Find, recreate or create every node; wait until all are READY. Returns nodes and renewed ids."""
        ops: dict[str, Any] = {}
        renewed: set[str] = set()
        surplus = [r["id"] for r in self.store.resources(self.name, NODE)
                   if r["id"] not in self.node_ids() and not r["info"].get("queued_resource")]
        if surplus:  # the spec asks for fewer nodes than were made
            self.progress(f"deleting {plural(len(surplus), 'node')} no longer in the spec: {', '.join(surplus)}")
            from testbed.providers import gcp_tpu_release

            failures = gcp_tpu_release.delete_nodes(self, surplus)
            if failures:
                raise failures[0]
        for nid in self.node_ids():
            node = self._get_node(nid)
            if node is not None:
                self._adopt_check(nid, node)
                st = _state(node)
                self.store.add_resource(self.name, NODE, nid, name=self.node_name(nid), state=st)
                if st in RECREATE_STATES:
                    self.progress(f"node {nid}: {st}; deleting it to create it again")
                    from testbed.providers import gcp_tpu_release

                    gcp_tpu_release.delete_nodes(self, [nid])
                    node = None
                elif st == "DELETING":
                    from testbed.providers import gcp_tpu_release

                    gcp_tpu_release.delete_nodes(self, [nid])
                    node = None
                elif st in HELD_STATES:
                    raise self._held(nid, st, node)
            if node is None:
                ops[nid] = self._create_node(nid, pub)
                renewed.add(nid)
            else:
                ops[nid] = None
        return self._wait_ready(ops, time.monotonic() + self.settings.create_timeout), renewed

    def _create_node(self, nid: str, pub: str) -> Any | None:
        """Ask for node ``nid``; its id is in state before the call is made. None if it already existed."""
        body = self._node_body(pub)
        self.store.add_resource(self.name, NODE, nid, name=self.node_name(nid), state="REQUESTED")
        try:
            op = self.client().create_node(parent=self.parent, node_id=nid, node=body,
                                           timeout=self.polling.rpc_timeout)
        except Exception as e:
            if is_already_exists(e):
                return None
            if is_api_error(e):
                if is_refusal(e):
                    self.store.remove_resource(self.name, NODE, nid)  # refused: nothing was created
                raise self._err(e, f"create TPU node {nid} ({self.settings.accelerator_type})",
                                self.node_name(nid)) from None
            raise
        self.store.add_resource(self.name, NODE, nid, name=self.node_name(nid), state="CREATING",
                                operation=op.operation.name)
        self.progress(f"node {nid}: create requested ({self.settings.accelerator_type})")
        return op

    def _held(self, nid: str, st: str, node: Any) -> TestbedError:
        """A node someone stopped or hid: it will not become READY by waiting."""
        why = node_trouble(node)
        fix = (f"start it (gcloud compute tpus tpu-vm start {nid} --zone {self.settings.zone}) and provision again, "
               f"or 'testbed destroy {self.name}' to release it") if st.startswith("STOP") else \
            f"'testbed destroy {self.name}' releases it; then provision again"
        return TestbedError(f"TPU node {nid} is {st}{f' ({why})' if why else ''}; it will not become READY by itself",
                            where=self.node_name(nid), fix=fix)

    def _wait_ready(self, ops: dict[str, Any], deadline: float) -> list[tuple[str, Any]]:
        """Poll until every node in ``ops`` is READY; a node that can never be READY, an operation error or the
        deadline raise (the nodes stay recorded for destroy)."""
        start = time.monotonic()
        ready: dict[str, Any] = {}
        seen: dict[str, str] = {}
        last_report = start
        pacer = pace(self.polling, deadline)
        while True:
            changed = False
            for nid, op in ops.items():
                if nid in ready:
                    continue
                node = self._get_node(nid)
                st = _state(node) if node is not None else "NOT_FOUND"
                op_over = op is None
                if st != "READY" and op is not None:
                    op_over = self._op_done(op, f"create TPU node {nid}", self.node_name(nid))  # raises on error
                    if op_over:  # done without error: the node should be READY now
                        node = self._get_node(nid)
                        st = _state(node) if node is not None else "NOT_FOUND"
                if seen.get(nid) != st:
                    seen[nid], changed = st, True
                    self.progress(f"node {nid}: {st} ({duration(time.monotonic() - start)})")
                if st == "READY":
                    ready[nid] = node
                elif st in HELD_STATES:
                    raise self._held(nid, st, node)
                elif st in NEVER_READY or (st == "NOT_FOUND" and op_over):
                    why = node_trouble(node) if node is not None else ""
                    raise TestbedError(f"TPU node {nid} became {st} before it was READY"
                                       f"{f' ({why})' if why else ''}",
                                       where=self.node_name(nid),
                                       fix=f"'testbed provision {self.name}' creates it again; "
                                           f"'testbed destroy {self.name}' releases everything")
            if len(ready) == len(ops):
                return [(nid, ready[nid]) for nid in ops]
            now = time.monotonic()
            if now >= deadline:
                waiting = ", ".join(f"{n} ({seen.get(n, '?')})" for n in ops if n not in ready)
                raise TestbedError(
                    f"TPU node(s) not READY after {self.settings.create_timeout} s: {waiting}",
                    where=self.parent,
                    fix=f"'testbed destroy {self.name}' deletes them (they may be billing); then retry, try another "
                        "zone, a queued resource (queued_resource: true), or raise provider.create_timeout")
            if changed:
                pacer.reset()
            pause = pacer.next()
            if now - last_report >= self.polling.report_every:
                last_report = now
                waiting = ", ".join(f"{n} {seen.get(n, '?')}" for n in ops if n not in ready)
                self.progress(f"waiting for {plural(len(ops) - len(ready), 'TPU node')} to be READY: {waiting} "
                              f"({duration(now - start)}, gives up in {duration(deadline - now)}; next check in "
                              f"{pause:.0f} s)")
            time.sleep(pause)

    # queued resources -------------------------------------------------------------------------------

    def discard(self, host: Host) -> list[str]:
        """A failed worker's node is deleted, so ``create`` makes it again: a slice is recreated as a whole (its
        workers share one node), and with a queued resource the whole request is (it owns every node)."""
        from testbed.providers import gcp_tpu_release

        self._validate()
        nid = str(host.facts.get("node") or host.name.rsplit("-w", 1)[0])
        qrs = [r["id"] for r in self.store.resources(self.name, QUEUED_RESOURCE)]
        self.progress(f"{host.name}: deleting {'queued resource ' + qrs[0] if qrs else 'node ' + nid} to make it "
                      "again")
        failures = gcp_tpu_release.delete_qrs(self, qrs) if qrs else gcp_tpu_release.delete_nodes(self, [nid])
        if failures:
            raise failures[0]
        owned = {nid} if not qrs else set(self.node_ids())
        return [h.name for h in self.store.hosts(self.name) if h.facts.get("node") in owned] or [host.name]

    def repair_fix(self, h: Host) -> str:
        return (f"'testbed provision {self.name} --repair {h.name}' again (capacity may be short: a queued "
                f"resource waits for it); 'testbed destroy {self.name}' releases the TPUs")

    # hosts and SSH ----------------------------------------------------------------------------------
    def _hosts(self, nodes: list[tuple[str, Any]]) -> list[Host]:
        s = self.settings
        hosts: list[Host] = []
        for nid, node in nodes:
            eps = list(node.network_endpoints)
            if not eps:
                raise TestbedError(f"TPU node {nid} is READY but lists no workers (network endpoints)",
                                   where=self.node_name(nid), fix=f"'testbed destroy {self.name}' and provision again")
            for k, ep in enumerate(eps):
                external = ep.access_config.external_ip if ep.access_config else ""
                address = ep.ip_address if s.internal_ips else external
                if not address:
                    raise TestbedError(
                        f"worker {k} of TPU node {nid} has no {'internal' if s.internal_ips else 'external'} IP",
                        where=self.node_name(nid),
                        fix="set provider.internal_ips: true when testbed runs inside the VPC, else check the "
                            "network allows external IPs")
                name = f"{nid}-w{k}"
                hosts.append(Host(
                    name=name, address=address, port=22, user=self.spec.user,
                    groups=self.spec.groups_for(name, len(hosts)),
                    facts={"provider": "gcp-tpu", "tpu": True, "accelerator": "tpu",
                           "accelerator_type": node.accelerator_type or s.accelerator_type,
                           "runtime_version": node.runtime_version or s.runtime_version,
                           "node": nid, "worker": k, "workers": len(eps), "zone": s.zone,
                           "internal_ip": ep.ip_address, "external_ip": external,
                           "health": getattr(node.health, "name", str(node.health)),
                           "spot": s.spot, "preemptible": s.preemptible}))
        return hosts

    @property
    def ssh_poll(self) -> float:
        return self.polling.ssh_interval

    def host_label(self, h: Host) -> str:
        return f"TPU worker {h.name}"

    def ssh_fix(self, h: Host) -> str:
        return ("check that a firewall rule of the TPU's VPC network allows tcp:22 from here (or set internal_ips "
                f"inside the VPC), raise provider.ssh_timeout, then provision again; 'testbed destroy {self.name}' "
                "releases the TPUs")

    def login_fix(self, h: Host) -> str:
        return (f"the guest agent makes user '{self.spec.user}' from the node's ssh-keys metadata a little after boot "
                "(raise provider.ssh_timeout if it is slow); if the project enforces OS Login (organization policy "
                "constraints/compute.requireOsLogin) metadata keys are ignored whatever enable-oslogin says: ask for "
                f"an exemption, then provision again; 'testbed destroy {self.name}' releases the TPUs")

    # destroy ----------------------------------------------------------------------------------------
    def release(self) -> None:
        from testbed.providers import gcp_tpu_release

        gcp_tpu_release.release(self)

    # status -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        tb = self.store.testbed(self.name) or {"info": {}}
        info = dict(tb["info"])
        info["nodes"] = [r["id"] for r in self.store.resources(self.name, NODE)]
        info["queued_resources"] = [r["id"] for r in self.store.resources(self.name, QUEUED_RESOURCE)]
        return info

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """State and health of every recorded node and queued resource, from the API (GONE = not found)."""
        nodes = []
        for r in self.store.resources(self.name, NODE):
            node = self._get_node(r["id"])
            nodes.append({"node": r["id"], "state": _state(node) if node is not None else "GONE",
                          "health": getattr(node.health, "name", "") if node is not None else "",
                          "workers": len(node.network_endpoints) if node is not None else 0,
                          "accelerator_type": node.accelerator_type if node is not None else "",
                          "queued_resource": r["info"].get("queued_resource", "")})
        qrs = []
        for r in self.store.resources(self.name, QUEUED_RESOURCE):
            qr = self._get_qr(r["id"])
            row = {"queued_resource": r["id"], "state": _state(qr.state) if qr is not None else "GONE"}
            if qr is not None and row["state"] in QR_BAD_STATES:
                from testbed.providers.gcp_tpu_queued import qr_reason

                row["reason"] = qr_reason(qr)
            qrs.append(row)
        return {"nodes": nodes, "queued_resources": qrs}

    # the dead-man's switch, the ledger (testbed.providers.gcp_tpu_switch) -------------------------------
    def check_switch(self, expiry: Expiry) -> None:
        from testbed.providers import gcp_tpu_switch

        gcp_tpu_switch.check(self, expiry)

    def switch_release(self, expiry: Expiry) -> dict[str, Any]:
        from testbed.providers import gcp_tpu_switch

        return gcp_tpu_switch.release_plan(self, expiry)

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        from testbed.providers import gcp_tpu_switch

        return gcp_tpu_switch.cost(self, prices)

    def planned_cost(self, prices: dict[str, Any], hosts: int) -> dict[str, Any] | None:
        from testbed.providers import gcp_tpu_switch

        return gcp_tpu_switch.planned_cost(self, prices)

    def orphans(self) -> list[dict[str, Any]]:
        from testbed.providers import gcp_tpu_switch

        return gcp_tpu_switch.orphans(self)

    def reported_states(self) -> dict[str, str] | None:
        """Up (READY), preempted, gone (no node), or the node's state in lower case, per host."""
        return {h.name: h.state for h in self.refresh()}

    def refresh(self) -> list[Host]:
        """Hosts with their real state: up, preempted, gone, or the node's state in lower case."""
        hosts = self.store.hosts(self.name)
        if not hosts and not self.store.resources(self.name):
            return hosts
        by_node = {row["node"]: row for row in self.status()["nodes"]}
        for h in hosts:
            row = by_node.get(h.facts.get("node", ""))
            st = row["state"] if row else "GONE"
            new = {"READY": "up", "PREEMPTED": "preempted", "GONE": "gone"}.get(st, st.lower())
            if new != h.state:
                self.store.set_host_state(self.name, h.name, new)
                h.state = new
            if row:
                h.facts.update(tpu_state=st, health=row["health"])
                self.store.update_host_facts(self.name, h.name, {"tpu_state": st, "health": row["health"]})
        return hosts
