"""The one SSH transport: every process that reaches a host (ssh, sftp, rsync, ssh-keyscan) is started here.

One policy for all of them (:func:`call`):

- each process leads its own session, so stopping it stops what it started too (rsync's ssh): at its ``timeout``
  (seconds for the whole call), after ``idle`` seconds without activity, or when the caller is interrupted, its
  process group gets SIGTERM, then SIGKILL after ``GRACE`` seconds;
- stdin is a temporary file, never a pipe a stuck host could block on; stdout and stderr go to temporary files, not
  pipes (a multiplexed master lingering in the background never holds a call open), and at most ``MAX_OUTPUT``
  bytes of each are kept (the end; ``truncated`` says so);
- every call returns a :class:`HostResult`, failures included: ``ok``, ``exit_code``, ``stdout``, ``stderr``,
  ``error`` (one sentence: unreachable, refused key, timed out, link lost), ``seconds``.

Calls: :func:`run` (one command on many hosts in parallel, over multiplexed connections), :func:`run_each` (a
command per host), :func:`script` (a program on a host shell's stdin), :func:`get` and :func:`put` (sftp),
:func:`rsync`, :func:`control` (the multiplexed master), :func:`keyscan`, :func:`interactive` (``testbed ssh``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal, NoReturn, TypedDict, TypeVar, Unpack

from testbed import ssh
from testbed.errors import TestbedError, UsageError
from testbed.hosts import Host

_T = TypeVar("_T")
_R = TypeVar("_R")


def sh(script: str) -> str:
    """A one-line command running ``script`` with /bin/sh whatever the login shell is (bash, zsh, tcsh, fish).

    A script of several lines travels base64-encoded and is ``eval``'d by sh: a quoted newline is a syntax
    error for csh-family login shells (tcsh says "Unmatched quote" and runs the rest itself), and stdin stays
    free for the script (``tar xzf -``).
    """
    if "\n" not in script.strip("\n"):
        return "sh -c " + shlex.quote(script)
    import base64

    b64 = base64.b64encode(script.encode()).decode()
    return f"sh -c 'eval \"$(echo {b64} | base64 -d)\"'"


GRACE = 3.0
"""Seconds between SIGTERM and SIGKILL when a call is stopped (rsync keeps its partial file on SIGTERM)."""
MAX_OUTPUT = 64 << 20
"""Bytes of stdout and of stderr kept per call (the end)."""
POLL = 0.25
"""Seconds between two looks at a call's progress when it has an ``idle`` limit."""


@dataclass
class HostResult:
    """What one call did on one host."""

    host: str
    exit_code: int | None  # None: stopped by the transport (timeout, idle) or not started
    stdout: str
    stderr: str
    error: str | None = None  # why it failed when the command itself did not say (unreachable, timed out, ...)
    seconds: float = 0.0
    truncated: bool = False  # stdout or stderr was longer than MAX_OUTPUT: they hold its end
    lost: bool = False  # the link failed mid-call (stalled, reset): calling again may finish the work

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


SSH_ERRORS = ("Permission denied", "Connection refused", "Connection timed out", "No route to host",
              "Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "Could not resolve",
              "Connection closed by", "Network is unreachable", "kex_exchange_identification",
              "Operation timed out", "port 22: Connection")
_LINK_LOST = ("Broken pipe", "Connection reset", "Connection timed out", "No route to host")
_FILE_ERRORS = (11, 23, 24)  # rsync: file I/O error, partial transfer (a file it could not read), vanished files


def selection(pattern: str, option: str = "--hosts") -> list[str]:
    """The items of a comma-separated host selection; one that names nothing (``''``, ``','``) is refused, as it
    would otherwise widen to every host."""
    wanted = [p.strip() for p in pattern.split(",") if p.strip()]
    if not wanted:
        raise UsageError(f"{option} {pattern!r} names no host", where=option,
                         fix=f"name hosts, groups or globs ({option} node1,node2 or {option} workers), or leave "
                             f"{option} out for every host")
    return wanted


def select_hosts(hosts: list[Host], pattern: str | None, option: str = "--hosts") -> list[Host]:
    """Hosts matching a comma-separated list of names, groups or globs (``node[12]``, ``workers``); None: all.

    Every item must match a host or a group: a misspelt name is refused (with the closest), not dropped."""
    if pattern is None:
        return hosts
    import difflib

    wanted = selection(pattern, option)
    groups = sorted({g for h in hosts for g in h.groups})
    for w in wanted:
        if not any(fnmatch.fnmatchcase(h.name, w) or w in h.groups for h in hosts):
            close = difflib.get_close_matches(w, [h.name for h in hosts] + groups, n=1, cutoff=0.5)
            raise UsageError(f"no host or group matches '{w}'" + (f" (in {pattern!r})" if w != pattern else ""),
                             where=option, fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"hosts: {', '.join(h.name for h in hosts) or 'none'}; groups: "
                             f"{', '.join(groups) or 'none'}")
    return [h for h in hosts if any(fnmatch.fnmatchcase(h.name, w) or w in h.groups for w in wanted)]


# the policy --------------------------------------------------------------------------------------
class _Group:
    """The processes of one fan-out: stopped together when the caller is interrupted (Ctrl-C)."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self.cancelled = False

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)
            if self.cancelled:
                _signal_group(proc, signal.SIGKILL)

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for p in procs:
            _signal_group(p, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL after GRACE s if its leader is still running."""
    _signal_group(proc, signal.SIGTERM)
    end = time.monotonic() + GRACE
    while time.monotonic() < end:
        if proc.returncode is not None or proc.poll() is not None:
            return
        time.sleep(0.05)
    _signal_group(proc, signal.SIGKILL)


class _Watch:
    """Stops a process group at its deadline, or after ``idle`` s without activity (``pet`` or a new ``probe()``)."""

    def __init__(self, proc: subprocess.Popen[bytes], timeout: float | None, idle: float | None,
                 probe: Callable[[], object] | None):
        self.proc, self.idle, self.probe = proc, idle, probe
        self.fired: Literal["timeout", "idle"] | None = None
        self.last = time.monotonic()
        self.deadline = None if timeout is None else self.last + timeout
        self.seen = probe() if probe is not None else None
        self._done = threading.Event()
        if self.deadline is not None or idle is not None:
            threading.Thread(target=self._watch, daemon=True, name="transport-watch").start()

    def pet(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while True:
            wait = POLL if self.idle is not None else None
            if self.deadline is not None:
                left = max(0.0, self.deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            if self._done.wait(wait):
                return
            now = time.monotonic()
            if self.probe is not None:
                value = self.probe()
                if value != self.seen:
                    self.seen, self.last = value, now
            if self.deadline is not None and now >= self.deadline:
                self.fired = "timeout"
            elif self.idle is not None and now - self.last > self.idle:
                self.fired = "idle"
            else:
                continue
            _terminate(self.proc)
            return


def _tail(f: IO[bytes], limit: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode(errors="replace"), size > limit


def _scratch() -> IO[bytes]:
    """An unnamed temporary file for a command's output: ``O_TMPFILE`` in ``$TMPDIR`` (what
    ``tempfile.TemporaryFile`` does on Linux, without importing tempfile and shutil into every command's start-up:
    8 ms of ``testbed exec``), else ``tempfile.TemporaryFile``."""
    try:
        fd = os.open(os.environ.get("TMPDIR") or "/tmp", os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):  # a file system without O_TMPFILE, or not Linux
        import tempfile

        return tempfile.TemporaryFile()
    return open(fd, "w+b")  # the caller closes it


def call(argv: Sequence[str], *, host: str = "", stdin: bytes | None = None, timeout: float | None = None,
         idle: float | None = None, probe: Callable[[], object] | None = None,
         on_output: Callable[[bytes], None] | None = None, max_output: int = MAX_OUTPUT,
         keep_stdout: bool = True, _group: _Group | None = None) -> HostResult:
    """Run ``argv`` under the transport's policy (see the module); ``error`` is set only when it was stopped.

    ``idle``: seconds without activity before it is stopped: a chunk of stdout (read as it comes and given to
    ``on_output`` when that is set) or a change in what ``probe()`` returns (looked at every POLL s).
    ``keep_stdout``: False for a stream ``on_output`` consumes (a transfer): ``stdout`` is then left empty.
    """
    t0 = time.monotonic()
    with contextlib.ExitStack() as files:
        out = files.enter_context(_scratch())
        err = files.enter_context(_scratch())
        fin: Any = subprocess.DEVNULL
        if stdin is not None:
            fin = files.enter_context(_scratch())
            fin.write(stdin)
            fin.seek(0)
        try:
            proc = subprocess.Popen(argv, stdin=fin, stdout=subprocess.PIPE if on_output else out, stderr=err,
                                    start_new_session=True)
        except OSError as e:
            return HostResult(host, None, "", "", f"cannot start {argv[0]}: {e.strerror}")
        if _group is not None:
            _group.add(proc)
        watch = _Watch(proc, timeout, idle, probe)
        try:
            if on_output is not None:
                assert proc.stdout is not None
                while chunk := os.read(proc.stdout.fileno(), 65536):
                    watch.pet()
                    if keep_stdout:
                        out.write(chunk)
                    on_output(chunk)
            rc = proc.wait()
        except BaseException:  # interrupted (Ctrl-C) or a failing on_output: nothing is left running
            _terminate(proc)
            raise
        finally:
            watch.stop()
            if _group is not None:
                _group.discard(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        stdout, cut_out = _tail(out, max_output)
        stderr, cut_err = _tail(err, max_output)
    res = HostResult(host, rc, stdout, stderr, seconds=round(time.monotonic() - t0, 3),
                     truncated=cut_out or cut_err)
    if watch.fired == "timeout":
        res.exit_code, res.error = None, f"timed out after {timeout:g} s"
    elif watch.fired == "idle":
        res.exit_code, res.error, res.lost = None, f"no data for {idle:g} s", True
    return res


# ssh ---------------------------------------------------------------------------------------------
def _ssh_failure(testbed: str, res: HostResult) -> HostResult:
    """Name an SSH-level failure (exit 255 with one of OpenSSH's messages) in ``error``."""
    if res.error is None and res.exit_code == 255 and any(e in res.stderr for e in SSH_ERRORS):
        res.error = ssh.describe_ssh_failure(res.stderr, res.host, testbed)
    return res


def _ssh_call(testbed: str, host: str, command: str, stdin: bytes | None, *, timeout: float | None, mux: str,
              connect_timeout: float | None, max_output: int, user: str | None = None,
              group: _Group | None = None) -> HostResult:
    argv = ["ssh", *ssh.ssh_options(testbed, mux=mux, connect_timeout=connect_timeout),
            *(["-l", user] if user else []), host, "--", command]
    return _ssh_failure(testbed, call(argv, host=host, stdin=stdin, timeout=timeout, max_output=max_output,
                                      _group=group))


def run(testbed: str, hosts: Sequence[str], command: str, *, timeout: float | None = None,
        stdin: bytes | None = None, concurrency: int = 64, mux: str = "auto",
        connect_timeout: float | None = None, max_output: int = MAX_OUTPUT,
        user: str | None = None) -> list[HostResult]:
    """Run ``command`` (a line for each host's login shell) on every host in parallel; results in host order.

    ``mux``: as for :func:`testbed.ssh.ssh_argv` ("auto": reuse or become the multiplexed master; "none": a
    connection of its own, e.g. to check a fresh login). ``user``: log in as this user instead of the host's.
    """
    return _fan_out(testbed, [(h, command, stdin) for h in hosts], timeout=timeout, concurrency=concurrency,
                    mux=mux, connect_timeout=connect_timeout, max_output=max_output, user=user)


def run_each(testbed: str, commands: Mapping[str, str], *, timeout: float | None = None,
             stdin: Mapping[str, bytes] | None = None, concurrency: int = 64, mux: str = "auto",
             connect_timeout: float | None = None, max_output: int = MAX_OUTPUT,
             user: str | None = None) -> list[HostResult]:
    """Run each host's own command (and stdin) in parallel; results in the order of ``commands``."""
    stdin = stdin or {}
    return _fan_out(testbed, [(h, c, stdin.get(h)) for h, c in commands.items()], timeout=timeout,
                    concurrency=concurrency, mux=mux, connect_timeout=connect_timeout, max_output=max_output,
                    user=user)


def _fan_out(testbed: str, jobs: list[tuple[str, str, bytes | None]], *, timeout: float | None, concurrency: int,
             mux: str, connect_timeout: float | None, max_output: int, user: str | None) -> list[HostResult]:
    for name, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):  # nan would never time out
            raise UsageError(f"{name} {seconds} is not a number of seconds", where=name,
                             fix="give a positive, finite number of seconds, or none")
    kw: dict[str, Any] = {"timeout": timeout, "mux": mux, "connect_timeout": connect_timeout,
                          "max_output": max_output, "user": user}
    if len(jobs) == 1:
        return [_ssh_call(testbed, *jobs[0], **kw)]
    group = _Group()
    return each(lambda job: _ssh_call(testbed, *job, group=group, **kw), jobs, limit=concurrency,
                name="transport", stop=group.cancel, stopped=lambda: group.cancelled)


def each(fn: Callable[[_T], _R], items: Sequence[_T], *, limit: int = 32, name: str = "fan-out",
         stop: Callable[[], None] | None = None, stopped: Callable[[], bool] | None = None) -> list[_R]:
    """``fn`` of every item, at most ``limit`` at once, the results in the items' order: testbed's one fan-out.

    A raise in ``fn`` (a bug, not a host's failure: those are results) starts no further item, calls ``stop`` (which
    ends what the others started) and is raised here once the others returned; so is Ctrl-C. ``stopped``: the
    caller gave up (no further item starts). Plain threads, not concurrent.futures: its import is ~8 ms of every
    ``testbed exec``."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    results: list[Any] = [None] * len(items)
    failure: list[BaseException] = []
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def worker() -> None:  # takes the next item until none is left (or one failed, or the caller gave up)
        while not failure and not (stopped is not None and stopped()):
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as e:
                failure.append(e)
                if stop is not None:
                    stop()
                return

    threads = [threading.Thread(target=worker, daemon=True, name=name) for _ in range(max(1, min(limit, len(items))))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:  # interrupted (Ctrl-C): every process started is stopped
        if stop is not None:
            stop()
        raise
    if failure:
        raise failure[0]
    if stopped is not None and stopped():
        return [r for r in results if r is not None]
    return results


def script(testbed: str, host: str, program: str, *, shell: str = "bash", timeout: float | None = None,
           connect_timeout: float | None = None, max_output: int = MAX_OUTPUT) -> HostResult:
    """Run ``program`` (shell text: see :func:`testbed.scripts.program`) as the stdin of ``<shell> -s`` on ``host``."""
    return _ssh_call(testbed, host, f"{shell} -s", program.encode(), timeout=timeout, mux="auto",
                     connect_timeout=connect_timeout, max_output=max_output)


def control(testbed: str, host: str, action: Literal["check", "start", "exit"], *,
            timeout: float = 30) -> HostResult:
    """The multiplexed master connection to ``host``: is one running (check), open one that later calls reuse
    (start; nothing to do when one runs), stop it (exit)."""
    base = ["ssh", *ssh.ssh_options(testbed, mux="auto")]
    if action == "start":
        running = control(testbed, host, "check", timeout=timeout)
        if running.ok:
            return running
        argv = [*base, "-fN", "-o", "ControlMaster=yes", host]
    else:
        argv = [*base, "-O", action, host]
    return _ssh_failure(testbed, call(argv, host=host, timeout=timeout))


def keyscan(address: str, port: int = 22, timeout: float = 5) -> HostResult:
    """The host's public keys as ``ssh-keyscan`` prints them (a real SSH handshake, no login)."""
    argv = ["ssh-keyscan", "-T", str(max(1, int(timeout))), "-p", str(port), "-t", "ed25519,ecdsa,rsa", address]
    return call(argv, host=address, timeout=timeout + 5)


def interactive(testbed: str, host: str, command: str | None = None) -> NoReturn:
    """Replace this process with ``ssh`` to ``host`` (with a terminal when stdin is one): ``testbed ssh``."""
    argv = ssh.ssh_argv(testbed, host, command, tty=sys.stdin.isatty(), mux="auto")
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)  # noqa: S606
    except OSError as e:
        raise TestbedError(f"cannot start ssh: {e.strerror}", where="this machine",
                           fix="apt-get install openssh-client (testbed doctor checks this)") from None


# transfers ---------------------------------------------------------------------------------------
def stream(testbed: str, host: str, command: str, *, stdin: bytes, on_output: Callable[[bytes], None],
           idle: float = 30, connect_timeout: float | None = None) -> HostResult:
    """Run ``command`` on ``host`` (over its master connection when one is up) and hand its stdout to
    ``on_output`` as it arrives, without keeping it: a transfer. ``idle``: seconds without data before it is
    stopped (``lost``: calling again may finish the work)."""
    argv = ["ssh", *ssh.ssh_options(testbed, mux="client", connect_timeout=connect_timeout), host, "--", command]
    res = call(argv, host=host, stdin=stdin, idle=idle, on_output=on_output, keep_stdout=False)
    return _transfer_failure(testbed, "stream", res, "from")


def _transfer_failure(testbed: str, tool: str, res: HostResult, direction: str) -> HostResult:
    """Name a failed transfer in ``error``; ``lost`` when the link failed (a retry resumes)."""
    host = res.host
    if res.exit_code == 0 and res.error is None:
        return res
    if res.lost:
        res.error = f"the connection to {host} was lost during the transfer ({res.error})"
        return res
    if res.error is not None:
        return res
    rc, stderr = res.exit_code, res.stderr
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {rc}"
    if rc == 30 or (rc not in _FILE_ERRORS and ("timeout" in stderr.lower() or any(e in stderr for e in _LINK_LOST))):
        res.error, res.lost = f"the connection to {host} was lost during the transfer ({last})", True
    elif rc == 255 or "connection unexpectedly closed" in stderr:
        res.error = f"{ssh.describe_ssh_failure(stderr, host, testbed)} ({tool} exit {rc})"
    else:  # rsync's first complaint names the file; its last line is often only the broken pipe that followed
        reason = next((ln for ln in lines if ln.startswith("rsync: ")), last) if tool == "rsync" else last
        res.error = f"{tool} {direction} {host} failed (exit {rc}): {reason}"
    return res


def sftp_word(path: str, *, glob: bool) -> str:
    """``path`` as one word of an sftp batch line (backslash-escaped); ``glob``: sftp expands it as a pattern
    (the source of a get or put), so its glob characters are escaped for the pattern; else they are refused."""
    out = []
    for c in path:
        if c in "?[*\\":
            if not glob:
                raise TestbedError(f"the path {path!r} contains {c!r}, which sftp cannot write to", where=path,
                                   fix="choose a destination without * ? [ or \\ in its path")
            out.append("\\" + c)  # kept escaped for sftp's glob, which removes the escape
        elif c.isalnum() or c in "/._-+@%,:=":
            out.append(c)
        else:
            out.append("\\" + c)
    return "".join(out)


def sftp(testbed: str, host: str, batch: Sequence[str], *, idle: float = 30, bwlimit_kbps: int | None = None,
         probe: Callable[[], object] | None = None, connect_timeout: float | None = None,
         timeout: float | None = None, direction: str = "with") -> HostResult:
    """Run an ``sftp -b`` batch (one command a line) on a connection of its own.

    A dead link is noticed by ServerAlive within about ``idle`` s; with ``probe`` (e.g. the bytes received so far)
    the batch is also stopped after ``idle`` s without a change in it. ``direction`` ("from", "to" the host)
    words the error.
    """
    alive = max(1, int(idle) // 3)
    argv = ["sftp", *ssh.ssh_options(testbed, mux="none", connect_timeout=connect_timeout),
            "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3", "-q", "-b", "-"]
    if bwlimit_kbps:
        argv += ["-l", str(int(bwlimit_kbps) * 8)]
    argv.append(host)
    res = call(argv, host=host, stdin=("\n".join(batch) + "\n").encode(), timeout=timeout,
               idle=idle if probe is not None else None, probe=probe)
    return _transfer_failure(testbed, "sftp", res, direction)


class SftpOptions(TypedDict, total=False):
    """The options of :func:`sftp` that :func:`get` and :func:`put` pass on."""

    idle: float
    bwlimit_kbps: int | None
    probe: Callable[[], object] | None
    connect_timeout: float | None
    timeout: float | None


def get(testbed: str, host: str, pairs: Sequence[tuple[str, Path]], *, resume: Collection[Path] = (),
        **kw: Unpack[SftpOptions]) -> HostResult:
    """Download each (host path, local path) in one sftp session; a local path in ``resume`` continues from the
    partial file there (``reget``). ``kw``: as for :func:`sftp`."""
    lines = [f"{'reget' if local in resume else 'get'} {sftp_word(src, glob=True)} "
             f"{sftp_word(str(local.absolute()), glob=False)}" for src, local in pairs]
    return sftp(testbed, host, lines, direction="from", **kw)


def put(testbed: str, host: str, pairs: Sequence[tuple[Path, str]], **kw: Unpack[SftpOptions]) -> HostResult:
    """Upload each (local path, host path) in one sftp session (folders of the host path must exist).
    ``kw``: as for :func:`sftp`."""
    lines = [f"put {sftp_word(str(local.absolute()), glob=True)} {sftp_word(dst, glob=False)}" for local, dst in pairs]
    return sftp(testbed, host, lines, direction="to", **kw)


_PROGRESS2 = re.compile(rb"^\s*([\d,.]+)\s+\d+%")


class _Progress2:
    """Feeds the byte counts of rsync's ``--info=progress2`` lines to ``advance`` as increments."""

    def __init__(self, advance: Callable[[int], None] | None):
        self.advance, self.done, self.buf = advance, 0, b""

    def feed(self, chunk: bytes) -> None:
        *lines, self.buf = re.split(rb"[\r\n]", self.buf + chunk)
        for ln in lines:
            m = _PROGRESS2.match(ln)
            if m:
                n = int(re.sub(rb"\D", b"", m.group(1)) or 0)
                if n > self.done and self.advance is not None:
                    self.advance(n - self.done)
                self.done = max(self.done, n)


def rsync(testbed: str, host: str, remote_dir: str, local_dir: Path, *, files: Sequence[str] | None = None,
          push: bool = False, options: Sequence[str] = ("-rt",), idle: float = 30, bwlimit_kbps: int | None = None,
          progress: Callable[[int], None] | None = None, connect_timeout: float | None = None) -> HostResult:
    """Copy ``remote_dir`` of ``host`` into ``local_dir`` (``push``: the other way), or only ``files`` (paths
    relative to both).

    ``progress(n)``: the bytes moved since its last call. ``idle``: seconds without progress before rsync is
    stopped (SIGTERM: it keeps its partial file); it is also rsync's own ``--timeout``, which does not fire while
    ssh keeps the pipe open over a dead link, so the transport's limit is the bound on how long a cut link holds
    a copy. ``stdout``: rsync's output without its progress lines (``--stats`` given in ``options`` for instance).
    """
    rsh = shlex.join(["ssh", *ssh.ssh_options(testbed, mux="client", connect_timeout=connect_timeout)])
    remote, local = f"{host}:{remote_dir}/", f"{local_dir}/"
    import tempfile  # here, not at the top: every command's start-up would pay for it (see _scratch)

    with tempfile.NamedTemporaryFile("wb", prefix="testbed-files-") as listed:
        argv = ["rsync", *options, "--info=progress2", f"--timeout={max(1, int(idle))}", "-e", rsh]
        if files is not None:
            listed.write(b"".join(p.encode() + b"\0" for p in files))
            listed.flush()
            argv += ["--from0", f"--files-from={listed.name}"]
        if bwlimit_kbps:
            argv.append(f"--bwlimit={int(bwlimit_kbps)}")
        argv += [local, remote] if push else [remote, local]
        res = call(argv, host=host, idle=idle, on_output=_Progress2(progress).feed)
    res.stdout = "\n".join(ln for ln in re.split(r"[\r\n]", res.stdout)
                           if ln.strip() and not _PROGRESS2.match(ln.encode()))
    return _transfer_failure(testbed, "rsync", res, "to" if push else "from")


def remove_control_dir(d: Path) -> None:
    """Stop every master connection whose socket is in ``d`` (ours, Ansible's), then remove ``d``."""
    with contextlib.suppress(OSError):
        for sock in sorted(p for p in d.rglob("*") if p.is_socket()):
            call(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "testbed-master"], timeout=10)
    import shutil  # here, not at the top (see _scratch)

    shutil.rmtree(d, ignore_errors=True)


def close_connections(testbed: str, hosts: list[str], *, remove: bool = False) -> None:
    """Stop multiplexed master connections (after destroy or when a host changed)."""
    d = ssh.control_dir(testbed, make=False)
    if not d.is_dir():
        return  # no master was ever started (or destroy removed them)
    if remove:  # every socket in it, Ansible's too
        remove_control_dir(d)
        return
    if ssh.ssh_config_path(testbed).exists():
        for h in hosts:
            control(testbed, h, "exit", timeout=10)


def scan_host_keys(address: str, port: int = 22, timeout: float = 5) -> list[str]:
    """The host's public keys (``type base64``) via a real SSH handshake (ssh-keyscan); [] when it does not answer."""
    keys = []
    for ln in keyscan(address, port, timeout).stdout.splitlines():
        parts = ln.split()
        if len(parts) >= 3 and not ln.startswith("#"):
            keys.append(f"{parts[1]} {parts[2]}")
    return keys
