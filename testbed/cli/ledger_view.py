"""The ledger (``testbed status`` with no name) as tables, this folder's and the other folders': the data comes
from :mod:`testbed.ledger`."""

from __future__ import annotations

from typing import Any

from testbed.cli.output import Plain
from testbed.expiry import span
from testbed.textfmt import plural


def _cost(c: dict[str, Any] | None) -> tuple[str, str]:
    if not c:
        return "free", "-"
    if c.get("per_hour") is None:
        return "?", str(c.get("basis", ""))
    unit = c["unit"]

    def fmt(v: float) -> str:
        return f"${v:,.2f}" if unit == "USD" else f"{v:,.2f} {unit}"

    return fmt(c["per_hour"]) + "/h", fmt(c.get("so_far") or 0.0)


def _table(out: Plain, title: str, rows: list[dict[str, Any]], *, folder: bool = False) -> None:
    table: list[list[str]] = []
    for r in rows:
        counts: dict[str, int] = {}
        for res in r["resources"]:
            counts[res["kind"]] = counts.get(res["kind"], 0) + 1
        holds = ", ".join(plural(n, k) for k, n in counts.items()) or plural(r["hosts"], "host")
        if r.get("lease_end"):
            holds += f"; lease ends {r['lease_end']}"
        holds += f"\nsince {r['since'] or 'unknown'}"
        per_h, so_far = _cost(r.get("cost"))
        e = r.get("expiry")
        exp_txt = "none"
        if e:
            parts = []
            if e["expire_at"]:
                parts.append(f"at {e['expire_at']}")
            if e["idle_after"]:
                parts.append(f"idle {span(e['idle_after'])}")
            exp_txt = (", ".join(parts) + f" [{e['switch']}]\nnext release {e['release_at']} (in {e['in']})"
                       + (", held by a run" if e.get("held_by_run") else ""))
        table.append([f"{r['name']}\n{r['provider']}, {r['status']}", *([r["folder"]] if folder else []), holds,
                      "\n".join(r["active_runs"]) or "-", f"{per_h}\n{so_far} so far", exp_txt])
    columns = ("testbed", *(("folder",) if folder else ()), "holds", "run", "cost", "expiry")
    out.table(title, columns, table, lines=True, whole=("testbed", "holds", "run"),  # ids, moments never cut in two
              paths=("folder",))
    for r in rows:
        if r.get("warning"):
            where = f" (in {r['folder']})" if folder else ""
            out.write(f"{out.paint('warning:', 'yellow')} {r['name']}{where}: {r['warning']}")
        if folder and r.get("note"):
            out.write(f"{out.paint('note:', 'yellow')} {r['name']} (in {r['folder']}): {r['note']}")


def _totals(out: Plain, totals: dict[str, Any], label: str) -> None:
    for unit, tot in totals.items():
        per_h, so_far = _cost({"unit": unit, **tot})
        out.write(f"{label}: {per_h}, {so_far} so far")


def render(out: Plain, data: dict[str, Any]) -> None:
    rows = data["testbeds"]
    other = data.get("elsewhere") or {}
    if not rows:
        why = [] if data.get("state", True) else [f"no state at {data.get('home')}"]
        why += [] if other.get("testbeds") else ["try: testbed provision local"]
        out.write("no testbed provisioned in this folder" + (f" ({'; '.join(why)})" if why else ""))
    else:
        _table(out, "testbeds (the ledger)", rows)
        _totals(out, data.get("totals", {}), "total")
    imgs = data.get("images") or []
    if imgs:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.textfmt import size

        monthly: dict[str, float] = {}
        for i in imgs:
            c = i["cost"]
            if c.get("per_month") is not None:
                monthly[c["unit"]] = monthly.get(c["unit"], 0.0) + c["per_month"]
        kept = ", ".join(f"{v:,.2f} {u}" for u, v in monthly.items()) or "?"
        out.write(f"images: {plural(len(imgs), 'image')}, {size(sum(i['size'] for i in imgs))}, {kept} a month "
                  "to keep (kept until 'testbed image prune'; 'testbed image list' shows them)")
    if other.get("testbeds"):
        _table(out, "testbeds in other folders", other["testbeds"], folder=True)
        _totals(out, other.get("totals", {}), "total in other folders")
    if data.get("totals") or other.get("totals"):
        out.write(out.paint("estimates from the price table (testbed/data/prices.json; your own in "
                            "<state home>/prices.json)", "dim"))
    pruned = other.get("pruned", [])
    if pruned:  # other folders' deleted states: one short line at the end (--json names each)
        # lazy: start-up (testbed status and exec load this module)
        from testbed.textfmt import home_relative

        names = [home_relative(p["folder"]) for p in pruned]
        shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
        out.write(f"{out.paint('note:', 'yellow')} forgot {plural(len(names), 'folder')} whose state was deleted "
                  f"({shown})")
    for n in other.get("notes", []):
        out.write(f"{out.paint('note:', 'yellow')} {n}")
    orphans = data.get("orphans")
    if orphans is None:
        return
    asked = data.get("orphans_asked") or []
    done = [a for a in asked if a["asked"]]
    if orphans:
        out.table("orphans: held at a provider, not in state", ("testbed", "kind", "id", "release with"),
                  [[o["testbed"], o["kind"], o["id"], o.get("release") or ""] for o in orphans],
                  whole=("testbed", "id"))
    elif done:
        out.write("orphans: none found at the providers asked")
    else:
        out.write("orphans: no provider could be asked, so none were looked for")
    for a in done:
        out.write(f"  asked {a['provider']} for testbed {a['testbed']}"
                  + (f" ({a['where']})" if a.get("where") else "") + f": {a['found']} found")
    for a in asked:
        if not a["asked"]:
            out.write(f"  {out.paint('not asked:', 'yellow')} {a['provider']} for testbed {a['testbed']}: "
                      f"{a['why']}" + (f"\n    fix: {a['fix']}" if a.get("fix") else ""))
