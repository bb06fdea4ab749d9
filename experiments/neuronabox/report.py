"""neuronabox's report: emulated (emu) vs original (ori) ns/op per collective and size; CNN step times.

Loaded by testbed from this folder (testbed.results, API 3) whenever it reports a run of this suite. The
artifact's outputs: collective benchmarks (ns/op per size) and CNN ``results<rank>.txt`` step times."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from testbed import results

results.require(3)

_SIZE = re.compile(r"size = (\d+), loop = (\d+)")
_AVG = re.compile(r"\[rk(\d+)\] average time for (\w+): ([\d.eE+-]+)")
_BYPASS = re.compile(r"MOD_KERNEL_BYPASS = (\d+)")
_HOST = re.compile(r"myrank (\d+) nranks (\d+) hostname (\S+)")
_STEP = re.compile(r"^(\d+) Epoch (\d+) Step (\d+) Time (\d+)\s*$")


@dataclass(frozen=True)
class CollRow:
    size: int | None
    loop: int | None
    rank: int
    metric: str
    ns_per_op: float
    bypass: bool | None


def parse_collective(src: Path | str) -> results.Parsed[CollRow]:
    """One row per ``[rkN] average time`` line, with the latest ``size = , loop =`` seen.

    Both ranks print into the one mpirun output, interleaved, so a ``MOD_KERNEL_BYPASS = `` line says nothing
    about the next row's rank: eval/coll/*.cu set MOD_KERNEL_BYPASS=1 on rank 0 (the emulated node) and 0 on the
    others, so a row's bypass is its rank's. The printed values are kept in ``meta["bypass_printed"]``.
    """
    text, _ = results.load_text(src)
    out: results.Parsed[CollRow] = results.Parsed()
    size = loop = None
    for line in text.splitlines():
        if m := _SIZE.search(line):
            size, loop = int(m[1]), int(m[2])
        elif m := _BYPASS.search(line):
            out.meta.setdefault("bypass_printed", []).append(m[1] == "1")
        elif m := _HOST.search(line):
            out.meta.setdefault("hosts", {})[int(m[1])] = m[3]
        elif m := _AVG.search(line):
            out.rows.append(CollRow(size, loop, int(m[1]), m[2], float(m[3]), int(m[1]) == 0))
    return out


@dataclass(frozen=True)
class StepTime:
    index: int
    epoch: int
    step: int
    ns: int


def parse_step_times(src: Path | str) -> results.Parsed[StepTime]:
    """``<i> Epoch <e> Step <s> Time <ns>`` lines; a cut-off last line is skipped and noted."""
    text, label = results.load_text(src)
    out: results.Parsed[StepTime] = results.Parsed()
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _STEP.match(line.strip()):
            out.rows.append(StepTime(int(m[1]), int(m[2]), int(m[3]), int(m[4])))
        elif line.strip():
            notes.append(results.skip_note(label, lineno, line))
    out.skipped = results.summarise_skips(label, notes)
    return out


_COLL = re.compile(r"(all_?reduce|all_?gather|broadcast|reduce_?scatter)", re.IGNORECASE)
_VARIANT = re.compile(r"(?<![a-z])(emu|ori)(?![a-z])", re.IGNORECASE)


def _name_hint(path: Path, rx: re.Pattern[str]) -> str | None:
    for part in reversed(path.parts):
        if m := rx.search(part):
            return m[1].lower().replace("_", "")
    return None


@results.reporter(tables=["collectives", "collectives_emu_vs_ori", "cnn_steps", "cnn_emu_vs_ori"])
def report(run: results.RunDir, rep: results.Report) -> None:
    rows: list[list[Any]] = []
    for host, path in run.files(r".*\.(out|log|txt)"):
        if re.fullmatch(r"results\d+\.txt", path.name):
            continue
        parsed = parse_collective(path)
        rel = path.relative_to(run.path)
        coll = _name_hint(rel, _COLL) or str(run.params.get("collective", "collective")).replace("_", "").lower()
        for r in parsed.rows:
            variant = _name_hint(rel, _VARIANT) or run.params.get("variant") or ("emu" if r.bypass else "ori")
            rows.append([coll, str(variant), r.size, r.loop, host, r.ns_per_op])
    if rows:
        _collectives(rep, rows)
    _cnn(run, rep)


def _collectives(rep: results.Report, rows: list[list[Any]]) -> None:
    rep.heading("Collectives: emu vs ori")
    rep.table("collectives", ["collective", "variant", "size", "loop", "host", "ns_per_op"], rows)
    pivot = []
    for coll in sorted({r[0] for r in rows}):
        for size in sorted({r[2] for r in rows if r[0] == coll}, key=lambda s: s or 0):
            by = {v: fmean(r[5] for r in rows if r[0] == coll and r[2] == size and r[1] == v)
                  for v in {r[1] for r in rows if r[0] == coll and r[2] == size}}
            emu, ori = by.get("emu"), by.get("ori")
            pivot.append([coll, size, emu, ori, emu / ori if emu and ori else None])
        series = {}
        for v in ("emu", "ori"):
            pts = sorted((r[2], r[5]) for r in rows if r[0] == coll and r[1] == v and r[2] is not None)
            if pts:
                series[v] = ([p[0] for p in pts], [p[1] for p in pts])
        if series:
            rep.figure(f"coll_{coll}", _log_lines(series, coll), f"{coll}: ns/op against message size.")
    rep.table("collectives_emu_vs_ori", ["collective", "size", "emu_ns_per_op", "ori_ns_per_op", "emu_over_ori"],
              pivot, "Mean ns/op per size")


def _log_lines(series: dict, title: str) -> Callable[[Any], None]:
    base = results.plotting.lines(series, xlabel="elements", ylabel="ns/op", title=title, marker="o")

    def draw(fig: Any) -> None:
        base(fig)
        fig.axes[0].set_xscale("log")
        fig.axes[0].set_yscale("log")

    return draw


def _cnn(run: results.RunDir, rep: results.Report) -> None:
    rows: list[list[Any]] = []
    for host, path in run.files(r"results\d+\.txt"):
        parsed = parse_step_times(path)
        rep.skip(parsed.skipped)
        rank = int(re.sub(r"\D", "", path.stem))
        variant = _name_hint(path.relative_to(run.path), _VARIANT) or run.params.get("variant") or ""
        rows += [[host, rank, variant, s.epoch, s.step, s.ns] for s in parsed.rows]
    if not rows:
        return
    rep.heading("CNN step times")
    rep.table("cnn_steps", ["host", "rank", "variant", "epoch", "step", "ns"], rows)
    series = {}
    for key in sorted({(r[1], r[2]) for r in rows}):
        pts = [(r[4], r[5] / 1e6) for r in rows if (r[1], r[2]) == key]
        series[f"rank {key[0]} {key[1]}".strip()] = ([p[0] for p in pts], [p[1] for p in pts])
    rep.figure("cnn_steps", results.plotting.lines(series, xlabel="step", ylabel="ms per step"), "Step time per rank.")
    by = {v: [r[5] / 1e6 for r in rows if r[2] == v] for v in ("emu", "ori")}
    if by["emu"] and by["ori"]:
        emu, ori = fmean(by["emu"]), fmean(by["ori"])
        rep.table("cnn_emu_vs_ori", ["emu_ms_per_step", "ori_ms_per_step", "emu_over_ori"], [[emu, ori, emu / ori]],
                  "Mean time per iteration, emulated against original (the paper's fidelity measure)")
