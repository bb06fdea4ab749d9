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
from testbed.expiry import tpu_rate
from testbed.providers.gcp_tpu.cloud import ANONYMOUS_ENV, NODE, QUEUED_RESOURCE

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.providers.gcp_tpu.cloud import Cloud

METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"  # noqa: S105 (a URL)
METADATA_ENV = "TESTBED_TPU_METADATA_URL"  # tests only (with TESTBED_TPU_ANONYMOUS): a fake metadata server
DEFAULT_ENDPOINT = "https://tpu.googleapis.com"


def check(c: Cloud, e: Expiry) -> None:
    if not c.settings.service_account:
        raise UsageError("a TPU testbed with an expiry needs provider.service_account: its nodes delete themselves "
                         "with that account's token from the metadata server",
                         where=f"{c.source}: provider.service_account",
                         fix="create a service account holding only tpu.nodes.delete (and tpu.queuedResources."
                             "delete) on this testbed's nodes (README: 'dead-man's switch'), name its e-mail in "
                             "provider.service_account; or drop --expire and idle_after")


def metadata_url(c: Cloud) -> str:
    override = os.environ.get(METADATA_ENV)
    if override and os.environ.get(ANONYMOUS_ENV) == "1" and c.settings.endpoint:
        return override
    return METADATA_TOKEN


def release_plan(c: Cloud, e: Expiry) -> dict[str, Any]:
    """DELETE of each recorded queued resource (force) and of each node outside one."""
    c.client()  # the project, resolved as for every call
    base = (c.settings.endpoint or DEFAULT_ENDPOINT).rstrip("/")
    reqs = [["DELETE", f"{base}/v2/{c.qr_name(r['id'])}?force=true"]
            for r in c.store.resources(c.name, QUEUED_RESOURCE)]
    reqs += [["DELETE", f"{base}/v2/{c.node_name(r['id'])}"] for r in c.store.resources(c.name, NODE)
             if not r["info"].get("queued_resource")]
    return {"auth": {"type": "gce-metadata", "url": metadata_url(c)}, "requests": reqs}


def cost(c: Cloud, table: dict[str, Any]) -> dict[str, Any] | None:
    """US dollars per hour of the nodes held, from the chip-hour price of the accelerator type."""
    nodes = c.store.resources(c.name, NODE)
    if not nodes:
        return None
    s = c.settings
    rate, basis = tpu_rate(table, s.accelerator_type, s.zone, spot=s.spot or s.preemptible)
    return {"per_hour": None if rate is None else round(rate * len(nodes), 4), "unit": "USD",
            "since": min(r["created"] for r in nodes),
            "basis": f"{len(nodes)} x {s.accelerator_type}: {basis}"}


def planned_cost(c: Cloud, table: dict[str, Any]) -> dict[str, Any]:
    """US dollars per hour of the nodes held, else of the spec's count of nodes."""
    s = c.settings
    nodes = len(c.store.resources(c.name, NODE)) or s.count
    rate, basis = tpu_rate(table, s.accelerator_type, s.zone, spot=s.spot or s.preemptible)
    return {"per_hour": None if rate is None else round(rate * nodes, 4), "unit": "USD",
            "basis": f"{nodes} x {s.accelerator_type}: {basis}"}


def orphans(c: Cloud) -> list[dict[str, Any]]:
    """Nodes labelled for this testbed (and its queued resource) in the zone that state does not record."""
    client = c.client()
    known = {r["id"] for r in c.store.resources(c.name, NODE)}
    out: list[dict[str, Any]] = []
    zone, project = c.settings.zone, c.project_id
    for n in c.call("listing nodes", client.list_nodes, parent=c.parent):
        nid = n.name.rsplit("/", 1)[-1]
        if dict(n.labels).get("testbed") == c.name and nid not in known:
            out.append({"kind": NODE, "id": nid, "accelerator_type": n.accelerator_type,
                        "release": f"gcloud compute tpus tpu-vm delete {nid} --zone {zone} --project {project}"})
    qknown = {r["id"] for r in c.store.resources(c.name, QUEUED_RESOURCE)}
    qr = c.get_qr(c.qr_id)
    if qr is not None and c.qr_id not in qknown:
        out.append({"kind": QUEUED_RESOURCE, "id": c.qr_id,
                    "release": f"gcloud compute tpus queued-resources delete {c.qr_id} --zone {zone} "
                               f"--project {project} --force"})
    return out
