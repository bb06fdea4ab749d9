"""Which shell commands must never be copied from untrusted text (a README) into a step, and why.

:func:`hazard` reads one command line as a shell would split it (pipelines, ``&&``/``;`` lists, ``$(...)``,
backquotes and ``<(...)``, ``sudo``/``env``/``nohup`` prefixes, quoting, ``$HOME``/``~``) and names the first
thing it would do that no artifact step should: delete or re-own a whole disk, system or home folder; write
over a disk or partition; stop, restart or crash the machine; kill every process; a fork bomb; or run a script
straight from the network (``curl … | sh``, ``bash <(wget -O- …)``, ``sh -c "$(curl …)"``). Pure: nothing is run.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

_HOME = "/home/~user"  # where ~ and $HOME are taken to point (two parts deep, as a real home folder is)
_SYSTEM = {"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "opt", "proc", "root", "run",
           "sbin", "srv", "sys", "usr", "var", "mnt", "media", "snap", "tmp"}
_SAFE_DEV = re.compile(r"^/dev/(null|zero|full|stdin|stdout|stderr|tty|random|urandom|fd/\d+|pts/\d+|shm/.*)$")
_PREFIXES = {"sudo", "doas", "env", "time", "nohup", "exec", "command", "builtin", "nice", "ionice", "timeout",
             "stdbuf", "setsid", "chrt", "taskset", "xargs"}
_WITH_VALUE = {"sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"},
               "nice": {"-n", "--adjustment"}, "ionice": {"-c", "-n", "-p"}, "timeout": {"-s", "-k", "--signal"},
               "env": {"-u", "-C", "--unset", "--chdir"}, "chrt": set(), "taskset": set(), "stdbuf": set(),
               "xargs": {"-I", "-n", "-P", "-L", "-d", "-E", "-s"}}
_DOWNLOADERS = {"curl", "wget", "fetch", "http", "https", "aria2c", "lynx", "links", "gdown"}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "csh", "tcsh", "fish", "ash", "busybox"}
_INTERPRETERS = re.compile(r"^(python[\d.]*|pypy[\d.]*|perl[\d.]*|ruby[\d.]*|node|nodejs|php[\d.]*|lua[\d.]*)$")
_FORK_BOMB = re.compile(r"([\w:]+)\s*\(\)\s*\{[^}]*\1\s*\|\s*\1\s*&")
_SUBST = re.compile(r"\$\(([^()]*)\)|`([^`]*)`|<\(([^()]*)\)")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(:?[-=?+][^}]*)?\}?")
_LIST = {"|", "|&", "||", "&&", ";", "&", ";;", "(", ")", "\n"}
_REDIRECT = {">", ">>", ">|", "&>", "&>>", ">&"}


@dataclass(frozen=True)
class Hazard:
    """Why a command is not copied: ``kind`` (delete, disk, power, reboot, kill, bomb, download) and the reason."""

    kind: str
    reason: str


_TRIGGERS = ({"rm", "find", "chmod", "chown", "chgrp", "setfacl", "mv", "dd", "tee", "cp", "rsync", "shred",
              "reboot", "shutdown", "halt", "poweroff", "kexec", "init", "telinit", "systemctl", "kill", "killall5"}
             | _DOWNLOADERS)
_DISK_TOOLS = re.compile(r"^(mkfs(\.\w+)?|mke2fs|mkswap|wipefs|fdisk|sfdisk|cfdisk|gdisk|sgdisk|parted|blkdiscard|"
                         r"badblocks|zpool|pvcreate|vgremove|lvremove|cryptsetup)$")


def hazard(command: str) -> Hazard | None:
    """What ``command`` (one line of shell, untrusted) would do that no step may (None: nothing found)."""
    names = set(re.findall(r"[\w.+-]+", command))
    if not (names & _TRIGGERS or ">" in command or "()" in command or any(_DISK_TOOLS.match(w) for w in names)):
        return None  # the common case, read without a tokenizer: no program or redirection below could match
    if _FORK_BOMB.search(command):
        return Hazard("bomb", "it is a fork bomb: it starts processes until the host stops answering")
    inner: list[str] = []
    fetched: list[bool] = []

    def hold(m: re.Match[str]) -> str:
        body = next(g for g in m.groups() if g is not None)
        inner.append(body)
        fetched.append(any(_program(c) in _DOWNLOADERS for c in _commands(body)))
        return f" __substitution_{len(inner) - 1}__ "

    outer = command
    for _ in range(8):  # innermost first, so nested substitutions are read too
        outer, n = _SUBST.subn(hold, outer)
        if not n:
            break
    for body in inner:
        found = hazard(body)
        if found:
            return found
    for stages in _pipelines(outer):
        for stage in stages:
            words = _strip(stage)
            found = _simple(words) or _runs_fetched(words, [i for i, f in enumerate(fetched) if f])
            if found:
                return found
        found = _piped(stages)
        if found:
            return found
    return None


def _tokens(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # unbalanced quotes: read as words
        return re.findall(r"[|;&()<>]+|[^\s|;&()<>]+", text)


def _pipelines(text: str) -> list[list[list[str]]]:
    """The text's pipelines, each as its stages' words."""
    out: list[list[list[str]]] = [[[]]]
    for t in _tokens(text):
        if t in ("|", "|&"):
            out[-1].append([])
        elif t in _LIST:
            out.append([[]])
        else:
            out[-1][-1].append(t)
    return [[s for s in p if s] for p in out if any(p)]


def _commands(text: str) -> list[list[str]]:
    """Every simple command's words, prefixes (``sudo -E``, ``env A=1``, ``nohup``, ``VAR=x``) dropped."""
    return [_strip(s) for p in _pipelines(text) for s in p if _strip(s)]


def _strip(words: list[str]) -> list[str]:
    i = 0
    while i < len(words):
        w = words[i]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):
            i += 1
            continue
        name = w.rsplit("/", 1)[-1]
        if name not in _PREFIXES:
            break
        i += 1
        takes = _WITH_VALUE.get(name, set())
        while i < len(words) and (words[i].startswith("-") or (name in ("timeout", "nice", "taskset", "chrt")
                                                               and re.match(r"^[\d.]+[smhd]?$|^0x", words[i]))):
            i += 2 if words[i] in takes else 1
    return words[i:]


def _program(words: list[str]) -> str:
    return words[0].rsplit("/", 1)[-1] if words else ""


def _expand(word: str) -> str:
    """A path word as it could expand at worst: ``~`` and ``$HOME`` the home folder, any other variable empty
    (or its default, ``${A:-x}``; one that stops the shell when empty, ``${A:?}``, stays a name)."""
    def var(m: re.Match[str]) -> str:
        op = (m[2] or "").lstrip(":")
        if m[1] == "HOME":
            return _HOME
        if op.startswith("?"):
            return m[1]
        return op[1:] if op[:1] in ("-", "=") else ""

    return _VAR.sub(var, re.sub(r"^~(?=/|$)", _HOME, word))


def _whole(word: str) -> str | None:
    """What deleting, moving or re-owning ``word`` would take away, when that is a whole disk, system folder or
    home folder (None: a narrower path)."""
    path = _expand(word)
    if not path.startswith("/"):
        return None
    norm = posixpath.normpath("/" + path.lstrip("/"))
    parent, last = posixpath.split(norm)
    if last and re.fullmatch(r"[*?.\[\]!]*\**", last) and "*" in last:  # dir/* and dir/.*: the folder's content
        norm = parent
    empty = [m[1] for m in _VAR.finditer(word)
             if m[1] != "HOME" and (m[2] or "").lstrip(":")[:1] not in ("?", "-", "=")]
    when = f" when ${empty[0]} is empty" if empty else ""
    if norm == "/":
        return "the whole disk (/)" + when
    if norm == _HOME or norm == "/root":
        return "your home folder" if norm == _HOME else "root's home folder (/root)"
    parts = norm.strip("/").split("/")
    if len(parts) == 1 and parts[0] in _SYSTEM:
        return f"the system folder {norm}{when}"
    return None


def _simple(words: list[str]) -> Hazard | None:
    p, args = _program(words), words[1:]
    if not p:
        return None
    paths = [a for a in args if not a.startswith("-") or a == "-"]
    if p == "rm" or (p == "find" and any(a in ("-delete", "rm") for a in args)):
        if "--no-preserve-root" in args:
            return Hazard("delete", "it deletes the whole disk (--no-preserve-root)")
        for a in (paths if p == "rm" else paths[:1]):
            gone = _whole(a)
            if gone:
                return Hazard("delete", f"it deletes {gone}")
    if p in ("chmod", "chown", "chgrp", "setfacl") and any(re.match(r"^-\w*R|^--recursive$", a) for a in args):
        for a in paths[1:]:
            gone = _whole(a)
            if gone:
                return Hazard("delete", f"it changes who may use every file of {gone}")
    if p == "mv":
        for a in paths[:-1]:
            gone = _whole(a)
            if gone:
                return Hazard("delete", f"it moves away {gone}")
        if paths and paths[-1] == "/dev/null":
            return Hazard("delete", "it moves files onto /dev/null (they are lost)")
    return _disk(p, words) or _power(p, args)


def _disk(p: str, words: list[str]) -> Hazard | None:
    args = words[1:]
    if p == "dd":
        for a in args:
            if a.startswith("of=/dev/") and not _SAFE_DEV.match(a[3:]):
                return Hazard("disk", f"it writes over the device {a[3:]} (a disk or partition: its data is lost)")
    if _DISK_TOOLS.match(p):
        return Hazard("disk", f"it formats or repartitions a disk ({p})")
    written = [words[k + 1] for k, a in enumerate(words[:-1]) if a in _REDIRECT]
    named = [a for a in args if not a.startswith("-")]
    written += named if p in ("tee", "shred") else named[-1:] if p in ("cp", "install", "rsync") else []
    for target in written:
        if target.startswith("/dev/") and not _SAFE_DEV.match(target):
            return Hazard("disk", f"it writes over the device {target} (a disk or partition: its data is lost)")
        if target == "/proc/sysrq-trigger":
            return Hazard("power", "it writes /proc/sysrq-trigger, which crashes or restarts the machine")
    return None


def _power(p: str, args: list[str]) -> Hazard | None:
    restart = (p == "reboot" or (p == "shutdown" and any(re.match(r"^-\w*r|^--reboot$", a) for a in args))
               or (p in ("init", "telinit") and args[:1] == ["6"])
               or (p == "systemctl" and any(a in ("reboot", "kexec", "soft-reboot") for a in args)))
    if restart:
        return Hazard("reboot", "it restarts the host (a set-up role's work; a step cannot reboot its own host)")
    if p in ("shutdown", "halt", "poweroff", "kexec") or (p in ("init", "telinit") and args[:1] == ["0"]) \
            or (p == "systemctl" and any(a in ("poweroff", "halt", "suspend", "hibernate") for a in args)):
        return Hazard("power", f"it stops the machine ({p})")
    if p == "kill":
        pids = args[1:] if args[:1] and args[0].startswith("-") and args[0] != "--" and len(args) > 1 else args
        pids = pids[2:] if args[:1] in (["-s"], ["-n"]) else pids
        if any(a in ("-1", "1") for a in pids if a != "--"):
            return Hazard("kill", "it kills every process it may (pid -1) or init (pid 1)")
    if p == "killall5":
        return Hazard("kill", "it kills every process it may")
    return None


def _reads_stdin(words: list[str]) -> bool:
    """Whether an interpreter's words make it run the script it reads on its standard input."""
    p, args = _program(words), words[1:]
    if p not in _SHELLS and not _INTERPRETERS.match(p) and p not in ("source", ".", "eval"):
        return False
    if p == "busybox":
        args = args[1:] if args[:1] and args[0] in _SHELLS else ["not-a-shell"]
    if p in ("source", "."):
        return bool(args) and args[0] in ("/dev/stdin", "-", "/proc/self/fd/0")
    if "-s" in args:
        return True
    first = next((a for a in args if not a.startswith("-") or a == "-"), None)
    if any(a in ("-c", "-e", "-m", "-r") for a in args):
        return False
    return first is None or first in ("-", "/dev/stdin", "/proc/self/fd/0")


def _piped(stages: list[list[str]]) -> Hazard | None:
    """``curl … | sh``: a download piped (through any filters) into an interpreter that runs what it reads."""
    got = None
    for words in stages:
        w = _strip(words)
        if _program(w) in _DOWNLOADERS:
            got = _program(w)
        elif got and _reads_stdin(w):
            return Hazard("download", f"it runs a script straight from the network ({got} … | {_program(w)}), "
                                      "unchecked")
    return None


def _runs_fetched(words: list[str], fetched: list[int]) -> Hazard | None:
    """``sh -c "$(curl …)"``, ``bash <(wget -O- …)``, ``eval "$(curl …)"``, ``. <(curl …)``: an interpreter fed
    a download's text."""
    if not fetched:
        return None
    p = _program(words)
    if p not in _SHELLS and not _INTERPRETERS.match(p) and p not in ("source", ".", "eval"):
        return None
    holds = [k for k in fetched if any(f"__substitution_{k}__" in a for a in words[1:])]
    if holds:
        return Hazard("download", f"it runs a script straight from the network ({p} fed a download), "
                                  "unchecked")
    return None
