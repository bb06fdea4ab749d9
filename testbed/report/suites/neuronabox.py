"""neuronabox: emulated (emu) vs original (ori) ns/op per collective and size; CNN step times."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from typing import Any

from testbed.report import plotting
from testbed.report.model import Report
from testbed.report.parsers.neuronabox import parse_collective, parse_step_times
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir

_COLL = re.compile(r"(all_?reduce|all_?gather|broadcast|reduce_?scatter)", re.IGNORECASE)
_VARIANT = re.compile(r"(?<![a-z])(emu|ori)(?![a-z])", re.IGNORECASE)


def _name_hint(path: Path, rx: re.Pattern[str]) -> str | None:
    for part in reversed(path.parts):
        if m := rx.search(part):
            return m[1].lower().replace("_", "")
    return None


@reporter("neuronabox", "ddl-emulator", tables=("collectives", "collectives_emu_vs_ori", "cnn_steps",
                                                   "cnn_emu_vs_ori"))
def report(run: RunDir, rep: Report) -> None:
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


def _collectives(rep: Report, rows: list[list[Any]]) -> None:
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
    base = plotting.lines(series, xlabel="elements", ylabel="ns/op", title=title, marker="o")

    def draw(fig: Any) -> None:
        base(fig)
        fig.axes[0].set_xscale("log")
        fig.axes[0].set_yscale("log")

    return draw


def _cnn(run: RunDir, rep: Report) -> None:
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
    rep.figure("cnn_steps", plotting.lines(series, xlabel="step", ylabel="ms per step"), "Step time per rank.")
    by = {v: [r[5] / 1e6 for r in rows if r[2] == v] for v in ("emu", "ori")}
    if by["emu"] and by["ori"]:
        emu, ori = fmean(by["emu"]), fmean(by["ori"])
        rep.table("cnn_emu_vs_ori", ["emu_ms_per_step", "ori_ms_per_step", "emu_over_ori"], [[emu, ori, emu / ori]],
                  "Mean time per iteration, emulated against original (the paper's fidelity measure)")
