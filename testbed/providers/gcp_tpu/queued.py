"""Queued resources: one request for all of a testbed's nodes, its id (and the ids of the nodes it will make)
recorded before the create call returns, waited on until ACTIVE.

The v2 API takes one node spec per request: ``node_id`` for one node, ``multislice_params`` (node count and id
prefix; nodes ``<prefix>-0`` ...) for several (v4 and later). The request is valid in the queue for
``create_timeout`` only (``queueing_policy.valid_until_duration``): a request testbed gave up waiting on fails in
the queue instead of turning into billing nodes hours later. A FAILED one reports the service's own reason
(``state.failed_data.error``); a FAILED, SUSPENDED or changed one is deleted and asked again by provision.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.errors import TestbedError
from testbed.providers.gcp_tpu import release
from testbed.providers.gcp_tpu.cloud import NODE, QR_BAD_STATES, QUEUED_RESOURCE, RECREATE_STATES, Cloud, state_name
from testbed.providers.gcp_tpu.errors import (
    is_already_exists,
    is_api_error,
    is_refusal,
)
from testbed.providers.gcp_tpu.wait import duration, pace


def qr_reason(qr: Any) -> str:
    """Why a queued resource is FAILED or SUSPENDED, in the service's words (``''`` when it gives none)."""
    st = qr.state
    err = getattr(getattr(st, "failed_data", None), "error", None)
    parts = []
    if err is not None and (err.code or err.message):
        from google.api_core import exceptions as gexc

        name = type(gexc.from_grpc_status(err.code, "")).__name__ if err.code else ""
        parts.append(f"{name + ': ' if name else ''}{' '.join(str(err.message).split())[:300]}")
    initiator = getattr(getattr(st, "state_initiator", None), "name", "")
    if state_name(st) in ("SUSPENDING", "SUSPENDED") and initiator in ("SERVICE", "USER"):
        parts.append("suspended by the Cloud TPU service (e.g. spot capacity reclaimed)" if initiator == "SERVICE"
                     else "suspended by a user")
    return "; ".join(parts)


def _asks_for(qr: Any) -> tuple[int, str]:
    """How many nodes of which accelerator type a recorded queued resource asks for."""
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    if not specs:
        return 0, ""
    spec = specs[0]
    count = spec.multislice_params.node_count if "multislice_params" in spec else 1
    return count, spec.node.accelerator_type


def ensure_queued_resource(c: Cloud, pub: str) -> tuple[list[tuple[str, Any]], set[str]]:
    qid = c.qr_id
    renewed: set[str] = set()
    qr = c.get_qr(qid)
    op = None
    if qr is not None:
        c.store.add_resource(c.name, QUEUED_RESOURCE, qid, name=c.qr_name(qid), state=state_name(qr.state))
        st = state_name(qr.state)
        broken = st in QR_BAD_STATES or any(
            (n := c.get_node(nid)) is not None and state_name(n) in RECREATE_STATES for nid in c.node_ids())
        asked = _asks_for(qr)
        changed = asked[0] and asked != (c.settings.count, c.settings.accelerator_type)
        if broken or changed or st == "DELETING":
            why = f"asks for {asked[0]} x {asked[1]}, the spec for {c.settings.count}" if changed and not broken \
                else st + (f" ({r})" if (r := qr_reason(qr)) else "")
            c.progress(f"queued resource {qid}: {why}; deleting it to ask again")
            failures = release.delete_qrs(c, [qid])
            if failures:
                raise failures[0]
            qr = None
    if qr is None:
        _check_names_free(c, qid)
        op = _create_qr(c, qid, pub)
        renewed = set(c.node_ids())
    deadline = time.monotonic() + c.settings.create_timeout
    _wait_qr_active(c, qid, op, deadline)
    for nid in c.node_ids():  # (recorded at the request; again for a request made by an older testbed)
        c.store.add_resource(c.name, NODE, nid, name=c.node_name(nid), queued_resource=qid)
    return c.wait_ready(dict.fromkeys(c.node_ids()), deadline), renewed


def _check_names_free(c: Cloud, qid: str) -> None:
    """The request would make nodes <testbed>-<i>: refuse (before recording them) when one already exists, which
    the service would refuse too, and which destroy must not take for the request's own."""
    for nid in c.node_ids():
        node = c.get_node(nid)
        if node is not None and node.queued_resource != c.qr_name(qid):
            c.adopt_check(nid, node)  # someone else's: refused with its own message
            raise TestbedError(f"TPU node {nid} exists outside queued resource {qid} (made by an earlier provision "
                               "without queued_resource)", where=c.node_name(nid),
                               fix=f"'testbed destroy {c.name}' deletes it; then provision again")


def _create_qr(c: Cloud, qid: str, pub: str) -> Any:
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    s = c.settings
    Spec = tpu_v2.QueuedResource.Tpu.NodeSpec
    if s.count == 1:
        spec = Spec(parent=c.parent, node_id=c.node_ids()[0], node=c.node_body(pub))
    else:  # nodes <testbed>-0 ... <testbed>-<count-1>: the names node_ids() expects
        spec = Spec(parent=c.parent, node=c.node_body(pub),
                    multislice_params=Spec.MultisliceParams(node_count=s.count, node_id_prefix=c.name))
    kw: dict[str, Any] = {
        "tpu": tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        "queueing_policy": tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=s.create_timeout))}
    if s.spot or s.preemptible:
        kw["spot"] = tpu_v2.QueuedResource.Spot()  # else no tier: on-demand, as gcloud asks by default
    c.store.add_resource(c.name, QUEUED_RESOURCE, qid, name=c.qr_name(qid), state="REQUESTED")
    for nid in c.node_ids():  # what the request will make: destroy deletes them too, should they outlive it
        c.store.add_resource(c.name, NODE, nid, name=c.node_name(nid), queued_resource=qid)
    try:
        op = c.client().create_queued_resource(parent=c.parent, queued_resource_id=qid,
                                               queued_resource=tpu_v2.QueuedResource(**kw),
                                               timeout=c.polling.rpc_timeout)
    except Exception as e:
        if is_already_exists(e):
            return None
        if is_api_error(e):
            if is_refusal(e):  # refused: nothing was made
                for nid in c.node_ids():
                    c.store.remove_resource(c.name, NODE, nid)
                c.store.remove_resource(c.name, QUEUED_RESOURCE, qid)
            raise c.err(e, f"create queued resource {qid} ({s.count} x {s.accelerator_type})",
                         c.qr_name(qid)) from None
        raise
    c.store.add_resource(c.name, QUEUED_RESOURCE, qid, name=c.qr_name(qid), state="CREATING",
                         operation=op.operation.name)
    c.progress(f"queued resource {qid}: requested ({s.count} x {s.accelerator_type}, "
               f"{'spot' if 'spot' in kw else 'on demand'}, valid in the queue for {duration(s.create_timeout)})")
    return op


def _wait_qr_active(c: Cloud, qid: str, op: Any, deadline: float) -> None:
    start = time.monotonic()
    last, last_report = "", start
    pacer = pace(c.polling, deadline, cap=c.polling.queue_max_interval)
    while True:
        if op is not None and c.op_done(op, f"create queued resource {qid}", c.qr_name(qid)):
            op = None
        qr = c.get_qr(qid)
        st = state_name(qr.state) if qr is not None else "NOT_FOUND"
        if st != last:
            last = st
            pacer.reset()
            c.progress(f"queued resource {qid}: {st} ({duration(time.monotonic() - start)})")
        if st == "ACTIVE":
            return
        if st in QR_BAD_STATES or st in ("NOT_FOUND", "DELETING"):
            reason = qr_reason(qr) if qr is not None else ""
            raise TestbedError(f"queued resource {qid} is {st}{f': {reason}' if reason else ''}",
                               where=c.qr_name(qid),
                               fix=f"'testbed provision {c.name}' deletes it and asks again (another zone or "
                                   f"accelerator type may have capacity); 'testbed destroy {c.name}' gives up")
        now = time.monotonic()
        if now >= deadline:
            raise TestbedError(
                f"queued resource {qid} not ACTIVE after {duration(c.settings.create_timeout)} (state {st}); the "
                "service fails the request at that age (valid until)", where=c.qr_name(qid),
                fix=f"raise provider.create_timeout (queued resources can wait for hours) and provision again, or "
                    f"'testbed destroy {c.name}' to give up")
        pause = pacer.next()
        if now - last_report >= c.polling.report_every:
            last_report = now
            c.progress(f"waiting for queued resource {qid}: {st} ({duration(now - start)}, gives up in "
                       f"{duration(deadline - now)}; next check in {pause:.0f} s)")
        time.sleep(pause)
