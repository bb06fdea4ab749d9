"""tesla (Scalable ViT): per-epoch GPU metrics per configuration, strong and weak scaling across configurations."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from testbed.report import plotting
from testbed.report.model import Report
from testbed.report.parsers.tesla_logs import parse_baseline, parse_vit_log
from testbed.report.parsers.tesla_metrics import MetricRow, RunConfig, config_from_path, parse_metrics
from testbed.report.registry import reporter
from testbed.report.rundir import RunDir
from testbed.textfmt import plural

PANELS = (("gpu_load_pct", "GPU load (%)"), ("gpu_used_mem_mb", "GPU memory used (MB)"),
          ("gpu_temp_c", "GPU temperature (C)"), ("computation_time", "epoch time (s)"))


def label(c: RunConfig) -> str:
    """``<N>gpu_p<fraction>_b<micro>_e<epochs>``."""
    return f"{c.gpus}gpu_p{c.fraction:g}_b{c.micro_batch}_e{c.epochs}"


def _panels(rows: list[MetricRow]) -> Any:
    def draw(fig: Any) -> None:
        for i, (attr, ylabel) in enumerate(PANELS, start=1):
            ax = fig.add_subplot(2, 2, i)
            for rank in sorted({r.rank for r in rows}):
                pts = sorted((r.epoch, getattr(r, attr)) for r in rows if r.rank == rank
                             and getattr(r, attr) is not None)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"rank {rank}")
            ax.set_xlabel("epoch")
            ax.set_ylabel(ylabel, fontsize="small")
            ax.grid(True, alpha=0.3)
        fig.axes[0].legend(fontsize="x-small")

    return draw


@reporter("tesla", "scalable-vit", tables=("metrics", "scaling", "vit_training", "baseline_util",
                                               "baseline_epochs"))
def report(run: RunDir, rep: Report) -> None:
    configs: dict[RunConfig | None, list[MetricRow]] = {}
    for host, path in run.files(r"metrics\.csv"):
        parsed = parse_metrics(path)
        rep.skip([f"{host}: {s}" for s in parsed.skipped])
        configs.setdefault(config_from_path(path), []).extend(parsed.rows)
    rep.heading("Per-epoch GPU metrics")
    all_rows = []
    for cfg, rows in sorted(configs.items(), key=lambda kv: label(kv[0]) if kv[0] else ""):
        name = label(cfg) if cfg else "metrics"
        rows = list({(r.rank, r.epoch, r.gpu_id): r for r in rows}.values())  # one row per rank, epoch, GPU
        configs[cfg] = rows
        all_rows += [[name, cfg.gpus if cfg else None, cfg.fraction if cfg else None, r.rank, r.epoch,
                      r.computation_time, r.gpu_id, r.gpu_name, r.gpu_load_pct, r.gpu_used_mem_mb,
                      r.gpu_free_mem_mb, r.gpu_total_mem_mb, r.gpu_temp_c] for r in rows]
        rep.figure(f"epochs_{name}", _panels(rows), f"{name}: load, memory, temperature and epoch time per rank.",
                   size=(9, 6))
    rep.table("metrics", ["config", "gpus", "fraction", "rank", "epoch", "computation_time_s", "gpu_id", "gpu_name",
                          "gpu_load_pct", "gpu_used_mem_mb", "gpu_free_mem_mb", "gpu_total_mem_mb", "gpu_temp_c"],
              all_rows, "metrics.csv, all configurations")
    scaling(rep, {c: rows for c, rows in configs.items() if c is not None and rows})
    _vit_logs(run, rep)
    _baseline(run, rep)


def scaling(rep: Report, configs: dict[RunConfig, list[MetricRow]]) -> None:
    """Strong: the full data set (p1) on N GPUs. Weak: p = 0.1 x N of the data on N GPUs.

    One series per micro-batch and epoch count, as the artifact's result/ plots (micro-batch 16 in
    strong_scaling_plot.png and weak_scaling_plot.png, 32 in strong_scaling_fp16.png): a point is never compared
    with another micro-batch's. Speedup = t(1 GPU) / t(N); efficiency = ideal / t(N), ideal = t(1) / N (strong) or
    t(1) (weak), t(1) of the same series.
    """
    epoch_s = {c: fmean(r.computation_time for r in rows) for c, rows in configs.items()}
    series: dict[tuple[str, int, int], list[tuple[int, float, float]]] = {}
    for c, t in sorted(epoch_s.items(), key=lambda kv: (kv[0].micro_batch, kv[0].epochs, kv[0].gpus)):
        if c.fraction == 1:
            series.setdefault(("strong", c.micro_batch, c.epochs), []).append((c.gpus, c.fraction, t))
        if abs(c.fraction - 0.1 * c.gpus) < 1e-9:
            series.setdefault(("weak", c.micro_batch, c.epochs), []).append((c.gpus, c.fraction, t))
    if not series:
        return
    rep.heading("Scaling")
    rows = []
    for (kind, micro, epochs), pts in sorted(series.items()):
        base = next((t for n, _, t in pts if n == 1), None)
        for n, frac, t in pts:
            ideal = base / n if kind == "strong" and base else base
            rows.append([kind, micro, epochs, n, frac, t, base / t if base else None, (ideal / t) if ideal else None])
    rep.table("scaling", ["kind", "micro_batch", "epochs", "gpus", "fraction", "mean_epoch_s", "speedup_vs_1",
                          "efficiency"], rows,
              "mean epoch time over ranks and epochs; strong: p1 on N GPUs; weak: p0.1xN on N GPUs; one series per "
              "micro-batch and epoch count, its speedup against its own 1-GPU point")
    for kind in ("strong", "weak"):
        lines = {f"micro-batch {micro}" + (f", {plural(epochs, 'epoch')}" if len({k[2] for k in series}) > 1 else ""):
                 ([p[0] for p in pts], [p[2] for p in pts])
                 for (k, micro, epochs), pts in sorted(series.items()) if k == kind}
        if lines:
            rep.figure(f"{kind}_scaling", plotting.lines(lines, xlabel="GPUs", ylabel="mean epoch time (s)",
                                                         marker="o", title=f"{kind} scaling"),
                       f"{kind.capitalize()} scaling: mean epoch time against GPU count, one line per micro-batch.")


def _vit_logs(run: RunDir, rep: Report) -> None:
    rows = []
    for _, path in run.files(r"vit_training_rank_\d+\.log"):
        cfg = config_from_path(path)
        parsed = parse_vit_log(path)
        rep.skip(parsed.skipped)
        rows += [[label(cfg) if cfg else "", e.rank, e.epoch, e.loss, e.accuracy, e.seconds] for e in parsed.rows]
    if rows:
        rep.heading("Training log")
        rep.table("vit_training", ["config", "rank", "epoch", "loss", "accuracy", "seconds"], rows)


def _baseline(run: RunDir, rep: Report) -> None:
    for _, path in run.files(r"metrics\.txt|baseline_measure_output\.txt"):
        log = parse_baseline(path)
        rep.skip(log.skipped)
        rep.heading(f"Baseline measure ({path.name})")
        rep.table("baseline_util", ["ts", "rank", "gpu", "cpu_pct", "mem_pct", "gpu_pct", "gpu_mem_mb"],
                  [[s.ts, s.rank, s.gpu, s.cpu_pct, s.mem_pct, s.gpu_pct, s.gpu_mem_mb] for s in log.samples])
        rep.table("baseline_epochs", ["rank", "epoch", "seconds"], [[e.rank, e.epoch, e.seconds] for e in log.epochs])
