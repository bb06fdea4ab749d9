"""Verdicts: each of a suite's references (``testbed.references``) against the value our report computed.

Data only: :func:`evaluate` reads the report's tables and the hosts the manifest records; the renderers draw
the verdict table (``render.py``) and ``--json`` writes :meth:`Verdict.to_json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import fmean
from typing import TYPE_CHECKING, Any

from testbed import paths
from testbed.errors import UsageError
from testbed.report.model import Link, Report, Table
from testbed.suite import SUITE_NAME_RE, Suite, load_suite
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.references import Reference, References

WITHIN, OUTSIDE, NOT_MEASURED = "within tolerance", "outside tolerance", "not measured"
REDUCERS: dict[str, Callable[[list[float]], float]] = {"mean": fmean, "min": min, "max": max, "sum": sum}


@dataclass
class Verdict:
    """One row of the verdict table."""

    metric: str
    reference: Any
    ours: Any
    difference: float | None  # ours - reference (numbers only)
    relative_pct: float | None  # the difference as a percent of the reference
    within: bool | None  # None: not measured
    tolerance: str  # "±10%", "±0.02", "exact"; "at most 0.025 ±0" for a bound
    source: str
    hardware: str = ""  # the difference between the reference's hardware and ours, named
    note: str = ""  # how ours was read (mean of n rows), or why it is not measured

    @property
    def status(self) -> str:
        return NOT_MEASURED if self.within is None else WITHIN if self.within else OUTSIDE

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


def summary(verdicts: Sequence[Verdict]) -> str:
    """``12 of 14 within tolerance, 1 outside, 1 not measured``."""
    n = len(verdicts)
    ok = sum(1 for v in verdicts if v.within)
    bad = sum(1 for v in verdicts if v.within is False)
    missing = n - ok - bad
    parts = [f"{ok} of {n} within tolerance"] + ([f"{bad} outside"] if bad else []) + \
        ([f"{missing} not measured"] if missing else [])
    return ", ".join(parts)


def headline(status: str | None, verdicts: Sequence[Verdict], why: str | None = None) -> str | None:
    """The run's status (and ``why``, its reason) with its verdicts beside it, so that neither reads alone:
    ``succeeded, but 1 of 4 verdicts outside tolerance``, ``succeeded; 4 of 4 within tolerance``; None with
    neither."""
    said = None if status is None else status + (f": {why}" if why else "")
    if not verdicts:
        return said
    bad = sum(1 for v in verdicts if v.within is False)
    text = f"{bad} of {plural(len(verdicts), 'verdict')} outside tolerance" if bad else summary(verdicts)
    if said is None:
        return text
    return f"{said}, but {text}" if bad and status == "succeeded" else f"{said}; {text}"


def headline_tone(status: str | None, verdicts: Sequence[Verdict]) -> str:
    """``good`` (succeeded, every verdict within), ``bad`` (not succeeded, or a verdict outside) or ``unsure``
    (succeeded, some verdict not measured)."""
    if (status not in (None, "succeeded")) or any(v.within is False for v in verdicts):
        return "bad"
    return "unsure" if any(v.within is None for v in verdicts) else "good"


def across_runs(own: Sequence[Verdict], per_run: Mapping[str, Sequence[Verdict]]) -> list[Verdict]:
    """A suite's or campaign's verdicts: each metric as its own tables measured it, else as its runs did (each run's
    report measures its own): within when every run that measured it is, outside when one is not (ours: the run
    furthest from the reference), the note naming how many of the runs measured it. A metric no run measured
    stays not measured, the note saying so."""
    out: list[Verdict] = []
    for v in own:
        if v.within is not None:
            out.append(v)
            continue
        measured = [(rid, rv) for rid, vs in per_run.items() for rv in vs if rv.metric == v.metric
                    and rv.within is not None]
        if not measured:
            out.append(replace(v, note=f"not measured by any of the {plural(len(per_run), 'run')}" if per_run
                               else v.note))
            continue
        bad = [rid for rid, rv in measured if rv.within is False]
        rid, far = max(measured, key=lambda m: (m[1].within is False, abs(m[1].relative_pct or 0.0),
                                                 abs(m[1].difference or 0.0)))
        runs = f"{len(measured)} of {plural(len(per_run), 'run')}"
        note = (f"measured by {runs} ({rid})" if len(measured) == 1 else
                f"measured by {runs}: {len(measured) - len(bad)} within tolerance"
                + (f", outside in {', '.join(bad)}" if bad else "") + f"; ours: {rid}, the furthest")
        out.append(replace(far, note=note + (f"; {far.note}" if far.note else ""), within=not bad))
    return out


def evaluate(refs: References, tables: Iterable[Table], hosts: Sequence[dict[str, Any]]) -> list[Verdict]:
    """Every reference against the report's ``tables``; ``hosts``: the manifest's host records (their facts)."""
    by_name = {t.name: t for t in tables}
    out = []
    for ref in refs.metrics:
        hw = hardware_difference(ref.hardware if ref.hardware is not None else refs.hardware, hosts)
        out.append(_one(ref, by_name.get(ref.table), hw))
    return out


def _one(ref: Reference, table: Table | None, hw: str) -> Verdict:
    tol = ref.tolerance.text()
    tol = tol if ref.compare == "equal" else f"{ref.compare.replace('-', ' ')} {ref.value} ({tol})"

    def missing(note: str) -> Verdict:
        return Verdict(ref.metric, ref.value, None, None, None, None, tol, ref.source, hw, note)

    if table is None:
        return missing(f"no table {ref.table} in this report")
    if ref.column not in table.columns:
        return missing(f"no column {ref.column} in {ref.table}")
    col = table.columns.index(ref.column)
    idx = {k: table.columns.index(k) for k in ref.where if k in table.columns}
    absent = [k for k in ref.where if k not in idx]
    if absent:
        return missing(f"no column {', '.join(absent)} in {ref.table}")
    rows = [r for r in table.rows if all(_same(r[i], ref.where[k]) for k, i in idx.items())]
    cells = [c for r in rows if (c := _value(r[col])) is not None]
    where = ", ".join(f"{k}={v}" for k, v in ref.where.items()) or "any row"
    numeric_ref = isinstance(ref.value, int | float) and not isinstance(ref.value, bool)
    how = ref.reduce or {"equal": "mean", "at-most": "max", "at-least": "min"}[ref.compare]
    if numeric_ref and how == "count":
        ours: Any = len(cells)
        diff = float(ours) - float(ref.value)
        rel = diff / abs(float(ref.value)) * 100 if ref.value else None
        return Verdict(ref.metric, ref.value, ours, diff, rel, _within(ref, float(ours)), tol, ref.source, hw,
                       f"rows where {where}")
    if not cells:
        return missing(f"no {ref.column} where {where}")
    numbers = [c for c in cells if isinstance(c, int | float) and not isinstance(c, bool)]
    note = ""
    if numeric_ref:
        if len(numbers) != len(cells):
            return missing(f"{ref.column} where {where} is not a number")
        ours = numbers[0] if len(numbers) == 1 and how != "sum" else REDUCERS[how](numbers)
        if len(numbers) > 1:
            note = f"{how} of {len(numbers)} rows"
        diff = float(ours) - float(ref.value)
        rel = diff / abs(float(ref.value)) * 100 if ref.value else None
        return Verdict(ref.metric, ref.value, ours, diff, rel, _within(ref, float(ours)), tol, ref.source, hw, note)
    distinct = sorted({str(c) for c in cells})
    ours = distinct[0] if len(distinct) == 1 else " / ".join(distinct)
    return Verdict(ref.metric, ref.value, ours, None, None, ours == str(ref.value), tol, ref.source, hw,
                   f"{len(cells)} rows" if len(cells) > 1 else "")


def _within(ref: Reference, ours: float) -> bool:
    value = float(ref.value)
    t = ref.tolerance
    slack = 0.0 if t.exact else (t.abs if t.abs is not None else abs(value) * (t.rel or 0) / 100)
    slack += 1e-9 * max(1.0, abs(value))  # a value typed as the CSV prints it is the same value
    if ref.compare == "at-most":
        return ours <= value + slack
    if ref.compare == "at-least":
        return ours >= value - slack
    return abs(ours - value) <= slack


def _value(cell: object) -> bool | int | float | str | None:
    """A table cell as a number or text; None for an empty or NaN cell."""
    if isinstance(cell, Link):
        cell = cell.text
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return None
    if isinstance(cell, bool | int | float | str):
        return cell
    return str(cell)


def _same(cell: object, want: object) -> bool:
    v = _value(cell)
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return v is not None and not isinstance(v, bool) and math.isclose(float(v), float(want), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(v) == str(want) if not isinstance(want, bool) else v == want


# --- hardware -------------------------------------------------------------------------------------------------
def host_hardware(hosts: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """What the manifest's hosts ran on: GPU names, core counts, TPU types (each list distinct, sorted)."""
    gpus: set[str] = set()
    cpus: set[int] = set()
    tpus: set[str] = set()
    for h in hosts:
        facts = h.get("facts") if isinstance(h.get("facts"), dict) else None
        if facts is None:
            continue
        for g in facts.get("gpus") or []:
            if isinstance(g, dict) and g.get("name"):
                gpus.add(str(g["name"]))
        if isinstance(facts.get("cpus"), int):
            cpus.add(facts["cpus"])
        if facts.get("tpu"):
            tpus.add(str(facts["tpu"]))
    known = any(isinstance(h.get("facts"), dict) for h in hosts)
    return {"gpu": sorted(gpus), "cpus": sorted(cpus), "tpu": sorted(tpus), "known": [known]}


def hardware_difference(ref_hw: dict[str, Any], hosts: Sequence[dict[str, Any]]) -> str:
    """The reference's hardware against ours, named (``reference: V100 GPU; ours: no GPU``); empty when
    they match or the reference names none."""
    if not ref_hw:
        return ""
    ours = host_hardware(hosts)
    if not ours["known"][0]:
        return "reference: " + _hw_text(ref_hw) + "; ours: not recorded in the manifest"
    diffs: list[str] = []
    if "gpu" in ref_hw:
        want = str(ref_hw["gpu"]).lower()
        if not any(want in g.lower() for g in ours["gpu"]):
            diffs.append(f"GPU {ref_hw['gpu']} vs ours " + (", ".join(ours["gpu"]) or "none"))
    if "cpus" in ref_hw and ours["cpus"] != [ref_hw["cpus"]]:
        diffs.append(f"{ref_hw['cpus']} cores vs ours " + ("/".join(map(str, ours["cpus"])) or "unknown"))
    if "tpu" in ref_hw and str(ref_hw["tpu"]) not in ours["tpu"]:
        diffs.append(f"TPU {ref_hw['tpu']} vs ours " + (", ".join(ours["tpu"]) or "none"))
    return "; ".join(diffs)


def _hw_text(hw: dict[str, Any]) -> str:
    return ", ".join(f"{v} cores" if k == "cpus" else f"{k.upper()} {v}" for k, v in hw.items())


def suite_references(suite: str) -> tuple[References | None, str | None]:
    """(the references of ``suite`` as ``experiments/`` holds it now, None) or (None, why they are not read)."""
    import re

    if not re.match(SUITE_NAME_RE, suite) or paths.find_suite(suite) is None:
        return None, None  # a suite without a file here has no references
    try:
        s = load_suite(suite)
    except UsageError as exc:
        return None, f"references of suite {suite!r} not read: {exc.what}"
    return s.references, None


def add_verdicts(rep: Report, suite: str, hosts: Sequence[dict[str, Any]],
                 located: tuple[Suite | None, str | None] | None = None) -> None:
    """Fill ``rep.verdicts`` from ``suite``'s references against ``rep``'s tables (none: no references);
    ``located``: (the Suite, why it is not read) as testbed.report.declared.locate_suite found it for the run,
    else the suite is looked up by name."""
    if located is not None and (located[0] is not None or located[1] is not None):
        s, why = located
        refs = s.references if s is not None else None
        why = why and why.replace(f"suite {suite!r} not read", f"references of suite {suite!r} not read", 1)
    else:
        refs, why = suite_references(suite)
    if why:
        rep.skip([why])
    if refs is not None:
        rep.verdicts = evaluate(refs, rep.tables, hosts)
