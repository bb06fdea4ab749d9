"""The data-stall paper's figure numbers, computed directly from emulator totals (no spreadsheet).

Formulas (Totals = the data / cpu2gpu / gpu seconds of one epoch):

- Figure 3, fetch-stall fraction of a model:
  ``(data_35 - data_100) / (data_35 + cpu2gpu_35 + gpu_35)`` with *_35 the final totals at about 35 % of the
  dataset cached (``output<model>.txt``) and data_100 those fully cached (``output_100<model>.txt``).
- Figure 4(a), per memory limit: fetch = epoch-2 data(limit) - epoch-2 data(largest limit);
  transfer = epoch-2 cpu2gpu(limit); compute = epoch-2 gpu(limit). Figure 4(b) is the same on the HDD run.
  The artifact's outputsfig4 holds both runs under one naming (output<limit>g.txt); its parser.py and
  grapher_a.py take the SSD run by its limits (6g..16g, figure4.sh's), the sheet's last row (fully cached) being
  the largest of them; the folder's other limits (4g, 18g..24g) are the HDD run's. Each run's fetch is relative to
  its own largest limit, never to the other run's.
- Figure 5, throughput: images/s = images / (data + cpu2gpu + gpu) of the final epoch, with
  images = batches in that epoch x batch size (an upper bound by less than one batch, since the last batch may
  be partial) unless the suite gives ``images_per_epoch``. The artifact's spreadsheet (time5.dat) equals
  13,395 / total on every cell, i.e. it assumed 13,395 images per epoch, so its values are ours scaled by a
  constant and the curves have the same shape.
- Figure 6, prep stall: 100 x data / (data + cpu2gpu + gpu) of the final epoch with the data fully cached, the
  share of the epoch spent waiting for CPU pre-processing. The artifact's own formula lived only in a
  spreadsheet and is not reproduced here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from testbed.report.parsers.datastall_output import Totals

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
