"""What a host holds for a run: the output globs expanded on the host, with size, mtime and sha256 of each file.

``listing_script`` is the one remote program (testbed/scripts/listing.sh, run by ``bash -s``) per host: it
expands the run's output globs (run-relative, ``~/``-relative or absolute), hashes what changed since the last
collect (a file is left unread only while its size, mtime, ctime and inode are what they were when it was hashed:
:class:`testbed.state.FileStamp`), says whether rsync is installed and prints the host's facts when asked;
``parse_listing`` reads its output back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed import scripts
from testbed.collect import manifest as mf
from testbed.state import FileStamp
from testbed.suite import output_pattern_problem

LOG_PATTERNS = ("rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end")
RUNS_DIR = "~/.testbed-runs"
UNHASHED = "-"
"""The checksum a lazy listing gives a file it left for the stream to hash (``listing_script(lazy=...)``)."""
RACY_NS = 10**9
"""A file whose ctime is this close to the listing's clock (or later) may be written again without its ctime
moving (the kernel stamps times from a clock that ticks every few ms; some file systems keep whole seconds), so
its stat is not kept for the next quick check (git's racy-timestamp rule): it is hashed once more next time."""


@dataclass
class Listing:
    run_dir: str = ""
    home: str = ""
    rsync: bool = False
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (size, sha256)
    mtimes: dict[str, int] = field(default_factory=dict)  # path -> mtime on the host (s)
    ids: dict[str, tuple[int | None, int]] = field(default_factory=dict)  # path -> (ctime ns or None, inode)
    now_ns: int | None = None  # the host's clock before it looked at the files (None: it did not say)
    nomatch: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fact_lines: list[str] = field(default_factory=list)

    def stamp(self, path: str) -> FileStamp | None:
        """The host's stat of ``path`` as listed, for the next quick check; None where a later write might leave
        it as it is: no ctime in ns, a ctime within RACY_NS of the listing's clock, or no clock said."""
        ctime, ino = self.ids.get(path, (None, 0))
        mtime = self.mtimes.get(path)
        if ctime is None or mtime is None or self.now_ns is None or ctime > self.now_ns - RACY_NS:
            return None
        return FileStamp(mtime, ctime, ino)


def output_patterns(info: dict[str, Any], host: str) -> tuple[list[str], list[str]]:
    """(patterns, notes): the logs plus the run's declared outputs for ``host``.

    Outputs may be relative to the run folder, ``~/``-relative or absolute; suites are checked when they load
    (``suite.output_pattern_problem``), so a pattern refused here comes from a hand-edited state only.
    """
    outputs = info.get("outputs") or {}
    declared: list[str] = []
    if isinstance(outputs, list):
        declared = [str(p) for p in outputs]
    elif isinstance(outputs, dict):
        declared = [str(p) for p in (outputs.get("*") or [])] + [str(p) for p in (outputs.get(host) or [])]
    pats, notes = list(LOG_PATTERNS), []
    for p in declared:
        problem = output_pattern_problem(p)
        if problem:
            notes.append(f"output pattern {p!r} ignored: {problem}")
        elif p not in pats:
            pats.append(p)
    return pats, notes


HOME_DIR = "@home"
"""Where files matched by ``~/`` output globs land in a host's results folder (``<host>/@home/<path>``; the
name is written as such in testbed/scripts/listing.sh)."""
ROOT_DIR = "@root"
"""Where files matched by absolute output globs land (``<host>/@root/<absolute path>``; as in listing.sh)."""


def host_path(lst: Listing, key: str) -> str:
    """The file's path on the host, for a path in a host's results folder."""
    if key.startswith(HOME_DIR + "/"):
        return f"{lst.home}/{key[len(HOME_DIR) + 1:]}"
    if key.startswith(ROOT_DIR + "/"):
        return "/" + key[len(ROOT_DIR) + 1:]
    return f"{lst.run_dir}/{key}"


def origin(key: str, run_dir: str) -> str:
    """Where a file of a host's results folder came from on the host (``~/``, absolute or in the run folder)."""
    if key.startswith(HOME_DIR + "/"):
        return "~/" + key[len(HOME_DIR) + 1:]
    if key.startswith(ROOT_DIR + "/"):
        return "/" + key[len(ROOT_DIR) + 1:]
    return f"{run_dir.rstrip('/')}/{key}"


def roots(lst: Listing, paths: list[str]) -> list[tuple[str, str, list[str]]]:
    """(host folder, local sub-folder, paths relative to both) for each root the paths live under."""
    groups: dict[str, list[str]] = {}
    for p in paths:
        top = p.split("/", 1)[0]
        groups.setdefault(top if top in (HOME_DIR, ROOT_DIR) else "", []).append(
            p[len(top) + 1:] if top in (HOME_DIR, ROOT_DIR) else p)
    out = []
    for top, rel in groups.items():
        remote = {"": lst.run_dir, HOME_DIR: lst.home, ROOT_DIR: ""}[top]
        out.append((remote, top, rel))
    return out


# host level --------------------------------------------------------------------------------------
def run_dir(info: dict[str, Any], run_id: str) -> str:
    """The run folder on the host (``~/`` is the host user's home)."""
    return str(info.get("run_dir") or f"{RUNS_DIR}/{run_id}")


def listing_script(run_dir: str, patterns: list[str], known: Sequence[tuple[int, int, int, int, str, str]] = (),
                   sources: Sequence[str] = (), background: str = "", lazy: tuple[int, int] = (0, 0),
                   stream: tuple[str, int] | None = None, budget: float = 0) -> str:
    """The program listing ``run_dir`` on a host (for ``bash -s``): testbed/scripts/listing.sh with its arguments.

    ``known``: (size, mtime, ctime ns, inode, sha256, path) of files already collected, as the host's stat said
    when it hashed them (:class:`FileStamp`); a file whose four are unchanged gets its known checksum instead of
    being hashed again, so a re-collect reads nothing. Size and mtime alone (rsync's quick check) would miss a
    file rewritten with its old size and mtime (``cp -p``, ``touch -r``, two writes within a second).
    ``sources``: the run's source checkouts on the host; files outside the run folder that git tracks there
    unchanged are the artifact's own (an output folder committed with the paper's results), never this run's.
    ``background``: a bash program run while the files are hashed (the host's facts); its output follows.
    ``lazy``: (files, bytes): when at least that many files or bytes would be hashed (and the host has python3),
    they are listed with checksum ``-`` (UNHASHED) instead: the collector streams them and the host hashes them
    while sending them.
    ``stream``: (token, bytes/s or 0): files listed with ``-`` are sent in the same session, right after the
    listing and a line ``@STREAM token`` (testbed/scripts/stream.py's format); ``background``'s output then comes
    first. The collector reads that output with :class:`testbed.collect.transfer.ListingStream`.
    ``budget``: seconds the listing may take on the host (0: no limit); past it, it stops and says how far it got,
    and what it started is killed, so nothing outlives a collect that gave up.
    """
    known_lines = "".join(f"{size}\t{mtime}\t{ctime}\t{ino}\t{sha}\t{path}\n"
                          for size, mtime, ctime, ino, sha, path in known if "\n" not in path)
    send = f"{stream[0]} {stream[1]} {scripts.text('stream.py')}" if stream else ""
    return scripts.program("listing.sh", run_dir, known_lines, "\n".join(sources), background, f"{lazy[0]} {lazy[1]}",
                           send, f"{max(0.0, budget):.0f}", *patterns)


def source_paths(info: dict[str, Any]) -> list[str]:
    """The run's source checkouts on a host."""
    return [str(s["path"]) for s in (info.get("sources") or {}).values() if isinstance(s, dict) and s.get("path")]


def parse_listing(stdout: str) -> tuple[Listing, str | None]:
    """Parse the output of :func:`listing_script` (+ fact lines): (listing, problem or None)."""
    lst = Listing()
    for ln in stdout.splitlines():
        if ln.startswith("F\t"):  # F size mtime ctime_ns|- inode sha256|- path
            parts = ln.split("\t", 6)
            if len(parts) == 7 and parts[1].isdigit() and parts[2].lstrip("-").isdigit() and \
                    (parts[3].isdigit() or parts[3] == "-") and parts[4].isdigit() and \
                    (len(parts[5]) == 64 or parts[5] == UNHASHED):
                lst.files[parts[6]] = (int(parts[1]), parts[5])
                lst.mtimes[parts[6]] = int(parts[2])
                lst.ids[parts[6]] = (int(parts[3]) if parts[3].isdigit() else None, int(parts[4]))
        elif ln.startswith("@NOW ") and ln[5:].isdigit():
            lst.now_ns = int(ln[5:])
        elif ln == "@NODIR":
            return lst, ln
        elif ln.startswith("@DIR "):
            lst.run_dir = ln[5:]
        elif ln.startswith("@HOME "):
            lst.home = ln[6:].rstrip("/")
        elif ln.startswith("@RSYNC "):
            lst.rsync = ln.endswith("1")
        elif ln.startswith("@NOMATCH "):
            lst.nomatch.append(ln[9:])
        elif ln.startswith("@NOTE "):
            lst.notes.append(ln[6:])
        elif ln.startswith("@ERR "):
            return lst, ln[5:]
        elif ln.startswith(mf.FACT_PREFIXES):
            lst.fact_lines.append(ln)
    return lst, None
