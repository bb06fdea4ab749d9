"""Expiry of a testbed: when it is released by itself, and what it costs while held.

A testbed may carry a hard deadline (``testbed provision NAME --expire 8h`` or ``expire: 8h`` in the spec) and an
idle limit (``idle_after: 2h``: released after that long with no run and no command). Both are recorded in the
testbed's state row (``info["expiry"]``); the dead-man's switch (:mod:`testbed.deadman`) enforces them on the
resources' side. This module is light (no SDK, no SSH): the spec, the CLI and the ledger import it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from testbed.state import Store

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_SECONDS = 30 * 86400  # a month: longer is a typo, not an expiry


def parse_duration(text: str | float | int) -> float:
    """``"8h"``, ``"90m"``, ``"2d"``, ``"45s"`` or a number of hours, as seconds; ValueError with the rule."""
    if isinstance(text, bool):
        raise ValueError("a duration such as 8h, 90m, 2d or 45s")
    if isinstance(text, int | float):
        secs = float(text) * 3600
    else:
        m = DURATION_RE.match(str(text))
        if not m:
            raise ValueError(f"'{text}' is not a duration: write a number with s, m, h or d (8h, 90m, 2d, 45s)")
        secs = float(m.group(1)) * UNITS[m.group(2) or "h"]
    if not 0 < secs <= MAX_SECONDS:
        raise ValueError(f"'{text}' is out of range: more than 0 s and at most 30 days")
    return secs


def span(secs: float) -> str:
    """A duration for people: '45s', '12m', '3h 05m', '2d 04h'; negative as '-…'."""
    sign, secs = ("-" if secs < 0 else ""), abs(int(secs))
    if secs < 60:
        return f"{sign}{secs}s"
    if secs < 3600:
        return f"{sign}{secs // 60}m"
    if secs < 86400:
        return f"{sign}{secs // 3600}h {secs % 3600 // 60:02d}m"
    return f"{sign}{secs // 86400}d {secs % 86400 // 3600:02d}h"


def iso(epoch: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else None


@dataclass
class Expiry:
    """A testbed's expiry as recorded in state: a hard deadline, an idle limit, the last controller action."""

    expire_at: float | None = None  # epoch seconds
    idle_after: float | None = None  # seconds
    touched: float = 0.0  # the last time testbed acted on the testbed (epoch)
    switch: str = ""  # how it is enforced: "agent" (on the hosts), "watchdog" (local), "" (not armed)
    armed: list[str] | None = None  # hosts whose agent holds the deadline

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> Expiry | None:
        raw = info.get("expiry")
        if not isinstance(raw, dict):
            return None
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def active(self) -> bool:
        return self.expire_at is not None or self.idle_after is not None

    def release_at(self, *, now: float | None = None, last_run: float | None = None) -> float | None:
        """When the switch releases the testbed if nothing happens: the earlier of the deadline and the idle limit
        counted from the last action (or the end of the last run, when later)."""
        times = []
        if self.expire_at is not None:
            times.append(self.expire_at)
        if self.idle_after is not None:
            times.append(max(self.touched, last_run or 0.0) + self.idle_after)
        return min(times) if times else None


# prices ---------------------------------------------------------------------------------------------------
PRICES_FILE = "prices.json"


@cache
def shipped_prices() -> dict[str, Any]:
    """The price table shipped with the package (``testbed/data/prices.json``; source and date inside)."""
    return dict(json.loads((Path(__file__).parent / "data" / PRICES_FILE).read_text(encoding="utf-8")))


def prices(home: Path) -> dict[str, Any]:
    """The shipped table with the user's overrides (``<state home>/prices.json``, same shape) laid over it."""
    table: dict[str, Any] = json.loads(json.dumps(shipped_prices()))  # a deep copy
    user = home / PRICES_FILE
    if user.exists():
        # lazy: start-up (testbed status and exec load this module)
        from testbed.errors import TestbedError

        try:
            over = json.loads(user.read_text())
            if not isinstance(over, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise TestbedError(f"the price overrides are not readable JSON ({e})", where=str(user),
                               fix="fix or delete the file; its shape is that of testbed/data/prices.json") from None
        for section, rows in over.items():
            if isinstance(rows, dict) and isinstance(table.get(section), dict):
                table[section].update(rows)
            else:
                table[section] = rows
    return table


def tpu_family(accelerator_type: str) -> tuple[str, int]:
    """('v4', 8) from 'v4-16' (chips = cores / 2 for v2-v4 and v5p; v5e/v6e name chips)."""
    fam, _, n = accelerator_type.partition("-")
    count = int(n) if n.isdigit() else 1
    if fam in ("v5litepod", "v5e", "v6e"):
        return ("v5e" if fam in ("v5litepod", "v5e") else fam), count
    return fam, max(1, count // 2)


def tpu_rate(table: dict[str, Any], accelerator_type: str, zone: str, *, spot: bool) -> tuple[float | None, str]:
    """Dollars per hour of one TPU node, and how it was found (or why not)."""
    fam, chips = tpu_family(accelerator_type)
    region = zone.rsplit("-", 1)[0]
    rows = table.get("tpu", {}).get(fam)
    if not isinstance(rows, dict):
        return None, f"no price for TPU {fam} in the table"
    row = rows.get(region) or rows.get("default")
    if not isinstance(row, dict):
        return None, f"no price for TPU {fam} in {region}"
    per_chip = row.get("spot" if spot else "on_demand")
    if per_chip is None:
        return None, f"no {'spot' if spot else 'on-demand'} price for TPU {fam} in {region}"
    tier, where = ("spot" if spot else "on-demand"), (region if region in rows else "default")
    return float(per_chip) * chips, f"{chips} chips x ${float(per_chip):.4g}/chip-h ({tier}, {where})"


# images of a set-up (testbed.setup.images): what keeping them costs, read by the ledger without the set-up stage
def image_monthly_cost(row: Mapping[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """What an image costs a month to keep, from the price table's ``images`` section (per GB-month)."""
    price = ((table.get("images") or {}).get(row["provider"]) or {})
    per_gb = price.get("per_gb_month")
    unit = price.get("unit", "USD")
    gb = row["size"] / 1e9
    return {"per_month": round(per_gb * gb, 4) if per_gb is not None else None, "unit": unit,
            "note": price.get("note", "")}


def image_listing(st: Store, table: dict[str, Any]) -> list[dict[str, Any]]:
    """Every recorded image: key, profile, size, where it lives, what it costs a month, the testbeds using it."""
    used = st.image_users()
    out = []
    for r in st.images():
        out.append({"key": r["key"], "id": r["id"], "provider": r["provider"], "profile": r["plan"],
                    "size": r["size"], "location": r["location"], "baked_from": f"{r['testbed']}/{r['host']}",
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["created"])),
                    "cost": image_monthly_cost(r, table), "used_by": used.get(r["key"], []),
                    **{k: v for k, v in r["info"].items() if k in ("status", "site", "visibility")}})
    return out
