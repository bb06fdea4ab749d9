"""tesla's report: per-epoch GPU metrics per configuration, strong and weak scaling across configurations; and,
across a campaign's runs, strong and weak scaling from every training run, missing points named.

Loaded by testbed from this folder (testbed.results, API 3: reporter and campaign_reporter) whenever it reports a
run or a campaign of this suite. The artifact's files: ``metrics.csv`` (header read by name; ``GPU_Load`` like
``80.0%``) under ``log/<N>_GPU[s]/p<fraction>_b<micro>_e<epochs>/``, the text logs ``vit_training_rank_<r>.log``
and baseline_measure's ``metrics.txt``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from testbed import results

results.require(3)


# --- parsers: metrics.csv, training and baseline logs -------------------------------------------------------------
HEADER = ("Timestamp", "Rank", "Epoch", "Computation_Time", "GPU_ID", "GPU_Name", "GPU_Load",
          "GPU_Free_Mem_MB", "GPU_Used_Mem_MB", "GPU_Total_Mem_MB", "GPU_Temp_C")
_CONFIG = re.compile(r"(\d+)_GPUs?/p([\d.]+)_b(\d+)_e(\d+)")


@dataclass(frozen=True)
class MetricRow:
    timestamp: str
    rank: int
    epoch: int
    computation_time: float
    gpu_id: int
    gpu_name: str
    gpu_load_pct: float | None
    gpu_free_mem_mb: float | None
    gpu_used_mem_mb: float | None
    gpu_total_mem_mb: float | None
    gpu_temp_c: float | None


def _row(d: dict[str, str]) -> MetricRow:
    num = results.to_float
    return MetricRow(d["Timestamp"], int(d["Rank"]), int(d["Epoch"]), float(d["Computation_Time"]),
                     int(float(d["GPU_ID"])), d["GPU_Name"], num(d["GPU_Load"]), num(d["GPU_Free_Mem_MB"]),
                     num(d["GPU_Used_Mem_MB"]), num(d["GPU_Total_Mem_MB"]), num(d["GPU_Temp_C"]))


def parse_metrics(src: Path | str) -> results.Parsed[MetricRow]:
    rows, notes = results.csv_rows(src, HEADER, _row)
    return results.Parsed(rows, notes)


@dataclass(frozen=True)
class RunConfig:
    """From ``log/<N>_GPU[s]/p<pct>_b<micro>_e<epochs>/``."""

    gpus: int
    fraction: float
    micro_batch: int
    epochs: int


def config_from_path(path: Path | str) -> RunConfig | None:
    m = _CONFIG.search(Path(path).as_posix())
    return RunConfig(int(m[1]), float(m[2]), int(m[3]), int(m[4])) if m else None


_VIT_METRIC = re.compile(r"Rank (\d+) - \w+ - Epoch \[(\d+)/(\d+)\] - Loss: ([\d.eE+-]+|nan), Accuracy: ([\d.eE+-]+)")
_VIT_TIME = re.compile(r"Rank (\d+) - \w+ - Epoch \[(\d+)/(\d+)\] completed in ([\d.eE+-]+) seconds")
_BASE_UTIL = re.compile(r"^(.*?) \| Rank (\d+) \| Local GPU (\d+) \| CPU: ([\d.]+)%, Mem: ([\d.]+)%, "
                        r"GPU: ([\d.]+)%, GPU Mem: ([\d.]+) MB")
_BASE_TIME = re.compile(r"^(.*?) \| Rank (\d+) \| Epoch (\d+) \| Computation Time: ([\d.eE+-]+) seconds")
_BASE_EPOCH = re.compile(r"^Rank (\d+): Epoch (\d+)/(\d+) complete in ([\d.eE+-]+) seconds")
_BASE_NOISE = re.compile(r"^(NCCL Debugging|Rank \d+: Starting Epoch)")


@dataclass
class VitEpoch:
    rank: int
    epoch: int
    loss: float | None = None
    accuracy: float | None = None
    seconds: float | None = None


def parse_vit_log(src: Path | str) -> results.Parsed[VitEpoch]:
    """One row per (rank, epoch): loss, accuracy and the epoch's wall time, merged from two lines."""
    text, label = results.load_text(src)
    rows: dict[tuple[int, int], VitEpoch] = {}
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _VIT_METRIC.search(line):
            ep = rows.setdefault((int(m[1]), int(m[2])), VitEpoch(int(m[1]), int(m[2])))
            ep.loss, ep.accuracy = float(m[4]), float(m[5])
        elif m := _VIT_TIME.search(line):
            ep = rows.setdefault((int(m[1]), int(m[2])), VitEpoch(int(m[1]), int(m[2])))
            ep.seconds = float(m[4])
        elif line.strip():
            notes.append(results.skip_note(label, lineno, line))
    return results.Parsed(sorted(rows.values(), key=lambda e: (e.rank, e.epoch)), results.summarise_skips(label, notes))


@dataclass(frozen=True)
class BaselineSample:
    ts: str
    rank: int
    gpu: int
    cpu_pct: float
    mem_pct: float
    gpu_pct: float
    gpu_mem_mb: float


@dataclass(frozen=True)
class BaselineEpoch:
    rank: int
    epoch: int
    seconds: float


@dataclass
class BaselineLog:
    samples: list[BaselineSample] = field(default_factory=list)
    epochs: list[BaselineEpoch] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def parse_baseline(src: Path | str) -> BaselineLog:
    """Utilisation samples and per-epoch computation times of baseline_measure.py."""
    text, label = results.load_text(src)
    out = BaselineLog()
    notes = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if m := _BASE_UTIL.match(s):
            out.samples.append(BaselineSample(m[1], int(m[2]), int(m[3]), float(m[4]), float(m[5]), float(m[6]),
                                              float(m[7])))
        elif m := _BASE_TIME.match(s):
            out.epochs.append(BaselineEpoch(int(m[2]), int(m[3]), float(m[4])))
        elif m := _BASE_EPOCH.match(s):
            out.epochs.append(BaselineEpoch(int(m[1]), int(m[2]), float(m[4])))
        elif s and not _BASE_NOISE.match(s):
            notes.append(results.skip_note(label, lineno, line))
    out.skipped = results.summarise_skips(label, notes)
    return out


# --- a run's report -----------------------------------------------------------------------------------------------
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


@results.reporter(tables=["metrics", "scaling", "vit_training", "baseline_util", "baseline_epochs"])
def report(run: results.RunDir, rep: results.Report) -> None:
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


def scaling(rep: results.Report, configs: dict[RunConfig, list[MetricRow]]) -> None:
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
        several = len({k[2] for k in series}) > 1
        lines = {f"micro-batch {micro}" + (f", {results.plural(epochs, 'epoch')}" if several else ""):
                 ([p[0] for p in pts], [p[2] for p in pts])
                 for (k, micro, epochs), pts in sorted(series.items()) if k == kind}
        if lines:
            rep.figure(f"{kind}_scaling", results.plotting.lines(lines, xlabel="GPUs", ylabel="mean epoch time (s)",
                                                         marker="o", title=f"{kind} scaling"),
                       f"{kind.capitalize()} scaling: mean epoch time against GPU count, one line per micro-batch.")


def _vit_logs(run: results.RunDir, rep: results.Report) -> None:
    rows = []
    for _, path in run.files(r"vit_training_rank_\d+\.log"):
        cfg = config_from_path(path)
        parsed = parse_vit_log(path)
        rep.skip(parsed.skipped)
        rows += [[label(cfg) if cfg else "", e.rank, e.epoch, e.loss, e.accuracy, e.seconds] for e in parsed.rows]
    if rows:
        rep.heading("Training log")
        rep.table("vit_training", ["config", "rank", "epoch", "loss", "accuracy", "seconds"], rows)


def _baseline(run: results.RunDir, rep: results.Report) -> None:
    for _, path in run.files(r"metrics\.txt|baseline_measure_output\.txt"):
        log = parse_baseline(path)
        rep.skip(log.skipped)
        rep.heading(f"Baseline measure ({path.name})")
        rep.table("baseline_util", ["ts", "rank", "gpu", "cpu_pct", "mem_pct", "gpu_pct", "gpu_mem_mb"],
                  [[s.ts, s.rank, s.gpu, s.cpu_pct, s.mem_pct, s.gpu_pct, s.gpu_mem_mb] for s in log.samples])
        rep.table("baseline_epochs", ["rank", "epoch", "seconds"], [[e.rank, e.epoch, e.seconds] for e in log.epochs])


# --- a campaign's report ------------------------------------------------------------------------------------------
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


@results.campaign_reporter(tables=[
    "metrics", "scaling", "vit_training", "baseline_util", "baseline_epochs", "configs", "missing_points"])
def campaign(camp: results.Campaign, rep: results.Report) -> None:
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


def _missing(rep: results.Report, have: dict[RunConfig, list[MetricRow]], launched: dict[RunConfig, list[str]],
             setting: tuple[int, int]) -> None:
    counts = sorted(set(GPU_COUNTS) | {c.gpus for c in have} | {c.gpus for c in launched})
    rows = []
    for kind in ("strong", "weak"):
        for n in counts:
            frac = 1.0 if kind == "strong" else round(WEAK_STEP * n, 6)
            cfg = RunConfig(n, frac, *setting)
            if not any(c.gpus == n and abs(c.fraction - frac) < 1e-9 for c in have):
                rows.append([kind, n, frac, results.why_missing(launched, cfg, "metrics.csv")])
    rep.heading("Missing points")
    rep.table("missing_points", ["kind", "gpus", "fraction", "problem"], rows,
              "strong: the full data set on 1-5 GPUs; weak: 10% of the data per GPU")
    rep.check("every scaling point is present", not rows,
              f"{len(rows)} missing: " + "; ".join(f"{r[0]} {r[1]} GPU(s) p{r[2]:g}" for r in rows)
              if rows else "strong and weak scaling complete")
