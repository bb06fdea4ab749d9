"""Shared-home write tracing for ``testbed rehearse``: which paths each host wrote in each step.

On a replica whose home is shared (``hardware.shared_home``), every step that runs on two or more hosts, and the
launch's ranks where they run on two or more hosts, have their command run by ``sh -c`` under ``strace -f`` on each
host (:func:`wrap`; a shell variable the step script set without exporting it is not seen there); each host's trace
goes to a file of its own in the run folder. After the run the traces are read back bounded (:func:`check`), parsed
by a pure function (:func:`writes`), and a path under the shared home that two hosts wrote in one step is a
collision (:func:`collisions`): the step would race with itself on the real testbed's NFS home. Outside a
rehearsal nothing here runs.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from testbed import remote
from testbed.suite import path_word

if TYPE_CHECKING:
    from testbed.records import RunPlan

TRACED = ("?open,openat,?creat,?mkdir,mkdirat,?rename,renameat,?renameat2,?unlink,unlinkat,?rmdir,?link,linkat,"
          "?symlink,symlinkat,truncate,chdir,fchdir,?fork,?vfork,clone,?clone3")
"""The syscalls traced: those that write a path, and those that change or pass on a process's folder."""
STRACE = f"strace -f -qq -z -y -s 4096 -e signal=none -e trace={TRACED}"
TRACE_DIR = "hometrace"  # under the run folder
MAX_BYTES = 2_000_000  # of one trace read back (after the read-only opens are dropped on the host)
MAX_LINES = 20_000
NO_STRACE = "#nostrace"
WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")
_CLONES = {"clone", "clone3", "fork", "vfork"}
_LINE = re.compile(r"^(\d+)\s+(.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)(.*)$")
_FD = re.compile(r"^(?:AT_FDCWD|-?\d+)<(.*)>$")
MAX_PIDS = 100_000
_KEEP = "/O_WRONLY|O_RDWR|O_CREAT|O_TRUNC/ {print; next} /^[0-9]+ +(open|openat)\\(/ {next} {print}"
"""awk: a trace's lines but its read-only opens (no '!': a csh login shell expands it even in single quotes)."""


@dataclass
class Trace:
    """What one host's trace of one step says."""

    cwd: str = ""  # the step's folder when its command started
    home: str = ""  # the host's $HOME
    traced: bool = True  # false: strace was missing or refused on the host
    why: str = ""  # why not traced
    writes: dict[str, str] = field(default_factory=dict)  # absolute path -> the first syscall that wrote it
    truncated: bool = False  # only the first MAX_LINES lines or MAX_BYTES bytes were read back


def trace_path(run_dir: str, key: str, host: str) -> str:
    """The trace file of step ``key`` on ``host``, under the run folder (``~/`` unexpanded)."""
    return f"{run_dir.rstrip('/')}/{TRACE_DIR}/{key}-{host}.trace"


def traced_command(command: str, trace: str) -> str:
    """``command`` run by ``sh -c`` under ``strace -f`` writing ``trace`` (a host path, ``~/`` for the home),
    after a header with the folder and home it starts in. Where strace is missing or cannot trace here, the
    command runs untraced and the header says so. The exit status is the command's."""
    t = path_word(trace)
    q = shlex.quote(command)
    return (f'_tb_t={t}; mkdir -p "$(dirname "$_tb_t")" && printf \'#cwd %s\\n#home %s\\n\' "$PWD" "$HOME" > "$_tb_t"\n'
            f'if [ -f "$_tb_t" ] && command -v strace >/dev/null 2>&1 && \\\n'
            f"   {STRACE} -o /dev/null -- sh -c : 2>/dev/null; then\n"
            f'  {STRACE} -A -o "$_tb_t" -- sh -c {q}\n'
            f"else\n"
            f"  if command -v strace >/dev/null 2>&1; then _tb_w='strace cannot trace here (ptrace refused?)'; "
            f"else _tb_w='strace is missing'; fi\n"
            f'  echo "{NO_STRACE} $_tb_w" 2>/dev/null >> "$_tb_t"\n'
            f"  sh -c {q}\nfi")


LAUNCH = "launch"  # the traced entry of the launch's ranks


def wrap(plan: RunPlan, shared_home: bool) -> list[dict[str, object]]:
    """On a testbed whose home is shared, every prepare and post step on two or more hosts, and the launch's ranks
    where they run on two or more hosts, run under strace on each (the rehearsal's own steps, named ``rehearse:
    ...``, left alone); the traced entries: step name, hosts, each host's trace keys and ranks."""
    if not shared_home:
        return []
    traced: list[dict[str, object]] = []
    for phase, steps in (("prepare", plan.prepare), ("post", plan.post)):
        for i, s in enumerate(steps):
            if len(set(s.hosts)) < 2 or s.name.startswith("rehearse:"):
                continue
            key = f"{phase}{i}"
            s.commands = {h: traced_command(c, trace_path(plan.run_dir, key, h)) for h, c in s.commands.items()}
            traced.append({"step": s.name, "hosts": list(s.hosts), "keys": {h: [key] for h in s.hosts}})
    if len({r.host for r in plan.ranks}) >= 2:
        keys: dict[str, list[str]] = {}
        ranks: dict[str, list[int]] = {}
        for r in plan.ranks:
            r.command = traced_command(r.command, trace_path(plan.run_dir, f"{LAUNCH}{r.rank}", r.host))
            keys.setdefault(r.host, []).append(f"{LAUNCH}{r.rank}")
            ranks.setdefault(r.host, []).append(r.rank)
        traced.append({"step": LAUNCH, "hosts": list(keys), "keys": keys, "ranks": ranks})
    return traced


def read_command(run_dir: str, keys: list[str], host: str) -> str:
    """The host-side command printing, for each key, ``@@ KEY SIZE`` and the trace's lines that can be writes
    (read-only opens dropped), at most MAX_LINES lines and MAX_BYTES bytes each. No ``!`` in it: a csh login
    shell (tcsh, as on some lab machines) expands it even inside single quotes."""
    parts = []
    for k in keys:
        t = path_word(trace_path(run_dir, k, host))
        parts.append(f"if [ -f {t} ]; then echo \"@@ {k} $(wc -c < {t})\"; "
                     f"awk {shlex.quote(_KEEP)} {t} "
                     f"| head -n {MAX_LINES} | head -c {MAX_BYTES}; echo; else echo \"@@ {k} -\"; fi")
    return "; ".join(parts)


def split_read(stdout: str) -> dict[str, tuple[str, int | None]]:
    """:func:`read_command`'s output -> key -> (its trace text, the file's size; None: no file)."""
    out: dict[str, tuple[str, int | None]] = {}
    key: str | None = None
    size: int | None = None
    lines: list[str] = []
    for ln in stdout.splitlines():
        if ln.startswith("@@ "):
            if key is not None:
                out[key] = ("\n".join(lines), size)
            _, key, sz = [*ln.split(" "), "", ""][:3]
            size, lines = (int(sz) if sz.isdigit() else None), []
        elif key is not None:
            lines.append(ln)
    if key is not None:
        out[key] = ("\n".join(lines), size)
    return out


def _unquote(s: str) -> str | None:
    """A C string as strace prints it (``"a\\x20b"``) -> its text; None when not a whole string."""
    if len(s) < 2 or not s.startswith('"') or not s.endswith('"'):
        return None
    try:
        return s[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode(
            "latin-1").decode("utf-8", "replace")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return s[1:-1]


def _args(text: str) -> list[str]:
    """strace's argument list split at its top-level commas (strings, <paths>, {..} and [..] kept whole)."""
    out, cur, depth, quoted, esc = [], [], 0, False, False
    for ch in text:
        if quoted:
            cur.append(ch)
            esc, quoted = (not esc and ch == "\\"), quoted and not (ch == '"' and not esc)
            continue
        if ch == '"':
            quoted = True
        elif ch in "<{[(":
            depth += 1
        elif ch in ">}])":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _path(arg: str, base: str) -> str | None:
    """The absolute path an argument names, relative ones joined to ``base``."""
    p = _unquote(arg)
    if p is None:
        return None
    return posixpath.normpath(posixpath.join(base, p)) if base or p.startswith("/") else None


def _dir(arg: str, cwd: str) -> str:
    """The folder a dirfd argument stands for (strace -y: ``AT_FDCWD</home/u>``, ``3</home/u/x>``)."""
    m = _FD.match(arg)
    return m.group(1) if m else cwd


# which arguments of each write syscall are paths: (dirfd index or None, path index)
_WRITES: dict[str, list[tuple[int | None, int]]] = {
    "open": [(None, 0)], "creat": [(None, 0)], "openat": [(0, 1)], "mkdir": [(None, 0)], "mkdirat": [(0, 1)],
    "rename": [(None, 0), (None, 1)], "renameat": [(0, 1), (2, 3)], "renameat2": [(0, 1), (2, 3)],
    "unlink": [(None, 0)], "unlinkat": [(0, 1)], "rmdir": [(None, 0)], "link": [(None, 1)], "linkat": [(2, 3)],
    "symlink": [(None, 1)], "symlinkat": [(1, 2)], "truncate": [(None, 0)],
}


def _joined(lines: list[str]) -> list[tuple[int, str]]:
    """(pid, whole call) per line, an ``<unfinished ...>`` call joined to its ``<... resumed>`` end."""
    pending: dict[int, str] = {}
    out = []
    for ln in lines:
        m = _LINE.match(ln)
        if not m:
            continue
        pid, body = int(m.group(1)), m.group(2)
        if body.endswith("<unfinished ...>"):
            if len(pending) < MAX_PIDS:
                pending[pid] = body[: -len("<unfinished ...>")].rstrip()
            continue
        r = _RESUMED.match(body)
        if r:
            if pid not in pending:
                continue
            body = pending.pop(pid) + r.group(2)
        out.append((pid, body))
    return out


def writes(text: str) -> Trace:
    """The paths a host's trace of one step (``strace -f -y -z`` after the ``#cwd``/``#home`` header) wrote,
    absolute, each process's relative paths resolved against its own folder (chdir, fchdir, inherited on
    fork/clone). Pure: ``text`` is untrusted and read as data only."""
    t = Trace()
    lines = text.splitlines()
    for ln in lines[:3]:
        if ln.startswith("#cwd "):
            t.cwd = ln[5:]
        elif ln.startswith("#home "):
            t.home = ln[6:]
        elif ln.startswith(NO_STRACE):
            t.traced, t.why = False, ln[len(NO_STRACE):].strip() or "strace is missing"
    cwd: dict[int, str] = {}
    for pid, body in _joined(lines):
        m = _CALL.match(body)
        if not m or int(m.group(3)) < 0:
            continue
        name, args, ret = m.group(1), _args(m.group(2)), int(m.group(3))
        here = cwd.setdefault(pid, t.cwd) if len(cwd) < MAX_PIDS else cwd.get(pid, t.cwd)
        if name in _CLONES and ret > 0 and len(cwd) < MAX_PIDS:
            cwd.setdefault(ret, here)  # a child seen before its clone returned keeps the folder it made its own
        elif name == "chdir" and args:
            cwd[pid] = _path(args[0], here) or here
        elif name == "fchdir" and args:
            cwd[pid] = _dir(args[0], here)
        elif name in _WRITES:
            flags = args[1 if name == "open" else 2] if len(args) > (1 if name == "open" else 2) else ""
            if name in ("open", "openat") and not any(f in flags for f in WRITE_FLAGS):
                continue
            for d, i in _WRITES[name]:
                if i < len(args):
                    p = _path(args[i], here if d is None else _dir(args[d], here))
                    if p:
                        t.writes.setdefault(p, name)
    return t


def _holds(path: str, word: str) -> bool:
    return bool(word) and re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", path) is not None


def shown(path: str, home: str) -> str:
    """``path`` as a line shows it: ``~/`` for the home, shell-quoted where needed, at most 160 characters."""
    rest = path[len(home) + 1:] if home and path.startswith(home.rstrip("/") + "/") else None
    text = "~/" + (shlex.quote(rest) if rest else "") if rest is not None else shlex.quote(path)
    if not text.isprintable():  # a newline or control character in an untrusted path: escaped, one line
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 160 else text[:157] + "..."


def collisions(step: str, traces: dict[str, Trace], run_dir: str,
               ranks: dict[str, list[int]] | None = None) -> str | None:
    """One line when two or more hosts wrote one path under the shared home in this step (``launch``: the launch's
    ranks, ``ranks`` on each host), else None.

    Not collisions: a host's write to a path holding its own name or one of its ranks; ``__pycache__`` (Python
    writes it atomically); the traces themselves (under ``run_dir``'s ``hometrace/``)."""
    by_path: dict[str, list[str]] = {}
    for host, t in sorted(traces.items()):
        if not t.home or t.home == "/":
            continue
        home = t.home.rstrip("/") + "/"
        rd = home + run_dir[2:].rstrip("/") if run_dir.startswith("~/") else run_dir.rstrip("/")
        own = [host, *(str(k) for k in (ranks or {}).get(host, []))]
        for p in t.writes:
            if not p.startswith(home) or p.startswith(f"{rd}/{TRACE_DIR}/") or "/__pycache__/" in p + "/":
                continue
            if any(_holds(p[len(home):], w) for w in own):
                continue
            by_path.setdefault(p, []).append(host)
    shared = sorted((p for p, hs in by_path.items() if len(hs) > 1), key=lambda p: (p.count("/"), p))
    if not shared:
        return None
    hosts = by_path[shared[0]]
    who = ", ".join(hosts[:-1]) + f" and {hosts[-1]}"
    home = next(t.home for t in traces.values() if t.home)
    more = f" (and {len(shared) - 1} more such path{'s' if len(shared) > 2 else ''})" if len(shared) > 1 else ""
    if ranks is not None:
        return (f"the launch's ranks wrote {shown(shared[0], home)} from {who} at once on the shared home{more}: "
                f"write per-rank or per-host paths, or write it from one rank")
    return (f"step {step!r} wrote {shown(shared[0], home)} from {who} at once on the shared home{more}: "
            f"mark it `per: home`, or write per-host paths")


def judge(step: str, host: str, text: str) -> tuple[Trace, str | None]:
    """One host's read-back trace of ``step``: its writes, and a note where the check was not made (no strace) or
    made on the first part of the trace only."""
    tr = writes(text)
    if not tr.traced:
        return tr, (f"shared home: not checked for step {step!r} on {host}: {tr.why} (install strace there to "
                    f"check it)")
    if len(text.encode()) >= MAX_BYTES or text.count("\n") + 1 >= MAX_LINES:
        tr.truncated = True
        return tr, (f"shared home: step {step!r} on {host}: only the first part of its trace ({MAX_BYTES:,} bytes, "
                    f"{MAX_LINES:,} lines) was checked")
    return tr, None


def check(testbed: str, plan: RunPlan, timeout: float = 60) -> tuple[list[str], list[str]]:
    """(one failure per traced step that two hosts raced in, one note per host and step not checked): the traces
    of ``plan.rehearsal['hometrace']`` read back from each host of the replica ``testbed``."""
    traced = list((plan.rehearsal or {}).get("hometrace") or [])
    if not traced:
        return [], []
    keys: dict[str, list[str]] = {}
    for t in traced:
        for h, ks in t["keys"].items():
            keys.setdefault(h, []).extend(ks)
    got: dict[str, dict[str, tuple[str, int | None]]] = {}
    notes: list[str] = []
    for res in remote.run_each(testbed, {h: remote.sh(read_command(plan.run_dir, ks, h)) for h, ks in keys.items()},
                               timeout=timeout):
        if res.ok:
            got[res.host] = split_read(res.stdout)
        else:
            notes.append(f"shared home: not checked on {res.host}: its traces could not be read "
                         f"({(res.error or res.stderr).strip()[-200:]})")
    failures: list[str] = []
    for t in traced:
        traces: dict[str, Trace] = {}
        for h, ks in t["keys"].items():
            for k in ks:
                text, size = got.get(h, {}).get(k, ("", None))
                if size is None:  # unread (said above), or the step did not reach the host
                    continue
                tr, note = judge(str(t["step"]), h, text)
                if note:
                    notes.append(note)
                if tr.traced:  # a host's ranks: one trace
                    traces.setdefault(h, Trace(cwd=tr.cwd, home=tr.home)).writes.update(tr.writes)
        line = collisions(str(t["step"]), traces, plan.run_dir, t.get("ranks"))
        if line:
            failures.append(line)
    return failures, notes
