"""Queued resources: one request for all of a testbed's nodes (spot or guaranteed), its id recorded before the
create call returns, waited on until ACTIVE; a FAILED or SUSPENDED one is deleted and reported."""

from __future__ import annotations

import time
from typing import Any

from testbed.errors import TestbedError
from testbed.providers import gcp_tpu_release
from testbed.providers.gcp_tpu import GONE_STATES, NODE, QR_BAD_STATES, QUEUED_RESOURCE, TpuProvider, _state
from testbed.providers.gcp_tpu_errors import (
    is_already_exists,
    is_api_error,
    is_refusal,
)


def ensure_queued_resource(p: TpuProvider, pub: str) -> tuple[list[tuple[str, Any]], set[str]]:
    qid = p.qr_id
    renewed: set[str] = set()
    qr = p._get_qr(qid)
    op = None
    if qr is not None:
        p.store.add_resource(p.name, QUEUED_RESOURCE, qid, name=p.qr_name(qid), state=_state(qr.state))
        st = _state(qr.state)
        broken = st in QR_BAD_STATES or any(
            (n := p._get_node(nid)) is not None and _state(n) in GONE_STATES for nid in p.node_ids())
        if broken or st == "DELETING":
            p.progress(f"queued resource {qid}: {st}; deleting it to ask again")
            gcp_tpu_release.delete_qrs(p, [qid])
            qr = None
    if qr is None:
        op = _create_qr(p, qid, pub)
        renewed = set(p.node_ids())
    deadline = time.monotonic() + p.settings.create_timeout
    _wait_qr_active(p, qid, op, deadline)
    for nid in p.node_ids():
        p.store.add_resource(p.name, NODE, nid, name=p.node_name(nid), queued_resource=qid)
    return p._wait_ready(dict.fromkeys(p.node_ids()), deadline), renewed


def _create_qr(p: TpuProvider, qid: str, pub: str) -> Any:
    from google.cloud import tpu_v2

    s = p.settings
    specs = [tpu_v2.QueuedResource.Tpu.NodeSpec(parent=p.parent, node_id=nid, node=p._node_body(pub))
             for nid in p.node_ids()]
    kw: dict[str, Any] = {"tpu": tpu_v2.QueuedResource.Tpu(node_spec=specs)}
    if s.spot or s.preemptible:
        kw["spot"] = tpu_v2.QueuedResource.Spot()
    else:
        kw["guaranteed"] = tpu_v2.QueuedResource.Guaranteed()
    p.store.add_resource(p.name, QUEUED_RESOURCE, qid, name=p.qr_name(qid), state="REQUESTED")
    try:
        op = p.client().create_queued_resource(parent=p.parent, queued_resource_id=qid,
                                                  queued_resource=tpu_v2.QueuedResource(**kw),
                                                  timeout=p.polling.rpc_timeout)
    except Exception as e:
        if is_already_exists(e):
            return None
        if is_api_error(e):
            if is_refusal(e):
                p.store.remove_resource(p.name, QUEUED_RESOURCE, qid)
            raise p._err(e, f"create queued resource {qid} ({s.count} x {s.accelerator_type})",
                            p.qr_name(qid)) from None
        raise
    p.store.add_resource(p.name, QUEUED_RESOURCE, qid, name=p.qr_name(qid), state="CREATING",
                            operation=op.operation.name)
    p.progress(f"queued resource {qid}: requested ({s.count} x {s.accelerator_type}, "
                  f"{'spot' if 'spot' in kw else 'guaranteed'})")
    return op


def _wait_qr_active(p: TpuProvider, qid: str, op: Any, deadline: float) -> None:
    start = time.monotonic()
    last, last_report = "", start
    while True:
        if op is not None and p._op_done(op, f"create queued resource {qid}", p.qr_name(qid)):
            op = None
        qr = p._get_qr(qid)
        st = _state(qr.state) if qr is not None else "NOT_FOUND"
        if st != last:
            last = st
            p.progress(f"queued resource {qid}: {st} ({int(time.monotonic() - start)} s)")
        if st == "ACTIVE":
            return
        if st in QR_BAD_STATES or st in ("NOT_FOUND", "DELETING"):
            raise TestbedError(f"queued resource {qid} is {st}", where=p.qr_name(qid),
                               fix=f"'testbed destroy {p.name}', then provision again (another zone or "
                                   "accelerator type may have capacity)")
        now = time.monotonic()
        if now >= deadline:
            raise TestbedError(
                f"queued resource {qid} not ACTIVE after {p.settings.create_timeout} s (state {st})",
                where=p.qr_name(qid),
                fix=f"raise provider.create_timeout and provision again (the request stays queued), or "
                    f"'testbed destroy {p.name}' to give up")
        if now - last_report >= p.polling.report_every:
            last_report = now
            p.progress(f"queued resource {qid}: {st} ({int(now - start)} s)")
        time.sleep(min(p.polling.interval, max(0.0, deadline - now)))
