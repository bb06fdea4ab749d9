"""Draft a suite from an artifact's README: text in, a :class:`Draft` out (:func:`draft`), YAML text out
(:func:`to_yaml`). Pure: no file, network or process is touched, and nothing read is ever executed.

The README is untrusted. Its fenced shell blocks are read line by line: ``git clone`` (and the checkout after it)
become ``sources:``; ``conda``/``venv`` lines the ``environment:``; package installs and builds ``prepare`` steps;
``limits.conf`` edits and reboots TODOs (a set-up role's work); ``python x.py``, ``torchrun``, ``deepspeed``,
``mpirun``, ``docker run`` the launch; the files those lines write ``outputs:``; "expected output" blocks
reference stubs. Every guess keeps the README line it came from; every gap is a TODO comment, which
:func:`todo_comments` lists for any suite file (``testbed show``'s "to fill in").
"""

from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from testbed.hazards import hazard
from testbed.suite import output_pattern_problem
from testbed.textfmt import plural

MAX_README_BYTES = 1 << 20
"""The largest README drafted from (a fetched one is cut off there and refused)."""

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", "shell-session", "shellsession", "terminal"}
OUTPUT_LANGS = {"text", "txt", "output", "log", "plaintext"}
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+.-]*)")
_EXPECT = re.compile(r"\b(expect(ed)?|should see|should get|sample output|example output|outputs? (is|are|looks?)"
                     r"|results?:|prints?:?\s*$)", re.I)
_COMMENT_EXPECT = re.compile(r"^#\s*(expect(ed)?( output)?|output|result)s?\s*:?\s*(.*)$", re.I)
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(\S*/)?python(\d+(\.\d+)?)?$")  # python, python3.8, /usr/bin/python3
_INSPECT = {"ls", "echo", "cat", "pwd", "which", "nvidia-smi", "nvcc", "lspci", "hostname", "ssh", "screen", "less",
            "head", "tail", "top", "htop", "watch", "true", "nano", "vim", "vi", "emacs", "touch", "mkdir", "cp",
            "mv", "rm", "tar", "unzip", "export", "unset", "set", "source", ".", "cd", "ssh-keygen", "ssh-keyscan",
            "gcloud", "env", "free", "df", "du", "ps", "kill", "exit", "logout", "chmod", "chown", "ln", "sleep"}
_SETUP = {"apt", "apt-get", "yum", "dnf", "zypper", "brew", "snap", "make", "cmake", "ninja", "meson", "gcc", "g++",
          "mpicc", "mpicxx", "nvcc", "pip", "pip3", "conda", "mamba", "micromamba", "wget", "curl", "gdown",
          "git", "cargo", "go", "npm", "./configure", "configure", "bazel", "scons", "autoreconf", "sh", "bash"}
_LAUNCHERS = {"torchrun", "deepspeed", "mpirun", "mpiexec", "srun", "horovodrun", "accelerate"}
_LAUNCH_SCRIPT = re.compile(r"(run|train|eval|bench|experiment|reproduce|main|entry|launch)", re.I)
_BUILD_SCRIPT = re.compile(r"(build|install|setup|env|config|create|prepare|download)", re.I)
_OUT_FLAG = re.compile(r"^--?(o|out|output|outputs|output[-_]dir|out[-_]dir|outdir|log|log[-_]dir|logdir|"
                       r"log[-_]file|logfile|save[-_]dir|save[-_]path|save|results?|results?[-_]dir|"
                       r"checkpoint[-_]dir|ckpt[-_]dir)$")
_DIR_FLAG = re.compile(r"dir$|^--save$")
_WRITES = re.compile(r"\b(generates?|writes?|creates?|produces?|saves?|outputs?)\b([^.`]{0,40}`[^`\n]+`)+")
_FILE = re.compile(r"`([^`\s/]+\.(?!py`|sh`|md`|ipynb`)[A-Za-z0-9]{1,5})`")  # `name.ext`, not a script or doc
_CAPS = r"(?<![A-Za-z0-9$\{])(?<!-x )[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_=])"
_PLACEHOLDER = re.compile(r"\[[^\]]*\]|<[^>]*>|\b(?:your|YOUR|Your)_?\w*|" + _CAPS
                          + r"|\babsolute_path\w*|\babosulte_path\w*")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_JINJA = re.compile(r"\{\{|\}\}|\{%|%\}|\{#|#\}")
_DOLLAR_BRACE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}(?=(\w)?)")
_TODO = re.compile(r"^#+\s*(.*;\s*)?TODO\b")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")  # \t and \n stay


@dataclass
class Source:
    name: str
    repo: str
    path: str
    line: int
    ref: str | None = None
    ref_line: int | None = None
    submodules: bool = False


@dataclass
class Step:
    name: str
    run: str
    line: int
    network: bool = False
    cwd: str | None = None
    todo: str | None = None


@dataclass
class LaunchLine:
    command: str  # the README's words, with its address, rank and world size replaced by templates
    program: str  # the script or launcher it starts (for a variant's name and the agreement)
    line: int
    cwd: str | None = None
    one_launcher: bool = False  # mpirun & co.: one command on the master starts every rank
    hosts: int | None = None  # the host count it names (--num-nodes/--nnodes N, mpirun -np N)
    todo: str | None = None


@dataclass
class Guess:
    value: str
    line: int
    todo: str | None = None


@dataclass
class Draft:
    """What a README says, as a suite would hold it; ``todos`` are the gaps (text, README line or None)."""

    title: str = ""
    sources: list[Source] = field(default_factory=list)
    environment: Guess | None = None
    steps: list[Step] = field(default_factory=list)
    launches: list[LaunchLine] = field(default_factory=list)
    outputs: list[Guess] = field(default_factory=list)
    expected: list[Guess] = field(default_factory=list)  # each a block of expected output
    setup_todos: list[Guess] = field(default_factory=list)  # what a set-up role must do (limits.conf, reboot)
    todos: list[tuple[str, int | None]] = field(default_factory=list)


@dataclass
class _Block:
    lang: str
    line: int  # the README line of its first content line
    lines: list[str]
    before: str  # the prose just above it
    after: str  # the prose just below it


def clean(text: str, limit: int = 2000) -> str:
    """``text`` with control characters dropped and ``${VAR}`` (which suite files expand) written ``$VAR``."""
    text = _CTRL.sub("", text)[:limit]
    return _DOLLAR_BRACE.sub(lambda m: f"${m[1]}" if not m[2] else f"\"${m[1]}\"", text)


def _blocks(text: str) -> list[_Block]:
    lines = text.split("\n")  # the lines an editor numbers (splitlines would also break at \x85, \u2028, ...)
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m[1], m[2].lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            j += 1
        before = " ".join(ln.strip() for ln in lines[max(0, start - 3):start] if ln.strip() and not _FENCE.match(ln))
        after = []  # the prose after it, to the next block or heading (at most 12 lines)
        for ln in lines[j + 1:j + 13]:
            if _FENCE.match(ln) or ln.lstrip().startswith("#"):
                break
            after.append(ln.strip())
        out.append(_Block(lang, start + 2, lines[start + 1:j], before, " ".join(a for a in after if a)))
        i = j + 1
    return out


def _words(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return cmd.split()


def _head(words: list[str]) -> list[str]:
    """The words from the program on: leading VAR=value assignments, sudo and env dropped."""
    i = 0
    while i < len(words) and (_ASSIGN.match(words[i]) or words[i] in ("sudo", "env", "time", "nohup", "exec")):
        i += 1
    return words[i:]


def _is_command(line: str) -> bool:
    w = _head(_words(line.removeprefix("$ ")))
    if not w:
        return False
    p = w[0]
    return (p in _INSPECT or p in _SETUP or p in _LAUNCHERS or bool(_PYTHON.match(p)) or p.startswith(("./", "/"))
            or p in ("docker", "git", "sudo", "reboot", "virtualenv") or p.endswith(".sh"))


def _kind(b: _Block) -> str:
    """shell, expected or other."""
    body = [ln for ln in b.lines if ln.strip() and not ln.strip().startswith("#")]
    if b.lang in SHELL_LANGS:
        return "shell"
    if b.lang in OUTPUT_LANGS:
        return "expected"
    if b.lang:
        return "other"
    commands = sum(_is_command(ln.strip()) for ln in body)
    if body and commands * 2 >= len(body) and commands:
        return "shell"
    return "expected" if body and _EXPECT.search(b.before) else "other"


def _commands(b: _Block) -> list[tuple[str, int]]:
    """The block's commands with their README lines: continuations joined, prompts dropped, ``&&`` split."""
    out: list[tuple[str, int]] = []
    pending, first = "", 0
    console = b.lang == "console" or any(ln.startswith("$ ") for ln in b.lines)
    for k, raw in enumerate(b.lines):
        s = raw.strip()
        if not pending:
            first = b.line + k
            if console:
                if not s.startswith("$ "):
                    continue
                s = s[2:]
            if not s or s.startswith("#"):
                continue
        if s.endswith("\\"):
            pending += s[:-1].rstrip() + " "
            continue
        whole = pending + s
        pending = ""
        parts = [whole] if ("'" in whole or '"' in whole) else re.split(r"\s*(?:&&|;)\s*", whole)
        out.extend((p.strip(), first) for p in parts if p.strip())
    return out


def _source_name(url: str) -> str:
    stem = re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    name = re.sub(r"[^A-Za-z0-9_]", "_", stem).lower().strip("_") or "repo"
    return name if re.match(r"^[A-Za-z_]", name) else f"r_{name}"


def https_url(url: str) -> str:
    """A GitHub ssh URL as https (hosts clone without the user's keys)."""
    m = re.match(r"^git@([\w.-]+):(.+)$", url)
    return f"https://{m[1]}/{m[2]}" if m else url


class _State:
    """What the reading knows so far: the draft, the folder the block is in, the source it is in."""

    def __init__(self, d: Draft) -> None:
        self.d = d
        self.cwd: str | None = None  # relative to the primary source (None: its root)
        self.repo: Source | None = None  # the source the block is in (after `cd REPO`)
        self.launched: set[tuple[str, str | None]] = set()  # (command, folder) of each launch line read


def _clone(st: _State, w: list[str], line: int) -> None:
    args = [a for a in w[2:]]
    ref = None
    for flag in ("-b", "--branch"):
        if flag in args and args.index(flag) + 1 < len(args):
            ref = args[args.index(flag) + 1]
    pos = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-b", "--branch",
                                                                                                     "--depth"))]
    if not pos:
        return
    url = https_url(clean(pos[0], 500))
    name = _source_name(url)
    if any(s.name == name for s in st.d.sources):
        return
    stem = re.sub(r"[^\w.-]", "_", re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1])).strip(".") or name
    folder = re.sub(r"[^\w.-]", "_", pos[1]) if len(pos) > 1 else stem
    if not folder.strip("."):  # `git clone URL .` or `..`: the home folder itself or above it, never a source's
        st.d.todos.append((clean(f"the README clones {url} into {pos[1]!r}; the draft clones it into ~/{stem}: "
                                 "check the folder", 500), line))
        folder = stem
    st.d.sources.append(Source(name, url, "~/" + folder, line, ref, line if ref else None,
                               "--recursive" in args or "--recurse-submodules" in args))


def _cd(st: _State, w: list[str]) -> None:
    to = w[1] if len(w) > 1 else "~"
    if to in ("~", "~/", "$HOME"):
        st.cwd, st.repo = None, None
        return
    base = to.rstrip("/").removeprefix("./").removeprefix("~/")
    for s in st.d.sources:
        if base == s.path.removeprefix("~/"):
            st.repo, st.cwd = s, None
            return
    if to == "..":
        st.cwd = st.cwd.rsplit("/", 1)[0] if st.cwd and "/" in st.cwd else None
    elif not to.startswith(("/", "~", "$")) and ".." not in to:
        st.cwd = f"{st.cwd}/{base}" if st.cwd else base


def _folder(st: _State) -> str | None:
    src = st.repo or (st.d.sources[0] if st.d.sources else None)
    if src is None:
        return st.cwd
    return f"{src.path}/{st.cwd}" if st.cwd else src.path


def _is_launch(w: list[str]) -> str | None:
    """The program a launch line starts, or None when the line is not a launch."""
    p = w[0]
    if p in _LAUNCHERS:
        return f"{p} {_target(w[1:])}".rstrip()
    if p == "docker" and len(w) > 1 and w[1] == "run":
        return "docker run"
    if _PYTHON.match(p):
        rest = w[1:]
        if not rest or any(a in ("-h", "--help", "-c", "--version", "-V") for a in rest):
            return None
        if rest[0] == "-m":
            mod = rest[1] if len(rest) > 1 else ""
            return mod if mod.startswith("torch.distributed") or mod in ("deepspeed", "accelerate") else None
        script = rest[0]
        if script.endswith(".py") and not re.search(r"(^|/)(setup|get-pip)\.py$", script):
            return script
        return None
    if p.endswith(".sh") or (p in ("bash", "sh") and len(w) > 1 and w[1].endswith(".sh")):
        script = p if p.endswith(".sh") else w[1]
        name = script.rsplit("/", 1)[-1]
        return script if _LAUNCH_SCRIPT.search(name) and not _BUILD_SCRIPT.search(name) else None
    return None


_TWO_VALUES = {"--mca", "-mca", "-gmca", "--gmca"}


def _target(args: list[str]) -> str:
    """The program a launcher (mpirun, torchrun, ...) starts: its first argument that is no option's value."""
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            i += 3 if a in _TWO_VALUES else (1 if "=" in a or i + 1 >= len(args) or args[i + 1].startswith("-")
                                              else 2)
            continue
        return a
    return ""


def _outputs_of(w: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(w):
        if a in (">", ">>", "1>", "2>", "&>") and i + 1 < len(w):
            out.append(w[i + 1])
        elif re.match(r"^(\d?>>?|&>)\S", a):
            out.append(re.sub(r"^(\d?>>?|&>)", "", a))
        elif a == "tee" and i + 1 < len(w):
            out.extend(x for x in w[i + 1:i + 2] if not x.startswith("-"))
        else:
            flag, eq, val = a.partition("=")
            if _OUT_FLAG.match(flag) and (eq or i + 1 < len(w)):
                v = val if eq else w[i + 1]
                if v.startswith("-"):
                    continue
                out.append(v.rstrip("/") + "/**" if _DIR_FLAG.search(flag) else v)
    return [o for o in out if o not in ("/dev/null", "&1", "&2")]


_TEMPLATED = re.compile(r"(?P<ip>\b(?:\d{1,3}\.){3}\d{1,3}\b)"
                        r"|(?P<rflag>--(?:rank|node[-_]rank)[ =])(?P<rank>\d+)\b"
                        r"|(?P<wflag>--(?:num[-_]nodes|nnodes|world[-_]size)[ =])(?P<world>\d+)\b"
                        r"|(?P<hflag>--?(?:hostfile|machinefile)[ =])(?P<hfile>\S+)")


def _literal(text: str) -> str | None:
    """``text`` as template text that renders to itself (None: it cannot be, it holds ``endraw``)."""
    if "endraw" in text:
        return None
    return "{% raw %}" + text + "{% endraw %}" if _JINJA.search(text) else text


def template(command: str) -> str | None:
    """A README command as a launch template: its IP address becomes ``{{ master_addr }}``, its rank, world size
    and hostfile testbed's; everything else is literal (None: it cannot be written literally)."""
    out, at = [], 0
    for m in _TEMPLATED.finditer(command):
        lit = _literal(command[at:m.start()])
        if lit is None:
            return None
        out.append(lit)
        if m["ip"]:
            out.append("{{ master_addr }}")
        elif m["rank"]:
            out.append(m["rflag"] + "{{ rank }}")
        elif m["world"]:
            out.append(m["wflag"] + "{{ world_size }}")
        else:
            out.append(m["hflag"] + "{{ hostfile }}")
        at = m.end()
    tail = _literal(command[at:])
    return None if tail is None else "".join(out) + tail


def _placeholder(text: str) -> str | None:
    m = _PLACEHOLDER.search(text)
    return m[0] if m else None


def _output(st: _State, path: str, line: int, cwd: str | None) -> None:
    glob = re.sub(r"\$\w+|\$\{[^}]*\}|\[[^\]]*\]|<[^>]*>|(?<![A-Za-z0-9])[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9](?![a-z0-9])",
                  "*", clean(path, 300))
    glob = re.sub(r"\*{3,}", "**", glob)
    if not glob.startswith(("/", "~")):
        glob = f"{cwd}/{glob.removeprefix('./')}" if cwd else glob.removeprefix("./")
    if any(g.value == glob for g in st.d.outputs):
        return
    problem = output_pattern_problem(glob)
    if problem:
        st.d.todos.append((f"the output {glob!r} cannot be collected as written ({problem}): add it to outputs "
                           "as a glob under the run folder, ~/ or an absolute folder", line))
        return
    st.d.outputs.append(Guess(glob, line, "the folder is a guess: check where the program writes it"
                              if not glob.startswith(("/", "~")) else None))


_HOSTS = re.compile(r"(?:--(?:num[-_]nodes|nnodes|world[-_]size)|(?:^|\s)-(?:np|n))[ =](\d{1,4})\b")


def _launch(st: _State, w: list[str], cmd: str, line: int, program: str) -> None:
    folder = _folder(st)
    if (clean(cmd), folder) in st.launched:
        return  # the same line again (a README repeats it per host or per step): one variant
    st.launched.add((clean(cmd), folder))
    ph = _placeholder(cmd)
    m = _HOSTS.search(cmd)
    guessed = st.repo is None and len(st.d.sources) > 1  # the folder: in the first of several sources, a guess
    todo = "; ".join(t for t in (f"replace {ph!r} (the README's placeholder)" if ph else "",
                                 f"check the folder ({folder}: the README does not cd into a source here)"
                                 if guessed else "") if t)
    st.d.launches.append(LaunchLine(clean(cmd), program, line, folder, one_launcher=program.split()[0] in _LAUNCHERS,
                                    todo=todo or None, hosts=int(m[1]) if m and 1 <= int(m[1]) <= 4096 else None))
    for o in _outputs_of(w):
        _output(st, o, line, folder)


def _environment(st: _State, w: list[str], line: int) -> bool:
    """Read a conda/venv line into the environment; True when it was one."""
    p, rest = w[0], w[1:]
    if p in ("conda", "mamba", "micromamba") and rest[:1] in (["create"], ["activate"]):
        for flag in ("-n", "--name", "-p", "--prefix"):
            if flag in rest and rest.index(flag) + 1 < len(rest):
                v = rest[rest.index(flag) + 1]
                path = v if flag in ("-p", "--prefix") else f"~/miniconda3/envs/{v}"
                st.d.environment = Guess(clean(path, 300), line, "the conda installation's folder is a guess")
                return True
        if rest[0] == "activate" and len(rest) > 1:
            st.d.environment = Guess(f"~/miniconda3/envs/{clean(rest[1], 200)}", line,
                                     "the conda installation's folder is a guess")
        return True
    venv = (_PYTHON.match(p) and rest[:2] == ["-m", "venv"]) or p == "virtualenv"
    if venv:
        args = [a for a in rest[2 if p != "virtualenv" else 0:] if not a.startswith("-")]
        if args:
            st.d.environment = Guess("~/" + clean(args[-1], 200).removeprefix("~/").removeprefix("./"), line,
                                     "the venv's folder (the README makes it in the folder it is run from)")
        return True
    if p in ("source", ".") and rest and rest[0].endswith("/bin/activate"):
        if st.d.environment is None:
            env = rest[0].removesuffix("/bin/activate")
            st.d.environment = Guess(env if env.startswith(("/", "~")) else "~/" + env.removeprefix("./"), line)
        return True
    return False


def _git(st: _State, w: list[str], line: int) -> bool:
    """Read a git line (clone, checkout, switch, submodule); True when it was one of those."""
    if len(w) < 2:
        return False
    if w[1] == "clone":
        _clone(st, w, line)
        return True
    src = st.repo or (st.d.sources[-1] if st.d.sources else None)
    if w[1] in ("checkout", "switch") and src is not None:
        ref = next((a for a in w[2:] if not a.startswith("-")), None)
        if ref and src.ref is None and not _placeholder(ref):
            src.ref, src.ref_line = clean(ref, 200), line
        return True
    if w[1] == "submodule" and src is not None:
        src.submodules = True
        return True
    return False


def _setup_kind(w: list[str], cmd: str) -> str | None:
    """What a set-up line is: limits, packages, build (None: not a set-up line; a reboot is a hazard)."""
    p = w[0]
    if "limits.conf" in cmd or "/etc/security/limits" in cmd:
        return "limits"
    if p in ("pip", "pip3", "apt", "apt-get", "yum", "dnf", "zypper", "conda", "mamba", "micromamba", "wget",
             "curl", "gdown", "snap", "brew", "npm", "cargo") or (_PYTHON.match(p) and w[1:3] == ["-m", "pip"]):
        return "packages"
    if p in _SETUP or (_PYTHON.match(p) and len(w) > 1 and re.search(r"(^|/)(setup|get-pip)\.py$", w[1])) \
            or p.endswith(".sh") or p.startswith("./"):
        return "build"
    return None


_DROP = {"ls", "pwd", "which", "nvidia-smi", "lspci", "hostname", "ssh", "screen", "less", "head", "tail", "top",
         "htop", "watch", "nano", "vim", "vi", "emacs", "gcloud", "ssh-keygen", "ssh-keyscan", "exit", "logout",
         "free", "df", "du", "ps"}


def _dropped(w: list[str], cmd: str) -> bool:
    """An inspection (ls, nvidia-smi, --version, an editor) or an interactive line: not part of a step."""
    p = w[0]
    if p in _DROP or "--version" in w or "-V" in w or (_PYTHON.match(p) and len(w) == 1):
        return True
    return p in ("echo", "cat") and ">" not in cmd


def _shell_block(st: _State, b: _Block) -> None:
    st.cwd, st.repo = None, None
    start = _folder(st)
    kept: list[tuple[str, int, str | None]] = []  # (command, line, set-up kind)
    launched = False
    for cmd, line in _commands(b):
        w = _head(_words(cmd))
        if not w:
            continue
        m = _COMMENT_EXPECT.match(cmd)
        if m:
            continue
        danger = hazard(cmd)
        if danger is not None:
            if danger.kind == "reboot":
                st.d.setup_todos.append(Guess("reboot the hosts (a set-up role; a step cannot reboot its own host)",
                                              line))
            else:
                st.d.todos.append((clean(f"not copied into a step: {cmd[:160]!r}, because {danger.reason}; do "
                                         "by hand what it is for, if the artifact needs it"), line))
            continue
        if w[0] == "git" and _git(st, w, line):
            continue
        if _environment(st, w, line):
            if w[1:2] == ["create"] or "venv" in w or w[0] == "virtualenv":
                st.d.setup_todos.append(Guess("make the environment (a set-up role: the profile's venv or conda "
                                              "role)", line))
            continue
        program = _is_launch(w)
        if program:
            _launch(st, w, cmd, line, program)
            launched = True
            continue
        if w[0] == "cd":
            _cd(st, w)
            kept.append((cmd, line, None))
            continue
        kind = _setup_kind(w, cmd)
        if kind == "limits":
            st.d.setup_todos.append(Guess("raise the memlock limit in /etc/security/limits.conf (a set-up role)",
                                          line))
            continue
        if not _dropped(w, cmd):
            kept.append((cmd, line, kind))
    _step(st, kept, start)
    if launched:
        for m in _WRITES.finditer(b.after):  # "generates a `x.txt` file", "generate two files: `a.txt` and `b.txt`"
            for f in _FILE.findall(m[0]):
                _output(st, f, st.d.launches[-1].line, st.d.launches[-1].cwd)
    _expect_comments(st, b)


def _step(st: _State, kept: list[tuple[str, int, str | None]], cwd: str | None) -> None:
    kinds = [k for _, _, k in kept if k]
    if not kinds:
        return
    while kept and kept[-1][2] is None:  # a trailing cd or export does nothing
        kept.pop()
    line = kept[0][1]
    builds = {"make", "cmake", "ninja", "mpicc", "mpicxx", "gcc", "g++", "nvcc", "bazel", "scons"}
    what = ("install packages" if all(k == "packages" for k in kinds) else
            "build" if any(c.split()[:1] and (set(_head(_words(c))[:1]) & builds or "setup.py" in c)
                           for c, _, _ in kept) else "set up")
    run = "\n".join(clean(c) for c, _, _ in kept)
    ph = _placeholder(run)
    literal = _literal(run)
    if literal is None:
        st.d.todos.append(("a set-up block could not be written as a step (it holds 'endraw'): write it by hand",
                           line))
        return
    st.d.steps.append(Step(f"{what} (line {line})", literal, line,
                           network=any(k == "packages" for k in kinds) or any(
                               c.split()[:2] == ["git", "clone"] for c, _, _ in kept),
                           cwd=cwd, todo=f"replace {ph!r} (the README's placeholder)" if ph else None))


def _expect_comments(st: _State, b: _Block) -> None:
    """``# expect:`` comment lines inside a shell block: the lines after it are expected output."""
    for k, raw in enumerate(b.lines):
        m = _COMMENT_EXPECT.match(raw.strip())
        if not m:
            continue
        got = [m[4]] if m[4] else []
        for nxt in b.lines[k + 1:]:
            s = nxt.strip()
            if not s.startswith("#"):
                break
            got.append(s.lstrip("#").strip())
        if any(got):
            st.d.expected.append(Guess(clean("\n".join(got), 20000), b.line + k))


def draft(text: str) -> Draft:
    """Read a README (untrusted text, at most :data:`MAX_README_BYTES`) into a :class:`Draft`."""
    d = Draft()
    text = text[:MAX_README_BYTES].replace("\r\n", "\n").replace("\r", "\n")
    head = re.search(r"^\s*#+\s*(.+?)\s*#*\s*$", text, re.M) or re.search(r"^\s*(\S.*?)\s*$", text, re.M)
    d.title = clean(head[1], 200) if head else ""
    st = _State(d)
    for b in _blocks(text):
        kind = _kind(b)
        if kind == "shell":
            _shell_block(st, b)
        elif kind == "expected" and any(ln.strip() for ln in b.lines):
            d.expected.append(Guess(clean("\n".join(b.lines), 20000), b.line))
    _gaps(d)
    return d


def _gaps(d: Draft) -> None:
    """The TODOs no single value carries: what the README did not say (a source's commit is a comment on it)."""
    if not d.sources:
        d.todos.append(("the artifact's repository: no 'git clone' in the README (add a source with its "
                        "commit)", None))
    if d.environment is None and any(s.network for s in d.steps):
        d.todos.append(("environment: the venv or conda env the steps install into and the ranks run in (the "
                        "README names none)", None))
    if d.environment is not None and "$" in d.environment.value:
        d.environment.todo = "replace the README's shell variable with the environment's folder"
    if not d.outputs:
        d.todos.append(("the outputs: no launch line names a file it writes", None))


def least_size(d: Draft) -> int:
    """A lower bound of the bytes :func:`to_yaml` writes for ``d`` (its values, without keys or comments): for a
    draft too large to load, known before it is written."""
    variants = 27 * len(d.launches) if len(d.launches) > 1 else 0  # "{% elif launch == 'x' %}" and "- x" each
    return (sum(len(ln.command) for ln in d.launches) + variants + sum(len(g.value) for g in d.outputs)
            + sum(len(s.run) + s.run.count("\n") for s in d.steps)  # a line break: at least 2 bytes written
            + sum(len(s.repo) for s in d.sources))


# --- writing ----------------------------------------------------------------------------------------------------
NO_LAUNCH = "echo 'TODO: write the launch command (testbed new found none in the README)' >&2; exit 2"


def _from(line: int | None, todo: str | None = None, origin: str = "README.md") -> str:
    said = f"from {origin}:{line}" if line else ""
    return "; ".join(x for x in (said, f"TODO {todo}" if todo else "") if x)


def _variant(launches: list[LaunchLine]) -> list[str]:
    names: list[str] = []
    taken: set[str] = set()
    next_k: dict[str, int] = {}
    for ln in launches:
        base = re.sub(r"[^a-z0-9]+", "-", ln.program.split()[-1].rsplit("/", 1)[-1].lower()
                      .removesuffix(".py").removesuffix(".sh")).strip("-") or "launch"
        name, k = base, next_k.get(base, 2)
        while name in taken:
            name, k = f"{base}-{k}", k + 1
        next_k[base] = k
        names.append(name)
        taken.add(name)
    return names


def _shell_path(path: str) -> str:
    """``path`` as one shell word, a leading ``~/`` left to expand."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def _launch_map(d: Draft, origin: str) -> tuple[Any, Any]:
    """(the launch mapping, the parameters mapping or None): one launch line as it is; several as the variants
    of a ``launch`` parameter."""
    from ruamel.yaml.comments import CommentedMap

    launch, params = CommentedMap(), None
    lines: list[tuple[LaunchLine, str]] = []
    for ln in d.launches:
        t = template(ln.command)
        cd = _literal(f"cd {_shell_path(ln.cwd)} && ") if ln.cwd and len(d.launches) > 1 else ""
        if t is None or cd is None:
            d.todos.append(("a launch line could not be written as a template (it holds 'endraw'): write it by "
                            "hand", ln.line))
        else:
            lines.append((ln, cd + t))
    if not lines:
        launch["command"] = NO_LAUNCH
        launch.yaml_add_eol_comment("TODO the launch command: the README starts no program", "command")
        return launch, None
    launch["on"] = "master" if all(ln.one_launcher for ln, _ in lines) else "all"
    launch.yaml_add_eol_comment("TODO the hosts that start ranks (a launcher such as mpirun: master)", "on")
    if len(lines) == 1:
        ln, t = lines[0]
        if ln.cwd:
            launch["cwd"] = ln.cwd
            launch.yaml_add_eol_comment(_from(ln.line, None, origin), "cwd")
        launch["command"] = t
        launch.yaml_add_eol_comment(_from(ln.line, ln.todo, origin), "command")
        return launch, None
    names = _variant([ln for ln, _ in lines])
    params = CommentedMap()
    params["launch"] = CommentedMap(type="str", default=names[0], choices=names,
                                    help="which of the README's launch lines runs")
    params.yaml_add_eol_comment("TODO keep the launch lines the artifact's results need", "launch")
    parts = []
    for k, (name, (_, t)) in enumerate(zip(names, lines, strict=True)):
        parts.append(("{% if" if k == 0 else "{% elif") + f" launch == '{name}' %}}" + t)
    launch["command"] = "".join(parts) + "{% endif %}"
    todos = [f"{n}: {ln.todo}" for n, (ln, _) in zip(names, lines, strict=True) if ln.todo]
    launch.yaml_add_eol_comment(_from(None, "; ".join(todos) if todos else None, origin) + (
        "; " if todos else "") + "from " + ", ".join(f"{origin}:{ln.line}" for ln, _ in lines), "command")
    return launch, params


def _sources(d: Draft, origin: str) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    seq = CommentedSeq()
    for s in d.sources:
        m = CommentedMap()
        m["name"], m["repo"] = s.name, s.repo
        m.yaml_add_eol_comment(_from(s.line, None, origin), "repo")
        if s.ref is not None:
            m["ref"] = s.ref
            m.yaml_add_eol_comment(_from(s.ref_line, None if _HEX.match(s.ref) else
                                         "a branch or tag, not a commit: pin the commit", origin), "ref")
        else:
            m.yaml_add_eol_comment(_from(s.line, "pin the commit (ref: COMMIT); the README checks out none",
                                         origin), "repo")
        m["path"] = s.path
        if s.submodules:
            m["submodules"] = True
        seq.append(m)
    return seq


def _steps(d: Draft, origin: str) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import LiteralScalarString

    seq = CommentedSeq()
    for s in d.steps:
        m = CommentedMap()
        m["name"] = s.name
        m.yaml_add_eol_comment(_from(s.line, s.todo, origin), "name")
        if s.cwd:
            m["cwd"] = s.cwd
        m["run"] = LiteralScalarString(s.run + "\n") if "\n" in s.run else s.run
        if s.network:
            m["needs"] = ["network"]
        seq.append(m)
    return seq


def _plain_data(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain_data(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain_data(v) for v in node]
    return str(node) if isinstance(node, str) else node


def to_yaml(d: Draft, name: str, origin: str = "README.md", expected_files: list[str] | None = None, *,
            came_from: str | None = None) -> str:
    """The draft as ``suite.yml`` text: values written by the YAML dumper (never pasted), each guess with a
    ``# from ORIGIN:LINE`` comment, each gap a ``TODO`` comment. ``expected_files``: where the CLI writes each
    expected-output block (the reference stubs point at them); ``came_from``: the path or URL the header names."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    origin = re.sub(r"[^\w./:@+-]", "_", origin)[:200] or "README.md"
    doc = CommentedMap()
    doc["name"] = name
    doc["description"] = (f"drafted from the README of {d.title}" if d.title else "drafted from a README")[:300]
    doc.yaml_add_eol_comment("TODO one line on what it runs", "description")
    named = max((ln for ln in d.launches if ln.hosts and ln.hosts > 1), key=lambda ln: ln.hosts or 0, default=None)
    doc["requires"] = CommentedMap(hosts=1)  # 1 whatever the README says, so that the draft plans on any testbed
    ranks = f" ({origin}:{named.line} starts {plural(named.hosts or 0, 'rank')}: a host each?)" if named else ""
    doc.yaml_add_eol_comment(f"TODO the hosts, providers and accelerator (gpu, tpu) it needs{ranks}", "requires")
    if d.environment is not None:
        doc["environment"] = d.environment.value
        doc.yaml_add_eol_comment(_from(d.environment.line, d.environment.todo, origin), "environment")
    if d.sources:
        doc["sources"] = _sources(d, origin)
    launch, params = _launch_map(d, origin)
    if params is not None:
        doc["parameters"] = params
    doc["steps"] = CommentedMap()
    if d.steps:
        doc["steps"]["prepare"] = _steps(d, origin)
    doc["steps"]["launch"] = launch
    if d.outputs:
        from ruamel.yaml.comments import CommentedSeq

        outs = CommentedSeq(g.value for g in d.outputs)
        for i, g in enumerate(d.outputs):
            outs.yaml_add_eol_comment(_from(g.line, g.todo, origin), i)
        doc["outputs"] = outs
    header = _header(name, re.sub(r"[^\w./:@+?=&%~-]", "_", came_from or origin)[:300])
    trailer = _trailer(d, origin, expected_files or [])
    for literal in (True, False):  # a block scalar the dumper cannot hold exactly: every value quoted instead
        text = header + _dump(doc, literal) + trailer
        if YAML(typ="safe").load(text) == _plain_data(doc):  # the dumper's quoting is the only way values reach
            return text                                      # the file: prove it held
    raise ValueError("the drafted YAML does not read back as written")


def _dump(doc: Any, literal: bool) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, LiteralScalarString

    def quoted(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for k, v in list(items):
            if isinstance(v, LiteralScalarString):
                node[k] = DoubleQuotedScalarString(str(v))
            quoted(v)

    if not literal:
        quoted(doc)
    buf = io.StringIO()
    yaml = YAML(typ="rt")
    yaml.width = 4096
    yaml.dump(doc, buf)
    return buf.getvalue()


def _header(name: str, origin: str) -> str:
    return (f"# Drafted by `testbed new {name}` from {origin}\n# Each guess says the line it came from; each gap is a "
            f"TODO comment, which testbed show {name} lists.\n# Fill them in, delete each TODO comment, then: "
            f"testbed rehearse {name}\n")


def _trailer(d: Draft, origin: str, expected_files: list[str]) -> str:
    out = []
    for g in d.setup_todos:
        out.append(f"# TODO set-up ({_from(g.line, None, origin)}): {g.value}")
    for text, line in d.todos:
        out.append(f"# TODO {text}" + (f" ({_from(line, None, origin)})" if line else ""))
    for g, path in zip(d.expected, expected_files, strict=False):
        out += [f"# TODO reference stub ({_from(g.line, None, origin)}; its text: {path}): name the table and "
                "column that hold it, then uncomment",
                "# references:", "#   metrics:", "#     - metric: TODO", "#       table: TODO",
                "#       column: TODO", "#       value: TODO", "#       tolerance: {rel: 10, why: TODO}",
                f"#       source: \"{origin}:{g.line}\""]
    return "".join(ln.replace("\n", " ") + "\n" for ln in out)


def todo_comments(text: str) -> list[tuple[int, str]]:
    """The ``TODO`` comments of a YAML file's text, as (line, comment without '#'), in order: real comments only
    (a '# TODO' inside a block scalar is a command's, not the file's). [] when the text is not YAML."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="rt").load(text)
    except YAMLError:
        return []
    found: dict[int, str] = {}

    def tokens(x: Any) -> None:
        if isinstance(x, list):
            for y in x:
                tokens(y)
        elif x is not None and hasattr(x, "start_mark") and isinstance(getattr(x, "value", None), str):
            line = x.start_mark.line + 1 - (1 if x.value.startswith("\n") else 0)
            for k, part in enumerate(x.value.split("\n")):
                c = part.strip()
                if c.startswith("#") and _TODO.search(c):
                    found[line + k] = c.lstrip("#").strip()

    def walk(node: Any) -> None:
        ca = getattr(node, "ca", None)
        if ca is not None:
            tokens(ca.comment)
            tokens(list(ca.items.values()))
            tokens(getattr(ca, "end", None))
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    return sorted(found.items())

