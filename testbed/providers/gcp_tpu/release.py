"""Giving a TPU testbed back: its nodes and queued resources deleted (NotFound counts as gone), each waited
on until the API no longer knows it, rows removed as they go, so a destroy can simply be run again."""

from __future__ import annotations

import time
from typing import Any

from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.providers.gcp_tpu.cloud import NODE, QUEUED_RESOURCE, Cloud, state_name
from testbed.providers.gcp_tpu.errors import (
    is_api_error,
    is_not_found,
)
from testbed.providers.gcp_tpu.wait import pace
from testbed.textfmt import plural


def release(c: Cloud) -> None:
    """Delete every recorded queued resource and node; raises while any is left."""
    nodes = [r["id"] for r in c.store.resources(c.name, NODE)]
    qrs = [r["id"] for r in c.store.resources(c.name, QUEUED_RESOURCE)]
    if nodes or qrs:
        c.validate()
        c.client()
        failures: list[TestbedError] = []
        try:
            if qrs:  # force-deleting a queued resource deletes its nodes too
                failures += delete_qrs(c, qrs)
            left = [r["id"] for r in c.store.resources(c.name, NODE)]
            if left:
                failures += delete_nodes(c, left)
        except KeyboardInterrupt:
            n = len(c.store.resources(c.name))
            raise TestbedError(f"destroy of TPU testbed '{c.name}' was interrupted; {plural(n, 'TPU resource')} "
                               "may still exist", where=f"testbed {c.name} ({c.parent})",
                               fix=f"run 'testbed destroy {c.name}' again", code=Exit.INTERRUPTED) from None
        if failures:
            c.store.set_testbed_status(c.name, "destroy-failed")
            left_ids = ", ".join(r["id"] for r in c.store.resources(c.name))
            first_fix = (failures[0].fix or "").split("; 'testbed destroy")[0]
            first_fix = first_fix.removesuffix(", then retry").removesuffix("retry") or "wait a little"
            raise TestbedError(f"could not delete TPU resource(s) {left_ids}: {failures[0].what}",
                               where=failures[0].where,
                               fix=f"{first_fix}; then run 'testbed destroy {c.name}' again "
                                   "(it is safe to repeat)")


def delete_nodes(c: Cloud, nids: list[str]) -> list[TestbedError]:
    """Delete nodes (all requests first, then wait); NotFound is gone. Returns the failures."""
    failures: list[TestbedError] = []
    ops: dict[str, Any] = {}
    for nid in nids:
        try:
            ops[nid] = c.client().delete_node(name=c.node_name(nid), timeout=c.polling.rpc_timeout)
            c.progress(f"node {nid}: delete requested")
        except Exception as e:
            if is_not_found(e):
                c.store.remove_resource(c.name, NODE, nid)
            elif is_api_error(e):
                try:
                    node = c.get_node(nid)
                except TestbedError:
                    node = None
                if node is not None and state_name(node) == "DELETING":
                    ops[nid] = None
                else:
                    failures.append(c.err(e, f"delete TPU node {nid}", c.node_name(nid)))
            else:
                raise
    failures += _wait_gone(c, ops, "node", c.get_node, NODE, c.node_name)
    return failures


def delete_qrs(c: Cloud, qids: list[str]) -> list[TestbedError]:
    failures: list[TestbedError] = []
    ops: dict[str, Any] = {}
    for qid in qids:
        try:
            from google.cloud import tpu_v2

            req = tpu_v2.DeleteQueuedResourceRequest(name=c.qr_name(qid), force=True)
            ops[qid] = c.client().delete_queued_resource(request=req, timeout=c.polling.rpc_timeout)
            c.progress(f"queued resource {qid}: delete requested")
        except Exception as e:
            if is_not_found(e):
                c.store.remove_resource(c.name, QUEUED_RESOURCE, qid)
            elif is_api_error(e):
                failures.append(c.err(e, f"delete queued resource {qid}", c.qr_name(qid)))
            else:
                raise
    failures += _wait_gone(c, ops, "queued resource", c.get_qr, QUEUED_RESOURCE, c.qr_name)
    if not failures:  # its nodes went with it
        owned = [r["id"] for r in c.store.resources(c.name, NODE) if r["info"].get("queued_resource")]
        for nid in owned:
            if c.get_node(nid) is None:
                c.store.remove_resource(c.name, NODE, nid)
    return failures


def _wait_gone(c: Cloud, ops: dict[str, Any], what: str, get: Any, kind: str, name_of: Any) -> list[TestbedError]:
    failures: list[TestbedError] = []
    deadline = time.monotonic() + c.polling.delete_timeout
    pacer = pace(c.polling, deadline)
    pending = dict(ops)
    while pending:
        for rid, op in list(pending.items()):
            try:
                if op is not None and not c.op_done(op, f"delete {what} {rid}", name_of(rid)):
                    continue
                if get(rid) is None:
                    c.store.remove_resource(c.name, kind, rid)
                    c.progress(f"{what} {rid}: deleted")
                    del pending[rid]
                else:
                    pending[rid] = None  # operation over, resource still listed: wait until it vanishes
            except TestbedError as e:
                failures.append(e)
                del pending[rid]
        if pending and time.monotonic() >= deadline:
            for rid in pending:
                failures.append(TestbedError(f"{what} {rid} still exists {int(c.polling.delete_timeout)} s "
                                             "after its deletion was requested", where=name_of(rid),
                                             fix="check it in the console"))
            break
        if pending:
            pacer.sleep()
    return failures
