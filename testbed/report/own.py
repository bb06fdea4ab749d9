"""A suite's own ``report.py``: which file may run, and running it bounded, in a child process.

Results are data. :func:`choose` picks the report.py of a suite from the places a user's own suites live: a suite
folder named by its path in this command (``report --suite PATH``, ``show PATH``), the file the run's manifest
recorded (when it still has the sha256 the run recorded), the working folder's ``experiments/<name>/``, the
shipped suites. It never picks one inside a run folder (a ``.suite/`` copy included) or inside the results tree
being reported, whatever a link or a manifest says (both the path as written and the path links lead to are
judged), nor one that another user owns or anyone may write. A received results folder is reported with its
declared tables, and the report names the tables only its suite's reporter makes and how to get them.

The chosen file runs in a child process forked from a clean server (:data:`SECONDS` of wall time, :data:`MEMORY`
bytes of address space): its top level (:func:`registered`), its parsers and run reporter (:func:`run_reporters`),
its campaign reporter (:func:`campaign_reporter`). An error, an early exit of the process, an overrun or running out
of memory is reported as what it is, naming the file.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from testbed import paths
from testbed.collect.suite_copy import sha256
from testbed.errors import UsageError
from testbed.paths import MANIFEST, SUITE_FILE
from testbed.report.model import Report, Table
from testbed.report.rundir import RunDir
from testbed.results import FILE_NAME, load

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from testbed.results import SuiteResults
    from testbed.suite import Suite

T = TypeVar("T")
S = TypeVar("S")  # what a reporter reads: a run folder or a campaign
SECONDS = float(os.environ.get("TESTBED_REPORT_SECONDS", "300"))
"""The wall time one run of a report.py may take (its load, or its reporters over one run or campaign)."""
MEMORY = int(os.environ.get("TESTBED_REPORT_MEMORY_MB", "4096")) << 20
"""The address space a report.py's process may use."""
COPY_DIRS = (".suite", ".profile")
"""The folders collect writes a suite's and a profile's copy into, inside a run folder."""


# --- what a report.py registered, as plain data -----------------------------------------------------------------
@dataclass(frozen=True)
class ParserInfo:
    """A registered parser without its function: table ``name`` from ``files``, with ``columns``."""

    name: str
    files: str
    columns: tuple[str, ...]
    where: str


@dataclass(frozen=True)
class Made:
    """A registered run or campaign reporter without its function: the tables it makes."""

    tables: tuple[str, ...]
    where: str


@dataclass(frozen=True)
class Registered:
    """What one report.py registered, read in its child process."""

    path: Path
    parsers: dict[str, ParserInfo] = field(default_factory=dict)
    reporter: Made | None = None
    campaign: Made | None = None

    def tables(self) -> set[str]:
        """The tables it makes: its parsers', its reporter's and its campaign reporter's."""
        return set(self.parsers) | set(self.reporter.tables if self.reporter else ()) | \
            set(self.campaign.tables if self.campaign else ())


def plain(res: SuiteResults) -> Registered:
    return Registered(
        Path(str(res.path)), {n: ParserInfo(p.name, p.files, p.columns, p.where) for n, p in res.parsers.items()},
        Made(res.reporter.tables, res.reporter.where) if res.reporter else None,
        Made(res.campaign.tables, res.campaign.where) if res.campaign else None)


# --- which report.py may run ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """The report.py to run (None: none), and why one that exists is not run (None: nothing refused)."""

    path: Path | None
    refused: str | None = None


def results_root(run: Path) -> Path:
    """The top of the results tree holding the run folder ``run``: the highest of its parent and grandparent
    that holds run folders (``results/<suite>/<run>``: ``results``)."""
    top = run.parent
    for up in (run.parent, run.parent.parent):
        if any(up.glob(f"*/{MANIFEST}")) or any(up.glob(f"*/*/{MANIFEST}")):
            top = up
    return top


def _inside_results(path: Path, roots: list[Path]) -> str | None:
    """Why ``path`` lies in a results folder (None: it does not), judged on the path as written and as its
    links lead."""
    for p in dict.fromkeys((Path(os.path.abspath(path)), path.resolve())):
        copy = next((d for d in COPY_DIRS if d in p.parts), None)
        if copy is not None:
            return f"it is a copy collect made in a run folder ({copy}/)"
        holder = next((d for d in p.parents if (d / MANIFEST).is_file()), None)
        if holder is not None:
            return f"it is inside the run folder {holder}"
        for root in roots:
            for r in dict.fromkeys((Path(os.path.abspath(root)), root.resolve())):
                if p.is_relative_to(r):
                    return f"it is inside the results folder being read ({r})"
    return None


def _not_own(path: Path) -> str | None:
    """Why the file at ``path`` and its folder are not the user's to run (None: they are): owned by another user
    than this one or root, or writable by every user."""
    for p in (path.resolve(), path.resolve().parent):
        st = p.stat()
        if st.st_uid not in (os.getuid(), 0):
            return f"{p} belongs to another user (uid {st.st_uid})"
        if st.st_mode & stat.S_IWOTH and not (p.is_dir() and st.st_mode & stat.S_ISVTX):
            return f"every user may write {p}"
    return None


def _recorded(run: RunDir | None) -> tuple[Path | None, str | None]:
    """The suite file a run's manifest recorded, and the sha256 of the report.py beside it then (None: none)."""
    rec = run.manifest.get("suite_file") if run is not None else None
    if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
        return None, None
    want = rec.get("report_sha256")
    return Path(rec["path"]), want if isinstance(want, str) else None


def choose(suite: Suite | None, run: RunDir | None = None) -> Choice:
    """The report.py of ``suite`` that may run when reading ``run`` (or, without a run, the one beside the suite
    file as named), from the places a user's suites live; never one from a results folder (module doc)."""
    if suite is None:
        return Choice(None)
    roots = [results_root(run.path)] if run is not None else []
    recorded, want = _recorded(run)
    found = paths.find_suite(suite.name)
    candidates: list[tuple[Path, str | None]] = [
        (f / FILE_NAME, None) for f in paths.named_suite_folders() if f.name == suite.name]
    if suite.source:
        source = Path(os.path.abspath(suite.source))
        candidates.append((source.parent / FILE_NAME, want if recorded is not None and
                           Path(os.path.abspath(recorded)) == source else None))
    if found is not None and found.name == SUITE_FILE:
        candidates.append((Path(os.path.abspath(found)).parent / FILE_NAME, None))
    refused: str | None = None
    for path, sha in dict.fromkeys(candidates):
        if not path.is_file():
            continue
        why = _inside_results(path, roots) or _not_own(path)
        if why is None and sha is not None and sha256(path) != sha:
            why = "it is not the report.py the run recorded (another sha256)"
        if why is None:
            return Choice(path)
        refused = refused or f"{path} is not run: {why}"
    return Choice(None, refused)


def missing_note(suite: Suite, refused: str, made_elsewhere: list[str]) -> str:
    """The note a report carries when the suite's report.py was not run: which tables need it, how to get them."""
    tables = f"its tables {', '.join(made_elsewhere)} are" if made_elsewhere else "the tables it makes are"
    return (f"{refused}; a results folder is data, its code never runs: {tables} not in this report. To get them, "
            f"put the suite's folder in ./experiments/{suite.name}/ (a copy you have read) or name it: "
            f"testbed report PATH --suite experiments/{suite.name}")


# --- running it, bounded ----------------------------------------------------------------------------------------
_CONTEXT: Any = None
_REGISTERED: dict[tuple[str, int, int], Registered] = {}


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["testbed.report.folders"])
    return _CONTEXT


def _child(conn: Connection, job: Callable[..., Any], path: str, args: tuple[Any, ...], memory: int) -> None:
    """In the child: bound the address space, load the report.py at ``path``, run ``job`` on it, send the outcome."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        out: tuple[str, Any] = ("ok", job(load(path), *args))
    except UsageError as exc:
        out = ("usage", (exc.what, exc.where, exc.fix))
    except MemoryError:
        out = ("memory", None)
    except BaseException as exc:
        out = ("error", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(out)
    except Exception as exc:
        conn.send(("error", f"its result cannot be read back ({type(exc).__name__}: {exc}); keep cells to "
                            "numbers, text, None and testbed's records"))
    conn.close()


class Stopped(UsageError):
    """A report.py's process that ran past its time, ran out of memory, or ended before it returned."""


def bounded(path: Path, job: Callable[..., T], *args: Any, what: str = "loading",
            seconds: float | None = None, memory: int | None = None) -> T:
    """``job(the report.py's SuiteResults, *args)`` in a child process, its result sent back. An error in the
    file is a UsageError naming it; an early exit, an overrun or running out of memory is :class:`Stopped`."""
    ctx = _context()
    seconds = SECONDS if seconds is None else seconds
    memory = MEMORY if memory is None else memory
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, job, str(path), args, memory), daemon=True)
    proc.start()
    send.close()
    got, overran = None, False
    try:
        if recv.poll(seconds):  # a result, or the end of the pipe when the process ended without one
            got = recv.recv()
        else:
            overran = True
    except EOFError:
        pass
    finally:
        recv.close()
    if overran:
        proc.kill()
    proc.join(10)
    fix = f"fix {path.name} (python3 {path} alone shows what its top level does)"
    if overran:
        raise Stopped(f"{path.name} ({what}) ran past {seconds:g} s and was stopped", where=str(path),
                      fix=f"{fix}; TESTBED_REPORT_SECONDS raises the bound")
    if got is None:
        how = f"exit status {proc.exitcode}" if (proc.exitcode or 0) >= 0 else f"signal {-proc.exitcode}"
        raise Stopped(f"{path.name} ({what}) ended its process ({how}) before it returned its result",
                      where=str(path), fix=f"{fix}: a report.py must not call exit() or os._exit(), nor kill its "
                                           f"process; one that needs more than {memory >> 20} MiB is stopped too")
    kind, value = got
    if kind == "ok":
        return value  # type: ignore[no-any-return]
    if kind == "usage":
        raise UsageError(value[0], where=value[1], fix=value[2])
    if kind == "memory":
        raise Stopped(f"{path.name} ({what}) ran out of memory (bound {memory >> 20} MiB)", where=str(path),
                      fix=f"{fix}; TESTBED_REPORT_MEMORY_MB raises the bound")
    raise UsageError(f"{path.name} ({what}) failed: {value}", where=str(path), fix=fix)


def registered(path: Path) -> Registered:
    """What the report.py at ``path`` registers, read in a child (once per version of the file)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _REGISTERED:
        _REGISTERED[key] = bounded(path, plain)
    return _REGISTERED[key]


ParserOut = tuple[Table, list[str], str | None]
"""A report.py parser's table of one run, its notes, and the error that stopped it (None: none)."""


def call_reporter(fn: Callable[[S, Report], None], subject: S, rep: Report, what: str) -> None:
    """Run a reporter; a broken output must still give a report (the error is a skip note and a failed check)."""
    try:
        fn(subject, rep)
    except Exception as exc:
        rep.skip([f"{what} stopped: {type(exc).__name__}: {exc}"])
        rep.check("report complete", False, f"reporter error: {exc}")


def stopped(rep: Report, exc: Stopped) -> None:
    """Note in ``rep`` that the suite's report.py was stopped (the report is made without what it makes)."""
    rep.skip([exc.what])
    rep.check("report complete", False, f"{exc.what} ({exc.fix})")
