"""A gcp-tpu testbed's dead-man's switch, cost and orphans.

The nodes run as ``provider.service_account``: the agent on each TPU VM asks the metadata server for that
account's token (no key file is placed on the host) and, at the deadline, deletes the testbed's nodes (or its
queued resource, with ``force``). The account should hold only ``tpu.nodes.delete`` (and
``tpu.queuedResources.delete`` for queued resources), for example through a custom role granted with an IAM
condition on the node names (see the README); it is the narrowest credential Cloud TPU offers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from testbed.errors import UsageError

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.providers.gcp_tpu import TpuProvider

METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"  # noqa: S105 (a URL)
METADATA_ENV = "TESTBED_TPU_METADATA_URL"  # tests only (with TESTBED_TPU_ANONYMOUS): a fake metadata server
DEFAULT_ENDPOINT = "https://tpu.googleapis.com"


def check(p: TpuProvider, e: Expiry) -> None:
    if not p.settings.service_account:
        raise UsageError("a TPU testbed with an expiry needs provider.service_account: its nodes delete themselves "
                         "with that account's token from the metadata server",
                         where=f"{p.source}: provider.service_account",
                         fix="create a service account holding only tpu.nodes.delete (and tpu.queuedResources."
                             "delete) on this testbed's nodes (README: 'dead-man's switch'), name its e-mail in "
                             "provider.service_account; or drop --expire and idle_after")


def metadata_url(p: TpuProvider) -> str:
    from testbed.providers.gcp_tpu import ANONYMOUS_ENV

    override = os.environ.get(METADATA_ENV)
    if override and os.environ.get(ANONYMOUS_ENV) == "1" and p.settings.endpoint:
        return override
    return METADATA_TOKEN


def release_plan(p: TpuProvider, e: Expiry) -> dict[str, Any]:
    """DELETE of each recorded queued resource (force) and of each node outside one."""
    from testbed.providers.gcp_tpu import NODE, QUEUED_RESOURCE

    p.client()  # the project, resolved as for every call
    base = (p.settings.endpoint or DEFAULT_ENDPOINT).rstrip("/")
    reqs = [["DELETE", f"{base}/v2/{p.qr_name(r['id'])}?force=true"]
            for r in p.store.resources(p.name, QUEUED_RESOURCE)]
    reqs += [["DELETE", f"{base}/v2/{p.node_name(r['id'])}"] for r in p.store.resources(p.name, NODE)
             if not r["info"].get("queued_resource")]
    return {"auth": {"type": "gce-metadata", "url": metadata_url(p)}, "requests": reqs}


def cost(p: TpuProvider, table: dict[str, Any]) -> dict[str, Any] | None:
    """US dollars per hour of the nodes held, from the chip-hour price of the accelerator type."""
    from testbed.expiry import tpu_rate
    from testbed.providers.gcp_tpu import NODE

    nodes = p.store.resources(p.name, NODE)
    if not nodes:
        return None
    s = p.settings
    rate, basis = tpu_rate(table, s.accelerator_type, s.zone, spot=s.spot or s.preemptible)
    return {"per_hour": None if rate is None else round(rate * len(nodes), 4), "unit": "USD",
            "since": min(r["created"] for r in nodes),
            "basis": f"{len(nodes)} x {s.accelerator_type}: {basis}"}


def planned_cost(p: TpuProvider, table: dict[str, Any]) -> dict[str, Any]:
    """US dollars per hour of the nodes held, else of the spec's count of nodes."""
    from testbed.expiry import tpu_rate
    from testbed.providers.gcp_tpu import NODE

    s = p.settings
    nodes = len(p.store.resources(p.name, NODE)) or s.count
    rate, basis = tpu_rate(table, s.accelerator_type, s.zone, spot=s.spot or s.preemptible)
    return {"per_hour": None if rate is None else round(rate * nodes, 4), "unit": "USD",
            "basis": f"{nodes} x {s.accelerator_type}: {basis}"}


def orphans(p: TpuProvider) -> list[dict[str, Any]]:
    """Nodes labelled for this testbed (and its queued resource) in the zone that state does not record."""
    from testbed.providers.gcp_tpu import NODE, QUEUED_RESOURCE

    c = p.client()
    known = {r["id"] for r in p.store.resources(p.name, NODE)}
    out: list[dict[str, Any]] = []
    zone, project = p.settings.zone, p._project
    for n in p._call("listing nodes", c.list_nodes, parent=p.parent):
        nid = n.name.rsplit("/", 1)[-1]
        if dict(n.labels).get("testbed") == p.name and nid not in known:
            out.append({"kind": NODE, "id": nid, "accelerator_type": n.accelerator_type,
                        "release": f"gcloud compute tpus tpu-vm delete {nid} --zone {zone} --project {project}"})
    qknown = {r["id"] for r in p.store.resources(p.name, QUEUED_RESOURCE)}
    qr = p._get_qr(p.qr_id)
    if qr is not None and p.qr_id not in qknown:
        out.append({"kind": QUEUED_RESOURCE, "id": p.qr_id,
                    "release": f"gcloud compute tpus queued-resources delete {p.qr_id} --zone {zone} "
                               f"--project {project} --force"})
    return out
