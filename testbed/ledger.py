"""One ledger: every testbed of this state home, what it holds, since when, what it costs, when it is released;
and (``elsewhere``) the testbeds of this user's other state homes, found through the per-user index
(``testbed.homes``), each with its folder.

Built from state alone (no network; ``orphans`` asks the providers). Costs are estimates from the price table
(:func:`testbed.expiry.prices`): TPU in US dollars from the chip-hour price of the accelerator type, Chameleon in
service units (1 SU = 1 bare-metal node-hour), counted from when each billing resource was recorded.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import expiry as exp
from testbed import paths
from testbed.errors import TestbedError

if TYPE_CHECKING:
    from testbed.providers.base import Provider
    from testbed.state import Store, TestbedRow


def _recorded_provider(st: Store, tb: TestbedRow) -> Provider:
    """The provider of a testbed of another folder, from the spec copy recorded at provision (a spec of the same
    name here may be another testbed altogether)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.providers import provider_class
    from testbed.spec import TestbedSpec

    copy = (tb["info"] or {}).get("spec")
    if not copy:
        raise TestbedError(f"testbed '{tb['name']}' has no recorded spec", where=str(st.path))
    try:
        spec = TestbedSpec.model_validate(copy)
    except ValueError as e:
        raise TestbedError(f"its recorded spec does not load here ({str(e).splitlines()[0]})",
                           where=str(st.path)) from None
    spec.source = tb.get("spec_path")
    return provider_class(spec.kind)(spec, st)


def entry(st: Store, tb: TestbedRow, table: dict[str, Any], now: float | None = None, *,
          recorded_spec: bool = False) -> dict[str, Any]:
    """The ledger row of one testbed (its state record ``tb``); ``recorded_spec``: its provider from the spec
    recorded at provision (another folder's testbed), not from the spec found here by name."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.providers import COSTS_MONEY, COUNTS_HOURS
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
    if tb["provider"] in COSTS_MONEY | COUNTS_HOURS:  # the others hold nothing that bills, counts or ends
        # lazy: start-up (testbed status and exec load this module)
        from testbed.resolved import Resolved

        try:
            p = _recorded_provider(st, tb) if recorded_spec else Resolved.open(name, st, recorded_ok=True).provider()
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


def _totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for r in rows:
        c = r.get("cost")
        if c and c.get("per_hour") is not None:
            t = totals.setdefault(c["unit"], {"per_hour": 0.0, "so_far": 0.0})
            t["per_hour"] = round(t["per_hour"] + c["per_hour"], 4)
            t["so_far"] = round(t["so_far"] + (c.get("so_far") or 0.0), 2)
    return totals


def folder_of(home: Path | str) -> str:
    """The working folder a state home belongs to (``/x`` for ``/x/.testbed``; a TESTBED_HOME elsewhere as is)."""
    p = Path(home)
    return str(p.parent) if p.name == ".testbed" else str(p)


def ledger(st: Store, home: Path) -> dict[str, Any]:
    """Every testbed's row of this folder's state ``st`` (``Store.empty`` when it has none) at ``home``, and the
    totals per cost unit."""
    table = exp.prices(home)
    rows = [entry(st, tb, table) for tb in st.testbeds()]
    return {"home": str(home), "state": st.exists, "testbeds": rows, "totals": _totals(rows),
            "images": exp.image_listing(st, table) if st.exists else [], "prices": table.get("_source", "")}


def _unreadable(home: str, e: Exception) -> str:
    what = e.what if isinstance(e, TestbedError) else str(e)
    return f"the testbeds of {folder_of(home)} are not listed: its state ({home}) cannot be read ({what})"


def elsewhere(current: Path) -> dict[str, Any]:
    """The testbeds recorded in this user's other state homes (from the index), each row with its ``home`` and
    ``folder``; the homes whose state no longer exists are removed from the index and named in ``pruned``;
    ``notes``: what could not be read. Other homes are opened read-only."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import homes
    from testbed.state import Store

    listed, note = homes.read()
    notes = [note] if note else []
    here = os.path.realpath(current)
    rows: list[dict[str, Any]] = []
    gone: list[str] = []
    for h in listed:
        if h == here:
            continue
        if not (Path(h) / "state.db").is_file():
            gone.append(h)
            continue
        try:
            st = Store(Path(h) / "state.db", readonly=True)
        except (TestbedError, OSError, sqlite3.Error) as e:
            notes.append(_unreadable(h, e))
            continue
        try:
            recorded = st.testbeds()
            if recorded:  # a home whose testbeds are all destroyed costs one query
                with paths.at_home(Path(h)):
                    table = exp.prices(Path(h))
                    rows += [{**entry(st, tb, table, recorded_spec=True), "home": h, "folder": folder_of(h)}
                             for tb in recorded]
        except (TestbedError, sqlite3.Error) as e:
            notes.append(_unreadable(h, e))
        finally:
            st.close()
    pruned: list[dict[str, str]] = []
    if gone:
        try:
            removed = homes.prune(gone)
        except OSError as e:
            removed = []
            notes.append(f"could not update the index of state homes ({paths.index_path()}: {e.strerror or e})")
        pruned = [{"home": h, "folder": folder_of(h),
                   "note": f"forgot {folder_of(h)}: its state ({h}/state.db) no longer exists; removed from "
                           f"the index of state homes ({paths.index_path()})"} for h in removed]
    return {"testbeds": rows, "totals": _totals(rows), "pruned": pruned, "notes": notes,
            "index": str(paths.index_path())}


def orphans(st: Store) -> dict[str, list[dict[str, Any]]]:
    """Resources at the providers that state does not record, for every recorded testbed and every cloud spec in
    inventories/ (a testbed whose state row is gone), asked of its provider (network; credentials needed).

    ``orphans``: what was found; ``asked``: one entry per cloud testbed, ``asked`` True with ``where`` and
    ``found``, or False with ``why`` (the extra missing, no credentials, credentials refused, the listing
    failed) and ``fix``: a provider that could not be asked is never reported as holding nothing.
    """
    # lazy: start-up (testbed status and exec load this module)
    from testbed import paths
    from testbed.providers import COSTS_MONEY
    from testbed.providers.usable import check
    from testbed.resolved import Resolved

    out: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    specs = paths.list_resources("inventories")
    names = {tb["name"] for tb in st.testbeds()} | set(specs)
    for name in sorted(names):
        rec = st.testbed(name)
        kind = str(rec["provider"]) if rec else _kind_written(specs.get(name))
        try:
            tb = Resolved.open(name, st, recorded_ok=True)
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


def _kind_written(path: Path | None) -> str:
    """provider.kind as a spec file writes it ('' when unreadable): what a spec that does not load is about."""
    if path is None:
        return ""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe").load(path.read_text())
        kind = data.get("provider", {}).get("kind") if isinstance(data, dict) else None
    except (OSError, YAMLError, AttributeError):
        return ""
    return kind if isinstance(kind, str) else ""
