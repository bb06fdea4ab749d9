"""One TPU testbed's dealings with the Cloud TPU API, held by the provider (not inherited): the names of its
nodes and queued resource, the client (``google.cloud.tpu_v2`` and ``google.auth`` imported only when it is built),
one clear message for every failed call, and the wait until nodes are READY. The queued, release and switch
modules take this object, so they never need the provider.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from testbed import paths
from testbed.errors import TestbedError, UsageError, require_extra
from testbed.providers.base import Progress
from testbed.providers.gcp_tpu.errors import ADC_FIX, api_error, is_api_error, is_not_found
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.gcp_tpu.wait import Polling, duration, pace
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec
    from testbed.state import Store

EXTRA = "tpu"  # the pip extra that brings google-cloud-tpu (pyproject.toml)
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


def state_name(obj: Any) -> str:
    st = getattr(obj, "state", None)
    return getattr(st, "name", None) or str(st or "STATE_UNSPECIFIED")


def node_trouble(node: Any) -> str:
    """The node's own account of what is wrong (health description, symptoms), or ''."""
    parts = [" ".join(str(getattr(node, "health_description", "") or "").split())]
    parts += [" ".join(str(getattr(s, "details", "") or "").split()) for s in getattr(node, "symptoms", [])]
    return "; ".join(p for p in parts if p)[:300]


class Cloud:
    """A testbed's view of the Cloud TPU API in its zone: what the queued, release and switch steps need."""

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress, polling: Polling):
        self.spec, self.store, self.progress, self.polling = spec, store, progress, polling
        self._client: Any = None
        self.project_id: str | None = None  # resolved when the client is built

    @property
    def name(self) -> str:
        return self.spec.name

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
        return f"projects/{self.project_id or self.settings.project or '-'}/locations/{self.settings.zone}"

    def node_name(self, nid: str) -> str:
        return f"{self.parent}/nodes/{nid}"

    def qr_name(self, qid: str) -> str:
        return f"{self.parent}/queuedResources/{qid}"

    def labels(self) -> dict[str, str]:
        return {"testbed": self.name, "managed-by": "testbed"}

    # connection -------------------------------------------------------------------------------------
    def validate(self) -> None:
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

    def credentials(self) -> tuple[Any, str | None]:
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
                         fix=f"export {PROJECT_ENV}=<project id>, or "
                             f"{paths.edit_hint(self.source, 'set provider.project')}, or "
                             "'gcloud config set project <id>' before 'gcloud auth application-default login'")

    def client(self) -> Any:
        """The ``tpu_v2.TpuClient`` (REST transport), built once; ADC is checked before any API request."""
        if self._client is not None:
            return self._client
        self.validate()
        creds, adc_project = self.credentials()
        self.project_id, _ = self.project(adc_project)
        from google.api_core.client_options import ClientOptions
        from google.cloud import tpu_v2

        opts = ClientOptions(api_endpoint=self.settings.endpoint) if self.settings.endpoint else None
        self._client = tpu_v2.TpuClient(credentials=creds, transport="rest", client_options=opts)
        return self._client

    def retry(self) -> Any:
        from google.api_core import exceptions as gexc
        from google.api_core import retry as gretry

        p = self.polling
        # reads only: a 503/500 or a rate limit (429) is asked again with api_core's jittered exponential backoff
        return gretry.Retry(predicate=gretry.if_exception_type(gexc.ServiceUnavailable, gexc.InternalServerError,
                                                               gexc.TooManyRequests),
                            initial=p.retry_initial, maximum=p.retry_maximum, multiplier=2, timeout=p.rpc_timeout)

    def err(self, e: BaseException, action: str, where: str | None = None) -> TestbedError:
        ep = f" via {self.settings.endpoint}" if self.settings.endpoint else ""
        return api_error(e, action=action, where=(where or self.parent) + ep, testbed=self.name,
                         zone=self.settings.zone, accelerator=self.settings.accelerator_type)

    def call(self, action: str, fn: Any, *args: Any, where: str | None = None, **kw: Any) -> Any:
        """One API call with a per-request timeout; library errors become one TestbedError."""
        try:
            return fn(*args, timeout=self.polling.rpc_timeout, **kw)
        except Exception as e:
            if is_api_error(e):
                raise self.err(e, action, where) from None
            raise

    def get_or_none(self, fn: Any, name: str, what: str) -> Any | None:
        """A node or queued resource by full name, or None when it does not exist."""
        try:
            return fn(name=name, retry=self.retry(), timeout=self.polling.rpc_timeout)
        except Exception as e:
            if is_not_found(e):
                return None
            if is_api_error(e):
                raise self.err(e, f"read {what}", name) from None
            raise

    def get_node(self, nid: str) -> Any | None:
        return self.get_or_none(self.client().get_node, self.node_name(nid), f"TPU node {nid}")

    def get_qr(self, qid: str) -> Any | None:
        return self.get_or_none(self.client().get_queued_resource, self.qr_name(qid), f"queued resource {qid}")

    def op_done(self, op: Any, what: str, where: str) -> bool:
        """Poll an operation once; True when done, a TestbedError when it ended in error."""
        try:
            done = op.done(retry=self.retry())
        except Exception as e:
            if is_api_error(e):
                raise self.err(e, f"follow the operation to {what}", where) from None
            raise
        if done and op.operation.error.code:
            from google.api_core import exceptions as gexc

            err = op.operation.error
            exc = gexc.from_grpc_status(err.code, err.message)
            mapped = self.err(exc, what, where)
            fix = mapped.fix
            if "ServerError" in {c.__name__ for c in type(exc).__mro__} or type(exc).__name__ == "Unknown":
                fix = (f"'testbed destroy {self.name}' deletes what the operation left behind; then 'testbed "
                       f"provision {self.name}' again (another zone if it repeats)")
            raise TestbedError(f"the operation to {what} ended in error: {type(exc).__name__}: "
                               f"{' '.join(err.message.split())[:300]}", where=mapped.where, fix=fix)
        return bool(done)

    def node_body(self, pub: str) -> Any:
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
            metadata={"ssh-keys": f"{self.spec.user}:{pub}", "enable-oslogin": "FALSE"}, labels=self.labels(),
            # the dead-man's switch deletes the node with this account's token (testbed.providers.gcp_tpu.switch)
            service_account=tpu_v2.ServiceAccount(email=s.service_account, scope=SCOPES)
            if s.service_account else None)

    def adopt_check(self, nid: str, node: Any) -> None:
        """Refuse to take over a node of the same name that another tool (or testbed) created."""
        recorded = {r["id"] for r in self.store.resources(self.name, NODE)}
        if nid not in recorded and dict(node.labels).get("testbed") != self.name:
            raise TestbedError(f"a TPU node named {nid} already exists and was not created by testbed '{self.name}'",
                               where=self.node_name(nid),
                               fix="delete it (gcloud compute tpus tpu-vm delete) or rename the testbed")

    def held(self, nid: str, st: str, node: Any) -> TestbedError:
        """A node someone stopped or hid: it will not become READY by waiting."""
        why = node_trouble(node)
        fix = (f"start it (gcloud compute tpus tpu-vm start {nid} --zone {self.settings.zone}) and provision again, "
               f"or 'testbed destroy {self.name}' to release it") if st.startswith("STOP") else \
            f"'testbed destroy {self.name}' releases it; then provision again"
        return TestbedError(f"TPU node {nid} is {st}{f' ({why})' if why else ''}; it will not become READY by itself",
                            where=self.node_name(nid), fix=fix)

    def wait_ready(self, ops: dict[str, Any], deadline: float) -> list[tuple[str, Any]]:
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
                node = self.get_node(nid)
                st = state_name(node) if node is not None else "NOT_FOUND"
                op_over = op is None
                if st != "READY" and op is not None:
                    op_over = self.op_done(op, f"create TPU node {nid}", self.node_name(nid))  # raises on error
                    if op_over:  # done without error: the node should be READY now
                        node = self.get_node(nid)
                        st = state_name(node) if node is not None else "NOT_FOUND"
                if seen.get(nid) != st:
                    seen[nid], changed = st, True
                    self.progress(f"node {nid}: {st} ({duration(time.monotonic() - start)})")
                if st == "READY":
                    ready[nid] = node
                elif st in HELD_STATES:
                    raise self.held(nid, st, node)
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

