"""Moving a host's files into results/: what to send, rsync or sftp, verification by sha256, resumption.

A file whose verified copy is already in results/ is skipped; a local file with other content is never
overwritten (unless it is the partial file of an interrupted collect); what is sent is hashed and compared with
the host's checksum, fetched once more on a mismatch, and recorded in the ``collected`` table once verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import remote, scripts, ssh
from testbed.collect import manifest as mf
from testbed.collect.listing import UNHASHED, Listing, host_path, parse_listing, roots, run_dir
from testbed.errors import TestbedError
from testbed.paths import PARTIAL_DIR
from testbed.state import CollectedFile, FileStamp, Store

PENDING = -1  # ``collected.size`` of a file whose transfer started but was not verified yet

ProgressFn = Callable[[str, int, int], None]
"""``progress(host, advance_bytes, add_to_total_bytes)``: called from the collecting threads."""

RSYNC_TEMP = re.compile(r"\.(.+)\.[A-Za-z0-9]{6}")  # where rsync writes a file before renaming it
_STATS_FILES = re.compile(r"Number of regular files transferred:\s*([\d,.]+)")
_STATS_MATCHED = re.compile(r"Matched data:\s*([\d,.]+)")


STREAM_MIN = (32, 64 << 20)
"""A host's first collect streams its files (hashed while sent) when at least this many files or bytes are new:
one read of each file on either side, overlapped with the transfer, instead of hashing, sending, hashing again."""


@dataclass
class HostCollect:
    """What collect did on one host of one run."""

    host: str
    method: str | None = None  # stream | rsync | sftp (stream+rsync when a stream's leftovers went by rsync)
    files: int = 0  # files matched on the host
    sent: int = 0  # files transferred (and verified) this time
    bytes_sent: int = 0
    unchanged: int = 0  # already in results/ with the same sha256: not sent
    shared: int = 0  # on a shared home: the same file another host of this collect brought (linked, not sent)
    rsync_transferred: int | None = None  # rsync's own count (--stats), when rsync ran
    reused_bytes: int = 0  # bytes rsync did not send because a partial local copy had them (resume)
    resumed: int = 0  # sftp downloads continued from a partial file (reget)
    missing: list[str] = field(default_factory=list)  # paths (or patterns) not in results/
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass
class Ctx:
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
    shared_home: bool = False  # one run folder on every host: a file is fetched once and linked for the others
    verified: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)  # this collect's files

    def done(self, host: str, items: list[tuple[str, str, int, FileStamp | None]]) -> None:
        """Files verified in results/ (path, sha256, size, the host's stat of it when hashed: ``Listing.stamp``):
        recorded, and listed in the manifest."""
        with self.lock:
            for p, sha, size, _ in items:
                self.verified[(host, p)] = (sha, size)
        self.record(host, [(p, sha, size, stamp) if self.final else (p, sha, PENDING, None)
                           for p, sha, size, stamp in items])

    def tick(self, host: str, advance: int, total: int = 0) -> None:
        if self.progress is not None and (advance or total):
            self.progress(host, advance, total)

    def rows(self, host: str) -> dict[str, CollectedFile]:
        with self.lock:
            return {r.path: r for r in self.store.collected(self.run_id, host)}

    def record(self, host: str, items: list[tuple[str, str, int, FileStamp | None]]) -> None:
        """Upsert (path, sha256, size, host stamp) rows; size PENDING marks a transfer in progress."""
        if not items:
            return
        with self.lock:
            self.store.record_collected(self.run_id, host, items, time.time())


def gather_software(ctx: Ctx, host: str) -> list[str]:
    """The run's Python, pip freeze and source commits from ``host`` (fact lines; [] when that failed)."""
    program = mf.facts_script(facts=False, python=str(ctx.info.get("python") or "python3"),
                              sources=ctx.info.get("sources"))
    res = remote.script(ctx.testbed, host, program, timeout=max(ctx.timeout, 120), connect_timeout=ctx.timeout)
    return [ln for ln in res.stdout.splitlines() if ln.startswith(mf.FACT_PREFIXES)] if res.ok else []


def list_host(ctx: Ctx, host: str, program: str) -> tuple[Listing | None, str | None]:
    """Run the listing program (:func:`listing_script`) on ``host``: (listing, None) or (None, error)."""
    res = remote.script(ctx.testbed, host, program, timeout=ctx.timeout, connect_timeout=ctx.timeout)
    return _listing_outcome(ctx, host, res, res.stdout, res.truncated)


def listing_budget(ctx: Ctx, streamed: bool) -> float:
    """Seconds a host's listing may take before it stops itself and says how far it got: inside the collector's
    own limit (the idle limit for a streaming listing, which prints nothing while it walks)."""
    limit = ctx.io_timeout if streamed else ctx.timeout
    return max(3.0, limit - max(2.0, limit * 0.15))


def _silent_cause(ctx: Ctx, host: str, waited: str) -> str:
    """Why a listing gave no answer: the host is asked afresh whether it answers at all, so that a host that is
    up is never called unreachable."""
    probe = remote.run(ctx.testbed, [host], "true", timeout=10, connect_timeout=10, mux="none")[0]
    if probe.ok:
        return (f"listing the run folder on {host} {waited}, though {host} answers: the folders its output patterns "
                "match are too large to list, or loop; the listing was stopped on the host")
    return f"{host} {waited} while listing the run folder, and does not answer now (unreachable?)"


def _listing_outcome(ctx: Ctx, host: str, res: remote.HostResult, stdout: str,
                     truncated: bool) -> tuple[Listing | None, str | None]:
    if res.exit_code is None and res.lost:
        return None, _silent_cause(ctx, host, f"sent nothing for {ctx.io_timeout:g} s")
    if res.exit_code is None:  # stopped at its timeout (or ssh could not start: its error says so)
        timed_out = (res.error or "").startswith("timed out")
        return None, _silent_cause(ctx, host, f"did not finish within {ctx.timeout:g} s") if timed_out else res.error
    if res.exit_code == 255:
        return None, res.error or ssh.describe_ssh_failure(res.stderr, host, ctx.testbed)
    if truncated:
        return None, f"the listing of the run folder on {host} is over {remote.MAX_OUTPUT >> 20} MiB"
    if "@END" not in stdout.splitlines()[-1:]:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"listing the run folder on {host} failed (exit {res.exit_code}): {last}"
    lst, problem = parse_listing(stdout)
    if problem == "@NODIR":
        return None, f"the run folder {run_dir(ctx.info, ctx.run_id)} does not exist on {host}"
    if problem and problem.startswith("a file vanished"):
        return None, f"{problem} on {host}; collect again once the run has finished writing"
    if problem:
        return None, f"{problem} on {host} (its output patterns match too much: narrow them in the suite's outputs)"
    return lst, None


def known_files(ctx: Ctx, host: str) -> list[tuple[int, int, int, int, str, str]]:
    """(size, mtime, ctime ns, inode, sha256, path) of this host's verified files, as the host's stat said when it
    hashed them, whose local copy still has the recorded size: the listing's quick check (``listing_script``).

    A row without a stamp (recorded before stamps were kept, or stat'ed too close to its listing's clock) is left
    out: that file is hashed again, never trusted on its size and mtime alone.
    """
    hdir = ctx.folder / host
    out = []
    for path, row in ctx.rows(host).items():
        if row.size < 0 or row.stamp is None:
            continue
        try:
            st = (hdir / path).stat()
        except OSError:
            continue
        if st.st_size == row.size:
            out.append((row.size, *row.stamp, row.sha256, path))
    return out


def _plan(ctx: Ctx, host: str, lst: Listing, hc: HostCollect) -> tuple[list[str], list[str]]:
    """(to_send, conflicts); unchanged files are counted and (re)recorded."""
    rows = ctx.rows(host)
    hdir = ctx.folder / host
    send: list[str] = []
    conflicts: list[str] = []
    confirmed: list[tuple[str, str, int, FileStamp | None]] = []
    for path, (size, sha) in sorted(lst.files.items()):
        local = hdir / path
        stamp = lst.stamp(path)
        try:
            st = local.stat()
        except FileNotFoundError:
            if not (ctx.shared_home and _link_shared(ctx, host, path, size, sha)):
                send.append(path)
            else:
                hc.shared += 1
                confirmed.append((path, sha, size, stamp))
            continue
        row = rows.get(path)
        # the recorded checksum holds while the file's ctime (set by the kernel on any write, rename or copy over
        # it, unlike mtime, which `cp -p` or `touch` can set back) is not after the moment it was verified
        if row and row.size >= 0 and row.sha256 == sha and st.st_size == size and st.st_ctime <= row.collected:
            hc.unchanged += 1
            with ctx.lock:
                ctx.verified[(host, path)] = (sha, size)
            if row.stamp != stamp:  # hashed again on the host (no stamp yet, or a touch): its stat now is kept
                confirmed.append((path, sha, size, stamp))
            continue
        if local.is_file() and st.st_size == size and sha256_file(local) == sha:
            hc.unchanged += 1
            confirmed.append((path, sha, size, stamp))
        elif row and row.size == PENDING:
            send.append(path)  # the partial file of an interrupted collect: resume it
        else:
            conflicts.append(path)
    ctx.done(host, confirmed)
    return send, conflicts


def _link_shared(ctx: Ctx, host: str, path: str, size: int, sha: str) -> bool:
    """On a shared home: link ``host``'s copy of ``path`` to the one another host of this collect brought with
    the same size and sha256 (the same file: fetched once); False when none did."""
    with ctx.lock:
        peer = next((h for (h, p), (s, n) in ctx.verified.items() if p == path and h != host and s == sha
                     and n == size and sha != UNHASHED), None)
    if peer is None:
        return False
    src, dst = ctx.folder / peer / path, ctx.folder / host / path
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return True


def transfer_host(ctx: Ctx, host: str, lst: Listing, hc: HostCollect) -> None:
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
    ctx.record(host, [(p, lst.files[p][1], PENDING, None) for p in send])
    ctx.tick(host, 0, sum(lst.files[p][0] for p in send))
    streamed = [p for p in send if lst.files[p][1] == UNHASHED]
    checked = [p for p in send if lst.files[p][1] != UNHASHED]  # before the stream fills in its checksums
    if streamed:
        hc.method = "stream"
        if not _send_streamed(ctx, host, lst, streamed, hc):
            return
    if checked:
        method = "rsync" if lst.rsync and not ctx.force_sftp else "sftp"
        hc.method = f"{hc.method}+{method}" if hc.method else method
        if not _send_checked(ctx, host, lst, checked, hc):
            return
    _clean_rsync_temps(hdir, send)


def _send_checked(ctx: Ctx, host: str, lst: Listing, todo: list[str], hc: HostCollect) -> bool:
    """rsync or sftp ``todo`` (host checksums known), verify each file, fetch mismatches once more."""
    hdir = ctx.folder / host
    for attempt in (1, 2):
        err = _fetch(ctx, host, lst, todo, hc)
        good, bad = _verify(hdir, lst, todo)
        ctx.done(host, [(p, lst.files[p][1], lst.files[p][0], lst.stamp(p)) for p in good])
        hc.sent += len(good)
        hc.bytes_sent += sum(lst.files[p][0] for p in good)
        if err is not None:
            hc.error = hc.error or err
            hc.missing += bad
            return False
        if not bad:
            return True
        if attempt == 2:
            hc.error = hc.error or _mismatch(host, lst, bad)
            hc.missing += bad
            _drop(hdir, bad)  # the manifest leaves them out: so does the folder
            return False
        for p in bad:  # fetch these again from scratch
            (hdir / p).unlink(missing_ok=True)
        todo = bad
    return True


def _drop(hdir: Path, bad: list[str]) -> None:
    """Remove what lies under the names of files that did not verify: a results folder holds only what its
    manifest lists (a file cut off mid-way waits in PARTIAL_DIR, where the next collect resumes it)."""
    for p in bad:
        if _safe_rel(p):
            (hdir / p).unlink(missing_ok=True)


def _mismatch(host: str, lst: Listing, bad: list[str]) -> str:
    return (f"checksum mismatch for {host}:{host_path(lst, bad[0])}"
            f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''} after a retry: "
            f"the file changes on the host or the transfer corrupts it")


def _send_streamed(ctx: Ctx, host: str, lst: Listing, todo: list[str], hc: HostCollect) -> bool:
    """Stream ``todo`` from the host (testbed/scripts/stream.py): each file is hashed on the host as it is read
    and here as it is written, and goes into place only when both digests agree; mismatches are sent once more.
    A file cut off mid-way waits in its folder's PARTIAL_DIR, where the next collect's rsync resumes it."""
    unsafe = [p for p in todo if not _safe_rel(p)]
    if unsafe:  # never written outside the host's folder
        hc.error = f"{host} listed a path that leaves its results folder: {unsafe[0]!r}"
        hc.missing += unsafe
        refused = set(unsafe)
        todo = [p for p in todo if p not in refused]
    for attempt in (1, 2):
        rx = _Receiver(ctx, host, todo)
        paths = b"".join(host_path(lst, p).encode() + b"\0" for p in todo)
        rate = int(ctx.bwlimit_kbps * 1024) if ctx.bwlimit_kbps else 0
        command = f"python3 -S -c {shlex.quote(scripts.text('stream.py'))} {rate}"
        res = remote.stream(ctx.testbed, host, command, stdin=paths, on_output=rx.feed, idle=ctx.io_timeout,
                            connect_timeout=ctx.timeout)
        rx.close()
        for p, sha, size, mtime in rx.good:
            lst.files[p], lst.mtimes[p] = (size, sha), mtime
        # their stamps keep the listing's ctime and inode, taken before the stream read them: a change since then
        # moved the ctime, so such a stamp never matches again (the file is hashed next time)
        ctx.done(host, [(p, sha, size, lst.stamp(p)) for p, sha, size, _ in rx.good])
        hc.sent += len(rx.good)
        hc.bytes_sent += sum(size for _, _, size, _ in rx.good)
        left = todo[rx.index:]  # never reached: the stream stopped
        if not res.ok or left:
            hc.error = hc.error or (f"{res.error}; {RESUME_HINT}" if res.lost else res.error) or \
                f"the stream from {host} ended early (exit {res.exit_code}): {res.stderr.strip()[-300:]}"
            hc.missing += rx.bad + left
            return False
        if not rx.bad:
            return True
        if attempt == 2:
            hc.error = hc.error or _mismatch(host, lst, rx.bad)
            hc.missing += rx.bad
            return False
        todo = rx.bad
    return True


class ListingStream:
    """Reads a first collect's listing that streams its new files in the same session (``listing_script(stream=
    ...)``): the listing's text up to ``@STREAM token``, then the files (into a :class:`_Receiver`), then the rest
    of the text. No round trip between the listing and the transfer, and one session per host instead of two."""

    def __init__(self, ctx: Ctx, host: str, token: str, hc: HostCollect,
                 on_listing: Callable[[Listing], None] | None = None) -> None:
        self.ctx, self.host, self.hc, self.on_listing = ctx, host, hc, on_listing
        self.mark = f"\n@STREAM {token}\n".encode()
        self.head = bytearray()  # the listing (with the facts)
        self.tail = bytearray()  # what follows the files
        self.lst: Listing | None = None
        self.rx: _Receiver | None = None

    def feed(self, chunk: bytes) -> None:
        if self.lst is None:
            self.head += chunk
            if len(self.head) > remote.MAX_OUTPUT:
                raise TestbedError(f"the listing of the run folder on {self.host} is over "
                                   f"{remote.MAX_OUTPUT >> 20} MiB", where=self.host, fix="declare fewer outputs")
            i = self.head.find(self.mark)
            if i >= 0:
                rest = bytes(self.head[i + len(self.mark):])
                del self.head[i + 1:]
                self._start()
                if rest:
                    self.feed(rest)
        elif self.rx is not None and self.rx.index < len(self.rx.paths):
            self.rx.feed(chunk)
            if self.rx.index >= len(self.rx.paths):  # the files are done: the rest is text
                self.tail += self.rx.buf
                self.rx.buf.clear()
        else:
            self.tail += chunk

    def _start(self) -> None:
        """The listing is complete: what follows are its files listed with ``-``, in its order."""
        lst, _ = parse_listing(self.head.decode(errors="replace"))
        self.lst = lst
        if self.on_listing is not None:
            self.on_listing(lst)
        paths = [p for p, (_, sha) in lst.files.items() if sha == UNHASHED]
        unsafe = frozenset(p for p in paths if not _safe_rel(p))
        if unsafe:  # never written outside the host's folder
            self.hc.error = f"{self.host} listed a path that leaves its results folder: {sorted(unsafe)[0]!r}"
            self.hc.missing += sorted(unsafe)
        self.ctx.record(self.host, [(p, UNHASHED, PENDING, None) for p in paths if p not in unsafe])
        self.ctx.tick(self.host, 0, sum(lst.files[p][0] for p in paths if p not in unsafe))
        self.rx = _Receiver(self.ctx, self.host, paths, unsafe)

    def finish(self, res: remote.HostResult) -> tuple[Listing | None, str | None, bool]:
        """(listing, error, streamed) once the session is over; when it streamed, the files it sent are verified
        and recorded in ``hc`` and mismatches were sent once more; otherwise transfer the listing as usual."""
        if self.rx is None or self.lst is None:  # no stream: an ordinary listing, or a failure before the files
            lst, err = _listing_outcome(self.ctx, self.host, res, self.head.decode(errors="replace"), False)
            return lst, err, False
        ctx, host, hc, lst, rx = self.ctx, self.host, self.hc, self.lst, self.rx
        rx.close()
        lst.fact_lines += [ln for ln in self.tail.decode(errors="replace").splitlines()
                           if ln.startswith(mf.FACT_PREFIXES)]
        hc.method = "stream"
        for p, sha, size, mtime in rx.good:
            lst.files[p], lst.mtimes[p] = (size, sha), mtime
        ctx.done(host, [(p, sha, size, lst.stamp(p)) for p, sha, size, _ in rx.good])
        hc.sent += len(rx.good)
        hc.bytes_sent += sum(size for _, _, size, _ in rx.good)
        left = rx.paths[rx.index:]  # never reached: the stream stopped
        if not res.ok or left:
            hc.error = hc.error or (f"{res.error}; {RESUME_HINT}" if res.lost else res.error) or \
                f"the stream from {host} ended early (exit {res.exit_code}): {res.stderr.strip()[-300:]}"
            hc.missing += rx.bad + left
            return lst, None, True
        if rx.bad:  # sent once more in a stream of their own (which checks them as this one did)
            ctx.record(host, [(p, lst.files[p][1], PENDING, None) for p in rx.bad])
            _send_streamed(ctx, host, lst, rx.bad, hc)
        _clean_rsync_temps(ctx.folder / host, [p for p in rx.paths if p not in rx.drop])
        return lst, None, True


def list_and_stream(ctx: Ctx, host: str, program: str, token: str, hc: HostCollect,
                    on_listing: Callable[[Listing], None] | None = None) -> tuple[Listing | None, str | None, bool]:
    """Run a streaming listing (``listing_script(stream=(token, rate))``) on ``host``: (listing, error,
    streamed); see :meth:`ListingStream.finish`."""
    reader = ListingStream(ctx, host, token, hc, on_listing)
    res = remote.stream(ctx.testbed, host, "bash -s", stdin=program.encode(), on_output=reader.feed,
                        idle=ctx.io_timeout, connect_timeout=ctx.timeout)
    return reader.finish(res)


class _Receiver:
    """Writes the stream of :func:`_send_streamed` into a host's results folder, hashing as it writes.

    Each file is written into ``<its folder>/PARTIAL_DIR/<name>`` (where rsync's ``--partial-dir`` looks), and
    renamed into place with the host's mtime once its sha256 matches the host's."""

    _HEAD = struct.Struct("!qq")

    def __init__(self, ctx: Ctx, host: str, paths: list[str], drop: frozenset[str] = frozenset()) -> None:
        self.ctx, self.host, self.hdir, self.paths, self.drop = ctx, host, ctx.folder / host, paths, drop
        self.index = 0  # the file being received
        self.buf = bytearray()
        self.file: Any = None
        self.sha: Any = None
        self.left = self.size = self.mtime = 0
        self.good: list[tuple[str, str, int, int]] = []  # (path, sha256, size, mtime)
        self.bad: list[str] = []

    def _partial(self, p: str) -> Path:
        local = self.hdir / p
        return local.parent / PARTIAL_DIR / local.name

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while self.index < len(self.paths):  # bounded: each pass consumes bytes or returns for more
            if self.file is None:
                if len(self.buf) < self._HEAD.size:
                    return
                self.size, self.mtime = self._HEAD.unpack_from(self.buf)
                del self.buf[:self._HEAD.size]
                p = self.paths[self.index]
                if self.size < 0:  # vanished or unreadable on the host: nothing follows its header
                    self.bad.append(p)
                    self.index += 1
                    continue
                if p in self.drop:  # read past it, written nowhere
                    self.file, self.sha, self.left = open(os.devnull, "wb"), hashlib.sha256(), self.size  # noqa: SIM115
                else:
                    part = self._partial(p)
                    part.parent.mkdir(parents=True, exist_ok=True)
                    self.file, self.sha, self.left = open(part, "wb"), hashlib.sha256(), self.size  # noqa: SIM115
            if self.left:
                n = min(self.left, len(self.buf))
                if not n:
                    return
                data = memoryview(self.buf)[:n]
                self.file.write(data)
                self.sha.update(data)
                data.release()
                del self.buf[:n]
                self.left -= n
                self.ctx.tick(self.host, n)
                continue
            if len(self.buf) < 33:
                return
            status, digest = self.buf[0], bytes(self.buf[1:33])
            del self.buf[:33]
            self._finish(status == 0 and digest == self.sha.digest(), digest.hex())

    def _finish(self, ok: bool, sha: str) -> None:
        p = self.paths[self.index]
        self.file.close()
        self.file = None
        if p in self.drop:
            self.index += 1
            return
        part = self._partial(p)
        if ok:
            os.utime(part, (self.mtime, self.mtime))  # like rsync -t: the copy carries the host file's mtime
            os.replace(part, self.hdir / p)
            self.good.append((p, sha, self.size, self.mtime))
        else:
            part.unlink(missing_ok=True)
            self.bad.append(p)
        self.index += 1

    def close(self) -> None:
        """The stream ended: a file cut off mid-way stays in its partial folder (the next collect resumes it)."""
        if self.file is not None:
            self.file.close()
            self.file = None


def _safe_rel(p: str) -> bool:
    """Whether ``p`` is a relative path that stays inside the folder it is joined to."""
    parts = p.split("/")
    return bool(p) and not p.startswith("/") and ".." not in parts and "" not in parts and "." not in parts


def unchanged_since(path: Path, sha: str, size: int, verified_at: float) -> bool:
    """Whether ``path`` still holds the bytes verified at ``verified_at`` (by ctime, else by hashing it)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if not path.is_file() or st.st_size != size:
        return False
    return st.st_ctime <= verified_at or sha256_file(path) == sha


def _verify(hdir: Path, lst: Listing, paths: list[str]) -> tuple[list[str], list[str]]:
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
                m = RSYNC_TEMP.fullmatch(entry.name)
                if m and m.group(1) in names and entry.is_file():
                    entry.unlink(missing_ok=True)
        partial = d / PARTIAL_DIR
        with contextlib.suppress(OSError):
            for name in names:
                (partial / name).unlink(missing_ok=True)
            partial.rmdir()  # only when empty


def _fetch(ctx: Ctx, host: str, lst: Listing, paths: list[str], hc: HostCollect) -> str | None:
    hdir = ctx.folder / host
    hdir.mkdir(parents=True, exist_ok=True)
    if hc.method == "rsync":
        return _fetch_rsync(ctx, host, lst, paths, hc)
    return _fetch_sftp(ctx, host, lst, paths, hc)


def _fetch_rsync(ctx: Ctx, host: str, lst: Listing, paths: list[str], hc: HostCollect) -> str | None:
    """One rsync per root the paths live under (the run folder, the home folder, ``/``)."""
    for remote_root, local_sub, rel in roots(lst, paths):
        err = _rsync_root(ctx, host, remote_root, ctx.folder / host / local_sub if local_sub else ctx.folder / host,
                          rel, hc)
        if err is not None:
            return err
    return None


RESUME_HINT = "collect again to resume: files already received are kept"


def _transfer_error(res: remote.HostResult) -> str | None:
    if res.ok:
        return None
    return f"{res.error}; {RESUME_HINT}" if res.lost else res.error or f"exit {res.exit_code}"


def _rsync_root(ctx: Ctx, host: str, remote_root: str, hdir: Path, paths: list[str],
                hc: HostCollect) -> str | None:
    hdir.mkdir(parents=True, exist_ok=True)
    # a partial file waits in PARTIAL_DIR (resumed next time), never under the file's own name
    res = remote.rsync(ctx.testbed, host, remote_root, hdir, files=paths,
                       options=["-rtL", f"--partial-dir={PARTIAL_DIR}", "--stats"], idle=ctx.io_timeout,
                       bwlimit_kbps=ctx.bwlimit_kbps, progress=lambda n: ctx.tick(host, n),
                       connect_timeout=ctx.timeout)
    m = _STATS_FILES.search(res.stdout)
    if m:
        hc.rsync_transferred = (hc.rsync_transferred or 0) + int(re.sub(r"\D", "", m.group(1)) or 0)
    m = _STATS_MATCHED.search(res.stdout)
    if m:
        hc.reused_bytes += int(re.sub(r"\D", "", m.group(1)) or 0)
    return _transfer_error(res)


def _stage(ctx: Ctx, host: str, path: str) -> Path:
    """Where sftp downloads ``path`` before it is moved into place (a partial file waits there for reget)."""
    return ctx.folder / ".partial" / host / hashlib.sha256(path.encode()).hexdigest()[:32]


def _fetch_sftp(ctx: Ctx, host: str, lst: Listing, paths: list[str], hc: HostCollect) -> str | None:
    """Fetch ``paths`` with one ``sftp -b`` batch into a staging folder; partial downloads resume (``reget``)."""
    hdir = ctx.folder / host
    staged = {p: _stage(ctx, host, p) for p in paths}
    next(iter(staged.values())).parent.mkdir(parents=True, exist_ok=True)
    resume = set()
    for p, tmp in staged.items():
        if tmp.is_file() and 0 < tmp.stat().st_size < lst.files[p][0]:
            resume.add(tmp)
            hc.resumed += 1
        else:
            tmp.unlink(missing_ok=True)
    def staged_bytes() -> int:
        total = 0
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                total += tmp.stat().st_size
        return total

    seen = staged_bytes()  # partial files resumed were counted by the collect that fetched them

    def received() -> int:
        """Bytes in the staging files (the batch's progress, ticked to the progress callback)."""
        nonlocal seen
        total = staged_bytes()
        ctx.tick(host, max(0, total - seen))
        seen = max(seen, total)
        return total

    try:
        res = remote.get(ctx.testbed, host, [(host_path(lst, p), tmp) for p, tmp in staged.items()], resume=resume,
                         idle=ctx.io_timeout, bwlimit_kbps=ctx.bwlimit_kbps, probe=received,
                         connect_timeout=ctx.timeout)
    except TestbedError as e:  # a results folder sftp cannot name
        raise TestbedError(e.what, where=e.where,
                           fix="collect into a --to folder without * ? [ or \\ in its path") from None
    received()
    for p, tmp in staged.items():  # complete downloads go into place; _verify checks them
        with contextlib.suppress(OSError):
            if tmp.stat().st_size == lst.files[p][0]:
                (hdir / p).parent.mkdir(parents=True, exist_ok=True)
                mtime = lst.mtimes.get(p)
                if mtime is not None:
                    os.utime(tmp, (mtime, mtime))  # like rsync -t: the copy carries the host file's mtime
                os.replace(tmp, hdir / p)
    for d in (next(iter(staged.values())).parent, ctx.folder / ".partial"):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty
    return _transfer_error(res)
