"""tesla across runs: strong and weak scaling from every training run of a campaign, missing points named."""

from __future__ import annotations

from statistics import fmean

from testbed.report.model import Report
from testbed.report.parsers.tesla_metrics import MetricRow, RunConfig, config_from_path, parse_metrics
from testbed.report.registry import campaign_reporter
from testbed.report.rundir import Campaign
from testbed.report.suites.tesla import label, scaling

GPU_COUNTS = (1, 2, 3, 4, 5)  # the artifact's five hosts; its result/ plots cover 1-5 GPUs
WEAK_STEP = 0.1  # weak scaling: 10% of the data per GPU (the p0.1 ... p0.5 folders)


def params_config(params: dict[str, object]) -> RunConfig | None:
    """The log folder a training run writes, from its parameters (None for the other tasks)."""
    if str(params.get("task", "train")) != "train":
        return None
    try:
        return RunConfig(int(str(params.get("gpus", 5))), float(str(params.get("dataset_percentage", 1.0))),
                         int(str(params.get("micro_batch", 16))), int(str(params.get("epochs", 10))))
    except ValueError:
        return None


@campaign_reporter("tesla", "scalable-vit", tables=(
    "metrics", "scaling", "vit_training", "baseline_util", "baseline_epochs", "configs", "missing_points"))
def campaign(camp: Campaign, rep: Report) -> None:
    configs: dict[RunConfig, list[MetricRow]] = {}
    origin: dict[RunConfig, tuple[bool, str]] = {}
    launched: dict[RunConfig, list[str]] = {}
    for run in camp.runs:
        own = params_config(run.params)
        if own is not None:
            launched.setdefault(own, []).append(run.run_id)
        found: dict[RunConfig, list[MetricRow]] = {}
        for host, path in run.files(r"metrics\.csv"):
            cfg = config_from_path(path)
            if cfg is None:
                rep.skip([f"{camp.rel(path)}: not under log/<N>_GPUs/p<fraction>_b<micro>_e<epochs>/; left out"])
                continue
            parsed = parse_metrics(path)
            rep.skip([f"{run.run_id}/{host}: {s}" for s in parsed.skipped])
            found.setdefault(cfg, []).extend(parsed.rows)
        for cfg, rows in found.items():
            is_own = cfg == own
            prev = origin.get(cfg)
            if prev is not None and prev[0] and not is_own:
                continue
            configs[cfg] = list({(r.rank, r.epoch, r.gpu_id): r for r in rows}.values())
            origin[cfg] = (is_own, run.run_id)
    rep.heading("Configurations")
    rep.table("configs", ["config", "gpus", "fraction", "micro_batch", "epochs", "run", "ranks", "epochs_logged",
                          "mean_epoch_s"],
              [[label(c), c.gpus, c.fraction, c.micro_batch, c.epochs, origin[c][1], len({r.rank for r in rows}),
                len({r.epoch for r in rows}), fmean(r.computation_time for r in rows) if rows else None]
               for c, rows in sorted(configs.items(), key=lambda kv: (kv[0].fraction, kv[0].gpus))],
              "mean epoch time over ranks and epochs (Computation_Time of metrics.csv)")
    groups: dict[tuple[int, int], dict[RunConfig, list[MetricRow]]] = {}
    for c, rows in configs.items():
        if rows:
            groups.setdefault((c.micro_batch, c.epochs), {})[c] = rows
    if groups:
        main = max(groups, key=lambda g: len(groups[g]))
        if len(groups) > 1:
            rep.text(f"Scaling has one series per micro-batch and epoch count; missing points are those of the "
                     f"micro-batch {main[0]}, {main[1]}-epoch series (the one with the most runs).")
        scaling(rep, {c: rows for c, rows in configs.items() if rows})
        _missing(rep, groups[main], launched, main)
    else:
        rep.text("No metrics.csv under log/<N>_GPUs/p<fraction>_b<micro>_e<epochs>/ in these runs.")


def _missing(rep: Report, have: dict[RunConfig, list[MetricRow]], launched: dict[RunConfig, list[str]],
             setting: tuple[int, int]) -> None:
    counts = sorted(set(GPU_COUNTS) | {c.gpus for c in have} | {c.gpus for c in launched})
    rows = []
    for kind in ("strong", "weak"):
        for n in counts:
            frac = 1.0 if kind == "strong" else round(WEAK_STEP * n, 6)
            cfg = RunConfig(n, frac, *setting)
            if not any(c.gpus == n and abs(c.fraction - frac) < 1e-9 for c in have):
                runs = launched.get(cfg, [])
                rows.append([kind, n, frac, f"no metrics.csv from run {', '.join(runs)}" if runs else "no run"])
    rep.heading("Missing points")
    rep.table("missing_points", ["kind", "gpus", "fraction", "problem"], rows,
              "strong: the full data set on 1-5 GPUs; weak: 10% of the data per GPU")
    rep.check("every scaling point is present", not rows,
              f"{len(rows)} missing: " + "; ".join(f"{r[0]} {r[1]} GPU(s) p{r[2]:g}" for r in rows)
              if rows else "strong and weak scaling complete")
