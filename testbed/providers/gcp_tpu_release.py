"""Giving a TPU testbed back: its nodes and queued resources deleted (NotFound counts as gone), each waited
on until the API no longer knows it, rows removed as they go, so a destroy can simply be run again."""

from __future__ import annotations

import time
from typing import Any

from testbed.errors import TestbedError
from testbed.providers.gcp_tpu import NODE, QUEUED_RESOURCE, TpuProvider, _state
from testbed.providers.gcp_tpu_errors import (
    is_api_error,
    is_not_found,
)
from testbed.providers.gcp_tpu_wait import pace
from testbed.textfmt import plural


def release(p: TpuProvider) -> None:
    """Delete every recorded queued resource and node; raises while any is left."""
    nodes = [r["id"] for r in p.store.resources(p.name, NODE)]
    qrs = [r["id"] for r in p.store.resources(p.name, QUEUED_RESOURCE)]
    if nodes or qrs:
        p._validate()
        p.client()
        failures: list[TestbedError] = []
        try:
            if qrs:  # force-deleting a queued resource deletes its nodes too
                failures += delete_qrs(p, qrs)
            left = [r["id"] for r in p.store.resources(p.name, NODE)]
            if left:
                failures += delete_nodes(p, left)
        except KeyboardInterrupt:
            n = len(p.store.resources(p.name))
            raise TestbedError(f"destroy of TPU testbed '{p.name}' was interrupted; {plural(n, 'TPU resource')} "
                               "may still exist", where=f"testbed {p.name} ({p.parent})",
                               fix=f"run 'testbed destroy {p.name}' again", code=130) from None
        if failures:
            p.store.set_testbed_status(p.name, "destroy-failed")
            left_ids = ", ".join(r["id"] for r in p.store.resources(p.name))
            first_fix = (failures[0].fix or "").split("; 'testbed destroy")[0]
            first_fix = first_fix.removesuffix(", then retry").removesuffix("retry") or "wait a little"
            raise TestbedError(f"could not delete TPU resource(s) {left_ids}: {failures[0].what}",
                               where=failures[0].where,
                               fix=f"{first_fix}; then run 'testbed destroy {p.name}' again "
                                   "(it is safe to repeat)")


def delete_nodes(p: TpuProvider, nids: list[str]) -> list[TestbedError]:
    """Delete nodes (all requests first, then wait); NotFound is gone. Returns the failures."""
    failures: list[TestbedError] = []
    ops: dict[str, Any] = {}
    for nid in nids:
        try:
            ops[nid] = p.client().delete_node(name=p.node_name(nid), timeout=p.polling.rpc_timeout)
            p.progress(f"node {nid}: delete requested")
        except Exception as e:
            if is_not_found(e):
                p.store.remove_resource(p.name, NODE, nid)
            elif is_api_error(e):
                try:
                    node = p._get_node(nid)
                except TestbedError:
                    node = None
                if node is not None and _state(node) == "DELETING":
                    ops[nid] = None
                else:
                    failures.append(p._err(e, f"delete TPU node {nid}", p.node_name(nid)))
            else:
                raise
    failures += _wait_gone(p, ops, "node", p._get_node, NODE, p.node_name)
    return failures


def delete_qrs(p: TpuProvider, qids: list[str]) -> list[TestbedError]:
    failures: list[TestbedError] = []
    ops: dict[str, Any] = {}
    for qid in qids:
        try:
            from google.cloud import tpu_v2

            req = tpu_v2.DeleteQueuedResourceRequest(name=p.qr_name(qid), force=True)
            ops[qid] = p.client().delete_queued_resource(request=req, timeout=p.polling.rpc_timeout)
            p.progress(f"queued resource {qid}: delete requested")
        except Exception as e:
            if is_not_found(e):
                p.store.remove_resource(p.name, QUEUED_RESOURCE, qid)
            elif is_api_error(e):
                failures.append(p._err(e, f"delete queued resource {qid}", p.qr_name(qid)))
            else:
                raise
    failures += _wait_gone(p, ops, "queued resource", p._get_qr, QUEUED_RESOURCE, p.qr_name)
    if not failures:  # its nodes went with it
        owned = [r["id"] for r in p.store.resources(p.name, NODE) if r["info"].get("queued_resource")]
        for nid in owned:
            if p._get_node(nid) is None:
                p.store.remove_resource(p.name, NODE, nid)
    return failures


def _wait_gone(p: TpuProvider, ops: dict[str, Any], what: str, get: Any, kind: str, name_of: Any) -> list[TestbedError]:
    failures: list[TestbedError] = []
    deadline = time.monotonic() + p.polling.delete_timeout
    pacer = pace(p.polling, deadline)
    pending = dict(ops)
    while pending:
        for rid, op in list(pending.items()):
            try:
                if op is not None and not p._op_done(op, f"delete {what} {rid}", name_of(rid)):
                    continue
                if get(rid) is None:
                    p.store.remove_resource(p.name, kind, rid)
                    p.progress(f"{what} {rid}: deleted")
                    del pending[rid]
                else:
                    pending[rid] = None  # operation over, resource still listed: wait until it vanishes
            except TestbedError as e:
                failures.append(e)
                del pending[rid]
        if pending and time.monotonic() >= deadline:
            for rid in pending:
                failures.append(TestbedError(f"{what} {rid} still exists {int(p.polling.delete_timeout)} s "
                                             "after its deletion was requested", where=name_of(rid),
                                             fix="check it in the console"))
            break
        if pending:
            pacer.sleep()
    return failures
