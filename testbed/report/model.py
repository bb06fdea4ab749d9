"""Plain records a reporter fills in and the renderers read: tables, figures, checks, text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from testbed.report.plotting import save_figure
from testbed.textfmt import iso

if TYPE_CHECKING:
    from testbed.report.plotting import Draw
    from testbed.report.verdicts import Verdict

T = TypeVar("T")



@dataclass(frozen=True)
class Link:
    """A table cell that links to another file (a path relative to the report); CSVs keep its text."""

    text: str
    href: str

    def __str__(self) -> str:
        return self.text


Cell = str | int | float | bool | Link | None  # a Timestamp too (defined below)
Check = tuple[str, bool | None, str]
"""(name, passed, detail); passed is None when the check could not be evaluated."""


@dataclass
class Parsed(Generic[T]):
    """What a parser returns: the rows it understood and a note for everything it skipped."""

    rows: list[T] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Table:
    """A tidy table: one row per observation, one column per variable; written to ``<name>.csv``."""

    name: str
    columns: list[str]
    rows: list[list[object]]  # Cell values; anything else is shown with str()
    title: str = ""


@dataclass
class Figure:
    """A PNG written into the report folder."""

    name: str
    path: Path
    caption: str = ""


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Text:
    text: str


@dataclass
class Code:
    """Lines shown as they are (a log's tail): a fenced block in Markdown, ``<pre>`` in HTML."""

    lines: list[str]


@dataclass(frozen=True)
class Timestamp:
    """A table cell holding a moment (unix seconds): shown as ISO 8601 UTC, written to CSVs as the number."""

    epoch: float

    def __str__(self) -> str:
        return iso(self.epoch, ms=self.epoch % 1 != 0) or ""


Block = Heading | Text | Code | Table | Figure


@dataclass
class Report:
    """What a suite reporter builds; ``build_report`` renders it to Markdown or HTML."""

    out_dir: Path
    title: str
    blocks: list[Block] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    cause: Any = None  # a failed run's report: its testbed.report.cause.Cause
    status: str | None = None  # the run's status and its reason: the first line a reader sees
    reason: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)  # one per reference
    lead: list[Block] = field(default_factory=list)  # the key figure and the timeline: on the first screen
    fold: bool = True  # HTML: fold every table and log after the first screen (an index folds nothing)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Heading(text, level))

    def text(self, text: str) -> None:
        self.blocks.append(Text(text))

    def code(self, lines: Sequence[str]) -> None:
        self.blocks.append(Code(list(lines)))

    def table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[object]], title: str = "",
              lead: bool = False) -> Table:
        """A tidy table; ``lead``: shown on the report's first screen (a short timeline), not among the details."""
        tab = Table(_safe_name(name), list(columns), [list(r) for r in rows], title)
        (self.lead if lead else self.blocks).append(tab)
        return tab

    def figure(
        self, name: str, draw: Draw, caption: str = "", size: tuple[float, float] = (7, 4),
        key: bool = False,
    ) -> Figure:
        """Draw with ``draw(fig)`` on a fresh matplotlib Figure and save it as ``<name>.png``; ``key``: the
        report's key figure, shown on its first screen (the first one marked wins; the others stay in place)."""
        path = self.out_dir / f"{_safe_name(name)}.png"
        save_figure(path, draw, size)
        fig = Figure(_safe_name(name), path, caption)
        first_key = key and not any(isinstance(b, Figure) for b in self.lead)
        (self.lead if first_key else self.blocks).append(fig)
        return fig

    def promote_key_figure(self) -> None:
        """Without a figure marked ``key``, the first figure is the key one (shown on the first screen)."""
        if not any(isinstance(b, Figure) for b in self.lead):
            first = next((b for b in self.blocks if isinstance(b, Figure)), None)
            if first is not None:
                self.blocks.remove(first)
                self.lead.insert(0, first)

    def check(self, name: str, passed: bool | None, detail: str) -> None:
        self.checks.append((name, passed, detail))

    def skip(self, notes: Sequence[str]) -> None:
        self.skipped.extend(notes)

    @property
    def tables(self) -> list[Table]:
        return [b for b in [*self.lead, *self.blocks] if isinstance(b, Table)]

    @property
    def figures(self) -> list[Figure]:
        return [b for b in [*self.lead, *self.blocks] if isinstance(b, Figure)]


def _safe_name(name: str) -> str:
    """A file-name-safe stem: letters, digits, dot, dash and underscore only."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._")
    return out or "unnamed"
