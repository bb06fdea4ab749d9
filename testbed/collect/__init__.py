"""Collect: each run's outputs and logs from every host into ``results/<suite>/<run-id>/<host>/``.

Per host, in parallel (one thread each):

1. one remote program (testbed/scripts/listing.sh on ``bash -s``, through testbed.remote) expands the run's output
   globs (relative to the run folder, ``~/``-relative or absolute; files from outside the run folder only when
   written since the run folder was made, and placed under ``@home/`` and ``@root/``), prints size, mtime,
   ctime, inode and sha256 of every matched file (a file already collected is not hashed again while its size,
   mtime, ctime and inode are those recorded when it was hashed: a rewrite that kept size and mtime moves the
   ctime), says whether ``rsync`` is installed and, when the manifest still lacks them, prints the host's facts:
   one round trip.
   The run's software (Python, pip freeze, source commits) is read from the first host, once per results folder:
   its listing also prints the source commits and the fingerprint of the Python's installed software; while that
   fingerprint is the one of a freeze already taken there, the freeze is reused (testbed.collect.software), else
   it is taken in a second session beside the transfers;
2. files whose verified copy is already in results/ (same sha256, recorded in the ``collected`` table, and not
   changed since: its ctime, which no copy or ``touch`` can set back) are skipped; a local file with other
   content is never overwritten, unless it is the partial file of an interrupted collect (its row in
   ``collected`` has ``size = -1``: pending);
3. the rest goes in one ``rsync --files-from`` (``--partial-dir=.testbed-partial`` so an interrupted transfer
   resumes while no unverified file sits under its final name; ``--timeout`` so a cut link fails in seconds), or
   one ``sftp -b`` batch into a staging folder when the host has no rsync;
4. every received file is hashed and compared with the host's checksum: a mismatch is fetched once more, then
   reported naming file and host; verified files are recorded in ``collected``.

An unreachable host is reported with its files missing; the other hosts are still collected. The run's
``manifest.json`` (testbed.collect.manifest) is rewritten after every collect that changes it and lists only files
whose bytes on disk are the verified ones (files put there otherwise are named in a note); a folder holding another
run's manifest is refused before any host is contacted. A run of which no file was ever verified gets no manifest,
and the folders this collect made for it are removed: a folder without files is never a run. Nothing from the
controller's environment is ever written under results/. The suite that ran (its YAML and files, while they
still hash as they did when the run was planned) and its profile are copied into ``.suite/`` and ``.profile/``
of the run folder (testbed.collect.suite_copy): ``testbed reproduce`` replays that copy and nothing outside.

A run whose hosts are gone (its testbed destroyed since, or destroyed and provisioned again: new hosts, new disks;
see :func:`hosts_gone`, read from state alone) is never retried: the results collected before are kept, and a run
never collected is named as one that cannot be collected any more (``lost``): a problem when it was named, a line
for ``--all``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed import remote
from testbed.collect import manifest as mf
from testbed.collect import software as swcache
from testbed.collect import suite_copy
from testbed.collect.listing import (
    LOG_PATTERNS,
    RUNS_DIR,
    Listing,
    listing_script,
    origin,
    output_patterns,
    run_dir,
    source_paths,
)
from testbed.collect.transfer import (
    RSYNC_TEMP,
    STREAM_MIN,
    Ctx,
    HostCollect,
    ProgressFn,
    gather_software,
    known_files,
    list_and_stream,
    list_host,
    listing_budget,
    transfer_host,
    unchanged_since,
)
from testbed.errors import TestbedError, UsageError
from testbed.hosts import Host
from testbed.paths import MANIFEST, PARTIAL_DIR, run_folder
from testbed.providers import KEEPS_HOSTS
from testbed.records import Manifest, RunRecord
from testbed.state import Store
from testbed.textfmt import plural

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")


@dataclass
class CollectResult:
    """One run's collect: its results folder, manifest and per-host outcome."""

    run_id: str
    suite: str
    path: Path
    manifest: Path | None = None
    hosts: list[HostCollect] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    lost: str | None = None  # why this run cannot be collected any more (its hosts are gone); nothing was kept
    named: bool = False  # asked for by its id (not by --all): a lost run is then a problem

    @property
    def ok(self) -> bool:
        return self.error is None and self.lost is None and all(h.error is None for h in self.hosts)

    @property
    def files_sent(self) -> int:
        return sum(h.sent for h in self.hosts)

    @property
    def bytes_sent(self) -> int:
        return sum(h.bytes_sent for h in self.hosts)

    def problems(self) -> list[str]:
        """One line per failed host (or the run's own failure)."""
        out = [f"{self.run_id}: {self.error}"] if self.error else []
        if self.lost and self.named:
            out.append(lost_line(self))
        out += [f"{self.run_id} on {h.host}: {h.error}" for h in self.hosts if h.error]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "suite": self.suite, "path": str(self.path),
                "manifest": str(self.manifest) if self.manifest else None, "ok": self.ok, "error": self.error,
                "lost": self.lost,
                "files_sent": self.files_sent, "bytes_sent": self.bytes_sent, "seconds": self.seconds,
                "notes": self.notes,
                "hosts": [asdict(h) for h in self.hosts]}


# public API --------------------------------------------------------------------------------------
def collect_runs(run_ids: list[str] | None, to: Path, *, all_runs: bool = False, progress: ProgressFn | None = None,
                 store: Store | None = None, timeout: float = 30, io_timeout: float = 30,
                 bwlimit_kbps: int | None = None, force_sftp: bool = False) -> list[CollectResult]:
    """Collect runs (``run_ids``, or every run with ``all_runs``) into ``to``; one result per run.

    Failures of a host or run are in the results (``ok``/``problems()``), never raised; an unknown run id is a
    UsageError before any host is touched. ``timeout``: seconds for a host's listing command; ``io_timeout``:
    seconds without data before a transfer is given up (it resumes on the next collect).
    """
    st = store or Store.open_default()
    ids = _resolve_ids(st, run_ids or [], all_runs)
    out = []
    for rid in ids:
        run = st.run(rid)
        assert run is not None  # _resolve_ids checked it
        if all_runs and not run_ended(run) and hosts_gone(st, run) is None:
            out.append(CollectResult(rid, run.suite, run_folder(to, run.suite, rid),
                                     notes=[f"still {run.status}: skipped by --all (name it to collect it now)"]))
            continue
        res = _collect_run(st, run, Path(to), progress=progress, timeout=timeout, io_timeout=io_timeout,
                           bwlimit_kbps=bwlimit_kbps, force_sftp=force_sftp)
        res.named = not all_runs
        out.append(res)
    return out


def hosts_gone(st: Store, run: RunRecord) -> str | None:
    """Why the hosts that held ``run``'s files are gone, or None while they may hold them still.

    From state alone (no host is contacted): the run's testbed is not recorded any more (destroyed), or its record
    is newer than the run (destroyed and provisioned again: new hosts, new disks), unless its provider's destroy
    leaves the hosts as they were (``Provider.keeps_hosts``: lab machines).
    """
    tb = st.testbed(run.testbed)
    if tb is None:
        return (f"testbed '{run.testbed}' was destroyed after this run and its hosts with it (had they been lab "
                f"machines, which keep their files: provision '{run.testbed}' again, then collect)")
    if float(tb["created"]) > run.created and tb["provider"] not in KEEPS_HOSTS:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(tb["created"])))
        return (f"testbed '{run.testbed}' was destroyed after this run and provisioned again at {when}: its hosts "
                f"are new ones, without this run's files")
    return None


def lost_line(res: CollectResult) -> str:
    """The one line saying that (and why) ``res``'s run cannot be collected any more."""
    return f"{res.run_id} cannot be collected any more: {res.lost}"


UNFINISHED = ("pending", "queued", "starting", "running")


def run_ended(run: RunRecord) -> bool:
    """Whether a run is over (its files will not change any more)."""
    return run.ended is not None or run.status not in UNFINISHED


# run level ---------------------------------------------------------------------------------------
def _resolve_ids(st: Store, run_ids: list[str], all_runs: bool) -> list[str]:
    if all_runs:
        ids = st.run_ids()
        if run_ids:
            raise UsageError("give run ids or --all, not both", where="testbed collect",
                             fix="testbed collect --all, or testbed collect RUN [RUN ...]")
        return ids
    if not run_ids:
        raise UsageError("no run to collect", where="testbed collect",
                         fix="name runs (see `testbed list runs`) or pass --all")
    unknown = [r for r in run_ids if st.run(r) is None]
    if unknown:
        raise UsageError(f"no run with id {', '.join(unknown)}", where="state",
                         fix="see `testbed list runs` for the recorded run ids")
    return list(dict.fromkeys(run_ids))


def _run_hosts(st: Store, run: RunRecord) -> list[Host]:
    known = {h.name: h for h in st.hosts(run.testbed)}
    names = list(run.info.hosts)
    if not names:
        names = list(dict.fromkeys(r.host for r in st.run_ranks(run.id)))
    if not names:
        names = list(known)
    return [known.get(n) or Host(name=n, address="", state="unknown") for n in names]


def _collect_run(st: Store, run: RunRecord, to: Path, *, progress: ProgressFn | None, timeout: float,
                 io_timeout: float, bwlimit_kbps: int | None, force_sftp: bool) -> CollectResult:
    t0 = time.monotonic()
    folder = run_folder(to, run.suite, run.id)
    res = CollectResult(run.id, run.suite, folder)
    gone = hosts_gone(st, run)
    tb = st.testbed(run.testbed)
    if gone is not None or tb is None:
        _kept_or_lost(res, run, gone or f"testbed '{run.testbed}' is not recorded any more")
        return res
    hosts = _run_hosts(st, run)
    old = mf.load(folder)
    res.error = _refused(run, hosts, folder, old)
    if res.error:
        return res
    made = _missing_parents(folder, Path(to))  # removed again when nothing of the run could be fetched
    folder.mkdir(parents=True, exist_ok=True)
    old_facts: dict[str, dict[str, Any]] = {  # as the manifest (untrusted) holds them: objects only
        str(h.get("name")): f for h in _listed(old.get("hosts"))
        if isinstance(h, dict) and isinstance(f := h.get("facts"), dict)}
    have_software = bool(_object(old.get("software")).get("pip_freeze"))
    rdir = run.info.run_dir or f"{RUNS_DIR}/{run.id}"
    ctx = Ctx(st, threading.Lock(), run.testbed, run.id, folder, run.info.to_json(), progress, timeout, io_timeout,
              bwlimit_kbps, force_sftp, final=run_ended(run),
              shared_home=bool(run.info.shared_home) and rdir.startswith("~"))
    if not ctx.final:
        res.notes.append(f"run is still {run.status}: files collected now may be replaced by their final "
                         f"version on the next collect")
    sw = _Software(ctx, hosts[0].name if hosts and not have_software else None)  # the run's software is read there
    gathered = _fetch_hosts(ctx, res, hosts, old_facts, sw)
    facts, software = _facts_and_software(old, old_facts, gathered, sw.lines, have_software)
    files = _manifest_files(ctx, hosts, rdir)
    stray = _stray_files(folder, {(f["host"], f["path"]) for f in files}, {h.name for h in hosts})
    if stray:
        res.notes.append(f"{plural(len(stray), 'file')} under {folder}: not verified files of this run, left out "
                         f"of its manifest: {', '.join(stray[:3])}{' …' if len(stray) > 3 else ''}")
    if not files and not old:  # nothing of the run was fetched: no manifest-only folder, which would read as a run
        _remove_empty(made)
        if not any(h.error for h in res.hosts):
            res.notes.append("no file of this run was found on its hosts: no manifest written")
    else:
        man = mf.build(st, run.id, hosts=hosts, facts=facts, software=software, files=files,
                       provider=tb["provider"])
        man["suite_copy"], why = suite_copy.copy_suite(ctx.info, folder, old.get("suite_copy"))
        if why:
            res.notes.append(why)
        _write_manifest(res, man, old)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


def _object(v: object) -> dict[str, Any]:
    """A JSON object of an earlier manifest (untrusted: the folder may have been edited), else an empty one."""
    return v if isinstance(v, dict) else {}


def _listed(v: object) -> list[Any]:
    """A JSON list of an earlier manifest, else an empty one."""
    return v if isinstance(v, list) else []


def _refused(run: RunRecord, hosts: list[Host], folder: Path, old: Manifest) -> str | None:
    """Why the run cannot be collected into ``folder`` (``old``: the manifest there), before anything is written."""
    bad = [h.name for h in hosts if not _SAFE_NAME.match(h.name)]
    if bad:
        return f"host name(s) unusable as folder names: {', '.join(bad)}"
    if old and old.get("run_id") != run.id:
        return (f"{folder} holds the results of run {old.get('run_id')!r}, not of {run.id}: its files are never "
                f"mixed with another run's; move that folder away or collect into another --to")
    return None


class _Software:
    """The run's software (python, pip freeze, source commits), read on one host (``host``; None: the manifest
    has it already) beside the transfers."""

    def __init__(self, ctx: Ctx, host: str | None):
        self.ctx, self.host = ctx, host
        self.python = str(ctx.info.get("python") or "python3")
        self.lines: list[str] = []
        self.threads: list[threading.Thread] = []

    def read(self, lst: Listing) -> None:
        """The first host's listing is back: its software from the cache while the host's fingerprint holds,
        else a pip freeze in a session of its own, beside the transfers."""
        assert self.host is not None
        st, testbed, host = self.ctx.store, self.ctx.testbed, self.host
        commits = [ln for ln in lst.fact_lines if ln.startswith("@S ")]
        hit = swcache.cached(st, testbed, host, self.python,
                             mf.parse_fact_lines(lst.fact_lines)[1].get("_fingerprint"))
        if hit is not None:
            self.lines.extend(hit + commits)
            return

        def gather() -> None:
            lines = gather_software(self.ctx, host)
            swcache.remember(st, testbed, host, self.python, lines)
            self.lines.extend(lines)

        t = threading.Thread(target=gather, daemon=True, name="collect-software")
        self.threads.append(t)
        t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join()


def _fetch_hosts(ctx: Ctx, res: CollectResult, hosts: list[Host], old_facts: dict[str, dict[str, Any]],
                 sw: _Software) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """List and transfer every host in parallel (``res.hosts``); the facts each listing printed, by host."""
    gathered: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def one(h: Host) -> HostCollect:
        hc, fact_lines = _collect_host(ctx, h, not (old_facts.get(h.name) or {}).get("kernel"),
                                       software=sw.read if h.name == sw.host else None)
        if fact_lines:
            gathered[h.name] = mf.parse_fact_lines(fact_lines)
        return hc

    # one run folder on a shared home: the first host's files are fetched, the others' same files linked to them
    lead = [one(hosts[0])] if ctx.shared_home and len(hosts) > 1 else []
    res.hosts = lead + remote.each(one, hosts[len(lead):], name="collect")
    sw.join()
    return gathered


def _facts_and_software(old: Manifest, old_facts: dict[str, dict[str, Any]],
                        gathered: dict[str, tuple[dict[str, Any], dict[str, Any]]], sw_lines: list[str],
                        have_software: bool) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each host's facts and the run's software: what this collect read, else what the manifest held."""
    facts: dict[str, dict[str, Any]] = {name: dict(f) for name, f in old_facts.items()}
    software: dict[str, Any] = {}
    if have_software:
        osw = _object(old.get("software"))
        software = {"python": osw.get("python"), "pip_freeze": osw.get("pip_freeze"),
                    "_commits": {k: _object(v).get("commit") for k, v in _object(osw.get("sources")).items()}}
    for name, (f, _) in gathered.items():
        if f:
            facts[name] = f
    if sw_lines:
        software = mf.parse_fact_lines(sw_lines)[1] or software
    return facts, software


def _manifest_files(ctx: Ctx, hosts: list[Host], rdir: str) -> list[dict[str, Any]]:
    """The run's verified files (this collect's, and earlier ones' still unchanged on disk) as manifest rows."""
    rows = ctx.store.collected(ctx.run_id, verified=True)
    listed = {(r.host, r.path): (r.sha256, r.size) for r in rows}
    listed.update(ctx.verified)
    host_names = {h.name for h in hosts}
    collected_at = {(r.host, r.path): r.collected for r in rows}
    return [{"host": h, "path": p, "from": origin(p, rdir), "sha256": sha, "size": size}
            for (h, p), (sha, size) in listed.items()
            if h in host_names and ((h, p) in ctx.verified or
                                    unchanged_since(ctx.folder / h / p, sha, size, collected_at.get((h, p), 0)))]


def _write_manifest(res: CollectResult, man: Manifest, old: Manifest) -> None:
    folder = res.path
    try:  # the same manifest as the one read at the start (an unchanged re-collect): nothing to write
        res.manifest = folder / MANIFEST if man == old else mf.write(folder, man)
    except OSError as e:  # a full disk, a read-only folder: the files stay, the manifest is written next time
        res.error = (f"cannot write {folder / MANIFEST}: {e.strerror}; the files collected so far are kept: "
                     "free some space (or choose another --to) and collect again")


def _kept_or_lost(res: CollectResult, run: RunRecord, gone: str) -> None:
    """A run whose hosts are gone: the results collected before are kept (a note says what never came back),
    else the run is ``lost``. Nothing is written."""
    old = mf.load(res.path)
    files = [f for f in _listed(old.get("files")) if isinstance(f, dict)] if old.get("run_id") == run.id else []
    if not files:
        res.lost = gone
        return
    res.manifest = res.path / MANIFEST
    have = {str(f.get("host")) for f in files}
    missing = [h for h in run.info.hosts if h not in have]
    res.notes.append(f"{gone}; kept the {plural(len(files), 'file')} collected before"
                     + (f" (none of {', '.join(missing)} had been collected)" if missing else ""))


def _missing_parents(folder: Path, to: Path) -> list[Path]:
    """The folders from ``to`` down to ``folder`` that do not exist yet, deepest first."""
    out = []
    p = folder
    while p != p.parent and not p.exists():
        out.append(p)
        if p == to:
            break
        p = p.parent
    return out


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders ``made`` (deepest first) as long as nothing but empty folders is in them."""
    for top in made:
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):  # not empty (a partial file of an interrupted transfer): kept
                os.rmdir(dirpath)


def _collect_host(ctx: Ctx, h: Host, want_facts: bool,
                  software: Callable[[Listing], None] | None = None) -> tuple[HostCollect, list[str]]:
    """List and transfer one host; ``software``: this host is where the run's software is read (the listing
    also prints its fingerprint and the source commits; the callback gets the listing before the transfer)."""
    t0 = time.monotonic()
    hc = HostCollect(h.name)
    pats, hc.notes = output_patterns(ctx.info, h.name)
    background = ""  # gathered while the listing hashes
    if want_facts or software is not None:
        background = mf.facts_script(facts=want_facts, sources=ctx.info.get("sources") if software else None,
                                     fingerprint=str(ctx.info.get("python") or "python3") if software else None)
    # many new files: sent in the listing's session, hashed as they stream (on a shared home only by the first
    # host: the others' listings hash, and what the first brought is linked, not sent again)
    first = _first_collect(ctx, h.name) and not (ctx.shared_home and bool(ctx.verified))
    token = secrets.token_hex(8)
    program = listing_script(run_dir(ctx.info, ctx.run_id), pats, known_files(ctx, h.name), source_paths(ctx.info),
                             background, STREAM_MIN if first else (0, 0),
                             stream=(token, int(ctx.bwlimit_kbps * 1024) if ctx.bwlimit_kbps else 0) if first else None,
                             budget=listing_budget(ctx, streamed=first))
    streamed = False
    try:
        if first:
            lst, err, streamed = list_and_stream(ctx, h.name, program, token, hc, software)
        else:
            lst, err = list_host(ctx, h.name, program)
    except OSError as e:  # local disk trouble while the files streamed in: name the file
        lst, err = None, f"cannot write {e.filename or 'results'}: {e.strerror}"
    except TestbedError as e:
        lst, err = None, e.what
    if lst is None:
        hc.error = err
        known = ctx.rows(h.name)
        hc.missing = sorted(p for p in known if not (ctx.folder / h.name / p).is_file()) or pats
        hc.seconds = round(time.monotonic() - t0, 3)
        return hc, []
    if software is not None and not streamed:  # (a streaming listing called it before its files)
        software(lst)
    hc.files = len(lst.files)
    hc.notes += lst.notes
    hc.notes += [f"no file matches {p!r}" for p in lst.nomatch if p not in LOG_PATTERNS]
    try:
        if not streamed:
            transfer_host(ctx, h.name, lst, hc)
    except OSError as e:  # local disk trouble: name the file
        hc.error = f"cannot write {e.filename or 'results'}: {e.strerror}"
    if hc.shared:
        hc.notes.append(f"{plural(hc.shared, 'file')} of the shared home's run folder fetched once, from another "
                        "host: linked here")
    hc.seconds = round(time.monotonic() - t0, 3)
    return hc, lst.fact_lines


def _first_collect(ctx: Ctx, host: str) -> bool:
    """Whether nothing of ``host`` was collected into this folder yet (no record, no file, no partial file)."""
    if ctx.force_sftp or ctx.rows(host):
        return False
    with contextlib.suppress(FileNotFoundError), os.scandir(ctx.folder / host) as entries:
        return next(entries, None) is None
    return True


def _stray_files(folder: Path, known: set[tuple[str, str]], hosts: set[str]) -> list[str]:
    """Files in the hosts' folders that are not among ``known`` (host, path): put there by hand or another run."""
    out = []
    for host in sorted(hosts):
        hdir = folder / host
        for dirpath, dirnames, filenames in os.walk(hdir):
            dirnames[:] = sorted(d for d in dirnames if d != PARTIAL_DIR)
            for name in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, name), hdir)
                if (host, rel) not in known and not RSYNC_TEMP.fullmatch(name):
                    out.append(f"{host}/{rel}")
    return out


def format_problems(results: list[CollectResult]) -> TestbedError | None:
    """One TestbedError summarising every failed host and run, or None when all went well (runs that cannot be
    collected any more are problems only when they were named: ``--all`` lists them and goes on)."""
    lines = [p for r in results for p in r.problems()]
    if not lines:
        return None
    failed_hosts = sorted({h.host for r in results for h in r.hosts if h.error})
    what = (f"collect incomplete: {plural(len(lines), 'problem')}\n  " + "\n  ".join(lines)) if len(lines) > 1 \
        else f"collect incomplete: {lines[0]}"
    where = ", ".join(failed_hosts) if failed_hosts else "state"
    retry = any(r.error or any(h.error for h in r.hosts) for r in results)
    lost = "runs that cannot be collected any more have no files left anywhere: run their suites again for new " \
        "results (collect --all lists them and collects the rest)"
    if not retry:
        return TestbedError(what, where=where, fix=lost)
    fix = "fix the cause and run the same collect again: verified files are kept and only missing or partial ones " \
        "are fetched"
    return TestbedError(what, where=where, fix=fix + ("; " + lost if any(r.lost and r.named for r in results) else ""))
