"""datastall-emulator: Figures 3, 4(a), 4(b), 5 and 6 of the data-stall paper from the emulator's outputs."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.report import plotting
from testbed.report.datastall_math import (
    KNOWN_MODELS,
    SHEET_IMAGES_PER_EPOCH,
    classify,
    fetch_stall_fraction,
    fig4a,
    images_per_second,
    point_key,
    prep_stall_pct,
    split_fig4,
)
from testbed.report.model import Report
from testbed.report.parsers.datastall_batches import parse_batch_csv
from testbed.report.parsers.datastall_output import EmulatorOutput, Totals, parse_emulator_output
from testbed.report.parsers.datastall_profile import parse_profile
from testbed.report.parsers.vmtouch import parse_vmtouch
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir
from testbed.textfmt import plural

FIG4_EPOCH = 2


Found = tuple[str, object, Path, EmulatorOutput]
"""(figure, point key, path, parsed output): the point key is the model, the limit in GB or (model, workers)."""
Outputs = dict[str, dict[object, tuple[Path, EmulatorOutput]]]


def load_outputs(run: RunDir, rep: Report) -> list[Found]:
    """Every ``output*.txt`` of the run that feeds a figure, parsed; what a parser skipped goes to ``rep``."""
    models = KNOWN_MODELS + tuple(str(m) for m in run.params.get("models", []) if isinstance(m, str))
    if isinstance(run.params.get("model"), str):
        models += (str(run.params["model"]),)
    found: list[Found] = []
    for _, path in run.files(r"output.*\.txt"):
        kind = classify(path.name, path.parent.name, models)
        if kind is None:
            continue
        parsed = parse_emulator_output(path)
        rep.skip([f"{run.rel(path)}: {s.split(': ', 1)[-1]}" if s.startswith(path.name) else s
                  for s in parsed.skipped])
        found.append((kind.figure, point_key(kind), path, parsed))
    return found


def empty_outputs() -> Outputs:
    return {"3": {}, "3-100": {}, "4": {}, "5": {}, "6": {}}


@reporter("datastall-emulator", "datastall", tables=(
    "fig3_fetch_stall", "fig4a_breakdown", "fig4b_breakdown", "fig5_throughput", "fig6_prep_stall", "profile",
    "profiled_batches"))
def report(run: RunDir, rep: Report) -> None:
    outs = empty_outputs()
    for figure, key, path, parsed in load_outputs(run, rep):
        outs[figure][key] = (path, parsed)
    figures(rep, outs, load_cache(run), run.params.get("images_per_epoch"))
    _inputs(run, rep)


def figures(rep: Report, outs: Outputs, cache: dict[str, float], images_param: object) -> None:
    """Figures 3, 4(a), 4(b), 5 and 6 from the outputs found (one run's, or a campaign's)."""
    _fig3(rep, outs["3"], outs["3-100"], cache)
    _fig4(rep, outs["4"], cache)
    _fig5(rep, outs["5"], images_param)
    _fig6(rep, outs["6"])


def load_cache(run: RunDir) -> dict[str, float]:
    """vmtouch residency (percent) by the part of ``cache_result<part>.txt`` after ``cache_result``."""
    found = {}
    for _, path in run.files(r"cache_result.*\.txt"):
        res = parse_vmtouch(path)
        if res is not None:
            found[path.stem.removeprefix("cache_result")] = res.percent
    return found


def _final(rep: Report, label: str, out: EmulatorOutput) -> Totals | None:
    if out.final is None:
        rep.skip([f"{label}: no complete epoch; left out"])
    return out.final


def _fig3(rep: Report, at35: dict, at100: dict, cache: dict[str, float]) -> None:
    if not at35 and not at100:
        return
    rep.heading("Figure 3: fetch stall by model (about 35% cached)")
    rows = []
    for model in sorted(set(at35) | set(at100)):
        a = _final(rep, f"output{model}.txt", at35[model][1]) if model in at35 else None
        b = _final(rep, f"output_100{model}.txt", at100[model][1]) if model in at100 else None
        frac = fetch_stall_fraction(a, b) if a and b else None
        if frac is None:
            rep.skip([f"figure 3: {model} lacks output{model}.txt or output_100{model}.txt; no fraction"])
        rows.append([model, a.data if a else None, a.cpu2gpu if a else None, a.gpu if a else None,
                     b.data if b else None, frac, cache.get(model)])
    rep.table("fig3_fetch_stall", ["model", "data_35", "cpu2gpu_35", "gpu_35", "data_100", "fetch_stall_fraction",
                                   "cached_pct"], rows,
              "fetch stall = (data_35 - data_100) / (data_35 + cpu2gpu_35 + gpu_35), final epoch totals")
    done = [r for r in rows if r[5] is not None]
    if done:
        rep.figure("fig3_fetch_stall", plotting.bars([r[0] for r in done], {"fetch stall": [r[5] for r in done]},
                                                     ylabel="fraction of epoch time"),
                   "Figure 3: fraction of epoch time stalled on fetching data, per model.")


def _fig4(rep: Report, by_limit: dict, cache: dict[str, float]) -> None:
    if not by_limit:
        return
    epoch2: dict[float, Totals] = {}
    for limit, (path, out) in sorted(by_limit.items()):
        t = out.epoch_totals(FIG4_EPOCH)
        if t is None:
            rep.skip([f"figure 4: {path.name} has no complete epoch {FIG4_EPOCH} "
                      f"({plural(len(out.epochs), 'epoch')} found); limit {limit:g}g left out"])
        else:
            epoch2[limit] = t
    ssd, hdd = split_fig4(list(by_limit))
    for part, disk, limits in (("a", "SSD", ssd), ("b", "HDD", hdd)):
        if limits:
            _fig4_part(rep, part, disk, {lim: epoch2[lim] for lim in limits if lim in epoch2}, cache)


def _fig4_part(rep: Report, part: str, disk: str, epoch2: dict[float, Totals], cache: dict[str, float]) -> None:
    rep.heading(f"Figure 4({part}): stall breakdown by memory limit, {disk} run (epoch {FIG4_EPOCH})")
    rows = fig4a(epoch2)
    which = ("figure4.sh's limits (6g..16g), as the artifact's parser.py and grapher_a.py take them" if part == "a"
             else "the limits outside figure4.sh's 6g..16g: the artifact's outputsfig4 holds its HDD run (4g, "
                  "18g..24g) beside the SSD run")
    rep.text(f"Limits: {which}. Epoch {FIG4_EPOCH} totals are the last cumulative line of epoch {FIG4_EPOCH}; an "
             "epoch starts where the batch index restarts. fetch = data(limit) - data(largest limit of this run)"
             + (f", here {max(epoch2):g}g." if epoch2 else "."))
    if part == "b":
        rep.text("The artifact's time4(b).dat (14g..24g, 43.4% to 100% cached, 64.5 s of compute) comes from an HDD "
                 "run whose outputs are not committed; it cannot be checked against outputsfig4.")
    name = f"fig4{part}_breakdown"
    rep.table(name, ["limit_gb", "cached_pct", "fetch_s", "transfer_s", "compute_s"],
              [[r.limit_gb, cache.get(f"{r.limit_gb:g}g"), r.fetch, r.transfer, r.compute] for r in rows])
    if rows:
        rep.figure(name, plotting.bars(
            [f"{r.limit_gb:g}g" for r in rows],
            {"fetch": [r.fetch for r in rows], "transfer": [r.transfer for r in rows],
             "compute": [r.compute for r in rows]}, ylabel=f"seconds (epoch {FIG4_EPOCH})", stacked=True),
            f"Figure 4({part}): fetch, transfer and compute time per memory limit, {disk} run.")


def _fig5(rep: Report, by_mw: dict, images_param: object) -> None:
    if not by_mw:
        return
    rep.heading("Figure 5: throughput by number of workers (fully cached)")
    rows = []
    for (model, workers), (path, out) in sorted(by_mw.items()):
        ep, t = out.final_epoch, out.final
        if ep is None or t is None:
            rep.skip([f"figure 5: {path.name} has no complete epoch; left out"])
            continue
        images = float(images_param) if isinstance(images_param, int | float) else ep.batches * (out.batch_size or 0)
        rows.append([model, workers, ep.batches, out.batch_size, images, t.total,
                     images_per_second(t, images) if images else None,
                     images_per_second(t, SHEET_IMAGES_PER_EPOCH)])
    rep.text("images/s = images / (data + cpu2gpu + gpu) of the final epoch; images = batches x batch size "
             "(or the suite's images_per_epoch). artifact_images_per_s is what the artifact's time5.dat plots: "
             f"{SHEET_IMAGES_PER_EPOCH:,} / epoch time, a constant that is not the epoch's image count "
             "(its sheet's error: an epoch here reads 342 batches of 256); same curves, another scale.")
    rep.table("fig5_throughput", ["model", "workers", "batches", "batch_size", "images", "epoch_s",
                                  "images_per_s", "artifact_images_per_s"], rows)
    series = {}
    for model in sorted({r[0] for r in rows}):
        pts = [(r[1], r[6]) for r in rows if r[0] == model and r[6] is not None]
        series[model] = ([p[0] for p in pts], [p[1] for p in pts])
    if series:
        rep.figure("fig5_throughput", plotting.lines(series, xlabel="data-loading workers", ylabel="images/s",
                                                     marker="o"), "Figure 5: images per second against workers.")


def _fig6(rep: Report, by_model: dict) -> None:
    if not by_model:
        return
    rep.heading("Figure 6: prep stall (fully cached)")
    rows = []
    for model, (path, out) in sorted(by_model.items()):
        t = out.final
        if t is None:
            rep.skip([f"figure 6: {path.name} has no complete epoch; left out"])
            continue
        rows.append([model, t.data, t.cpu2gpu, t.gpu, prep_stall_pct(t)])
    rep.table("fig6_prep_stall", ["model", "data_s", "cpu2gpu_s", "gpu_s", "prep_stall_pct"], rows,
              "prep stall % = 100 x data / (data + cpu2gpu + gpu)")
    rep.text("The artifact's time6.dat (76.60, 33.69, 46.59, 2.01) does not follow from its committed "
             "outputsfig6 totals by this or any simple ratio of them; its grapher's title says 8 workers where "
             "figure6.sh runs 24, so the sheet came from another run and cannot be checked here.")
    if rows:
        rep.figure("fig6_prep_stall", plotting.bars([r[0] for r in rows], {"prep stall": [r[4] for r in rows]},
                                                    ylabel="% of epoch time"), "Figure 6: prep stall per model.")


def _inputs(run: RunDir, rep: Report) -> None:
    for _, path in run.files(r"profile\.csv"):
        parsed = parse_profile(path)
        rep.skip(parsed.skipped)
        rep.table("profile", ["gpu_type", "model", "batch_size", "cpu2gpu_time", "gpu_compute_time"],
                  [[r.gpu_type, r.model, r.batch_size, r.cpu2gpu_time, r.gpu_compute_time] for r in parsed.rows],
                  "GPU profile (profile.csv)")
    rows = []
    for _, path in run.files(r".+-batch\d+\.csv"):
        m = re.fullmatch(r"(.+)-batch(\d+)", path.stem)
        timings = parse_batch_csv(path)
        rep.skip(timings.skipped)
        rows += [[path.parent.name, m[1] if m else path.stem, int(m[2]) if m else None, i, r.data_stall_time,
                  r.cpu2gpu_time, r.gpu_time] for i, r in enumerate(timings.rows)]
    if rows:
        rep.heading("Profiled batches")
        rep.table("profiled_batches", ["gpu_type", "model", "batch_size", "row", "data_stall_time", "cpu2gpu_time",
                                       "gpu_time"], rows)
