"""Collect: each run's outputs and logs from every host into ``results/<suite>/<run-id>/<host>/``.

Per host, in parallel (one thread each):

1. one remote command (``bash -s`` over the testbed's SSH config) expands the run's output globs (relative to the
   run folder, ``~/``-relative or absolute; files from outside the run folder only when written since the run
   folder was made, and placed under ``@home/`` and ``@root/``), prints size, mtime and sha256 of every matched
   file (a file already collected whose size and mtime are unchanged is not hashed again), says whether
   ``rsync`` is installed and, when the manifest still lacks them, prints the host's facts: one round trip.
   The run's software (Python, pip freeze, source commits) is read from the first host in a second session
   started beside the transfers, once per results folder;
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
``manifest.json`` (testbed.manifest) is rewritten after every collect and lists only files whose bytes on disk
are the verified ones (files put there otherwise are named in a note); a folder holding another run's manifest
is refused before any host is contacted. Nothing from the controller's
environment is ever written under results/.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from testbed import manifest as mf
from testbed import ssh
from testbed.errors import TestbedError, UsageError
from testbed.paths import PARTIAL_DIR
from testbed.providers.base import Host
from testbed.state import Store

LOG_PATTERNS = ("rank*.out", "rank*.err", "rank*.exit", "rank*.start", "rank*.end")
PENDING = -1  # ``collected.size`` of a file whose transfer started but was not verified yet
RUNS_DIR = "~/.testbed-runs"

ProgressFn = Callable[[str, int, int], None]
"""``progress(host, advance_bytes, add_to_total_bytes)``: called from the collecting threads."""

_PROGRESS2 = re.compile(rb"^\s*([\d,.]+)\s+\d+%")
_STATS_FILES = re.compile(r"Number of regular files transferred:\s*([\d,.]+)")
_STATS_MATCHED = re.compile(r"Matched data:\s*([\d,.]+)")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")


@dataclass
class HostCollect:
    """What collect did on one host of one run."""

    host: str
    method: str | None = None  # rsync | sftp
    files: int = 0  # files matched on the host
    sent: int = 0  # files transferred (and verified) this time
    bytes_sent: int = 0
    unchanged: int = 0  # already in results/ with the same sha256: not sent
    rsync_transferred: int | None = None  # rsync's own count (--stats), when rsync ran
    reused_bytes: int = 0  # bytes rsync did not send because a partial local copy had them (resume)
    resumed: int = 0  # sftp downloads continued from a partial file (reget)
    missing: list[str] = field(default_factory=list)  # paths (or patterns) not in results/
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


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

    @property
    def ok(self) -> bool:
        return self.error is None and all(h.error is None for h in self.hosts)

    @property
    def files_sent(self) -> int:
        return sum(h.sent for h in self.hosts)

    @property
    def bytes_sent(self) -> int:
        return sum(h.bytes_sent for h in self.hosts)

    def problems(self) -> list[str]:
        """One line per failed host (or the run's own failure)."""
        out = [f"{self.run_id}: {self.error}"] if self.error else []
        out += [f"{self.run_id} on {h.host}: {h.error}" for h in self.hosts if h.error]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "suite": self.suite, "path": str(self.path),
                "manifest": str(self.manifest) if self.manifest else None, "ok": self.ok, "error": self.error,
                "files_sent": self.files_sent, "bytes_sent": self.bytes_sent, "seconds": self.seconds,
                "notes": self.notes,
                "hosts": [asdict(h) for h in self.hosts]}


@dataclass
class _Listing:
    run_dir: str = ""
    home: str = ""
    rsync: bool = False
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (size, sha256)
    mtimes: dict[str, int] = field(default_factory=dict)  # path -> mtime on the host (s)
    nomatch: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fact_lines: list[str] = field(default_factory=list)


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
        row = st.query("SELECT suite, status, ended FROM runs WHERE id=?", (rid,))[0]
        if all_runs and not run_ended(row):
            out.append(CollectResult(rid, row["suite"], run_folder(to, row["suite"], rid),
                                     notes=[f"still {row['status']}: skipped by --all (name it to collect it now)"]))
            continue
        out.append(_collect_run(st, rid, Path(to), progress=progress, timeout=timeout, io_timeout=io_timeout,
                                bwlimit_kbps=bwlimit_kbps, force_sftp=force_sftp))
    return out


UNFINISHED = ("pending", "queued", "starting", "running")


def run_ended(row: Any) -> bool:
    """Whether a ``runs`` row is over (its files will not change any more)."""
    return row["ended"] is not None or row["status"] not in UNFINISHED


def run_folder(to: Path, suite: str, run_id: str) -> Path:
    """``<to>/<suite>/<run-id>``."""
    return Path(to) / suite / run_id


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# run level ---------------------------------------------------------------------------------------
def _resolve_ids(st: Store, run_ids: list[str], all_runs: bool) -> list[str]:
    if all_runs:
        ids = [r["id"] for r in st.query("SELECT id FROM runs ORDER BY created, id")]
        if run_ids:
            raise UsageError("give run ids or --all, not both", where="testbed collect",
                             fix="testbed collect --all, or testbed collect RUN [RUN ...]")
        return ids
    if not run_ids:
        raise UsageError("no run to collect", where="testbed collect",
                         fix="name runs (see `testbed list runs`) or pass --all")
    known = {r["id"] for r in st.query("SELECT id FROM runs")}
    unknown = [r for r in run_ids if r not in known]
    if unknown:
        raise UsageError(f"no run with id {', '.join(unknown)}", where="state",
                         fix="see `testbed list runs` for the recorded run ids")
    return list(dict.fromkeys(run_ids))


def _run_hosts(st: Store, run_id: str, testbed: str, info: dict[str, Any]) -> list[Host]:
    known = {h.name: h for h in st.hosts(testbed)}
    names = [str(h) for h in info.get("hosts") or []]
    if not names:
        names = list(dict.fromkeys(r["host"] for r in st.query(
            "SELECT host FROM run_hosts WHERE run_id=? ORDER BY rank", (run_id,))))
    if not names:
        names = list(known)
    return [known.get(n) or Host(name=n, address="", state="unknown") for n in names]


def _patterns(info: dict[str, Any], host: str) -> tuple[list[str], list[str]]:
    """(patterns, notes): the logs plus the run's declared outputs for ``host``.

    Outputs may be relative to the run folder, ``~/``-relative or absolute; suites are checked when they load
    (``suite.output_pattern_problem``), so a pattern refused here comes from a hand-edited state only.
    """
    from testbed.suite import output_pattern_problem

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
"""Where files matched by ``~/`` output globs land in a host's results folder (``<host>/@home/<path>``)."""
ROOT_DIR = "@root"
"""Where files matched by absolute output globs land (``<host>/@root/<absolute path>``)."""


def host_path(lst: _Listing, key: str) -> str:
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


def _roots(lst: _Listing, paths: list[str]) -> list[tuple[str, str, list[str]]]:
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


def _collect_run(st: Store, run_id: str, to: Path, *, progress: ProgressFn | None, timeout: float,
                 io_timeout: float, bwlimit_kbps: int | None, force_sftp: bool) -> CollectResult:
    t0 = time.monotonic()
    row = st.query("SELECT * FROM runs WHERE id=?", (run_id,))[0]
    suite, testbed = row["suite"], row["testbed"]
    info = json.loads(row["info"] or "{}")
    folder = run_folder(to, suite, run_id)
    res = CollectResult(run_id, suite, folder)
    tb = st.testbed(testbed)
    if tb is None:
        if (folder / mf.MANIFEST).is_file():
            res.notes.append(f"testbed '{testbed}' is gone; kept the results collected before")
        else:
            res.error = f"testbed '{testbed}' of this run is not provisioned any more: its hosts cannot be reached"
        return res
    hosts = _run_hosts(st, run_id, testbed, info)
    bad = [h.name for h in hosts if not _SAFE_NAME.match(h.name)]
    if bad:
        res.error = f"host name(s) unusable as folder names: {', '.join(bad)}"
        return res
    old = mf.load(folder)
    if old and old.get("run_id") != run_id:
        res.error = (f"{folder} holds the results of run {old.get('run_id')!r}, not of {run_id}: its files are never "
                     f"mixed with another run's; move that folder away or collect into another --to")
        return res
    folder.mkdir(parents=True, exist_ok=True)
    old_facts = {h.get("name"): h.get("facts") or {} for h in old.get("hosts") or [] if isinstance(h, dict)}
    have_software = bool((old.get("software") or {}).get("pip_freeze"))
    lock = threading.Lock()
    ctx = _Ctx(st, lock, testbed, run_id, folder, info, progress, timeout, io_timeout, bwlimit_kbps, force_sftp,
               final=run_ended(row))
    if not ctx.final:
        res.notes.append(f"run is still {row['status']}: files collected now may be replaced by their final "
                         f"version on the next collect")
    gathered: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def one(h: Host) -> HostCollect:
        hc, fact_lines = _collect_host(ctx, h, not (old_facts.get(h.name) or {}).get("kernel"))
        if fact_lines:
            gathered[h.name] = mf.parse_fact_lines(fact_lines)
        return hc

    sw_lines: list[str] = []
    sw_thread = None
    if not have_software and hosts:  # pip freeze is slow: its own session, beside the transfers
        sw_thread = threading.Thread(target=lambda: sw_lines.extend(_gather_software(ctx, hosts[0].name)),
                                     daemon=True, name="collect-software")
        sw_thread.start()
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts))), thread_name_prefix="collect") as pool:
        res.hosts = list(pool.map(one, hosts))
    if sw_thread is not None:
        sw_thread.join()

    facts: dict[str, dict[str, Any]] = {str(name): dict(f) for name, f in old_facts.items() if isinstance(f, dict)}
    software: dict[str, Any] = {}
    if have_software:
        osw = old.get("software") or {}
        software = {"python": osw.get("python"), "pip_freeze": osw.get("pip_freeze"),
                    "_commits": {k: (v or {}).get("commit") for k, v in (osw.get("sources") or {}).items()}}
    for name, (f, _) in gathered.items():
        if f:
            facts[name] = f
    if sw_lines:
        software = mf.parse_fact_lines(sw_lines)[1] or software
    listed = {(r["host"], r["path"]): (r["sha256"], r["size"]) for r in st.query(
        "SELECT host, path, sha256, size FROM collected WHERE run_id=? AND size>=0", (run_id,))}
    listed.update(ctx.verified)
    host_names = {h.name for h in hosts}
    rdir = str(info.get("run_dir") or f"{RUNS_DIR}/{run_id}")
    collected_at = {(r["host"], r["path"]): r["collected"] for r in st.query(
        "SELECT host, path, collected FROM collected WHERE run_id=? AND size>=0", (run_id,))}
    files = [{"host": h, "path": p, "from": origin(p, rdir), "sha256": sha, "size": size}
             for (h, p), (sha, size) in listed.items()
             if h in host_names and ((h, p) in ctx.verified or
                                     _unchanged_since(folder / h / p, sha, size, collected_at.get((h, p), 0)))]
    stray = _stray_files(folder, {(f["host"], f["path"]) for f in files}, host_names)
    if stray:
        res.notes.append(f"{len(stray)} file(s) under {folder} are not verified files of this run and are left out "
                         f"of its manifest: {', '.join(stray[:3])}{' …' if len(stray) > 3 else ''}")
    man = mf.build(st, run_id, hosts=hosts, facts=facts, software=software, files=files, provider=tb["provider"])
    try:
        res.manifest = mf.write(folder, man)
    except OSError as e:  # a full disk, a read-only folder: the files stay, the manifest is written next time
        res.error = (f"cannot write {folder / mf.MANIFEST}: {e.strerror}; the files collected so far are kept: "
                     "free some space (or choose another --to) and collect again")
    res.seconds = round(time.monotonic() - t0, 3)
    return res


@dataclass
class _Ctx:
    store: Store
    lock: threading.Lock
    testbed: str
    run_id: str
    folder: Path
    info: dict[str, Any]
    progress: ProgressFn | None
    timeout: float
    io_timeout: float
    bwlimit_kbps: int | None
    force_sftp: bool
    final: bool = True  # the run has ended: verified files are final (else recorded pending: replaceable)
    verified: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)  # this collect's files

    def done(self, host: str, items: list[tuple[str, str, int]]) -> None:
        """Files verified in results/ (path, sha256, size): recorded, and listed in the manifest."""
        with self.lock:
            for p, sha, size in items:
                self.verified[(host, p)] = (sha, size)
        self.record(host, [(p, sha, size if self.final else PENDING) for p, sha, size in items])

    def tick(self, host: str, advance: int, total: int = 0) -> None:
        if self.progress is not None and (advance or total):
            self.progress(host, advance, total)

    def rows(self, host: str) -> dict[str, tuple[str, int, float]]:
        with self.lock:
            return {r["path"]: (r["sha256"], r["size"], r["collected"]) for r in self.store.query(
                "SELECT path, sha256, size, collected FROM collected WHERE run_id=? AND host=?",
                (self.run_id, host))}

    def record(self, host: str, items: list[tuple[str, str, int]]) -> None:
        """Upsert (path, sha256, size) rows; size PENDING marks a transfer in progress."""
        if not items:
            return
        now = time.time()
        with self.lock, self.store.tx() as db:
            db.executemany("INSERT OR REPLACE INTO collected(run_id, host, path, sha256, size, collected) "
                           "VALUES (?,?,?,?,?,?)", [(self.run_id, host, p, s, n, now) for p, s, n in items])


# host level --------------------------------------------------------------------------------------
def _remote_dir(info: dict[str, Any], run_id: str) -> str:
    """Shell words for the run folder on the host (``~/`` expanded by the host's shell)."""
    from testbed.suite import path_word

    return path_word(str(info.get("run_dir") or f"{RUNS_DIR}/{run_id}"))


_PY_HASH = shlex.quote("""import hashlib, sys
for p in sys.stdin.buffer.read().split(b"\\0")[:-1]:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    print(h.hexdigest())
""")


def listing_script(run_dir_words: str, patterns: list[str], known: Sequence[tuple[int, int, str, str]] = (),
                   source_words: Sequence[str] = ()) -> str:
    """The bash script run on a host: run folder, rsync presence, then ``F<TAB>size<TAB>mtime<TAB>sha256<TAB>path``.

    ``known``: (size, mtime, sha256, path) of files already collected; a file whose size and mtime are unchanged
    (rsync's quick check) gets its known checksum instead of being hashed again, so a re-collect reads nothing.
    ``source_words``: the run's source checkouts (shell words); files outside the run folder that git tracks there
    unchanged are the artifact's own (an output folder committed with the paper's results), never this run's.
    """
    pats = " ".join(shlex.quote(p) for p in patterns)
    srcs = " ".join(source_words)
    known_lines = "".join(f"{size}\t{mtime}\t{sha}\t{path}\n" for size, mtime, sha, path in known
                          if "\n" not in path)
    return rf"""set -u
export LC_ALL=C
: "${{HOME:=/nonexistent}}"
if ! cd -- {run_dir_words} 2>/dev/null; then echo "@NODIR"; else
echo "@DIR $(pwd -P)"
echo "@HOME $HOME"
tb_ref=$(mktemp)  # files outside the run folder count only when written since the run folder was made
tb_since=$(stat -c %Z tb-rank.sh 2>/dev/null || echo 0)
touch -d "@$((tb_since - 2))" "$tb_ref" 2>/dev/null || touch -t 197001010000 "$tb_ref"
trap 'rm -f "$tb_ref"' EXIT
if command -v rsync >/dev/null 2>&1; then echo "@RSYNC 1"; else echo "@RSYNC 0"; fi
shopt -s nullglob dotglob globstar
declare -A seen=() K=()
files=()
while IFS=$'\t' read -r ksz kmt ksha kpath; do K["$kpath"]="$ksz $kmt $ksha"; done <<'TB_KNOWN_EOF'
{known_lines}TB_KNOWN_EOF
tb_hash() {{  # NUL-separated paths in, one hex digest per line out (python's sha256 uses SHA-NI; coreutils may not)
  if command -v python3 >/dev/null 2>&1; then python3 -c {_PY_HASH}
  else xargs -0 sha256sum -- | sed 's/^\\//' | cut -c1-64; fi
}}
declare -A tb_pristine=()
for tb_s in {srcs}; do  # tracked and unchanged in a source checkout: the artifact's files, not outputs
  [[ -d $tb_s/.git ]] || continue
  unset tb_mod; declare -A tb_mod=()
  while IFS= read -r -d '' x; do tb_mod["$x"]=1; done < <(git -C "$tb_s" ls-files -m -z 2>/dev/null)
  while IFS= read -r -d '' x; do [[ -n ${{tb_mod[$x]+x}} ]] || tb_pristine["$tb_s/$x"]=1
  done < <(git -C "$tb_s" ls-files -z 2>/dev/null)
done
add() {{  # a matched path -> its place in the results folder: run-relative, @home/..., @root/...
  case "$1" in *$'\n'*) echo "@NOTE skipped a file with a newline in its name"; return ;; esac
  if [[ $kind != run && -n ${{tb_pristine[$1]+x}} ]]; then pr=$((pr+1)); return 1; fi
  local f="${{1#./}}"
  case "$kind" in
    home) f="{HOME_DIR}/${{f#"$HOME"/}}" ;;
    root) f="{ROOT_DIR}$f" ;;
    *) case "$f" in {HOME_DIR}/*|{ROOT_DIR}/*)
         echo "@NOTE skipped $f: {HOME_DIR}/ and {ROOT_DIR}/ hold the files from outside the run folder"; return ;;
       esac ;;
  esac
  if [[ -z "${{seen[$f]+x}}" ]]; then seen[$f]=1; tb_src["$f"]=$1; files+=("$f"); fi
}}
declare -A tb_src=()
for pat in {pats}; do
  n=0; old=0; pr=0
  case "$pat" in "~/"*) kind=home; glob="${{pat#"~/"}}" ;; /*) kind=root; glob=$pat ;; *) kind=run; glob=$pat ;; esac
  IFS=$'\n'
  if [[ $kind == home ]]; then ms=("$HOME"/$glob); else ms=($glob); fi
  unset IFS
  for m in "${{ms[@]}}"; do
    if [[ -d $m ]]; then
      newer=(); [[ $kind == run ]] || newer=(-newer "$tb_ref")
      while IFS= read -r -d '' x; do add "$x" && n=$((n+1))
      done < <(find -L "$m" -type f "${{newer[@]}}" -print0 2>/dev/null)
    elif [[ -f $m ]]; then
      if [[ $kind == run || $m -nt $tb_ref ]]; then add "$m" && n=$((n+1)); else old=$((old+1)); fi
    fi
  done
  [[ $old -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: not written during this run\n' "$pat" "$old"
  [[ $pr -gt 0 ]] && printf '@NOTE %s: %s matching file(s) left out: the source checkout holds them unchanged\n' \
    "$pat" "$pr"
  [[ $n -eq 0 && $old -eq 0 && $pr -eq 0 ]] && printf '@NOMATCH %s\n' "$pat"
done
if ((${{#files[@]}})); then
  mapfile -t S < <(for f in "${{files[@]}}"; do printf '%s\0' "${{tb_src[$f]}}"; done | xargs -0 stat -L -c '%s %Y' --)
  declare -a Hm=() todo=()
  if [[ ${{#S[@]}} -eq ${{#files[@]}} ]]; then
    for i in "${{!files[@]}}"; do
      k=${{K[${{files[i]}}]-}}
      if [[ -n $k && "${{k% *}}" == "${{S[i]}}" ]]; then Hm[i]=${{k##* }}; else todo+=("$i"); fi
    done
    if ((${{#todo[@]}})); then
      mapfile -t H < <(for i in "${{todo[@]}}"; do printf '%s\0' "${{tb_src[${{files[i]}}]}}"; done | tb_hash)
      if [[ ${{#H[@]}} -eq ${{#todo[@]}} ]]; then
        j=0
        for i in "${{todo[@]}}"; do Hm[i]=${{H[j]}}; j=$((j+1)); done
      fi
    fi
  fi
  if [[ ${{#S[@]}} -ne ${{#files[@]}} || ${{#Hm[@]}} -ne ${{#files[@]}} ]]; then
    echo "@ERR a file vanished or is unreadable while it was being checksummed"
  else
    for i in "${{!files[@]}}"; do
      printf 'F\t%s\t%s\t%s\t%s\n' "${{S[i]% *}}" "${{S[i]#* }}" "${{Hm[i]}}" "${{files[i]}}"
    done
  fi
fi
fi
"""


def _source_words(info: dict[str, Any]) -> list[str]:
    """Shell words for the run's source checkouts on a host."""
    from testbed.suite import path_word

    return [path_word(str(s["path"])) for s in (info.get("sources") or {}).values()
            if isinstance(s, dict) and s.get("path")]


def _ssh_opts(ctx: _Ctx) -> list[str]:
    return ["-F", str(ssh.ssh_config_path(ctx.testbed)), "-o", f"ConnectTimeout={max(1, int(ctx.timeout))}"]


def _run_script(ctx: _Ctx, host: str, script: str, timeout: float) -> tuple[str, str, int | None]:
    """Run a bash script on ``host`` (stdin, one ssh session): (stdout, stderr, exit code or None on timeout)."""
    argv = ["ssh", *_ssh_opts(ctx), host, "--", "bash -s"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        rc: int | None
        try:
            proc.communicate(script.encode(), timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        return out.read().decode(errors="replace"), err.read().decode(errors="replace"), rc


def _gather_software(ctx: _Ctx, host: str) -> list[str]:
    """The run's Python, pip freeze and source commits from ``host`` (fact lines; [] when that failed)."""
    script = mf.facts_script(facts=False, python=str(ctx.info.get("python") or "python3"),
                             sources=ctx.info.get("sources")) + "echo @END\n"
    stdout, _, rc = _run_script(ctx, host, script, max(ctx.timeout, 120))
    lines = stdout.splitlines()
    return [ln for ln in lines if ln.startswith(mf.FACT_PREFIXES)] if rc == 0 and lines[-1:] == ["@END"] else []


def _list_host(ctx: _Ctx, host: str, script: str) -> tuple[_Listing | None, str | None]:
    """Run the listing script on ``host``: (listing, None) or (None, error)."""
    stdout, stderr, rc = _run_script(ctx, host, script, ctx.timeout)
    if rc is None:
        return None, f"{host} did not answer within {ctx.timeout:g} s (unreachable?)"
    if rc == 255:
        return None, ssh.describe_ssh_failure(stderr, host, ctx.testbed)
    if "@END" not in stdout.splitlines()[-1:]:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"listing the run folder on {host} failed (exit {rc}): {last}"
    lst, problem = parse_listing(stdout)
    if problem == "@NODIR":
        return None, f"the run folder {ctx.info.get('run_dir') or RUNS_DIR + '/' + ctx.run_id} does not exist on {host}"
    if problem:
        return None, f"{problem} on {host}; collect again once the run has finished writing"
    return lst, None


def parse_listing(stdout: str) -> tuple[_Listing, str | None]:
    """Parse the output of :func:`listing_script` (+ fact lines): (listing, problem or None)."""
    lst = _Listing()
    for ln in stdout.splitlines():
        if ln.startswith("F\t"):
            parts = ln.split("\t", 4)
            if len(parts) == 5 and parts[1].isdigit() and parts[2].lstrip("-").isdigit() and len(parts[3]) == 64:
                lst.files[parts[4]] = (int(parts[1]), parts[3])
                lst.mtimes[parts[4]] = int(parts[2])
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


def _collect_host(ctx: _Ctx, h: Host, want_facts: bool) -> tuple[HostCollect, list[str]]:
    t0 = time.monotonic()
    hc = HostCollect(h.name)
    pats, hc.notes = _patterns(ctx.info, h.name)
    script = ""
    if want_facts:  # gathered in the background while the listing hashes
        script = "tb_facts=$(mktemp)\n( " + mf.facts_script(facts=True) + ') > "$tb_facts" 2>/dev/null &\ntb_fpid=$!\n'
    script += "(\n" + listing_script(_remote_dir(ctx.info, ctx.run_id), pats, _known(ctx, h.name),
                                      _source_words(ctx.info)) + ")\n"
    if want_facts:
        script += 'wait "$tb_fpid"; cat "$tb_facts"; rm -f "$tb_facts"\n'
    script += "echo @END\n"
    lst, err = _list_host(ctx, h.name, script)
    if lst is None:
        hc.error = err
        known = ctx.rows(h.name)
        hc.missing = sorted(p for p in known if not (ctx.folder / h.name / p).is_file()) or pats
        hc.seconds = round(time.monotonic() - t0, 3)
        return hc, []
    hc.files = len(lst.files)
    hc.notes += lst.notes
    hc.notes += [f"no file matches {p!r}" for p in lst.nomatch if p not in LOG_PATTERNS]
    try:
        _transfer_host(ctx, h.name, lst, hc)
    except OSError as e:  # local disk trouble: name the file
        hc.error = f"cannot write {e.filename or 'results'}: {e.strerror}"
    hc.seconds = round(time.monotonic() - t0, 3)
    return hc, lst.fact_lines


def _known(ctx: _Ctx, host: str) -> list[tuple[int, int, str, str]]:
    """(size, mtime, sha256, path) of this host's verified files whose local copy still has the recorded size.

    A local copy carries the host file's mtime (rsync -t; set after sftp), so an unchanged host file matches.
    """
    hdir = ctx.folder / host
    out = []
    for path, (sha, size, _) in ctx.rows(host).items():
        if size < 0:
            continue
        try:
            st = (hdir / path).stat()
        except OSError:
            continue
        if st.st_size == size:
            out.append((size, int(st.st_mtime), sha, path))
    return out


def _plan(ctx: _Ctx, host: str, lst: _Listing, hc: HostCollect) -> tuple[list[str], list[str]]:
    """(to_send, conflicts); unchanged files are counted and (re)recorded."""
    rows = ctx.rows(host)
    hdir = ctx.folder / host
    send: list[str] = []
    conflicts: list[str] = []
    confirmed: list[tuple[str, str, int]] = []
    for path, (size, sha) in sorted(lst.files.items()):
        local = hdir / path
        try:
            st = local.stat()
        except FileNotFoundError:
            send.append(path)
            continue
        row = rows.get(path)
        # the recorded checksum holds while the file's ctime (set by the kernel on any write, rename or copy over
        # it, unlike mtime, which `cp -p` or `touch` can set back) is not after the moment it was verified
        if row and row[1] >= 0 and row[0] == sha and st.st_size == size and st.st_ctime <= row[2]:
            hc.unchanged += 1
            with ctx.lock:
                ctx.verified[(host, path)] = (sha, size)
            continue
        if local.is_file() and st.st_size == size and sha256_file(local) == sha:
            hc.unchanged += 1
            confirmed.append((path, sha, size))
        elif row and row[1] == PENDING:
            send.append(path)  # the partial file of an interrupted collect: resume it
        else:
            conflicts.append(path)
    ctx.done(host, confirmed)
    return send, conflicts


def _transfer_host(ctx: _Ctx, host: str, lst: _Listing, hc: HostCollect) -> None:
    send, conflicts = _plan(ctx, host, lst, hc)
    hdir = ctx.folder / host
    if conflicts:
        p = conflicts[0]
        local_sha = sha256_file(hdir / p) if (hdir / p).is_file() else "not a file"
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        hc.error = (f"refusing to overwrite {hdir / p}{more}: it differs from {host}:{host_path(lst, p)} "
                    f"(local sha256 {local_sha[:12]}…, host {lst.files[p][1][:12]}…); results are never "
                    f"overwritten with different content: move the local copy away or collect into another --to")
        hc.missing += conflicts
    if not send:
        return
    hc.method = "rsync" if lst.rsync and not ctx.force_sftp else "sftp"
    ctx.record(host, [(p, lst.files[p][1], PENDING) for p in send])
    ctx.tick(host, 0, sum(lst.files[p][0] for p in send))
    todo = send
    for attempt in (1, 2):
        err = _fetch(ctx, host, lst, todo, hc)
        good, bad = _verify(hdir, lst, todo)
        ctx.done(host, [(p, lst.files[p][1], lst.files[p][0]) for p in good])
        hc.sent += len(good)
        hc.bytes_sent += sum(lst.files[p][0] for p in good)
        if err is not None:
            hc.error = hc.error or err
            hc.missing += bad
            return
        if not bad:
            break
        if attempt == 2:
            hc.error = hc.error or (f"checksum mismatch for {host}:{host_path(lst, bad[0])}"
                                    f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''} after a retry: "
                                    f"the file changes on the host or the transfer corrupts it")
            hc.missing += bad
            return
        for p in bad:  # fetch these again from scratch
            (hdir / p).unlink(missing_ok=True)
        todo = bad
    _clean_rsync_temps(hdir, send)


def _unchanged_since(path: Path, sha: str, size: int, verified_at: float) -> bool:
    """Whether ``path`` still holds the bytes verified at ``verified_at`` (by ctime, else by hashing it)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if not path.is_file() or st.st_size != size:
        return False
    return st.st_ctime <= verified_at or sha256_file(path) == sha


def _stray_files(folder: Path, known: set[tuple[str, str]], hosts: set[str]) -> list[str]:
    """Files in the hosts' folders that are not among ``known`` (host, path): put there by hand or another run."""
    out = []
    for host in sorted(hosts):
        hdir = folder / host
        for dirpath, dirnames, filenames in os.walk(hdir):
            dirnames[:] = sorted(d for d in dirnames if d != PARTIAL_DIR)
            for name in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, name), hdir)
                if (host, rel) not in known and not re.fullmatch(r"\..+\.[A-Za-z0-9]{6}", name):
                    out.append(f"{host}/{rel}")
    return out


def _verify(hdir: Path, lst: _Listing, paths: list[str]) -> tuple[list[str], list[str]]:
    good: list[str] = []
    bad: list[str] = []
    for p in paths:
        local = hdir / p
        ok = local.is_file() and local.stat().st_size == lst.files[p][0] and sha256_file(local) == lst.files[p][1]
        (good if ok else bad).append(p)
    return good, bad


def _clean_rsync_temps(hdir: Path, sent: list[str]) -> None:
    """Remove rsync temp files (``.name.XXXXXX``) left by a killed collect next to files now verified, and
    partial copies of them (with their folder once empty)."""
    for d in {(hdir / p).parent for p in sent}:
        names = {Path(p).name for p in sent if (hdir / p).parent == d}
        with contextlib.suppress(OSError):
            for entry in d.iterdir():
                m = re.fullmatch(r"\.(.+)\.[A-Za-z0-9]{6}", entry.name)
                if m and m.group(1) in names and entry.is_file():
                    entry.unlink(missing_ok=True)
        partial = d / PARTIAL_DIR
        with contextlib.suppress(OSError):
            for name in names:
                (partial / name).unlink(missing_ok=True)
            partial.rmdir()  # only when empty


def _fetch(ctx: _Ctx, host: str, lst: _Listing, paths: list[str], hc: HostCollect) -> str | None:
    hdir = ctx.folder / host
    hdir.mkdir(parents=True, exist_ok=True)
    if hc.method == "rsync":
        return _fetch_rsync(ctx, host, lst, paths, hc)
    return _fetch_sftp(ctx, host, lst, paths, hc)


def _fetch_rsync(ctx: _Ctx, host: str, lst: _Listing, paths: list[str], hc: HostCollect) -> str | None:
    """One rsync per root the paths live under (the run folder, the home folder, ``/``)."""
    for remote_root, local_sub, rel in _roots(lst, paths):
        err = _rsync_root(ctx, host, remote_root, ctx.folder / host / local_sub if local_sub else ctx.folder / host,
                          rel, hc)
        if err is not None:
            return err
    return None


def _rsync_root(ctx: _Ctx, host: str, remote_root: str, hdir: Path, paths: list[str],
                hc: HostCollect) -> str | None:
    hdir.mkdir(parents=True, exist_ok=True)
    rsh = shlex.join(["ssh", *_ssh_opts(ctx), "-o", "ControlMaster=no"])
    with tempfile.NamedTemporaryFile("wb", prefix="testbed-files-") as fl, tempfile.TemporaryFile() as err:
        fl.write(b"".join(p.encode() + b"\0" for p in paths))
        fl.flush()
        # a partial file waits in PARTIAL_DIR (resumed next time), never under the file's own name
        argv = ["rsync", "-rtL", f"--partial-dir={PARTIAL_DIR}", "--from0", f"--files-from={fl.name}",
                "--info=progress2", "--stats",
                f"--timeout={max(1, int(ctx.io_timeout))}", "-e", rsh]
        if ctx.bwlimit_kbps:
            argv.append(f"--bwlimit={int(ctx.bwlimit_kbps)}")
        argv += [f"{host}:{remote_root}/", f"{hdir}/"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        assert proc.stdout is not None
        dog = _Watchdog(proc, ctx.io_timeout)
        text = _pump_progress(proc.stdout, lambda n: ctx.tick(host, n), dog.pet)
        rc = proc.wait()
        dog.stop()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    m = _STATS_FILES.search(text)
    if m:
        hc.rsync_transferred = (hc.rsync_transferred or 0) + int(re.sub(r"\D", "", m.group(1)) or 0)
    m = _STATS_MATCHED.search(text)
    if m:
        hc.reused_bytes += int(re.sub(r"\D", "", m.group(1)) or 0)
    if rc == 0:
        return None
    if dog.fired:
        return (f"the connection to {host} was lost during the transfer (no data for {ctx.io_timeout:g} s); "
                f"collect again to resume: files already received are kept")
    return _describe_transfer_failure(ctx, host, rc, stderr, "rsync")


class _Watchdog:
    """Stops a transfer that received nothing for ``limit`` seconds (SIGTERM, so rsync keeps the partial file).

    rsync's own ``--timeout`` does not fire while ssh keeps the pipe open over a dead link, so this is the
    bound on how long a cut link can hold a collect.
    """

    def __init__(self, proc: subprocess.Popen[bytes], limit: float):
        self.proc, self.limit = proc, limit
        self.last = time.monotonic()
        self.fired = False
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="collect-watchdog").start()

    def pet(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(0.25):
            if time.monotonic() - self.last > self.limit and self.proc.poll() is None:
                self.fired = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                if self._done.wait(3) or self.proc.poll() is not None:
                    return
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                return


def _pump_progress(stream: IO[bytes], advance: Callable[[int], None], activity: Callable[[], None]) -> str:
    """Read rsync's output, feeding ``--info=progress2`` byte counts to ``advance``; returns the rest."""
    last = 0
    buf = b""
    keep: list[bytes] = []
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        activity()
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for ln in lines:
            m = _PROGRESS2.match(ln)
            if m:
                n = int(re.sub(rb"\D", b"", m.group(1)) or 0)
                if n > last:
                    advance(n - last)
                    last = n
            elif ln.strip():
                keep.append(ln)
    keep.append(buf)
    return b"\n".join(keep).decode(errors="replace")


def _describe_transfer_failure(ctx: _Ctx, host: str, rc: int | None, stderr: str, tool: str) -> str:
    last = (stderr.strip().splitlines() or [f"exit {rc}"])[-1]
    if rc == 30 or "timeout" in stderr.lower() or any(e in stderr for e in ("Broken pipe", "Connection reset",
                                                                            "Connection timed out",
                                                                            "No route to host")):
        return (f"the connection to {host} was lost during the transfer ({last}); collect again to resume: "
                f"files already received are kept")
    if rc == 255 or "connection unexpectedly closed" in stderr:
        return f"{ssh.describe_ssh_failure(stderr, host, ctx.testbed)} ({tool} exit {rc})"
    return f"{tool} from {host} failed (exit {rc}): {last}"


def _sftp_arg(path: str, *, remote: bool) -> str:
    """``path`` as one word of an sftp batch line (unquoted, backslash-escaped; remote paths are globbed)."""
    out = []
    for c in path:
        if c in "?[*\\":
            if not remote:
                raise TestbedError(f"the results path {path!r} contains {c!r}, which sftp cannot write to",
                                   where=path, fix="collect into a --to folder without * ? [ or \\ in its path")
            out.append("\\" + c)  # kept escaped for sftp's glob, which removes the escape
        elif c.isalnum() or c in "/._-+@%,:=":
            out.append(c)
        else:
            out.append("\\" + c)
    return "".join(out)


def _stage(ctx: _Ctx, host: str, path: str) -> Path:
    """Where sftp downloads ``path`` before it is moved into place (a partial file waits there for reget)."""
    return ctx.folder / ".partial" / host / hashlib.sha256(path.encode()).hexdigest()[:32]


def _fetch_sftp(ctx: _Ctx, host: str, lst: _Listing, paths: list[str], hc: HostCollect) -> str | None:
    """Fetch ``paths`` with one ``sftp -b`` batch into a staging folder; partial downloads resume (``reget``)."""
    hdir = ctx.folder / host
    staged = {p: _stage(ctx, host, p) for p in paths}
    next(iter(staged.values())).parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for p, tmp in staged.items():
        verb = "get"
        if tmp.is_file() and 0 < tmp.stat().st_size < lst.files[p][0]:
            verb = "reget"
            hc.resumed += 1
        else:
            tmp.unlink(missing_ok=True)
        src = _sftp_arg(host_path(lst, p), remote=True)
        lines.append(f"{verb} {src} {_sftp_arg(str(tmp.absolute()), remote=False)}")
    alive = max(1, int(ctx.io_timeout) // 3)
    argv = ["sftp", *_ssh_opts(ctx), "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3", "-q", "-b", "-"]
    if ctx.bwlimit_kbps:
        argv += ["-l", str(int(ctx.bwlimit_kbps) * 8)]
    argv.append(host)

    def local_bytes() -> int:
        total = 0
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                total += tmp.stat().st_size
        return total

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write(("\n".join(lines) + "\n").encode())
        proc.stdin.close()
        seen = local_bytes()
        idle_since = time.monotonic()
        stalled = False
        while proc.poll() is None:
            time.sleep(0.1)
            now_bytes = local_bytes()
            if now_bytes != seen:
                ctx.tick(host, max(0, now_bytes - seen))
                seen, idle_since = now_bytes, time.monotonic()
            elif time.monotonic() - idle_since > ctx.io_timeout:
                stalled = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        ctx.tick(host, max(0, local_bytes() - seen))
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    for p, tmp in staged.items():  # complete downloads go into place; _verify checks them
        with contextlib.suppress(OSError):
            if tmp.stat().st_size == lst.files[p][0]:
                (hdir / p).parent.mkdir(parents=True, exist_ok=True)
                mtime = lst.mtimes.get(p)
                if mtime is not None:
                    os.utime(tmp, (mtime, mtime))  # like rsync -t: the next listing's quick check matches
                os.replace(tmp, hdir / p)
    for d in (next(iter(staged.values())).parent, ctx.folder / ".partial"):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty
    if stalled:
        return (f"the connection to {host} was lost during the transfer (no data for {ctx.io_timeout:g} s); "
                f"collect again to resume: files already received are kept")
    if proc.returncode == 0:
        return None
    return _describe_transfer_failure(ctx, host, proc.returncode, stderr, "sftp")


def format_problems(results: list[CollectResult]) -> TestbedError | None:
    """One TestbedError summarising every failed host and run, or None when all went well."""
    lines = [p for r in results for p in r.problems()]
    if not lines:
        return None
    failed_hosts = sorted({h.host for r in results for h in r.hosts if h.error})
    what = (f"collect incomplete: {len(lines)} problem(s)\n  " + "\n  ".join(lines)) if len(lines) > 1 \
        else f"collect incomplete: {lines[0]}"
    where = ", ".join(failed_hosts) if failed_hosts else "state"
    return TestbedError(what, where=where,
                        fix="fix the cause and run the same collect again: verified files are kept and only "
                            "missing or partial ones are fetched")
