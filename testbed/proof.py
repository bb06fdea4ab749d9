"""What a rehearsed point must prove about what it produced: pure readings of text, no host touched.

``testbed rehearse`` judges every point it ran on three kinds of evidence besides its exit status: the failure
signatures in the logs it collected (``scan``), the interfaces a launcher is told to use against those a replica
host has (``interfaces_given``, ``missing_interfaces``), and the tracked files of a source checkout that the run
changed against those the suite says it edits (``changed_tracked``, ``undeclared_edits``).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

QUOTE_MAX = 160
"""The longest a quoted log line is in a verdict (longer ones are cut and end with an ellipsis)."""

SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("OpenMPI was given an interface the host lacks",
     re.compile(r"Unknown interface name|invalid value was given for \w*_if_(include|exclude)")),
    ("a missing file", re.compile(r"No such file or directory|unable to stat")),
    # an error's own words (``cp: cannot open 'x': Permission denied``), not an errno named inside a warning
    # (OpenMPI's ``plm:rsh: Warning: setpgid(61,61) failed in parent with errno=Permission denied(13)``: a race it
    # recovers from)
    ("permission denied", re.compile(r"(^|:\s*|\]\s*)Permission denied(?!\(\d)")),
    ("a Python traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("a command not found", re.compile(r"command not found|\bsh: (line )?\d+: .*\S: not found\s*$")),  # bash, dash
)
"""(what it means, the pattern) of each line that says a run went wrong even where its exit status is 0."""

OURS = ("testbed probe:", "testbed rehearse:")
"""Lines the rehearsal's own stand-ins print: never the program's output, never judged here."""


@dataclass(frozen=True)
class Finding:
    """One failure signature in one log: what it means, the line number and the line (quoted, bounded)."""

    signature: str
    line_no: int
    line: str

    def verdict(self, where: str) -> str:
        """One line: ``where`` (a log), the line number, what the signature means and the line quoted."""
        return f"{where}, line {self.line_no}: {self.signature}: {quote(self.line)}"


def quote(line: str, limit: int = QUOTE_MAX) -> str:
    """``line`` in double quotes, stripped, at most ``limit`` characters inside them."""
    line = line.strip()
    return '"' + (line if len(line) <= limit else line[:limit - 1] + "…") + '"'


def scan(text: str) -> list[Finding]:
    """The first line of each failure signature in ``text`` (a log); for a traceback, the exception line that ends
    it (the line that says what went wrong) rather than its header."""
    lines = text.splitlines()
    found: dict[str, Finding] = {}
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith(OURS):
            continue
        for name, pat in SIGNATURES:
            if name in found or not pat.search(ln):
                continue
            quoted = _traceback_end(lines, i) if name == "a Python traceback" else (i, ln)
            found[name] = Finding(name, quoted[0] + 1, quoted[1])
    return sorted(found.values(), key=lambda f: f.line_no)


def _traceback_end(lines: list[str], start: int) -> tuple[int, str]:
    """(index, line) of the exception line closing the traceback that starts at ``start`` (the header when the log
    ends inside it)."""
    for j in range(start + 1, len(lines)):
        if lines[j].strip() and not lines[j][:1].isspace():
            return j, lines[j]
    return start, lines[start]


# --- interfaces a launcher is given ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Given:
    """An interface named to a launcher or library: the name, how it was given, and whether a prefix of the name
    suffices (NCCL's and TensorPipe's ``*_SOCKET_IFNAME`` without ``=`` match by prefix)."""

    name: str
    how: str
    prefix: bool = False

    def on(self, have: Iterable[str]) -> bool:
        """Whether a host with interfaces ``have`` has this one."""
        return any(h.startswith(self.name) if self.prefix else h == self.name for h in have)


MCA_KEYS = ("btl_tcp_if_include", "oob_tcp_if_include")
ENV_KEYS = {"NCCL_SOCKET_IFNAME": True, "TP_SOCKET_IFNAME": True, "GLOO_SOCKET_IFNAME": False,
            **{f"OMPI_MCA_{k}": False for k in MCA_KEYS}}
"""Environment variables that name interfaces -> whether a name in them is a prefix (NCCL, TensorPipe)."""


def _words(command: str) -> list[str]:
    """The shell words of ``command``, and those of every quoted word that is itself a command (``sh -c '...'``)."""
    try:
        lexer = shlex.shlex(command.replace("\n", " "), posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unbalanced quote: the words as they are
        words = command.split()
    out = []
    for w in words:
        out.append(w)
        if " " in w:
            out += _words(w)
    return out


def _names(value: str, how: str, prefix: bool) -> list[Given]:
    """The interface names in one value (comma-separated), leaving out subnets, addresses, exclusions (``^``)
    and what the shell or a template fills in later."""
    if value.startswith("^") or any(c in value for c in "${}"):
        return []
    out = []
    for part in value.split(","):
        exact = part.startswith("=")
        part = part.lstrip("=").strip()
        if part and "/" not in part and not re.fullmatch(r"[0-9.:]+", part):
            out.append(Given(part, how, prefix and not exact))
    return out


def interfaces_given(command: str, env: Mapping[str, str] | None = None) -> list[Given]:
    """Every interface ``command`` (and ``env``) names to a launcher: ``--mca btl_tcp_if_include X`` (also
    ``oob_tcp_if_include``, ``-mca``), ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME`` and
    ``OMPI_MCA_*_if_include``, whether assigned, exported or passed with ``-x``."""
    words = _words(command)
    out: list[Given] = []
    for i, w in enumerate(words):
        if w in ("--mca", "-mca") and i + 2 < len(words) and words[i + 1] in MCA_KEYS:
            out += _names(words[i + 2], f"{w} {words[i + 1]}", False)
        key, eq, value = w.partition("=")
        if eq and key in ENV_KEYS:
            out += _names(value, key, ENV_KEYS[key])
    for key, value in (env or {}).items():
        if key in ENV_KEYS:
            out += _names(value, key, ENV_KEYS[key])
    return list(dict.fromkeys(out))


def link_names(ip_link: str) -> list[str]:
    """The interface names in ``ip -o link`` output (``2: eno1@if7: <...>`` gives ``eno1``)."""
    out = []
    for ln in ip_link.splitlines():
        parts = ln.split(":", 2)
        if len(parts) == 3 and parts[0].strip().isdigit():
            out.append(parts[1].strip().split("@", 1)[0])
    return out


def missing_interfaces(given: Iterable[Given], have: Mapping[str, list[str]]) -> list[str]:
    """One line per interface a host of ``have`` (host -> its interfaces) lacks, naming what the host has."""
    out = []
    for g in given:
        for host, names in have.items():
            if not g.on(names):
                kind = "no interface named " + g.name + "*" if g.prefix else "no interface " + g.name
                out.append(f"interface {g.name} given by {g.how}: {host} has {kind} (it has "
                           f"{', '.join(names) or 'none'})")
    return out


# --- tracked files of a source checkout ------------------------------------------------------------------------------
def changed_tracked(porcelain: str) -> list[str]:
    """The tracked files ``git status --porcelain --untracked-files=no`` reports changed (renames: the new path)."""
    out = []
    for ln in porcelain.splitlines():
        if len(ln) > 3 and not ln.startswith("??"):
            path = ln[3:].split(" -> ")[-1].strip()
            out.append(path[1:-1] if path.startswith('"') and path.endswith('"') else path)
    return out


def undeclared_edits(changed: Iterable[str], edits: Iterable[str]) -> list[str]:
    """The ``changed`` paths that none of the suite's declared ``edits`` globs (relative to the checkout) covers."""
    pats = list(edits)
    return [c for c in changed if not any(fnmatch.fnmatchcase(c, p) or c.startswith(p.rstrip("/") + "/")
                                          for p in pats)]


# --- the programs a shell command calls ------------------------------------------------------------------------------
# one string, not a list of quoted words: the scan for provider kinds named outside providers/ would read the
# shell built-in named like the local provider as that provider
_SHELL_WORDS = """
    if then else elif fi for in do done while until case esac function select ! { } [[ ]] . : [ alias bg break
    builtin cd command continue declare echo eval exec exit export false fg getopts hash jobs kill let local printf
    pwd read readonly return set shift source test trap true type typeset ulimit umask unalias unset wait
"""
SHELL_WORDS = frozenset(_SHELL_WORDS.split())
"""Shell keywords and built-ins (bash and dash): a host has them whatever is installed."""
WRAPPERS = frozenset({"sudo", "env", "nohup", "nice", "ionice", "setsid", "stdbuf", "timeout", "xargs", "chrt",
                      "taskset", "numactl"})
"""Programs that run the next word as a command (``sudo shred x`` calls sudo and shred)."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_LEADERS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "fi", "done", "esac"})
"""Words after which the next word is a command."""


def commands_called(command: str) -> list[str]:
    """The commands ``command`` (a shell command line) calls by name, in order, once each: the first word of each
    simple command (past ``VAR=value``), in ``$(...)`` and backquotes too, and the command a wrapper (sudo, env,
    timeout, nohup, xargs, ...) runs. Built-ins, keywords, paths and words the shell or a template fills in
    (``$x``, ``{{ }}``) are left out: only names a host's PATH must hold."""
    text = re.sub(r"\d*[<>]{1,2}&\d+|&>", " ", command)  # 2>&1, &>: redirections, not a background '&'
    text = re.sub(r"\$\(|`", " ; ", text)  # a command substitution starts a command
    try:
        lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unbalanced quote: the words as they are
        words = text.replace("\n", " ; ").split()
    out: list[str] = []
    start, wrapped, takes = True, False, False
    for w in words:
        if takes:  # an option's own value (sudo -u alice, timeout -s KILL)
            takes = False
            continue
        if set(w) <= set(";&|()") or w in _LEADERS:
            start, wrapped = True, False
            continue
        if not start:
            continue
        if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w):
            continue  # an assignment before the command (or after env)
        if wrapped and (w.startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?", w)):
            takes = w in ("-u", "-g", "-s", "-k", "-n", "-C", "-p", "-D", "-h")
            continue  # a wrapper's options and durations (sudo -E, timeout 30)
        start = wrapped = False
        if w in ("command", "exec", "time"):
            start = wrapped = True
        elif _NAME.fullmatch(w) and w not in SHELL_WORDS:
            if w not in out:
                out.append(w)
            start = wrapped = w in WRAPPERS
    return out
