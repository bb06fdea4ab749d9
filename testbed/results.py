"""The public API of a suite's own ``report.py``: results tables (and whole reporters) in Python, versioned.

testbed loads ``report.py`` from the suite's folder (beside its YAML) by path whenever it builds that suite's
report (``testbed report``, ``run --collect``) or checks the suite (``testbed show``, ``run --dry-run``); it is
never imported by name and never read from a results folder. A parser is a pure function of one file's text::

    from testbed import results

    results.require(1)                       # this file's API version: a clear error on an older testbed

    @results.parser("steps", files="rank*.out", columns=["step", "loss"])
    def steps(text: str) -> list[dict]:
        return [{"step": int(a), "loss": float(b)} for a, b in re.findall(r"step (\\d+) loss (\\S+)", text)]

Each registered table has the columns ``host``, ``rank``, ``file`` (where a row was read, as a declared table's:
testbed.tables) then ``columns``; ``references:`` and ``checks:`` name it as they name any table. A reporter
(``@results.reporter(tables=[...])``) builds the whole report instead (``fn(run: RunDir, rep: Report)``: the
generic report is not made), and declares the tables it makes. An error while loading the file is one message
naming its ``file:line``; a parser that raises on a file is a note and a failed "report complete" check.
Test parsers as plain functions, or load the file as testbed does: ``results.load(path).parsers["steps"]``.

Versions: API 1 (``require(1)``): ``parser``, ``reporter``, ``RunDir``, ``Report``. API 2 adds, for reporters
moved out of testbed into their suite folders: ``csv_rows(path, header)`` (a header-checked CSV read, with notes
for the rows skipped), ``boxes(data, ylabel=...)`` and ``lines(series, xlabel=..., ylabel=...)`` (figure drawers
for ``rep.figure``). API 3 adds, for the reporters of testbed's other shipped suites: ``csv_rows(..., make=fn,
delimiter=",")`` (typed rows, a row whose cells ``fn`` cannot convert skipped with a note; another separator);
the generic report helpers a reporter builds on (``plotting``: figure drawers; ``Timestamp``, ``Parsed``,
``event_time``, ``plural``, ``rank_of``, ``mean_by``; ``load_text``, ``skip_note``, ``summarise_skips``,
``to_float``: reading a file, noting the lines skipped, a lenient number); and ``campaign_reporter(tables=[...])``:
``fn(camp: Campaign, rep: Report)`` builds the cross-run part of a campaign's report (``testbed report
results/<suite>/``, ``--campaign``) after its table of runs, as ``reporter`` builds a run's, and names the tables
it makes; later, ``why_missing(launched, point, what)``: the ``problem`` cell of a campaign's ``missing_points``
table (``no output from run A, B`` or ``no run``).
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from testbed.distribution import install_command
from testbed.errors import UsageError
from testbed.report import plotting
from testbed.report.model import Parsed, Report, Timestamp
from testbed.report.parsers.csv_rows import parse_csv
from testbed.report.rundir import Campaign, RunDir, event_time
from testbed.report.textio import load_text, skip_note, summarise_skips, to_float
from testbed.tables import CONTEXT_COLUMNS, GENERIC_TABLES, TABLE_NAME_RE
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.report.plotting import Draw

API_VERSION = 3
"""The version of this API: raised when it changes in a way a report.py written for the last one would notice."""
__version__ = str(API_VERSION)
FILE_NAME = "report.py"

__all__ = ["API_VERSION", "FILE_NAME", "Campaign", "Parsed", "Parser", "Report", "RunDir", "RunReporter",
           "SuiteResults", "Timestamp", "boxes", "campaign_reporter", "csv_rows", "event_time", "lines", "load",
           "load_text", "mean_by", "parser", "plotting", "plural", "rank_of", "register_campaign_reporter",
           "register_parser", "register_reporter", "reporter", "require", "skip_note", "summarise_skips",
           "to_float", "why_missing"]

ParseFn = Callable[[str], Iterable[Mapping[str, Any]]]
ReportFn = Callable[[RunDir, Report], None]
CampaignFn = Callable[[Campaign, Report], None]
F = TypeVar("F", bound=Callable[..., Any])
K = TypeVar("K")  # a campaign's point: its parameters' values


@dataclass(frozen=True)
class Parser:
    """A table made by ``fn`` from the text of every file matching ``files`` (a glob in each host's folder)."""

    name: str
    fn: ParseFn
    files: str
    columns: tuple[str, ...]
    where: str  # report.py:LINE of its registration


@dataclass(frozen=True)
class RunReporter:
    """A whole run report built by ``fn``, which makes the tables ``tables`` names."""

    fn: ReportFn
    tables: tuple[str, ...]
    where: str


@dataclass(frozen=True)
class CampaignReporter:
    """The cross-run part of a campaign report built by ``fn``, which makes the tables ``tables`` names. API 3."""

    fn: CampaignFn
    tables: tuple[str, ...]
    where: str


@dataclass
class SuiteResults:
    """What one report.py registered."""

    path: Path | None = None
    parsers: dict[str, Parser] = field(default_factory=dict)
    reporter: RunReporter | None = None
    campaign: CampaignReporter | None = None

    def tables(self) -> set[str]:
        """The tables it makes: its parsers', its reporter's and its campaign reporter's."""
        return set(self.parsers) | set(self.reporter.tables if self.reporter else ()) | \
            set(self.campaign.tables if self.campaign else ())


class RegistrationError(Exception):
    """A registration refused: ``fix`` says what to write instead."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.fix = fix


_LOADING: contextvars.ContextVar[SuiteResults | None] = contextvars.ContextVar("testbed_results", default=None)
_LOADED: dict[tuple[str, int, int], SuiteResults] = {}


def require(version: int) -> None:
    """Refuse to load (one clear error) when this testbed's API is older than ``version``."""
    if not isinstance(version, int) or version > API_VERSION:
        raise RegistrationError(f"this report.py needs testbed.results API {version}; this testbed has "
                                f"{API_VERSION}", f"upgrade testbed ({install_command(reinstall=True)}), or write the "
                                f"file for API {API_VERSION}")


def parser(name: str, *, files: str, columns: Sequence[str]) -> Callable[[F], F]:
    """Register the decorated ``fn(text) -> rows`` (mappings of column -> value) as table ``name``."""

    def deco(fn: F) -> F:
        register_parser(name, fn, files=files, columns=columns)
        return fn

    return deco


def register_parser(name: str, fn: ParseFn, *, files: str, columns: Sequence[str]) -> None:
    """Table ``name``: ``fn`` applied to the text of each file matching ``files`` on every host."""
    res, where = _target()
    if not isinstance(name, str) or not re.match(TABLE_NAME_RE, name):
        raise RegistrationError(f"{name!r} is not a table name", "start with a letter; then letters, digits, - and _")
    if name in GENERIC_TABLES:
        raise RegistrationError(f"every report has a table '{name}' already", f"name it otherwise (e.g. my_{name})")
    if name in res.parsers:
        raise RegistrationError(f"table '{name}' is registered twice (first at {res.parsers[name].where})",
                                "register each table once")
    if not callable(fn):
        raise RegistrationError(f"the parser of table '{name}' is not a function", "pass fn(text) -> rows")
    if not isinstance(files, str) or not files.strip():
        raise RegistrationError(f"table '{name}': files is not a glob", "give files='rank*.out' (in each host's "
                                                                        "folder of the collected run)")
    cols = _names(columns, f"table '{name}'")
    res.parsers[name] = Parser(name, fn, files, cols, where)


def reporter(*, tables: Sequence[str]) -> Callable[[F], F]:
    """Register the decorated ``fn(run, rep)`` as the suite's whole run report; ``tables``: those it makes."""

    def deco(fn: F) -> F:
        register_reporter(fn, tables=tables)
        return fn

    return deco


def register_reporter(fn: ReportFn, *, tables: Sequence[str]) -> None:
    """``fn(run: RunDir, rep: Report)`` builds the run's report (instead of the generic one)."""
    res, where = _target()
    if res.reporter is not None:
        raise RegistrationError(f"a second reporter (the first at {res.reporter.where})", "register one reporter")
    if not callable(fn):
        raise RegistrationError("the reporter is not a function", "pass fn(run, rep)")
    res.reporter = RunReporter(fn, _names(tables, "the reporter's tables", context=False), where)


def campaign_reporter(*, tables: Sequence[str]) -> Callable[[F], F]:
    """Register the decorated ``fn(camp, rep)`` as the suite's campaign (cross-run) report; ``tables``: those it
    makes. API 3."""

    def deco(fn: F) -> F:
        register_campaign_reporter(fn, tables=tables)
        return fn

    return deco


def register_campaign_reporter(fn: CampaignFn, *, tables: Sequence[str]) -> None:
    """``fn(camp: Campaign, rep: Report)`` builds the cross-run part of a campaign's report. API 3."""
    res, where = _target()
    if res.campaign is not None:
        raise RegistrationError(f"a second campaign reporter (the first at {res.campaign.where})",
                                "register one campaign reporter")
    if not callable(fn):
        raise RegistrationError("the campaign reporter is not a function", "pass fn(camp, rep)")
    res.campaign = CampaignReporter(fn, _names(tables, "the campaign reporter's tables", context=False), where)


def _names(columns: object, what: str, context: bool = True) -> tuple[str, ...]:
    if isinstance(columns, str) or not isinstance(columns, Sequence) or \
            not all(isinstance(c, str) and c for c in columns):
        raise RegistrationError(f"{what}: not a list of names ({columns!r})", "give a list of strings: ['step', "
                                                                               "'loss']")
    clash = [c for c in columns if c in CONTEXT_COLUMNS] if context else []
    if clash:
        raise RegistrationError(f"{what}: column '{clash[0]}' would hide the '{clash[0]}' column every table has",
                                f"call it otherwise (e.g. {clash[0]}_name)")
    if len(set(columns)) != len(columns):
        raise RegistrationError(f"{what}: a name is there twice", "list each name once")
    return tuple(columns)


def _target() -> tuple[SuiteResults, str]:
    """The SuiteResults being loaded (a throw-away one outside a load: importing a report.py in a test registers
    nothing) and ``file:line`` of the report.py line registering."""
    res = _LOADING.get()
    if res is None:
        return SuiteResults(), "?"
    frame = sys._getframe(1)
    while frame is not None and res.path is not None and Path(frame.f_code.co_filename) != res.path:
        frame = frame.f_back  # type: ignore[assignment]
    return res, f"{res.path}:{frame.f_lineno}" if frame is not None else str(res.path)


def load(path: str | Path) -> SuiteResults:
    """Run the report.py at ``path`` (once per version of the file) and return what it registered; any error in
    it is one UsageError naming its ``file:line``."""
    path = Path(path).absolute()
    try:
        st = path.stat()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", where=str(path), fix="check the file") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key in _LOADED:
        return _LOADED[key]
    res = SuiteResults(path)
    name = "testbed_suite_report_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} cannot be loaded as Python", where=str(path), fix="name it report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    token = _LOADING.set(res)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"{path.name}: syntax error: {exc.msg}", where=f"{path}:{exc.lineno}",
                         fix=f"fix that line (python3 -m py_compile {path} says it too)") from None
    except RegistrationError as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"{path.name}: {exc}", where=f"{path}:{error_line(exc, path)}", fix=exc.fix) from None
    except MemoryError:
        sys.modules.pop(name, None)
        raise  # the bound it ran under says so (testbed.report.own)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"{path.name} failed while loading: {type(exc).__name__}: {exc}",
                         where=f"{path}:{error_line(exc, path)}",
                         fix=f"fix that line; python3 {path} shows the whole traceback") from None
    finally:
        _LOADING.reset(token)
    _LOADED[key] = res
    return res


# --- helpers for reporters (API 2) ------------------------------------------------------------------------------
def csv_rows(src: Path | str, header: Sequence[str], make: Callable[[dict[str, str]], Any] = dict,
             delimiter: str = ",") -> tuple[list[Any], list[str]]:
    """(rows, notes) of the CSV file ``src`` (a Path; a str is the text itself) whose first line names at least
    the columns ``header`` (in any order): each row a mapping of column -> cell (stripped), a short row skipped
    with a note, a file lacking a column skipped whole with one. API 2; API 3: ``make(row)`` turns each mapping
    into the row kept (a ValueError or KeyError from it skips the row with a note); ``delimiter``: the cell
    separator (a tab: ``"\\t"``)."""
    parsed = parse_csv(src, header, make, delimiter)
    return list(parsed.rows), list(parsed.skipped)


def boxes(data: Mapping[str, Sequence[float]], *, ylabel: str, title: str = "") -> Draw:
    """A figure of one box per label, for ``rep.figure(name, boxes(...), caption)``. API 2."""
    return plotting.boxes(data, ylabel=ylabel, title=title)


def lines(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, xlabel: str, ylabel: str,
          title: str = "") -> Draw:
    """A figure of labelled line series (label -> (xs, ys)), for ``rep.figure(name, lines(...), caption)``.
    API 2."""
    return plotting.lines(series, xlabel=xlabel, ylabel=ylabel, title=title)


_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def rank_of(path: Path, default: int) -> int:
    """The rank named in a file or folder name (``rank3``, ``timing_rank3.csv``), else ``default``. API 3."""
    for part in reversed(path.parts):
        m = _RANK.search(part)
        if m:
            return int(m[1])
    return default


def mean_by(pairs: Iterable[tuple[int, float]]) -> tuple[list[int], list[float]]:
    """Group (x, y) pairs by x, average y; sorted by x. API 3."""
    from statistics import fmean

    groups: dict[int, list[float]] = {}
    for x, y in pairs:
        groups.setdefault(x, []).append(y)
    xs = sorted(groups)
    return xs, [fmean(groups[x]) for x in xs]


def why_missing(launched: Mapping[K, Sequence[str]], point: K, what: str = "output") -> str:
    """The ``problem`` cell of a campaign's ``missing_points`` row for a ``point`` it lacks: ``no <what> from run
    A, B`` when ``launched`` (point -> the ids of the runs launched for it) names runs for it, else ``no run``.
    Added in API 3 (an addition: a report.py that does not call it is unchanged)."""
    runs = launched.get(point, [])
    return f"no {what} from run {', '.join(runs)}" if runs else "no run"


def error_line(exc: BaseException, path: Path) -> int | str:
    """The line of ``path`` nearest the error in ``exc``'s traceback ('?' when the file is not in it)."""
    line: int | str = "?"
    tb = exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
