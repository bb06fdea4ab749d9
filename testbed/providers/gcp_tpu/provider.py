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

import time
from typing import TYPE_CHECKING, Any

from testbed.capabilities import Capability, Repairs
from testbed.errors import TestbedError, UsageError
from testbed.exitcodes import Exit
from testbed.hosts import Host
from testbed.providers.base import AgentSwitch, Made, Progress, Provider, _quiet
from testbed.providers.gcp_tpu import queued, release, switch
from testbed.providers.gcp_tpu.cloud import (
    HELD_STATES,
    NODE,
    QR_BAD_STATES,
    QUEUED_RESOURCE,
    RECREATE_STATES,
    SINGLE_SLICE_ONLY,
    Cloud,
    state_name,
)
from testbed.providers.gcp_tpu.errors import is_already_exists, is_api_error, is_refusal
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.gcp_tpu.wait import Polling
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.spec import TestbedSpec
    from testbed.state import Store


class TpuProvider(Provider, Repairs, AgentSwitch):
    lacking = {Capability.IMAGES: "TPU VMs boot a runtime version (a Google-managed image): the TPU API testbed uses "
                                  "(v2) has no field for a custom image and no snapshot of a TPU VM's disk (custom OS "
                                  "images exist only in the alpha API, built by hand for some TPU generations); an "
                                  "unchanged set-up is skipped by its content address instead",
               Capability.EXTEND: "TPU VMs are held by no reservation: they run, and bill, until deleted",
               Capability.KILL_HOST: "testbed does not stop TPU VMs (the TPU API stops a whole node, not one worker)",
               Capability.CUT_NETWORK: "testbed does not change a TPU VM's network (the VPC is the project's)"}
    accelerator = "tpu"
    repair_how = "its node deleted and created again"
    kind = "gcp-tpu"

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress = _quiet, *,
                 polling: Polling | None = None):
        super().__init__(spec, store, progress)
        # the API's side (names, client, errors, waits): what the queued, release and switch steps take
        self.cloud = Cloud(spec, store, lambda line: self.progress(line), polling or Polling())

    @property
    def settings(self) -> TpuSettings:
        return self.cloud.settings

    @property
    def polling(self) -> Polling:
        return self.cloud.polling

    @polling.setter
    def polling(self, value: Polling) -> None:
        self.cloud.polling = value

    # provision --------------------------------------------------------------------------------------
    def preflight(self) -> None:
        self.cloud.validate()
        s = self.settings
        why = s.refuse_user(self.spec.user)
        if why:
            raise UsageError(f"user '{self.spec.user}' cannot log in on a TPU VM: {why.split('; ')[0]}",
                             where=f"{self.cloud.source}: user",
                             fix="set 'user: tpu' (or any normal login name), or leave user out: the default is tpu")
        if s.queued_resource and s.count > 1 and s.accelerator_type.startswith(SINGLE_SLICE_ONLY):
            raise UsageError(
                f"a queued resource for {plural(s.count, 'node')} is a multislice request, which Cloud TPU offers for "
                f"v4 and later only, not {s.accelerator_type}", where=f"{self.cloud.source}: provider.queued_resource",
                fix="use count: 1 (a bigger slice such as v2-32 has several workers, each a host), queued_resource: "
                    "false (one create per node), or a v4 or later accelerator_type")
        self.cloud.client()  # refuses missing ADC / project before any API request

    def create(self, public_key: str | None) -> Made:
        """Every node (or one queued resource for all), READY; hosts of nodes made now are renewed."""
        assert public_key is not None
        if self.settings.queued_resource:
            nodes, renewed = queued.ensure_queued_resource(self.cloud, public_key)
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
            where=f"testbed {self.name} ({self.cloud.parent})",
            fix=f"'testbed destroy {self.name}' releases them, or 'testbed provision {self.name}' resumes",
            code=Exit.INTERRUPTED)

    def info(self) -> dict[str, Any]:
        return self._info()

    def _info(self) -> dict[str, Any]:
        s = self.settings
        return {"project": self.cloud.project_id or s.project, "zone": s.zone, "accelerator_type": s.accelerator_type,
                "runtime_version": s.runtime_version, "count": s.count, "queued_resource": s.queued_resource,
                "spot": s.spot, "preemptible": s.preemptible, "endpoint": s.endpoint,
                "network": s.network or "default", "subnetwork": s.subnetwork or "default"}

    def _ensure_nodes(self, pub: str) -> tuple[list[tuple[str, Any]], set[str]]:
        """Find, recreate or create every node; wait until all are READY. Returns nodes and renewed ids."""
        ops: dict[str, Any] = {}
        renewed: set[str] = set()
        surplus = [r["id"] for r in self.store.resources(self.name, NODE)
                   if r["id"] not in self.cloud.node_ids() and not r["info"].get("queued_resource")]
        if surplus:  # the spec asks for fewer nodes than were made
            self.progress(f"deleting {plural(len(surplus), 'node')} no longer in the spec: {', '.join(surplus)}")
            failures = release.delete_nodes(self.cloud, surplus)
            if failures:
                raise failures[0]
        for nid in self.cloud.node_ids():
            node = self.cloud.get_node(nid)
            if node is not None:
                self.cloud.adopt_check(nid, node)
                st = state_name(node)
                self.store.add_resource(self.name, NODE, nid, name=self.cloud.node_name(nid), state=st)
                if st in RECREATE_STATES:
                    self.progress(f"node {nid}: {st}; deleting it to create it again")
                    release.delete_nodes(self.cloud, [nid])
                    node = None
                elif st == "DELETING":
                    release.delete_nodes(self.cloud, [nid])
                    node = None
                elif st in HELD_STATES:
                    raise self.cloud.held(nid, st, node)
            if node is None:
                ops[nid] = self._create_node(nid, pub)
                renewed.add(nid)
            else:
                ops[nid] = None
        return self.cloud.wait_ready(ops, time.monotonic() + self.settings.create_timeout), renewed

    # queued resources -------------------------------------------------------------------------------

    def _create_node(self, nid: str, pub: str) -> Any | None:
        """Ask for node ``nid``; its id is in state before the call is made. None if it already existed."""
        body = self.cloud.node_body(pub)
        self.store.add_resource(self.name, NODE, nid, name=self.cloud.node_name(nid), state="REQUESTED")
        try:
            op = self.cloud.client().create_node(parent=self.cloud.parent, node_id=nid, node=body,
                                           timeout=self.polling.rpc_timeout)
        except Exception as e:
            if is_already_exists(e):
                return None
            if is_api_error(e):
                if is_refusal(e):
                    self.store.remove_resource(self.name, NODE, nid)  # refused: nothing was created
                raise self.cloud.err(e, f"create TPU node {nid} ({self.settings.accelerator_type})",
                                self.cloud.node_name(nid)) from None
            raise
        self.store.add_resource(self.name, NODE, nid, name=self.cloud.node_name(nid), state="CREATING",
                                operation=op.operation.name)
        self.progress(f"node {nid}: create requested ({self.settings.accelerator_type})")
        return op

    # repair ------------------------------------------------------------------------------------------
    def discard(self, host: Host) -> list[str]:
        """A failed worker's node is deleted, so ``create`` makes it again: a slice is recreated as a whole (its
        workers share one node), and with a queued resource the whole request is (it owns every node)."""
        self.cloud.validate()
        nid = str(host.facts.get("node") or host.name.rsplit("-w", 1)[0])
        qrs = [r["id"] for r in self.store.resources(self.name, QUEUED_RESOURCE)]
        self.progress(f"{host.name}: deleting {'queued resource ' + qrs[0] if qrs else 'node ' + nid} to make it "
                      "again")
        failures = release.delete_qrs(self.cloud, qrs) if qrs else release.delete_nodes(self.cloud, [nid])
        if failures:
            raise failures[0]
        owned = {nid} if not qrs else set(self.cloud.node_ids())
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
                                   where=self.cloud.node_name(nid),
                                   fix=f"'testbed destroy {self.name}' and provision again")
            for k, ep in enumerate(eps):
                external = ep.access_config.external_ip if ep.access_config else ""
                address = ep.ip_address if s.internal_ips else external
                if not address:
                    raise TestbedError(
                        f"worker {k} of TPU node {nid} has no {'internal' if s.internal_ips else 'external'} IP",
                        where=self.cloud.node_name(nid),
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
        release.release(self.cloud)

    # status -----------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        info = dict(self.store.testbed_info(self.name))
        info["nodes"] = [r["id"] for r in self.store.resources(self.name, NODE)]
        info["queued_resources"] = [r["id"] for r in self.store.resources(self.name, QUEUED_RESOURCE)]
        return info

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """State and health of every recorded node and queued resource, from the API (GONE = not found)."""
        nodes = []
        for r in self.store.resources(self.name, NODE):
            node = self.cloud.get_node(r["id"])
            nodes.append({"node": r["id"], "state": state_name(node) if node is not None else "GONE",
                          "health": getattr(node.health, "name", "") if node is not None else "",
                          "workers": len(node.network_endpoints) if node is not None else 0,
                          "accelerator_type": node.accelerator_type if node is not None else "",
                          "queued_resource": r["info"].get("queued_resource", "")})
        qrs = []
        for r in self.store.resources(self.name, QUEUED_RESOURCE):
            qr = self.cloud.get_qr(r["id"])
            row = {"queued_resource": r["id"], "state": state_name(qr.state) if qr is not None else "GONE"}
            if qr is not None and row["state"] in QR_BAD_STATES:
                row["reason"] = queued.qr_reason(qr)
            qrs.append(row)
        return {"nodes": nodes, "queued_resources": qrs}

    # the dead-man's switch, the ledger (testbed.providers.gcp_tpu.switch) -------------------------------
    def check_switch(self, expiry: Expiry) -> None:
        switch.check(self.cloud, expiry)

    def switch_release(self, expiry: Expiry) -> dict[str, Any]:
        return switch.release_plan(self.cloud, expiry)

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        return switch.cost(self.cloud, prices)

    def planned_cost(self, prices: dict[str, Any], hosts: int) -> dict[str, Any] | None:
        return switch.planned_cost(self.cloud, prices)

    def orphans(self) -> list[dict[str, Any]]:
        return switch.orphans(self.cloud)

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
