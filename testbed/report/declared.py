"""A suite's own results: its declared ``tables:`` (testbed.tables) and its ``report.py`` (testbed.results).

:func:`locate_suite` finds the suite a collected run ran; :func:`own_results` loads its report.py;
:func:`add_own_tables` adds both kinds of tables to a run's report; :func:`add_table_checks` judges the suite's
``checks:`` that name a table. :func:`unknown_tables` is what ``testbed show`` and ``run --dry-run`` refuse: a
reference or check naming a table that nothing makes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import paths, points
from testbed.errors import UsageError
from testbed.paths import PARTIAL_DIR
from testbed.report import own as own_mod
from testbed.report import registry
from testbed.report.model import Report, Table
from testbed.report.own import Registered
from testbed.report.parsers.declared import Row, csv_rows, json_rows, keep, regex_rows, typed_columns
from testbed.report.rundir import REPORT_DIR, RunDir
from testbed.report.suites import get_campaign_reporter, get_reporter
from testbed.report.textio import summarise_skips
from testbed.report.verdicts import _same, _value
from testbed.results import error_line
from testbed.suite import SUITE_NAME_RE, load_suite
from testbed.tables import CONTEXT_COLUMNS, GENERIC_TABLES, DeclaredTable

if TYPE_CHECKING:
    from testbed.results import Parser
    from testbed.suite import Suite
    from testbed.yamlfile import Loc

MAX_FILE_BYTES = 256 << 20
"""A file larger than this is not read into a table (a note says so): a table is for results, not a disk image."""
MAX_ROWS = 500_000
"""The most rows one table keeps (a note counts the rest)."""
_RANK = re.compile(r"^rank[_-]?(\d+)\b", re.IGNORECASE)
REPORT_SUMMARY_TABLES = ("run", "params", "hosts", "events", "timeline", "recovery", "goodput", "lost", "unanswered")
"""The tables testbed's summary makes in every run's report (testbed.report.summary.add_summary)."""


# --- the suite of a run ---------------------------------------------------------------------------------------
def locate_suite(run: RunDir) -> tuple[Suite | None, str | None]:
    """(the suite ``run`` ran, as its file reads now, None) or (None, why it is not read; None when there is no
    file to read): the file the manifest records, else ``experiments/<suite>/suite.yml`` or ``.yml`` (this
    folder's, then the shipped one), else the copy collect made in the run folder (``.suite/``: YAML only, never
    its report.py)."""
    rec = run.manifest.get("suite_file")
    recorded = Path(str(rec["path"])) if isinstance(rec, dict) and isinstance(rec.get("path"), str) else None
    path: Path | None = recorded if recorded is not None and recorded.is_absolute() and recorded.is_file() else None
    if path is None and re.match(SUITE_NAME_RE, run.suite):
        path = paths.find_suite(run.suite)
    if path is None:
        copy = run.manifest.get("suite_copy")
        rel = copy.get("path") if isinstance(copy, dict) else None
        if isinstance(rel, str) and (run.path / rel).is_file() and ".." not in Path(rel).parts:
            path = run.path / rel
    if path is None:
        return None, None
    try:
        return load_suite(str(path), named=False), None  # a manifest's path names no suite folder
    except UsageError as exc:
        return None, f"suite {run.suite!r} not read ({path}): {exc.what}"


def report_py(suite: Suite, run: RunDir | None = None) -> Path | None:
    """The suite's report.py that may run when reading ``run`` (testbed.report.own.choose), or None; never one
    from a results folder."""
    return own_mod.choose(suite, run).path


def own_results(suite: Suite | None, run: RunDir | None = None) -> Registered | None:
    """What the suite's report.py registers (None without one it may run), read in a bounded child; a broken
    one is a UsageError at its line."""
    path = report_py(suite, run) if suite is not None else None
    return own_mod.registered(path) if path is not None else None


# --- building -------------------------------------------------------------------------------------------------
def glob_rx(pattern: str) -> re.Pattern[str]:
    """A glob over paths relative to a host folder: ``*`` and ``?`` within a folder, ``**`` across folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            out, i = out + "[" + ("^" + body[1:] if body.startswith("!") else body) + "]", end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def host_files(run: RunDir, pattern: str) -> list[tuple[str, str, Path]]:
    """(host, path in the host folder, path) of every collected file matching ``pattern``, by host then path."""
    rx = glob_rx(pattern.lstrip("/").removeprefix("./"))
    found: list[tuple[str, str, Path]] = []
    for host in run.hosts:
        hdir = run.path / host
        if not hdir.is_dir() or host == REPORT_DIR or "/" in host or host in (".", ".."):  # never outside the run
            continue
        for p in sorted(hdir.rglob("*")):
            rel = p.relative_to(hdir)
            if p.is_file() and not p.is_symlink() and PARTIAL_DIR not in rel.parts and rx.fullmatch(rel.as_posix()):
                found.append((host, rel.as_posix(), p))
    return found


def _context(host: str, rel: str) -> Row:
    m = _RANK.match(Path(rel).name)
    return {"host": host, "rank": int(m[1]) if m else None, "file": rel}


def _read(path: Path, label: str, notes: list[str]) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{label}: larger than {MAX_FILE_BYTES >> 20} MiB; not read")
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        notes.append(f"{label}: unreadable ({exc.strerror})")
        return None


def declared_table(run: RunDir, name: str, spec: DeclaredTable) -> tuple[Table, list[str]]:
    """Table ``name`` read from the run's files as ``spec`` says, and notes on what was skipped."""
    rows: list[Row] = []
    notes: list[str] = []
    files = host_files(run, spec.files)
    for host, rel, path in files:
        label = f"{host}/{rel}"
        text = _read(path, label, notes)
        if text is None:
            continue
        if spec.format == "csv":
            got = csv_rows(text, spec.delimiter, label)
        elif spec.format == "json":
            got = json_rows(text, label)
        else:
            got = regex_rows(text, spec.regex or "", label)
        notes += got.skipped
        _, kept, missing = keep(got.rows, spec.columns, label)
        notes += missing
        rows += [{**_context(host, rel), **r} for r in kept]
    if not files:
        notes.append(f"table {name}: no collected file matches {spec.files!r} on any host")
    names = spec.names()
    if names is None:
        names = [c for c in keep(rows, None)[0] if c not in CONTEXT_COLUMNS]
    return _table(name, names, rows, spec.types, notes)


def _table(name: str, names: list[str], rows: list[Row], types: Mapping[str, str],
           notes: list[str]) -> tuple[Table, list[str]]:
    if len(rows) > MAX_ROWS:
        notes.append(f"table {name}: {len(rows) - MAX_ROWS} rows past the first {MAX_ROWS} left out")
        rows = rows[:MAX_ROWS]
    notes += [f"table {name}: {n}" for n in typed_columns(names, rows, types)]
    columns = [*CONTEXT_COLUMNS, *names]
    table = Table(name, columns, [[r.get(c) for c in columns] for r in rows], f"{name} (declared in the suite)")
    return table, summarise_skips(f"table {name}", notes)


def parser_table(run: RunDir, p: Parser) -> tuple[Table, list[str], str | None]:
    """The table of a report.py parser, notes, and the error that stopped it (None: none)."""
    rows: list[Row] = []
    notes: list[str] = []
    for host, rel, path in host_files(run, p.files):
        label = f"{host}/{rel}"
        text = _read(path, label, notes)
        if text is None:
            continue
        try:
            got = [dict(r) for r in p.fn(text)]
        except Exception as exc:
            file = p.where.rsplit(":", 1)[0]
            line = error_line(exc, Path(file))
            return Table(p.name, [*CONTEXT_COLUMNS, *p.columns], []), notes, \
                f"parser '{p.name}' ({file}:{line}) failed on {label}: {type(exc).__name__}: {exc}"
        rows += [{**_context(host, rel), **{c: r.get(c) for c in p.columns}} for r in got]
    table, notes = _table(p.name, list(p.columns), rows, {}, notes)
    table.title = f"{p.name} (report.py)"
    return table, notes, None


def add_own_tables(run: RunDir, rep: Report, suite: Suite | None,
                   parsed: Mapping[str, own_mod.ParserOut] | None = None) -> None:
    """The suite's declared tables, then its report.py parsers' tables (``parsed``: each parser's table, notes
    and error, made in the report.py's child), each under one heading."""
    declared = suite.tables if suite is not None else {}
    if not declared and not parsed:
        return
    rep.heading("Results tables")
    for name, spec in declared.items():
        table, notes = declared_table(run, name, spec)
        rep.blocks.append(table)
        rep.skip(notes)
    for table, notes, error in (parsed or {}).values():
        rep.blocks.append(table)
        rep.skip(notes)
        if error:
            rep.skip([error])
            rep.check("report complete", False, error)


# --- table checks ---------------------------------------------------------------------------------------------
def add_table_checks(rep: Report, suite: Suite | None, params: dict[str, Any] | None = None) -> None:
    """Each of the suite's checks that names a table and applies at the run's point (``params``: its ``when:``),
    judged on the report's tables."""
    if suite is None:
        return
    by_name = {t.name: t for t in rep.tables}
    applying = [c for _, c in points.checks(suite, params)] if params is not None else \
        [c for c in suite.checks if c.when is None]
    for c in applying:
        if c.table is None:
            continue
        table = by_name.get(c.table)
        if table is None:
            rep.check(c.name, False, f"no table {c.table} in this report")
            continue
        wanted = [k for k in [*c.where, *([c.column] if c.column else [])] if k not in table.columns]
        if wanted:
            rep.check(c.name, False, f"no column {', '.join(wanted)} in {c.table}")
            continue
        idx = {k: table.columns.index(k) for k in c.where}
        rows = [r for r in table.rows if all(_same(r[i], c.where[k]) for k, i in idx.items())]
        where = " where " + ", ".join(f"{k}={v}" for k, v in c.where.items()) if c.where else ""
        if len(rows) < c.rows:
            rep.check(c.name, False, f"{len(rows)} rows{where} in {c.table}; at least {c.rows} wanted")
            continue
        if c.column is None:
            rep.check(c.name, True, f"{len(rows)} rows{where} in {c.table}")
            continue
        values = [_value(r[table.columns.index(c.column)]) for r in rows]
        rep.check(c.name, *_bounded(values, c.column, c.min, c.max, where))


def _bounded(values: Sequence[bool | int | float | str | None], column: str, lo: float | None, hi: float | None,
             where: str) -> tuple[bool, str]:
    bad = [v for v in values if not isinstance(v, int | float) or isinstance(v, bool)
           or (lo is not None and v < lo) or (hi is not None and v > hi)]
    span = f"at most {hi:g}" if lo is None else f"at least {lo:g}" if hi is None else f"within [{lo:g}, {hi:g}]"
    if bad:
        return False, f"{len(bad)} of {len(values)} {column} values{where} not a number {span} (first: {bad[0]!r})"
    nums = [float(v) for v in values if v is not None]  # each a number by now (any other value is bad above)
    seen = f"{min(nums):g}..{max(nums):g}" if nums else "none"
    return True, f"{len(values)} {column} values{where} {span} ({seen})"


# --- the static check -----------------------------------------------------------------------------------------
def known_tables(suite: Suite, own: Registered | None) -> set[str] | None:
    """Every table the suite's reports can hold (None: not known, a built-in reporter declares none)."""
    out = set(REPORT_SUMMARY_TABLES) | set(GENERIC_TABLES) | set(suite.tables)
    if own is not None:
        out |= own.tables()
    builtin = (("run", own is not None and own.reporter is not None, get_reporter(suite.name)),
               ("campaign", own is not None and own.campaign is not None, get_campaign_reporter(suite.name)))
    for kind, has_own, fn in builtin:
        if fn is not None and not has_own:
            made = registry.tables_of(kind, suite.name)
            if made is None:
                return None
            out |= made
    return out


def unmade_tables(suite: Suite) -> list[str]:
    """The tables the suite's references and checks name that only its report.py makes (nothing declared or
    built in does)."""
    known = known_tables(suite, None) or set()
    named = [r.table for r in (suite.references.metrics if suite.references is not None else [])]
    named += [c.table for c in suite.checks if c.table is not None]
    return sorted({t for t in named if t not in known})


def unknown_tables(suite: Suite) -> list[UsageError]:
    """Each reference and check of ``suite`` naming a table no parser, declared table or report.py makes (or a
    column a declared table does not have), as the error ``show`` and ``--dry-run`` raise; a broken report.py
    is the one error."""
    choice = own_mod.choose(suite)
    if choice.path is None and choice.refused is not None:
        return []  # its report.py is not run (a copy in a results folder): the tables it makes are not known
    try:
        own = own_mod.registered(choice.path) if choice.path is not None else None
    except UsageError as exc:
        return [exc]
    known = known_tables(suite, own)
    if known is None:
        return []
    errors: list[UsageError] = []
    named: list[tuple[Loc, str, Iterable[str]]] = []
    if suite.references is not None:
        named += [(("references", "metrics", i), r.table, [r.column, *r.where])
                  for i, r in enumerate(suite.references.metrics)]
    named += [(("checks", i), c.table, [*([c.column] if c.column else []), *c.where])
              for i, c in enumerate(suite.checks) if c.table is not None]
    for loc, table, columns in named:
        if table not in known:
            import difflib

            close = difflib.get_close_matches(table, sorted(known), n=1)
            own_names = sorted(set(suite.tables) | (own.tables() if own else set()))
            errors.append(UsageError(
                f"{suite.name}: table '{table}' is made by no parser, declared table or report.py, so its "
                "value would never be measured", where=suite.at(*loc, "table"),
                fix=(f"did you mean '{close[0]}'? " if close else "")
                + "declare it under tables: (a regex, CSV or JSON files), or register it in the suite's report.py"
                + (f"; this suite's own tables: {', '.join(own_names)}" if own_names else "")))
            continue
        cols = _columns_of(suite, own, table)
        missing = [c for c in columns if cols is not None and c not in cols]
        if missing:
            errors.append(UsageError(
                f"{suite.name}: table '{table}' has no column '{missing[0]}'", where=suite.at(*loc),
                fix=f"name one of its columns: {', '.join(cols or [])}"))
    return errors


def _columns_of(suite: Suite, own: Registered | None, table: str) -> list[str] | None:
    """The columns of one of the suite's own tables, when known before any run (None: not known)."""
    spec = suite.tables.get(table)
    if spec is not None:
        names = spec.names()
        return None if names is None else [*CONTEXT_COLUMNS, *names]
    if own is not None and table in own.parsers:
        return [*CONTEXT_COLUMNS, *own.parsers[table].columns]
    return None
