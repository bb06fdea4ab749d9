"""Console, JSON output and the state store for the command bodies, importable without Typer (the hot
commands in ``testbed.cli.hot`` run without it), and :class:`Plain`: lines with a little colour, without Rich
(whose import is ~30 ms of a ``testbed exec``)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console

    from testbed.state import Store


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def store() -> Store:
    """This folder's state, created when it has none (the commands that record something)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.state import Store

    return Store.open_default()


def existing_store(*, readonly: bool = True) -> Store:
    """This folder's state for a command that only reads it: never created (``Store.empty`` when none)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.state import Store

    return Store.open_existing(readonly=readonly)


class _Elapsed:
    """What a command waits for, with the seconds it has waited: rendered afresh at each refresh."""

    def __init__(self, what: str) -> None:
        self.what, self.t0 = what, time.monotonic()

    def __rich__(self) -> str:
        return f"{escape(self.what)} [dim]({time.monotonic() - self.t0:.0f} s)[/dim]"


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """While inside: on a terminal, a live line on stderr says what the command waits for and for how long, so no
    wait is silent; what the command prints meanwhile goes above it. Off a terminal (a pipe, a log): nothing."""
    err = console(stderr=True)
    if not err.is_terminal:
        yield
        return
    with err.status(_Elapsed(what), spinner="dots", refresh_per_second=4):
        yield


def escape(s: str) -> str:
    """``s`` with Rich markup made inert (a user's text never styles or hides part of a message)."""
    from rich.markup import escape as rich_escape

    return rich_escape(s)


class Plain:
    """Writes lines to ``stream`` (stdout), coloured as Rich would colour them: only on a terminal that is not
    ``dumb``, never under ``NO_COLOR``, always under a non-empty ``FORCE_COLOR``. User text is written as it is
    (no markup is read from it)."""

    CODES = {"green": "32", "red": "31", "yellow": "33", "dim": "2", "bold": "1"}

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        env = os.environ
        tty = _isatty(self.stream) and env.get("TERM", "") != "dumb"
        self.colour = bool(env.get("FORCE_COLOR")) or (tty and "NO_COLOR" not in env)
        enc = (getattr(self.stream, "encoding", None) or "").lower()
        self.line_char = "─" if enc.startswith("utf") else "-"
        self.width = _width(self.stream)

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{self.CODES[style]}m{text}\x1b[0m" if self.colour and text else text

    def write(self, text: str) -> None:
        self.stream.write(text if text.endswith("\n") else text + "\n")

    def rule(self, *parts: tuple[str, str | None]) -> None:
        """A rule across the width, led by ``parts`` ((text, style or None)) two spaces apart."""
        plain = "  ".join(t for t, _ in parts)
        title = "  ".join(self.paint(t, st) if st else t for t, st in parts)
        self.write(f"{title} {self.line_char * max(0, self.width - len(plain) - 1)}")

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, lines: bool = False,
              whole: Sequence[str] = (), paths: Sequence[str] = ()) -> None:
        """A boxed table as Rich draws one (heavy head), cells wrapped to fit the width; ``lines``: a rule between
        rows. Cells may hold several lines. The columns named in ``whole`` (ids: runs, hosts, testbeds) never
        break a word: the other columns give up their room first, and a table that still does not fit is wider
        than the terminal rather than cut an id in two. The columns named in ``paths`` hold paths: each is
        written ``~``-relative and, where it does not fit, shortened by an ellipsis in its middle (never wrapped
        over several lines)."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed.textfmt import home_relative

        cells = [[[home_relative(ln) for ln in str(c).split("\n")] if columns[i] in paths else str(c).split("\n")
                  for i, c in enumerate(r)] for r in rows]
        widths = [max([len(h), *(len(ln) for r in cells for ln in r[i])]) for i, h in enumerate(columns)]
        floor = [max([8, *(len(w) for r in cells for ln in r[i] for w in ln.split())]) if h in whole
                 else max(len(h), 16) if h in paths else 8 for i, h in enumerate(columns)]
        floor = [min(f, w) for f, w in zip(floor, widths, strict=True)]
        room = self.width - 3 * len(columns) - 1
        while sum(widths) > room:  # bounded: a column shrinks by one each pass, never below its floor
            give = [i for i, w in enumerate(widths) if w > floor[i]]
            if not give:
                break
            widest = max(give, key=lambda i: widths[i])
            widths[widest] -= 1
        u = self.line_char == "─"
        h, v, hh, hv = ("─", "│", "━", "┃") if u else ("-", "|", "-", "|")

        def border(left: str, mid: str, right: str, fill: str) -> str:
            return left + mid.join(fill * (w + 2) for w in widths) + right

        def block(row: list[list[str]], edge: str, style: str | None = None) -> list[str]:
            # lazy: start-up (testbed status and exec load this module)
            from testbed.textfmt import middle

            wrapped = [[middle(ln, w) for ln in lines_] if style is None and columns[i] in paths else _wrap(lines_, w)
                       for i, (lines_, w) in enumerate(zip(row, widths, strict=True))]
            out = []
            for i in range(max(len(c) for c in wrapped)):
                parts = [(c[i] if i < len(c) else "").ljust(w) for c, w in zip(wrapped, widths, strict=True)]
                out.append(edge + edge.join(f" {self.paint(p, style) if style else p} " for p in parts) + edge)
            return out

        out = [self.paint(title, "bold")] if title else []
        out.append(border(*(("┏", "┳", "┓") if u else ("+", "+", "+")), hh))
        out += block([[c] for c in columns], hv, "bold")
        out.append(border(*(("┡", "╇", "┩") if u else ("+", "+", "+")), hh))
        for i, r in enumerate(cells):
            if lines and i:
                out.append(border(*(("├", "┼", "┤") if u else ("+", "+", "+")), h))
            out += block(r, v)
        out.append(border(*(("└", "┴", "┘") if u else ("+", "+", "+")), h))
        self.write("\n".join(out))


def _wrap(lines: list[str], width: int) -> list[str]:
    """``lines`` cut into pieces of at most ``width`` characters, at a space where there is one."""
    out: list[str] = []
    for ln in lines:
        while len(ln) > width:  # bounded: ln shrinks each pass
            cut = ln.rfind(" ", 1, width + 1)
            cut = cut if cut > 0 else width
            out.append(ln[:cut].rstrip())
            ln = ln[cut:].lstrip()
        out.append(ln)
    return out


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _width(stream: IO[str]) -> int:
    """COLUMNS when set, else the terminal's width, else 80 (what Rich does)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80
