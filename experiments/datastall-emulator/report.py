"""datastall-emulator's report: Figures 3, 4(a), 4(b), 5 and 6 of the data-stall paper from the emulator's outputs;
and, across a campaign's runs, the same figures from every run, with the points still missing.

Loaded by testbed from this folder (testbed.results, API 3: reporter and campaign_reporter) whenever it reports a
run or a campaign of this suite: the emulator's output parsers, the paper's arithmetic, then the reporters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed import results

results.require(3)


# --- the emulator's output ----------------------------------------------------------------------------------------
# Data-stall emulator stdout ``output*.txt`` (artifacts.md section 3).
#
# Each batch prints ``batch N <tab> data_time: x <tab> cpu2gpu_time: y <tab> gpu_time: z`` and then a line of
# the epoch's *cumulative* ``data cpu2gpu gpu`` seconds. **Epoch boundaries** are found from the batch index:
# a ``batch N`` line whose N is not greater than the previous batch's starts a new epoch (the emulator counts
# from 0 each epoch and resets its cumulative totals there). An epoch's totals are its last cumulative line.
# The last epoch is incomplete when the run was interrupted (a Python traceback follows) or when it has fewer
# batches than the epoch before it; incomplete epochs are kept but flagged, and noted as skipped.
_BATCH = re.compile(r"^batch\s+(\d+)\s+data_time:\s*(\S+)\s+cpu2gpu_time:\s*(\S+)\s+gpu_time:\s*(\S+)\s*$")
_TOTALS = re.compile(r"^\s*([0-9.eE+-]+)\s+([0-9.eE+-]+)\s+([0-9.eE+-]+)\s*$")
_HEADER = re.compile(r"batch_size:\s*(\d+)\s+batch_cpu2gpu_time:\s*(\S+)\s+batch_gpu_compute_time:\s*(\S+)")
_NOISE = ("We don't find the matching batch size", "=> creating model", "using CPU", "NOT using MinIO",
          "Using MinIO", "=> ", "Use GPU")


@dataclass(frozen=True)
class Totals:
    """Seconds spent waiting for data, copying to the (emulated) GPU, and computing."""

    data: float
    cpu2gpu: float
    gpu: float

    @property
    def total(self) -> float:
        return self.data + self.cpu2gpu + self.gpu


@dataclass(frozen=True)
class BatchRow:
    epoch: int
    batch: int
    data: float
    cpu2gpu: float
    gpu: float


@dataclass
class Epoch:
    number: int  # 1-based
    batches: int = 0
    last_batch: int = -1
    totals: Totals | None = None
    complete: bool = True


@dataclass
class EmulatorOutput:
    """A parsed output file: header, per-batch rows, per-epoch cumulative totals, what was skipped."""

    batch_size: int | None = None
    batch_cpu2gpu_time: float | None = None
    batch_gpu_compute_time: float | None = None
    rows: list[BatchRow] = field(default_factory=list)
    epochs: list[Epoch] = field(default_factory=list)
    interrupted: str | None = None
    skipped: list[str] = field(default_factory=list)

    def epoch_totals(self, number: int) -> Totals | None:
        """Cumulative totals of a complete epoch (1-based), or None."""
        ep = next((e for e in self.epochs if e.number == number), None)
        return ep.totals if ep and ep.complete else None

    @property
    def final(self) -> Totals | None:
        """Totals of the last complete epoch (the file's last line when the run finished)."""
        done = [e for e in self.epochs if e.complete and e.totals]
        return done[-1].totals if done else None

    @property
    def final_epoch(self) -> Epoch | None:
        done = [e for e in self.epochs if e.complete and e.totals]
        return done[-1] if done else None


def parse_emulator_output(src: Path | str) -> EmulatorOutput:
    text, label = results.load_text(src)
    out = EmulatorOutput()
    notes: list[str] = []
    traceback_at = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if traceback_at:
            if re.match(r"^\w*(Error|Interrupt|Exception)\b", line):
                out.interrupted = line
            continue
        if line.startswith("Traceback"):
            traceback_at = lineno
            out.interrupted = "traceback"
            continue
        try:
            if m := _BATCH.match(line):
                idx = int(m[1])
                if not out.epochs or idx <= out.epochs[-1].last_batch:
                    out.epochs.append(Epoch(len(out.epochs) + 1))
                ep = out.epochs[-1]
                out.rows.append(BatchRow(ep.number, idx, float(m[2]), float(m[3]), float(m[4])))
                ep.batches += 1
                ep.last_batch = idx
            elif m := _TOTALS.match(line):
                if not out.epochs:
                    notes.append(results.skip_note(label, lineno, line, "totals before any batch"))
                else:
                    out.epochs[-1].totals = Totals(float(m[1]), float(m[2]), float(m[3]))
            elif m := _HEADER.search(line):
                out.batch_size = int(m[1])
                out.batch_cpu2gpu_time, out.batch_gpu_compute_time = float(m[2]), float(m[3])
            elif line.startswith("We don't find") and not line.startswith(_NOISE):  # no profile row: it exits 0
                out.interrupted = f"the emulator found no profile data: {line.strip()[:120]}"
                out.skipped.append(f"{label}:{lineno}: {line.strip()[:160]} (the emulator stopped: nothing measured)")
            elif not line.startswith(_NOISE):
                notes.append(results.skip_note(label, lineno, line))
        except ValueError as exc:
            notes.append(results.skip_note(label, lineno, line, f"bad number ({exc})"))
    _flag_incomplete(out, label)
    out.skipped = results.summarise_skips(label, notes) + out.skipped
    return out


def _flag_incomplete(out: EmulatorOutput, label: str) -> None:
    if not out.epochs:
        return
    last = out.epochs[-1]
    shorter = len(out.epochs) > 1 and last.batches < out.epochs[-2].batches
    if out.interrupted or shorter or last.totals is None:
        last.complete = False
        why = f"interrupted ({out.interrupted})" if out.interrupted else "fewer batches than the epoch before"
        out.skipped.append(f"{label}: epoch {last.number} incomplete, {why} after batch {last.last_batch} "
                           f"({last.batches} batches); its totals are not used")


def parse_totals_lines(src: Path | str) -> tuple[list[Totals], list[str]]:
    """Lines of three numbers ``data cpu2gpu gpu`` (e.g. the artifact's parsed_output.txt)."""
    text, label = results.load_text(src)
    rows, notes = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _TOTALS.match(line)
        if m:
            rows.append(Totals(float(m[1]), float(m[2]), float(m[3])))
        else:
            notes.append(results.skip_note(label, lineno, line))
    return rows, results.summarise_skips(label, notes)


# --- per-batch CSV ------------------------------------------------------------------------------------------------
# Per-batch timing CSV ``<gpu>/<arch>-batch<bs>.csv``: ``data_stall_time<tab>cpu2gpu_time<tab>gpu_time``.
HEADER = ("data_stall_time", "cpu2gpu_time", "gpu_time")


@dataclass(frozen=True)
class BatchTiming:
    data_stall_time: float
    cpu2gpu_time: float
    gpu_time: float


def parse_batch_csv(src: Path | str) -> results.Parsed[BatchTiming]:
    """Rows for epochs >= 1 (as written by the profiler; its cpu2gpu column repeats the last value)."""
    rows, notes = results.csv_rows(src, HEADER, lambda d: BatchTiming(float(d["data_stall_time"]),
                                                                      float(d["cpu2gpu_time"]), float(d["gpu_time"])),
                                   delimiter="\t")
    return results.Parsed(rows, notes)


# --- profile ------------------------------------------------------------------------------------------------------
# The emulator's ``profile.csv``: tab separated, no header, N/A and #VALUE! cells (read as None).
COLUMNS = ("gpu_type", "gpu_memory", "model", "batch_size", "input_size", "memory_required_mb",
           "cpu2gpu_time", "gpu_compute_time", "batches_per_epoch", "transfer_per_epoch",
           "compute_per_epoch", "reason")
_BAD = ("N/A", "#VALUE!")


@dataclass(frozen=True)
class ProfileRow:
    gpu_type: str
    model: str
    batch_size: int | None
    cpu2gpu_time: float | None
    gpu_compute_time: float | None
    batches_per_epoch: float | None
    transfer_per_epoch: float | None
    compute_per_epoch: float | None


def parse_profile(src: Path | str) -> results.Parsed[ProfileRow]:
    text, label = results.load_text(src)
    out: results.Parsed[ProfileRow] = results.Parsed()
    bad_cells = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) < 8 or not cells[2].strip():
            out.skipped.append(results.skip_note(label, lineno, line, "fewer than 8 columns"))
            continue
        cells += [""] * (len(COLUMNS) - len(cells))
        bad_cells += sum(c.strip() in _BAD for c in cells)
        bs = results.to_float(cells[3])
        out.rows.append(ProfileRow(cells[0].strip(), cells[2].strip(), int(bs) if bs else None,
                                   *(results.to_float(cells[i]) for i in range(6, 11))))
    if bad_cells:
        out.skipped.append(f"{label}: {bad_cells} N/A or #VALUE! cells read as empty")
    return out


def lookup(rows: list[ProfileRow], gpu_type: str, model: str, batch_size: int) -> tuple[float, float] | None:
    """(cpu2gpu, compute) seconds per batch; another batch size is scaled linearly, as the emulator does.

    ``gpu_type`` matches case-insensitively as a substring of the profile's GPU Type.
    """
    cands = [r for r in rows if gpu_type.lower() in r.gpu_type.lower() and r.model == model
             and r.batch_size and r.cpu2gpu_time is not None and r.gpu_compute_time is not None]
    if not cands:
        return None
    exact = [r for r in cands if r.batch_size == batch_size]
    r = exact[0] if exact else cands[0]
    scale = batch_size / r.batch_size if r.batch_size else 1.0
    return r.cpu2gpu_time * scale, r.gpu_compute_time * scale  # type: ignore[operator]


# --- vmtouch ------------------------------------------------------------------------------------------------------
# vmtouch output (``cache_result*.txt``): ``Resident Pages: 991250/2620080  3G/9G  37.8%``.
_PAGES = re.compile(r"Resident Pages:\s*(\d+)/(\d+)\s+\S+/\S+\s+([0-9.]+)%")
_FILES = re.compile(r"Files:\s*(\d+)")


@dataclass(frozen=True)
class CacheResult:
    resident_pages: int
    total_pages: int
    percent: float
    files: int | None = None


def parse_vmtouch(src: Path | str) -> CacheResult | None:
    """The page-cache residency, or None when there is no ``Resident Pages`` line."""
    text, _ = results.load_text(src)
    m = _PAGES.search(text)
    if not m:
        return None
    f = _FILES.search(text)
    return CacheResult(int(m[1]), int(m[2]), float(m[3]), int(f[1]) if f else None)


# --- the paper's math ---------------------------------------------------------------------------------------------
# The data-stall paper's figure numbers, computed directly from emulator totals (no spreadsheet).
#
# Formulas (Totals = the data / cpu2gpu / gpu seconds of one epoch):
#
# - Figure 3, fetch-stall fraction of a model:
#   ``(data_35 - data_100) / (data_35 + cpu2gpu_35 + gpu_35)`` with *_35 the final totals at about 35 % of the
#   dataset cached (``output<model>.txt``) and data_100 those fully cached (``output_100<model>.txt``).
# - Figure 4(a), per memory limit: fetch = epoch-2 data(limit) - epoch-2 data(largest limit);
#   transfer = epoch-2 cpu2gpu(limit); compute = epoch-2 gpu(limit). Figure 4(b) is the same on the HDD run.
#   The artifact's outputsfig4 holds both runs under one naming (output<limit>g.txt); its parser.py and
#   grapher_a.py take the SSD run by its limits (6g..16g, figure4.sh's), the sheet's last row (fully cached) being
#   the largest of them; the folder's other limits (4g, 18g..24g) are the HDD run's. Each run's fetch is relative to
#   its own largest limit, never to the other run's.
# - Figure 5, throughput: images/s = images / (data + cpu2gpu + gpu) of the final epoch, with
#   images = batches in that epoch x batch size (an upper bound by less than one batch, since the last batch may
#   be partial) unless the suite gives ``images_per_epoch``. The artifact's spreadsheet (time5.dat) equals
#   13,395 / total on every cell, i.e. it assumed 13,395 images per epoch, so its values are ours scaled by a
#   constant and the curves have the same shape.
# - Figure 6, prep stall: 100 x data / (data + cpu2gpu + gpu) of the final epoch with the data fully cached, the
#   share of the epoch spent waiting for CPU pre-processing. The artifact's own formula lived only in a
#   spreadsheet and is not reproduced here.
KNOWN_MODELS = (
    "alexnet", "densenet121", "densenet161", "densenet169", "densenet201", "googlenet", "inception_v3",
    "mobilenet_v2", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0", "squeezenet1_0", "squeezenet1_1", "vgg11", "vgg13", "vgg16", "vgg19",
)


SHEET_IMAGES_PER_EPOCH = 13395
"""The constant behind the artifact's time5.dat (images/s = 13,395 / epoch time on every cell)."""

# The points of the artifact's own figure scripts (figure3.sh ... figure6.sh, grapher_a.py's sizes).
FIG3_MODELS = ("shufflenet_v2_x0_5", "alexnet", "resnet18", "squeezenet1_0", "squeezenet1_1", "mobilenet_v2",
               "resnet50", "vgg11")
FIG4_LIMITS_GB = (6.0, 8.0, 10.0, 12.0, 14.0, 16.0)
"""Figure 4(a)'s (SSD) limits: figure4.sh:7, outputsfig4/parser.py:2 and grapher_a.py's sizes."""
FIG5_MODELS = ("alexnet", "resnet18", "mobilenet_v2", "resnet50")
FIG5_WORKERS = (1, 2, 3, 6, 12, 24)
FIG6_MODELS = FIG5_MODELS


def fetch_stall_fraction(at35: Totals, at100: Totals) -> float:
    return (at35.data - at100.data) / at35.total


@dataclass(frozen=True)
class Fig4Row:
    limit_gb: float
    fetch: float
    transfer: float
    compute: float


def split_fig4(limits: list[float] | set[float] | tuple[float, ...]) -> tuple[list[float], list[float]]:
    """(SSD limits, HDD limits), ascending: figure4.sh's limits are figure 4(a)'s, any other figure 4(b)'s."""
    return (sorted(lim for lim in limits if lim in FIG4_LIMITS_GB),
            sorted(lim for lim in limits if lim not in FIG4_LIMITS_GB))


def fig4a(epoch2: dict[float, Totals]) -> list[Fig4Row]:
    """One row per memory limit (ascending), fetch relative to the largest limit (one run's limits only)."""
    if not epoch2:
        return []
    ref = epoch2[max(epoch2)]
    return [Fig4Row(lim, t.data - ref.data, t.cpu2gpu, t.gpu) for lim, t in sorted(epoch2.items())]


def images_per_second(totals: Totals, images: float) -> float:
    return images / totals.total


def prep_stall_pct(totals: Totals) -> float:
    return 100 * totals.data / totals.total


@dataclass(frozen=True)
class OutputKind:
    figure: str  # "3", "3-100", "4", "5", "6"
    model: str | None = None
    limit_gb: float | None = None
    workers: int | None = None


def point_key(kind: OutputKind) -> object:
    """The point an output stands for within its figure: model, limit (GB) or (model, workers)."""
    if kind.figure == "4":
        return kind.limit_gb
    if kind.figure == "5":
        return (kind.model, kind.workers)
    return kind.model


def params_point(params: dict[str, object]) -> tuple[str, object] | None:
    """(figure, point key) a run was launched for, from its parameters (figure, model, mem_limit, workers)."""
    fig, model = str(params.get("figure") or ""), params.get("model")
    try:
        if fig in ("3", "3-100", "6") and isinstance(model, str):
            return fig, model
        if fig == "4":
            return fig, float(str(params.get("mem_limit", "")).lower().removesuffix("g"))
        if fig == "5" and isinstance(model, str):
            return fig, (model, int(str(params.get("workers"))))
    except ValueError:
        return None
    return None


def _split_model(rest: str, models: tuple[str, ...]) -> tuple[str, int | None] | None:
    """``resnet1812`` -> (resnet18, 12); ``resnet18`` -> (resnet18, None); longest known model wins."""
    for m in sorted(models, key=len, reverse=True):
        if rest == m:
            return m, None
        if rest.startswith(m) and rest[len(m):].isdigit():
            return m, int(rest[len(m):])
    return None


def classify(name: str, folder: str = "", models: tuple[str, ...] = KNOWN_MODELS) -> OutputKind | None:
    """Which figure an ``output*.txt`` file feeds, from its name (and folder ``outputsfigN`` when present)."""
    stem = name.removesuffix(".txt")
    if stem == "output_fill_cache":  # the fill-cache epoch of figures 3-100, 5 and 6 feeds no figure
        return None
    hint = m[1] if (m := re.fullmatch(r"outputsfig(\d)", folder)) else ""
    if m := re.fullmatch(r"output_100(.+)", stem):
        return OutputKind("3-100", model=m[1])
    if m := re.fullmatch(r"output(\d+(?:\.\d+)?)g", stem):
        return OutputKind("4", limit_gb=float(m[1]))
    if m := re.fullmatch(r"output_(.+)", stem):
        split = _split_model(m[1], models)
        if split and split[1] is not None and hint != "6":
            return OutputKind("5", model=split[0], workers=split[1])
        if split and split[1] is None and hint != "5":
            return OutputKind("6", model=split[0])
        if hint == "5" and (w := re.fullmatch(r"(.*?[a-z_])(\d+)", m[1])):
            return OutputKind("5", model=w[1], workers=int(w[2]))
        return OutputKind("6", model=m[1]) if hint in ("", "6") else None
    if m := re.fullmatch(r"output([A-Za-z].*)", stem):
        return OutputKind("3", model=m[1])
    return None


# --- a run's report -----------------------------------------------------------------------------------------------
FIG4_EPOCH = 2


Found = tuple[str, object, Path, EmulatorOutput]
"""(figure, point key, path, parsed output): the point key is the model, the limit in GB or (model, workers)."""
Outputs = dict[str, dict[object, tuple[Path, EmulatorOutput]]]


def load_outputs(run: results.RunDir, rep: results.Report) -> list[Found]:
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


@results.reporter(tables=[
    "fig3_fetch_stall", "fig4a_breakdown", "fig4b_breakdown", "fig5_throughput", "fig6_prep_stall", "profile",
    "profiled_batches"])
def report(run: results.RunDir, rep: results.Report) -> None:
    outs = empty_outputs()
    for figure, key, path, parsed in load_outputs(run, rep):
        outs[figure][key] = (path, parsed)
    figures(rep, outs, load_cache(run), run.params.get("images_per_epoch"))
    _inputs(run, rep)


def figures(rep: results.Report, outs: Outputs, cache: dict[str, float], images_param: object) -> None:
    """Figures 3, 4(a), 4(b), 5 and 6 from the outputs found (one run's, or a campaign's)."""
    _fig3(rep, outs["3"], outs["3-100"], cache)
    _fig4(rep, outs["4"], cache)
    _fig5(rep, outs["5"], images_param)
    _fig6(rep, outs["6"])


def load_cache(run: results.RunDir) -> dict[str, float]:
    """vmtouch residency (percent) by the part of ``cache_result<part>.txt`` after ``cache_result``."""
    found = {}
    for _, path in run.files(r"cache_result.*\.txt"):
        res = parse_vmtouch(path)
        if res is not None:
            found[path.stem.removeprefix("cache_result")] = res.percent
    return found


def _final(rep: results.Report, label: str, out: EmulatorOutput) -> Totals | None:
    if out.final is None:
        rep.skip([f"{label}: no complete epoch; left out"])
    return out.final


def _fig3(rep: results.Report, at35: dict, at100: dict, cache: dict[str, float]) -> None:
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
        rep.figure("fig3_fetch_stall", results.plotting.bars([r[0] for r in done],
                                                             {"fetch stall": [r[5] for r in done]},
                                                             ylabel="fraction of epoch time"),
                   "Figure 3: fraction of epoch time stalled on fetching data, per model.")


def _fig4(rep: results.Report, by_limit: dict, cache: dict[str, float]) -> None:
    if not by_limit:
        return
    epoch2: dict[float, Totals] = {}
    for limit, (path, out) in sorted(by_limit.items()):
        t = out.epoch_totals(FIG4_EPOCH)
        if t is None:
            rep.skip([f"figure 4: {path.name} has no complete epoch {FIG4_EPOCH} "
                      f"({results.plural(len(out.epochs), 'epoch')} found); limit {limit:g}g left out"])
        else:
            epoch2[limit] = t
    ssd, hdd = split_fig4(list(by_limit))
    for part, disk, limits in (("a", "SSD", ssd), ("b", "HDD", hdd)):
        if limits:
            _fig4_part(rep, part, disk, {lim: epoch2[lim] for lim in limits if lim in epoch2}, cache)


def _fig4_part(rep: results.Report, part: str, disk: str, epoch2: dict[float, Totals], cache: dict[str, float]) -> None:
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
        rep.figure(name, results.plotting.bars(
            [f"{r.limit_gb:g}g" for r in rows],
            {"fetch": [r.fetch for r in rows], "transfer": [r.transfer for r in rows],
             "compute": [r.compute for r in rows]}, ylabel=f"seconds (epoch {FIG4_EPOCH})", stacked=True),
            f"Figure 4({part}): fetch, transfer and compute time per memory limit, {disk} run.")


def _fig5(rep: results.Report, by_mw: dict, images_param: object) -> None:
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
        rep.figure("fig5_throughput", results.plotting.lines(series, xlabel="data-loading workers", ylabel="images/s",
                                                     marker="o"), "Figure 5: images per second against workers.")


def _fig6(rep: results.Report, by_model: dict) -> None:
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
        rep.figure("fig6_prep_stall", results.plotting.bars([r[0] for r in rows], {"prep stall": [r[4] for r in rows]},
                                                    ylabel="% of epoch time"), "Figure 6: prep stall per model.")


def _inputs(run: results.RunDir, rep: results.Report) -> None:
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


# --- a campaign's report ------------------------------------------------------------------------------------------
FIGURE_OF = {"3": "3", "3-100": "3", "4": "4(a)", "5": "5", "6": "6"}


def _own_cache_key(params: dict[str, object]) -> str | None:
    fig, model, limit = params.get("figure"), params.get("model"), params.get("mem_limit")
    return {"3": f"{model}", "3-100": f"_100{model}", "4": f"{limit}"}.get(str(fig))


@results.campaign_reporter(tables=[
    "fig3_fetch_stall", "fig4a_breakdown", "fig4b_breakdown", "fig5_throughput", "fig6_prep_stall", "profile",
    "profiled_batches", "missing_points"])
def campaign(camp: results.Campaign, rep: results.Report) -> None:
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


def missing(rep: results.Report, outs: Outputs, launched: dict[tuple[str, object], list[str]]) -> None:
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
            if key not in outs[fig]:
                why = results.why_missing(launched, (fig, key))
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
