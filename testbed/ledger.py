"""One ledger: every testbed of this state home, what it holds, since when, what it costs, when it is released.

Built from state alone (no network; ``orphans`` asks the providers). Costs are estimates from the price table
(:func:`testbed.expiry.prices`): TPU in US dollars from the chip-hour price of the accelerator type, Chameleon in
service units (1 SU = 1 bare-metal node-hour), counted from when each billing resource was recorded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from testbed import expiry as exp
from testbed.errors import TestbedError

if TYPE_CHECKING:
    from testbed.state import Store


def entry(st: Store, tb: dict[str, Any], table: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The ledger row of one testbed (its state record ``tb``)."""
    from testbed.providers import COSTS_MONEY
    from testbed.state import ACTIVE

    now = now or time.time()
    name = tb["name"]
    resources = [{"kind": r["kind"], "id": r["id"], "since": exp.iso(r["created"]),
                  **{k: v for k, v in r["info"].items() if k in ("name", "host", "address", "end", "accelerator_type",
                                                                  "queued_resource")}}
                 for r in st.resources(name)]
    runs = st.run_rows(200, testbed=name)
    active = [r["id"] for r in runs if r["status"] in ACTIVE]
    last_run = max((r["ended"] or 0.0 for r in runs), default=0.0)
    row: dict[str, Any] = {"name": name, "provider": tb["provider"], "status": tb["status"],
                           "since": exp.iso(tb["created"]), "hosts": len(st.hosts(name)), "resources": resources,
                           "active_runs": active}
    cost: dict[str, Any] | None = None
    if tb["provider"] in COSTS_MONEY:  # the others hold nothing that bills or ends (and their spec is not loaded)
        from testbed.handle import Testbed

        try:
            p = Testbed.open(name, st, recorded_ok=True).provider()
            cost = p.cost(table)
            row.update({k: v for k, v in p.describe().items() if k in ("lease_end", "remaining", "warning")})
        except TestbedError as err:
            row["note"] = err.what
    if cost:
        hours = max(0.0, (now - float(cost.pop("since", tb["created"]))) / 3600)
        per_hour = cost.get("per_hour")
        cost["so_far"] = round(per_hour * hours, 2) if per_hour is not None else None
        cost["hours"] = round(hours, 2)
    row["cost"] = cost
    e = exp.Expiry.from_info(tb["info"])
    if e is not None and e.active:
        at = e.release_at(last_run=last_run)
        row["expiry"] = {"expire_at": exp.iso(e.expire_at), "idle_after": e.idle_after,
                         "last_action": exp.iso(e.touched), "switch": e.switch or "not armed",
                         "release_at": exp.iso(at), "in": exp.span(at - now) if at else None,
                         "held_by_run": bool(active) and e.idle_after is not None}
        if at is not None and at <= now and not active:
            row["warning"] = (f"past its release time ({exp.iso(at)}): its dead-man's switch has released it or "
                              f"is doing so; 'testbed status {name} --probe' checks, 'testbed destroy {name}' "
                              "forgets it")
    else:
        row["expiry"] = None
    return row


def ledger(st: Store, home: Any) -> dict[str, Any]:
    """Every testbed's row, and the totals per cost unit."""
    table = exp.prices(home)
    rows = [entry(st, tb, table) for tb in st.testbeds()]
    totals: dict[str, dict[str, float]] = {}
    for r in rows:
        c = r.get("cost")
        if c and c.get("per_hour") is not None:
            t = totals.setdefault(c["unit"], {"per_hour": 0.0, "so_far": 0.0})
            t["per_hour"] = round(t["per_hour"] + c["per_hour"], 4)
            t["so_far"] = round(t["so_far"] + (c.get("so_far") or 0.0), 2)
    return {"testbeds": rows, "totals": totals, "prices": table.get("_source", "")}


def orphans(st: Store) -> dict[str, list[dict[str, Any]]]:
    """Resources at the providers that state does not record, for every recorded testbed and every cloud spec in
    inventories/ (a testbed whose state row is gone), asked of its provider (network; credentials needed).

    ``orphans``: what was found; ``asked``: one entry per cloud testbed, ``asked`` True with ``where`` and
    ``found``, or False with ``why`` (the extra missing, no credentials, credentials refused, the listing
    failed) and ``fix``: a provider that could not be asked is never reported as holding nothing.
    """
    from testbed import paths
    from testbed.handle import Testbed
    from testbed.providers import COSTS_MONEY
    from testbed.providers.check import check

    out: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    specs = paths.list_resources("inventories")
    names = {tb["name"] for tb in st.testbeds()} | set(specs)
    for name in sorted(names):
        rec = st.testbed(name)
        kind = str(rec["provider"]) if rec else _kind_written(specs.get(name))
        try:
            tb = Testbed.open(name, st, recorded_ok=True)
            kind = tb.kind
            if kind not in COSTS_MONEY:
                continue
            assert tb.spec is not None
            ready = check(kind, tb.spec, quotas=False)  # extra, credentials, a login: the reason when it fails
            where = ", ".join(f"{k} {ready.context[k]}" for k in ("site", "project", "zone") if k in ready.context)
            if not ready.usable:
                bad = ready.failed
                asked.append({"testbed": name, "provider": kind, "asked": False,
                              "why": f"{bad.check}: {bad.detail}" if bad else "not usable",
                              "fix": bad.fix if bad else ""})
                continue
            found = [{"testbed": name, **o} for o in tb.provider().orphans()]
        except TestbedError as e:
            if kind and kind not in COSTS_MONEY:
                continue
            asked.append({"testbed": name, "provider": kind or "?", "asked": False, "why": e.what,
                          "fix": e.fix or ""})
            continue
        out += found
        asked.append({"testbed": name, "provider": kind, "asked": True, "where": where, "found": len(found)})
    return {"orphans": out, "asked": asked}


def _kind_written(path: Any) -> str:
    """provider.kind as a spec file writes it ('' when unreadable): what a spec that does not load is about."""
    if path is None:
        return ""
    from ruamel.yaml import YAML, YAMLError

    try:
        data = YAML(typ="safe").load(path.read_text())
        kind = data.get("provider", {}).get("kind") if isinstance(data, dict) else None
    except (OSError, YAMLError, AttributeError):
        return ""
    return kind if isinstance(kind, str) else ""
