"""How testbed writes counts, sizes and moments for people: one plural rule, one size and one time format.

Times are ISO 8601 in UTC with a ``Z`` (``2025-01-01T12:00:00Z``), the form the manifest, the ledger and the
expiry already use; a clock in a live stream is the time of day of the same form (``12:00:01.2Z``). JSON keeps
the numbers (unix seconds) it always gave.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

_SAME = frozenset({"netns", "series", "ms", "s", "GB", "MB", "KB", "B", "data"})  # a plural like the singular
_IRREGULAR = {"is": "are", "was": "were", "has": "have", "this": "these", "it": "them", "entry": "entries",
              "directory": "directories", "dependency": "dependencies", "policy": "policies", "child": "children"}


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun`` made to agree: ``1 rank``, ``4 ranks``, ``2 netns``, ``3 processes``, ``0 hosts``."""
    return f"{n} {noun if n == 1 else (many or plural_of(noun))}"


def plural_of(noun: str) -> str:
    """The plural of an English noun as testbed uses them (kinds of resources, hosts, ranks, runs...)."""
    head, sep, last = noun.rpartition(" ")
    if sep:
        return f"{head} {plural_of(last)}"
    if noun in _SAME or not noun[-1:].isalpha():
        return noun
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    low = noun.lower()
    if low.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if low.endswith("y") and low[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"


def iso(ts: float | None, *, ms: bool = False) -> str | None:
    """Unix seconds as ISO 8601 UTC: ``2025-01-01T12:00:00Z`` (``.123Z`` with ``ms``); None (or 0) stays None."""
    if not ts:
        return None
    moment = datetime.fromtimestamp(float(ts), UTC)
    return moment.isoformat(timespec="milliseconds" if ms else "seconds").replace("+00:00", "Z")


def clock(ts: float | None) -> str:
    """The time of day of a moment, ISO 8601 UTC with tenths (``12:00:01.2Z``): a live stream's prefix."""
    if not ts:
        return ""
    t = float(ts)
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 10)}Z"


def size(n: float) -> str:
    """A byte count for people, in decimal units as pip and rsync show them: ``512 B``, ``11.2 kB``, ``190.2 MB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def home_relative(path: str) -> str:
    """``path`` with the user's home directory written ``~`` (``/home/ana/x`` -> ``~/x``); others as they are."""
    import os

    home = os.path.expanduser("~").rstrip("/")
    if home and home != "~" and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home):]
    return path


def middle(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` characters by an ellipsis in its middle, keeping its head and its tail
    (a path's last part, the part that names it, is kept whole when it fits): ``/tmp/a/…/experiment``."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    keep = width - 1
    tail = text.rsplit("/", 1)[-1] if "/" in text else ""
    if tail and len(tail) + 1 < keep:  # the last part whole, the head filled up to the room left
        return text[:keep - len(tail) - 1] + "…/" + tail
    back = keep // 2
    return text[:keep - back] + "…" + text[len(text) - back:]


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word boundary with an ellipsis (``…``) when it is longer;
    only a single word longer than ``width`` is cut inside."""
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width)  # the ellipsis takes the last place
    head = text[:cut] if cut > 0 else text[:width - 1]
    return head.rstrip(" ,;:") + "…"


def words(value: object) -> str:
    """A value from an event or record as words: a mapping as ``key: value; key: value``, a list as ``a, b``,
    anything else as its text (never Python's ``{'node1': ...}``); an empty one as ``none``."""
    if isinstance(value, (dict, list, tuple, set, frozenset)) and not value:
        return "none"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {words(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(words(v) for v in value)
    return str(value)
