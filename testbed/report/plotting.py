"""Matplotlib, imported lazily, drawn on an explicit Agg canvas (no pyplot, no global state)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    Draw = Callable[[Figure], None]  # fills a fresh Figure


def save_figure(path: Path, draw: Draw, size: tuple[float, float] = (7, 4)) -> Path:
    """Create a Figure, let ``draw`` fill it, save a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    draw(fig)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


VLINE_STYLES = (("--", "dashed"), (":", "dotted"), ("-.", "dash-dotted"))
"""The line style of each vertical marker of :func:`lines`, in turn (matplotlib's, and in words)."""


def vline_key(vlines: Sequence[tuple[float, str, str]]) -> str:
    """How :func:`lines` draws each vertical marker, in words for a caption: ``fault (node2): red, dashed;
    recovery: green, dotted`` (the colour without matplotlib's ``tab:`` prefix)."""
    return "; ".join(f"{label}: {color.removeprefix('tab:')}, {VLINE_STYLES[i % len(VLINE_STYLES)][1]}"
                     for i, (_, label, color) in enumerate(vlines))


def lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    vlines: Sequence[tuple[float, str, str]] = (),
    marker: str = "",
) -> Draw:
    """A drawer for one axis of labelled line series, with optional vertical markers (x, label, color)."""

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for label, (xs, ys) in series.items():
            ax.plot(list(xs), list(ys), marker=marker, label=label)
        for i, (x, label, color) in enumerate(vlines):
            ax.axvline(x, color=color, linestyle=VLINE_STYLES[i % len(VLINE_STYLES)][0], label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if series or vlines:
            ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)

    return draw


def bars(
    labels: Sequence[str],
    groups: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    title: str = "",
    stacked: bool = False,
) -> Draw:
    """A drawer for grouped (or stacked) bars: one bar group per label, one bar per series."""

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        n = max(len(groups), 1)
        width = 0.8 if stacked else 0.8 / n
        bottom = [0.0] * len(labels)
        for i, (name, values) in enumerate(groups.items()):
            vals = [float(v) for v in values]
            if stacked:
                ax.bar(range(len(labels)), vals, width, bottom=bottom, label=name)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            else:
                xs = [j - 0.4 + width * (i + 0.5) for j in range(len(labels))]
                ax.bar(xs, vals, width, label=name)
        ax.set_xticks(range(len(labels)), list(labels), rotation=30, ha="right", fontsize="small")
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if len(groups) > 1:
            ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)

    return draw


def boxes(data: Mapping[str, Sequence[float]], *, ylabel: str, title: str = "") -> Draw:
    """A drawer for one box per label."""

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.boxplot([list(v) for v in data.values()])
        ax.set_xticks(range(1, len(data) + 1), list(data.keys()))
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)

    return draw
