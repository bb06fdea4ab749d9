"""datastall-emulator across runs: Figures 3-6 from every run of a campaign, with the points still missing."""

from __future__ import annotations

from testbed.report.datastall_math import (
    FIG3_MODELS,
    FIG4_LIMITS_GB,
    FIG5_MODELS,
    FIG5_WORKERS,
    FIG6_MODELS,
    params_point,
)
from testbed.report.model import Report
from testbed.report.registry import campaign_reporter
from testbed.report.rundir import Campaign
from testbed.report.suites.datastall import FIG4_EPOCH, Outputs, empty_outputs, figures, load_cache, load_outputs

FIGURE_OF = {"3": "3", "3-100": "3", "4": "4(a)", "5": "5", "6": "6"}


def _own_cache_key(params: dict[str, object]) -> str | None:
    fig, model, limit = params.get("figure"), params.get("model"), params.get("mem_limit")
    return {"3": f"{model}", "3-100": f"_100{model}", "4": f"{limit}"}.get(str(fig))


@campaign_reporter("datastall-emulator", "datastall", tables=(
    "fig3_fetch_stall", "fig4a_breakdown", "fig4b_breakdown", "fig5_throughput", "fig6_prep_stall", "profile",
    "profiled_batches", "missing_points"))
def campaign(camp: Campaign, rep: Report) -> None:
    outs = empty_outputs()
    origin: dict[tuple[str, object], tuple[bool, str]] = {}
    launched: dict[tuple[str, object], list[str]] = {}
    cache: dict[str, float] = {}
    own_cache: dict[str, float] = {}
    for run in camp.runs:  # oldest first: a later run of the same point replaces an earlier one
        own = params_point(run.params)
        if own is not None:
            launched.setdefault(own, []).append(run.run_id)
        for fig, key, path, parsed in load_outputs(run, rep):
            is_own = own == (fig, key)
            prev = origin.get((fig, key))
            if prev is not None and prev[0] and not is_own:
                continue  # a copy of another run's output collected with this run: the owner's copy wins
            if prev is not None and prev[0] and is_own:
                rep.skip([f"figure {_figure(fig, key)} {_point(fig, key)}: run {run.run_id} replaces run {prev[1]}"])
            outs[fig][key] = (path, parsed)
            origin[(fig, key)] = (is_own, run.run_id)
        found = load_cache(run)
        cache.update(found)
        ck = _own_cache_key(run.params)
        if ck is not None and ck in found:
            own_cache[ck] = found[ck]
    figures(rep, outs, {**cache, **own_cache}, None)
    missing(rep, outs, launched)


def _figure(fig: str, key: object) -> str:
    """The paper's figure of a point: a figure-4 limit outside figure4.sh's is the HDD run's, 4(b)."""
    if fig == "4" and isinstance(key, float) and key not in FIG4_LIMITS_GB:
        return "4(b)"
    return FIGURE_OF[fig]


def _point(fig: str, key: object) -> str:
    if fig == "4" and isinstance(key, float):
        return f"{key:g}g"
    if fig == "5" and isinstance(key, tuple):
        return f"{key[0]}, {key[1]} workers"
    return str(key)


def missing(rep: Report, outs: Outputs, launched: dict[tuple[str, object], list[str]]) -> None:
    """Which points of each figure the campaign lacks (or has only incomplete), against the artifact's scripts."""
    expected: dict[str, set[object]] = {"3": set(FIG3_MODELS), "3-100": set(FIG3_MODELS), "4": set(FIG4_LIMITS_GB),
                                        "5": {(m, w) for m in FIG5_MODELS for w in FIG5_WORKERS},
                                        "6": set(FIG6_MODELS)}
    for (fig, key) in launched:
        expected[fig].add(key)
    for fig in expected:
        expected[fig] |= set(outs[fig])
    expected["3"] |= set(outs["3-100"])
    expected["3-100"] |= set(outs["3"])
    present = {FIGURE_OF[f] for f in outs if outs[f]} | {FIGURE_OF[f] for f, _ in launched}
    rows = []
    for fig in ("3", "3-100", "4", "5", "6"):
        if FIGURE_OF[fig] not in present:
            continue
        for key in sorted(expected[fig], key=str):
            runs = launched.get((fig, key), [])
            if key not in outs[fig]:
                why = f"no output from run {', '.join(runs)}" if runs else "no run"
            else:
                path, out = outs[fig][key]
                done = out.epoch_totals(FIG4_EPOCH) if fig == "4" else out.final
                if done is not None:
                    continue
                why = f"{path.name}: no complete epoch{f' {FIG4_EPOCH}' if fig == '4' else ''}" + (
                    f" ({out.interrupted})" if out.interrupted else "")
            rows.append([_figure(fig, key), fig, _point(fig, key), why])
    rep.heading("Missing points")
    absent = sorted({FIGURE_OF[f] for f in outs} - present)
    if absent:
        rep.text(f"No run of figure(s) {', '.join(absent)} in these runs.")
    rep.text("Expected points: those of the artifact's figure scripts (figure3.sh, figure3_100.sh, figure4.sh, "
             "figure5.sh, figure6.sh) and every point a run was launched for. Figure 3 needs both the ~35% cached "
             "run (3) and the fully cached run (3-100) of a model; figure 4(a) needs epoch 2 of every limit.")
    rep.table("missing_points", ["figure", "series", "point", "problem"], rows)
    if present:
        rep.check("every point of the figures run is present", not rows,
                  f"{len(rows)} missing: " + "; ".join(f"{r[1]} {r[2]}" for r in rows[:6])
                  + (" ..." if len(rows) > 6 else "") if rows else f"figure(s) {', '.join(sorted(present))} complete")
