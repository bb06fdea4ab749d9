"""The seed artifacts' real code (../shared/artifacts) for conformance tests: unpacking, parsers, commands.

Nothing here copies the artifacts: their archives are unpacked into a temporary folder per test session, and
their argument parsers are read from the real source with ``ast`` and rebuilt as real ``argparse`` parsers
(same option strings, types, actions, choices, ``allow_abbrev``), so an argv the suite renders is accepted
here exactly when the artifact's own parser would accept it.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import itertools
import os
import re
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.records import RelaunchStep, RunPlan
from testbed.run.plan import HostInfo, TestbedInfo, build_plan
from testbed.suite import load_suite, resolve_params

SHARED = Path(__file__).resolve().parents[2] / "shared"
ARTIFACTS = Path(os.environ.get("TESTBED_ARTIFACTS", SHARED / "artifacts"))
FIXTURES = SHARED / "fixtures"
_UNPACKED: dict[str, Path] = {}
_ROOT: list[Path] = []  # made on the first unpack, removed when the session's process ends (never at import)


def _root() -> Path:
    """The folder the artifacts are unpacked into, once per process; removed at its exit."""
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="testbed-artifacts-")))
        atexit.register(shutil.rmtree, _ROOT[0], True)
    return _ROOT[0]


def artifact(name: str) -> Path:
    """The repository ``name`` at its pinned commit (unpacked once per session); skips when absent."""
    if name in _UNPACKED:
        return _UNPACKED[name]
    tgz = ARTIFACTS / f"{name}.tar.gz"
    if not tgz.is_file():
        pytest.skip(f"{tgz} is absent (the artifacts live in ../shared/artifacts)")
    dest = _root() / name
    with tarfile.open(tgz) as tf:
        tf.extractall(dest, filter="data")
    inner = [p for p in dest.iterdir() if p.is_dir()]
    _UNPACKED[name] = inner[0] if len(inner) == 1 and not (dest / ".git").exists() else dest
    return _UNPACKED[name]


# --- argument parsers, read statically -------------------------------------------------------------------------
class ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise ParseError(message or f"exit {status}")


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
# helpers that add arguments to a parser, as the libraries define them
_KNOWN_ADDERS = {
    "add_config_arguments": [  # deepspeed.add_config_arguments (deepspeed/__init__.py _add_core_arguments)
        (["--deepspeed"], {"action": "store_true", "default": False}),
        (["--deepspeed_config"], {"default": None, "type": str}),
        (["--deepscale"], {"action": "store_true", "default": False}),
        (["--deepscale_config"], {"default": None, "type": str}),
    ],
}


@dataclass
class StaticParser:
    """What ``ast`` found: every add_argument call of a script, and the rebuilt parser."""

    path: Path
    arguments: list[tuple[list[str], dict[str, object]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    allow_abbrev: bool = True

    @property
    def options(self) -> set[str]:
        return {o for names, _ in self.arguments for o in names if o.startswith("-")}

    def build(self) -> argparse.ArgumentParser:
        p = _Parser(prog=self.path.name, allow_abbrev=self.allow_abbrev, add_help=True)
        for names, kw in self.arguments:
            p.add_argument(*names, **kw)  # type: ignore[arg-type]
        return p

    def parse(self, argv: list[str]) -> argparse.Namespace:
        return self.build().parse_args(argv)


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return _UNKNOWN


_UNKNOWN = object()


def read_parser(path: Path) -> StaticParser:
    """Every ``*.add_argument(...)`` in ``path`` (and known adders such as deepspeed's) as a StaticParser."""
    tree = ast.parse(path.read_text(errors="replace"), str(path))
    sp = StaticParser(path)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        if attr == "ArgumentParser" or (isinstance(node.func, ast.Attribute) and attr == "ArgumentParser"):
            for kw in node.keywords:
                if kw.arg == "allow_abbrev" and isinstance(kw.value, ast.Constant):
                    sp.allow_abbrev = bool(kw.value.value)
        if attr in _KNOWN_ADDERS:
            sp.arguments += [(list(n), dict(k)) for n, k in _KNOWN_ADDERS[attr]]
            continue
        if attr != "add_argument":
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names:
            sp.notes.append(f"line {node.lineno}: add_argument without literal names")
            continue
        kwargs: dict[str, object] = {}
        for kw in node.keywords:
            if kw.arg is None:
                continue
            if kw.arg == "type":
                t = kw.value.id if isinstance(kw.value, ast.Name) else None
                kwargs["type"] = _TYPES.get(t or "", str)  # a custom converter accepts any string here
                if t not in _TYPES:
                    sp.notes.append(f"line {node.lineno}: {names[0]} has type {ast.unparse(kw.value)} (taken as str)")
            elif kw.arg in ("action", "nargs", "dest", "required", "const", "default", "choices", "metavar"):
                v = _literal(kw.value)
                if v is _UNKNOWN:
                    if kw.arg == "choices":
                        sp.notes.append(f"line {node.lineno}: {names[0]} choices are computed (not checked)")
                    continue
                if kw.arg == "action" and v not in ("store", "store_true", "store_false", "store_const",
                                                    "append", "append_const", "count", "version",
                                                    "extend", "help"):
                    continue
                kwargs[kw.arg] = v
        if kwargs.get("action") == "version":
            kwargs.setdefault("version", "")
        sp.arguments.append((names, kwargs))
    return sp


# --- commands --------------------------------------------------------------------------------------------------
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", "then", "else", "fi", "do", "done"}
_REDIRECT = re.compile(r"^\d*[<>]{1,2}&?\d*$|^&>$")


@dataclass
class PyCall:
    """``python[3] script.py args`` found in a command, with the folder it runs in."""

    script: str
    argv: list[str]
    cwd: str | None
    compiled: bool = False  # a C/CUDA source handed to a compiler (only its existence is checked)


_HEREDOC = re.compile(r"<<-?[ \t]*(['\"]?)(\w+)\1[^\n]*\n.*?\n[ \t]*\2[ \t]*(?=\n|$)", re.S)


def python_calls(command: str, cwd: str | None = None) -> list[PyCall]:
    """Every Python script invocation in a shell command, following ``cd DIR`` before it."""
    out: list[PyCall] = []
    command = _HEREDOC.sub("", command)  # a here-document's body is data (e.g. a repair script), not commands
    lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    toks = list(lexer)
    here = cwd
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "-c" and i > 0 and re.fullmatch(r"(?:.*/)?(?:ba|z|tc|c|da)?sh", toks[i - 1]) and i + 1 < len(toks):
            out += python_calls(toks[i + 1], here)  # sh -c 'python3 x.py ...' (e.g. under mpirun)
            i += 2
            continue
        if t == "cd" and i + 1 < len(toks):
            nxt = toks[i + 1]
            here = nxt if nxt.startswith(("/", "~", "$HOME")) or here is None else f"{here}/{nxt}"
            i += 2
            continue
        if re.fullmatch(r"(?:.*/)?(?:nvcc|mpicc|mpicxx|mpic\+\+|gcc|g\+\+|cc|c\+\+)", t):
            j = i + 1
            while j < len(toks) and toks[j] not in _SEPARATORS:
                if re.search(r"\.(?:c|cc|cpp|cu)$", toks[j]) and not toks[j - 1] == "-o":
                    out.append(PyCall(toks[j], [], here, compiled=True))
                j += 1
            i = j
            continue
        if re.fullmatch(r"(?:.*/)?python(?:3(?:\.\d+)?)?", t) and i + 1 < len(toks) and toks[i + 1].endswith(".py"):
            script = toks[i + 1]
            argv: list[str] = []
            j = i + 2
            while j < len(toks) and toks[j] not in _SEPARATORS:
                if toks[j].isdigit() and j + 1 < len(toks) and toks[j + 1][:1] in "<>":
                    j += 1  # the file descriptor of a redirection (2>&1)
                    continue
                if _REDIRECT.match(toks[j]) or toks[j] in ("<", ">", ">>", "2>", "&>"):
                    j += 2
                    continue
                argv.append(toks[j])
                j += 1
            out.append(PyCall(script, argv, here))
            i = j
            continue
        i += 1
    return out


def host_path_to_artifact(path: str, mounts: dict[str, Path]) -> Path | None:
    """A host path (``~/open-jitc/UserLevel``, ``$HOME/...``) in the unpacked artifact it belongs to."""
    p = path.replace("$HOME/", "~/").replace('"$HOME"/', "~/")
    for prefix, root in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if p == prefix or p.startswith(prefix.rstrip("/") + "/"):
            return root / p[len(prefix):].lstrip("/")
    return None


# --- what a suite renders --------------------------------------------------------------------------------------
def points(suite_name: str) -> list[dict[str, Any]]:
    """Every matrix point, plus the defaults with each value of each choice parameter."""
    s = load_suite(suite_name)
    pts: list[dict[str, Any]] = []
    raw = s.matrix if isinstance(s.matrix, list) else (
        [dict(zip(s.matrix, c, strict=True)) for c in itertools.product(*s.matrix.values())] if s.matrix else [])
    pts += [dict(p) for p in raw]
    for name, p in s.parameters.items():
        for v in p.choices or []:
            pts.append({name: v})
    return pts


def plan_for(suite_name: str, given: dict[str, Any], faults: list[str] | None = None) -> RunPlan:
    s = load_suite(suite_name)
    params = resolve_params(s, {k: str(v) for k, v in given.items()})
    n = max(8, s.requires.hosts)
    hosts = [HostInfo(f"host{i}", f"10.0.0.{i + 2}", ["master"] if i == 0 else ["workers"], {}) for i in range(n)]
    tb = TestbedInfo("conformance", (s.requires.providers or ["lab"])[0], hosts,
                     {"name": "conformance", "provider": "lab", "subnet": "10.0.0.0/24", "ssh_config": "x"})
    return build_plan(s, tb, params, faults=faults)


def commands(plan: RunPlan) -> list[tuple[str, str, str | None]]:
    """(where, command, cwd) of every step and rank of the plan (recovery included)."""
    out: list[tuple[str, str, str | None]] = []
    for phase, steps in (("prepare", plan.prepare), ("post", plan.post)):
        for st in steps:
            for h, cmd in st.commands.items():
                out.append((f"{phase} '{st.name}' on {h}", cmd, st.cwd))
    for r in plan.ranks:
        out.append((f"launch rank {r.rank}", r.command, r.cwd))
    for f in plan.faults:
        for recovery in f.recovery.values():
            for st in recovery:
                for r in st.ranks if isinstance(st, RelaunchStep) else []:
                    out.append((f"recovery rank {r.rank}", r.command, r.cwd))
    return out


def rendered_argvs(suite_name: str, script: str) -> list[list[str]]:
    """Every distinct argv a suite gives ``script`` (a path ending) over its points, recovery ranks included."""
    out: list[list[str]] = []
    for given in points(suite_name):
        s = load_suite(suite_name)
        plan = plan_for(suite_name, given, faults=list(s.faults) if "fault" not in s.parameters else None)
        for _, cmd, cwd in commands(plan):
            for call in python_calls(cmd, cwd):
                if call.script.endswith(script) and call.argv not in out:
                    out.append(call.argv)
    return out


# --- the real parser, run where the script's imports load ------------------------------------------------------
PARSE_ONLY = r'''
import argparse, atexit, json, os, runpy, shutil, signal, socket, sys, tempfile
script = os.path.abspath(sys.argv[1])
argvs = json.load(sys.stdin)


class Parsed(BaseException):
    pass


class Refused(BaseException):
    pass


real_parse = argparse.ArgumentParser.parse_args


def parse_only(self, args=None, namespace=None):
    raise Parsed(vars(real_parse(self, args, namespace)))


def refuse(self, message):
    raise Refused(message)


class Unparsed(BaseException):
    pass


def no_network(*_a, **_k):
    raise Unparsed("the script opened a connection before parsing its arguments")


def too_long(*_a):
    raise Unparsed("the script did not reach parse_args within 120 s")


argparse.ArgumentParser.parse_args = parse_only
argparse.ArgumentParser.error = refuse
socket.socket.connect = socket.socket.bind = socket.socket.accept = no_network  # parse only: never wait on a peer
signal.signal(signal.SIGALRM, too_long)
sys.path.insert(0, os.path.dirname(script))
work = tempfile.mkdtemp()  # what the script's top level makes (./output) lands here, not in the checkout
atexit.register(shutil.rmtree, work, True)
os.chdir(work)
results = []
for argv in argvs:
    sys.argv = [script, *argv]
    signal.alarm(120)
    try:
        runpy.run_path(script, run_name="__main__")
        results.append({"argv": argv, "error": "the script ended without parsing its arguments"})
    except Parsed as p:
        results.append({"argv": argv, "args": {k: repr(v) for k, v in p.args[0].items()}})
    except (Refused, Unparsed) as r:
        results.append({"argv": argv, "error": str(r)})
    finally:
        signal.alarm(0)
print("@RESULT " + json.dumps(results))
'''
"""Runs a script as ``__main__`` once per argv (stdin: a JSON list) up to its ``parse_args``, with its own parser:
the parsed namespace or the parser's refusal, per argv; nothing past parsing runs. Imports load once."""
