"""The ledger (``testbed status`` with no name) as Rich tables: the data comes from :mod:`testbed.ledger`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.expiry import span


def _cost(c: dict[str, Any] | None) -> tuple[str, str]:
    if not c:
        return "free", "-"
    if c.get("per_hour") is None:
        return "?", escape(str(c.get("basis", "")))
    unit = c["unit"]
    fmt = (lambda v: f"${v:,.2f}") if unit == "USD" else (lambda v: f"{v:,.2f} {unit}")
    return fmt(c["per_hour"]) + "/h", fmt(c.get("so_far") or 0.0)


def render(con: Console, data: dict[str, Any]) -> None:
    rows = data["testbeds"]
    if not rows:
        con.print("no testbed provisioned (try: testbed provision local)")
    else:
        t = Table(title="testbeds (the ledger)", title_justify="left", show_lines=True)
        for col in ("testbed", "holds", "run", "cost", "expiry"):
            t.add_column(col, overflow="fold")
        for r in rows:
            counts: dict[str, int] = {}
            for res in r["resources"]:
                counts[res["kind"]] = counts.get(res["kind"], 0) + 1
            holds = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in counts.items()) or f"{r['hosts']} hosts"
            if r.get("lease_end"):
                holds += f"; lease ends {r['lease_end']}"
            holds += f"\nsince {(r['since'] or '')[:16]}"
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
            t.add_row(f"{escape(r['name'])}\n{r['provider']}, {r['status']}", escape(holds),
                      ", ".join(r["active_runs"]) or "-", f"{per_h}\n{so_far} so far", escape(exp_txt))
        con.print(t)
        for r in rows:
            if r.get("warning"):
                con.print(f"[yellow]warning:[/yellow] {r['name']}: {escape(r['warning'])}")
        for unit, tot in data.get("totals", {}).items():
            per_h, so_far = _cost({"unit": unit, **tot})
            con.print(f"total: {per_h}, {so_far} so far")
        if data.get("totals"):
            con.print("[dim]estimates from the price table (testbed/data/prices.json; your own in "
                      "<state home>/prices.json)[/dim]")
    orphans = data.get("orphans")
    if orphans is not None:
        if not orphans:
            con.print("orphans: none found at the providers")
        else:
            t = Table(title="orphans: held at a provider, not in state", title_justify="left")
            for col in ("testbed", "kind", "id", "release with"):
                t.add_column(col)
            for o in orphans:
                t.add_row(escape(o["testbed"]), escape(o["kind"]), escape(o["id"]),
                          escape(o.get("release") or o.get("error") or ""))
            con.print(t)
