"""Time and cost arithmetic for campaigns: a suite's declared ``estimate:``, budgets, a testbed's price per hour,
the wall time of a matrix dispatched over a testbed's hosts, and time actually spent.

Light (no SDK, no SSH): the suite loader, ``testbed plan`` and the campaign driver import it. The stage that puts
these together is :mod:`testbed.run.forecast`.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from typing import Any

from testbed.errors import UsageError
from testbed.expiry import MAX_SECONDS, UNITS

# --- a suite's estimate ------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(?P<dur>\d+(?:\.\d+)?(?:s|m|h|d))\b|(?P<num>\d+(?:\.\d+)?)\b|(?P<name>[A-Za-z_]\w*)"
                    r"|\(\s*(?P<oname>[A-Za-z_]\w*)\s+or\s+(?P<dflt>\d+(?:\.\d+)?)\s*\)|(?P<op>[+*]))")
ESTIMATE_RULE = ("a duration such as 5m, or a sum of terms, each a duration times numbers or int/float parameters, "
                 "'(name or N)' for one that may be unset (e.g. '2m + 40s * epochs', '3m * (epochs or 2)')")


MAX_RUN_SECONDS = MAX_SECONDS
"""The longest one run may be estimated at (a month, the longest expiry): more is an overflow or a typo."""


class EstimateTooLarge(ValueError):
    """An estimate that is not a finite number of seconds up to ``MAX_RUN_SECONDS``."""


def _bounded(seconds: float, what: str) -> float:
    if not math.isfinite(seconds) or seconds > MAX_RUN_SECONDS:
        shown = f"{seconds:.3g} s" if math.isfinite(seconds) else "not a finite number"
        raise EstimateTooLarge(f"{what} is {shown}; one run is estimated at most {MAX_RUN_SECONDS:,} s (30 days)")
    return seconds


@dataclass(frozen=True)
class Term:
    """One product of an estimate: a duration (seconds) times numbers and parameters."""

    seconds: float
    factors: tuple[float | str | tuple[str, float], ...]  # numbers, parameters, (parameter, value when unset)


@dataclass(frozen=True)
class Estimate:
    """A declared wall time per run: the sum of its terms, evaluated with a point's parameters."""

    text: str
    terms: tuple[Term, ...]

    @property
    def names(self) -> list[str]:
        return sorted({f if isinstance(f, str) else f[0] for t in self.terms for f in t.factors
                       if not isinstance(f, float)})

    def seconds(self, params: dict[str, Any]) -> float:
        """The estimate for these parameters; ValueError naming a parameter that has no number."""
        total = 0.0
        for t in self.terms:
            v = t.seconds
            for f in t.factors:
                if not isinstance(f, float):
                    name, x = (f, params.get(f)) if isinstance(f, str) else (f[0], params.get(f[0]))
                    if x is None and isinstance(f, tuple):
                        x = f[1]
                    if isinstance(x, bool) or not isinstance(x, int | float):
                        raise ValueError(f"parameter '{name}' is {x!r} here, not a number")
                    v *= float(x)
                else:
                    v *= f
            total += v
        return _bounded(total, f"the estimate {self.text!r} with these parameters")


def parse_estimate(text: str) -> Estimate:
    """``'5m'``, ``'2m + 40s * epochs'``: each term one duration times numbers or names; ValueError with the rule."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty")
    pos, terms = 0, []
    dur: float | None = None
    factors: list[float | str | tuple[str, float]] = []
    expect_operand = True
    while pos < len(text):  # bounded: every match consumes at least one character
        if not text[pos:].strip():
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot read {text[pos:].strip()!r} in {text!r}")
        pos = m.end()
        if m["op"]:
            if expect_operand:
                raise ValueError(f"'{m['op']}' without a value before it in {text!r}")
            if m["op"] == "+":
                terms.append(_term(dur, factors, text))
                dur, factors = None, []
            expect_operand = True
            continue
        if not expect_operand:
            raise ValueError(f"two values with no + or * between them in {text!r}")
        expect_operand = False
        if m["dur"]:
            if dur is not None:
                raise ValueError(f"a term of {text!r} multiplies two durations")
            dur = _bounded(float(m["dur"][:-1]) * UNITS[m["dur"][-1]], f"the duration {m['dur']!r}")
        elif m["num"]:
            factors.append(_bounded(float(m["num"]), f"the number {m['num']!r}"))
        elif m["oname"]:
            factors.append((m["oname"], _bounded(float(m["dflt"]), f"the number {m['dflt']!r}")))
        else:
            factors.append(m["name"])
    if expect_operand:
        raise ValueError(f"{text!r} ends with an operator")
    terms.append(_term(dur, factors, text))
    return Estimate(text.strip(), tuple(terms))


@dataclass(frozen=True)
class Declared:
    """A suite's ``estimate:``: one expression for every run, or one per value of a parameter (``by``), with
    ``other`` for the values not listed."""

    by: str | None
    cases: dict[str, Estimate]
    other: Estimate | None

    @property
    def names(self) -> list[str]:
        return sorted({n for e in [*self.cases.values(), *([self.other] if self.other else [])] for n in e.names})

    def pick(self, params: dict[str, Any]) -> Estimate:
        """The expression for these parameters; ValueError when the ``by`` value has none."""
        if self.by is None:
            assert self.other is not None
            return self.other
        value = params.get(self.by)
        key = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        found = self.cases.get(key, self.other)
        if found is None:
            raise ValueError(f"{self.by}={value} has no case (cases: {', '.join(self.cases)}) and there is no "
                             "'other'")
        return found


def declared(raw: Any) -> Declared:
    """A suite's ``estimate:`` as written (an expression, or ``{by, cases, other}``); ValueError, with ``loc`` in
    ``args[1]`` when the culprit is below ``estimate``."""
    if isinstance(raw, str):
        return Declared(None, {}, parse_estimate(raw))
    cases: dict[str, Estimate] = {}
    for k, v in (raw.get("cases") or {}).items():
        try:
            cases[str(k)] = parse_estimate(v)
        except ValueError as e:
            raise ValueError(str(e), ("cases", k)) from None
    other = None
    if raw.get("other") is not None:
        try:
            other = parse_estimate(raw["other"])
        except ValueError as e:
            raise ValueError(str(e), ("other",)) from None
    return Declared(str(raw["by"]), cases, other)


def _term(dur: float | None, factors: list[float | str | tuple[str, float]], text: str) -> Term:
    if dur is None:
        raise ValueError(f"a term of {text!r} has no duration (a number needs s, m, h or d)")
    return Term(dur, tuple(factors))


# --- budgets -----------------------------------------------------------------------------------------------------
BUDGET_RULE = "hours (40h, 90m, 2d), service units (500 SU) or US dollars ($120 or 120 USD)"
_BUDGET = re.compile(r"^\s*(?:\$\s*(?P<usd1>\d+(?:\.\d+)?)|(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>su|usd|\$|s|m|h|d))\s*$",
                     re.IGNORECASE)


@dataclass(frozen=True)
class Budget:
    """A campaign's limit: ``amount`` of ``unit`` (``hours``, ``SU`` or ``USD``), as given."""

    amount: float
    unit: str
    given: str

    def to_json(self) -> dict[str, Any]:
        return {"amount": self.amount, "unit": self.unit, "given": self.given}


def parse_budget(text: str) -> Budget:
    """``40h``, ``90m``, ``500 SU``, ``$120``, ``120 USD``; ValueError with the rule (a bare number is refused:
    hours, SUs and dollars differ by orders of magnitude)."""
    m = _BUDGET.match(text or "")
    if not m:
        raise ValueError(f"'{text}' is not a budget")
    if m["usd1"] is not None:
        amount, unit = float(m["usd1"]), "USD"
    else:
        amount, u = float(m["n"]), m["unit"].lower()
        unit = {"su": "SU", "usd": "USD", "$": "USD"}.get(u, "hours")
        if unit == "hours":
            amount = amount * UNITS[u] / 3600
    if not (amount > 0 and math.isfinite(amount)):
        raise ValueError(f"'{text}' is not a budget: it must be more than zero")
    return Budget(round(amount, 6), unit, text.strip())


# --- price per hour ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rate:
    """What the whole testbed costs per hour held: ``per_hour`` of ``unit`` (None: free, or no price known)."""

    per_hour: float | None
    unit: str | None
    basis: str

    def cost(self, seconds: float) -> float | None:
        return None if self.per_hour is None else round(self.per_hour * seconds / 3600, 4)

    @classmethod
    def of(cls, cost: dict[str, Any] | None, free: str) -> Rate:
        """From a provider's ``planned_cost`` (None: free, ``free`` saying why)."""
        if cost is None:
            return cls(None, None, free)
        return cls(cost.get("per_hour"), str(cost["unit"]), str(cost.get("basis") or ""))


def budget_hours(b: Budget, r: Rate) -> float:
    """The budget as hours of this testbed; UsageError when its unit is not the testbed's."""
    if b.unit == "hours":
        return b.amount
    if r.unit != b.unit or not r.per_hour:
        has = f"is priced in {r.unit}" if r.unit and r.per_hour else "has no price"
        raise UsageError(f"--budget {b.given} is in {b.unit}, but this testbed {has} ({r.basis})", where="--budget",
                         fix=("give the budget in hours (e.g. --budget 40h)" if not (r.unit and r.per_hour) else
                              f"give the budget in {r.unit} or in hours (e.g. --budget 40h)"))
    return b.amount / r.per_hour


# --- schedules ---------------------------------------------------------------------------------------------------
def makespan(durations: list[float], needs: list[int], hosts: int, busy: list[tuple[float, int]] | None = None
             ) -> tuple[float, list[float]]:
    """Wall time of dispatching points in matrix order as the campaign does (a point starts when enough hosts are
    free, never ahead of an earlier point), starting now with ``busy`` (seconds left, hosts held) already running.
    Returns the total and each point's start."""
    running: list[tuple[float, int]] = list(busy or [])
    heapq.heapify(running)
    free = hosts - sum(n for _, n in running)
    t, starts, end = 0.0, [], max((e for e, _ in running), default=0.0)
    for d, n in zip(durations, needs, strict=True):
        n = min(n, hosts)
        while free < n and running:  # bounded: each pass removes one running point
            e, k = heapq.heappop(running)
            t, free = max(t, e), free + k
        starts.append(t)
        heapq.heappush(running, (t + d, n))
        free -= n
        end = max(end, t + d)
    return end, starts


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval: the testbed time a campaign's runs held, overlaps counted once."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total
