"""testbed rehearse: the probe that stands in for a program the host lacks the hardware for (standard library only;
it runs in the rank's own Python, 3.8 on the artifacts' older images: no runtime ``X | Y`` types, no ``match``).

Armed on a replica host (``python3 probe.py arm CONFIG`` writes ``testbed_probe.pth`` into the site folders of the
interpreters that may start the program), every Python process the real launcher starts (mpirun, deepspeed,
torchrun, a plain ``python3 script.py``) imports this module first. When its main script is one the rehearsal
probes (it lies under a source checkout, or is named in the config), the program does not run; instead the probe
checks what the program needs from the host, writes ``probe-<host>-<pid>.json`` into the run folder, prints one
line per finding. With a problem it exits at once (86: something the real run would trip on); otherwise it prints
``testbed probe: ready`` and stays alive for ``stay`` seconds of the config (the rehearsal's bound), or until it is
signalled, then exits 0: so a fault fires on it through the real supervisor, as on the running program.

- its working folder and script exist;
- its argv is accepted by its own argument parser (the script run up to ``parse_args``, its imports loaded; when
  an import fails on this host, by the parser read from the source with ``ast``);
- the environment variables it reads with ``os.environ[...]`` (no default) are set;
- the folders it writes into by a literal relative path exist or are made by the code itself, and the files it
  reads by a literal relative path exist.

``python3 probe.py disarm`` removes the hook again. The config: ``{"run_dir", "roots", "programs", "stay",
"skipped"}`` (``skipped``: the steps the rehearsal skipped, name -> what they would have run).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys

TYPE_CHECKING = False  # typing is not imported at run time: this module loads in every Python process of a run
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

CONFIG = os.path.expanduser("~/.cache/testbed/probe.json")
HOOK = "testbed_probe"
PROBLEM_EXIT = 86


# --- when the interpreter starts (the .pth hook) --------------------------------------------------------------
def _config() -> dict[str, Any] | None:
    try:
        with open(CONFIG) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def _module_argv() -> list[str]:
    """The interpreter's own command line (``sys.orig_argv``, 3.10+; else /proc/self/cmdline): with ``-m``, the
    module name is gone from ``sys.argv`` when the .pth hook runs."""
    orig = getattr(sys, "orig_argv", None)
    if orig:
        return list(orig)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _module() -> str | None:
    """The module a ``python -m MODULE`` process runs, else None."""
    if not sys.argv or sys.argv[0] != "-m":
        return None
    words = _module_argv()
    for i, w in enumerate(words[1:], 1):
        if w == "-m" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("-m") and len(w) > 2:
            return w[2:]
        if not w.startswith("-"):
            return None  # a script, not a module
    return None


def _module_file(module: str) -> str | None:
    """The source file ``python -m module`` runs (a package's ``__main__``), found from the working folder first as
    ``-m`` does, without running it."""
    import importlib.util

    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(module + ".__main__")
        return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None
    except (ImportError, ValueError, AttributeError):
        return None
    finally:
        sys.path[:] = saved


def _target(cfg: dict[str, Any]) -> str | None:
    """The main script when it is one the rehearsal probes (for ``python -m``: the module's file)."""
    argv0 = sys.argv[0] if sys.argv else ""
    module = _module()
    if module is not None:
        argv0 = _module_file(module) or ""
    if not argv0.endswith(".py"):
        return None
    script = os.path.realpath(argv0)
    roots = [os.path.realpath(os.path.expanduser(r)) for r in cfg.get("roots", [])]
    named = {os.path.realpath(os.path.expanduser(p)) for p in cfg.get("programs", [])}
    names = {os.path.basename(p) for p in cfg.get("programs", [])}
    if script in named or os.path.basename(script) in names or (module is not None and module in names):
        return argv0
    if any(script == r or script.startswith(r.rstrip("/") + "/") for r in roots):
        return argv0
    return None


def hook() -> None:
    """Called from ``testbed_probe.pth``: probe and exit when this process is a probed program, else nothing."""
    cfg = _config()
    if not cfg:
        return
    script = _target(cfg)
    if script is None:
        return
    findings = probe(script, sys.argv[1:], cfg, module=_module())
    report(findings, cfg)
    sys.stdout.flush()
    if findings["problems"]:
        os._exit(PROBLEM_EXIT)
    stay_alive(float(cfg.get("stay") or 0))
    os._exit(0)


READY = "testbed probe: ready"
"""The line a probe prints once its checks passed, before it stays alive: a rehearsal fires a fault on it."""
STAY_MAX = 30.0


def stay_alive(seconds: float) -> None:
    """Stay alive ``seconds`` (at most STAY_MAX), as the program would while it runs; a signal ends it as it would
    end the program (TERM and INT by their default action)."""
    import signal
    import time

    seconds = max(0.0, min(seconds, STAY_MAX))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    print(f"{READY}: alive {seconds:g} s or until signalled", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # bounded: the stay is at most STAY_MAX
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))


# --- the checks -----------------------------------------------------------------------------------------------
def probe(script: str, argv: list[str], cfg: dict[str, Any], module: str | None = None) -> dict[str, Any]:
    """The checks of ``script`` run with ``argv`` (``module``: run as ``python -m module``)."""
    cwd = os.getcwd()
    out: dict[str, Any] = {"host": os.uname().nodename, "pid": os.getpid(), "script": script, "argv": argv, "cwd": cwd,
                 "module": module,
                 "python": sys.executable, "problems": [], "notes": [],
                 "rank_env": {k: v for k, v in os.environ.items() if k in RANK_ENV}}
    if not os.path.isfile(script):
        out["problems"].append(f"{script}: no such file in {cwd}")
        return out
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read(), script)
    except SyntaxError as e:
        out["problems"].append(f"{script}:{e.lineno}: the script does not parse with {sys.version.split()[0]}: {e.msg}")
        return out
    parsed = parse_args(script, argv, tree, module)
    out.update({k: v for k, v in parsed.items() if k != "problem"})
    if parsed.get("problem"):
        out["problems"].append(parsed["problem"])
    env_reads(tree, script, out)
    file_uses(tree, script, out)
    argv_paths(tree, script, out, cfg.get("skipped") or {})
    return out


RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME", "TESTBED_RANK")


class _Parsed(BaseException):
    pass


class _Refused(BaseException):
    pass


def parse_args(script: str, argv: list[str], tree: ast.Module, module: str | None = None) -> dict[str, Any]:
    """argv through the script's own parser: run up to ``parse_args`` (nothing past it; a ``module`` as ``-m``
    runs it, its package imported), or read with ``ast``."""
    import argparse
    import runpy
    import signal
    import socket

    real_parse = argparse.ArgumentParser.parse_args
    real_known = argparse.ArgumentParser.parse_known_args

    def parse_only(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        raise _Parsed(vars(real_parse(self, args, namespace)), _actions(self))

    def known_only(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        ns, rest = real_known(self, args, namespace)
        raise _Parsed({**vars(ns), "_unparsed": rest}, _actions(self))

    def refuse(self, message):  # type: ignore[no-untyped-def]
        raise _Refused(message)

    def no_network(*_a, **_k):  # type: ignore[no-untyped-def]
        raise _Refused("the script opened a connection before parsing its arguments")

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args,
             argparse.ArgumentParser.error, socket.socket.connect)
    argparse.ArgumentParser.parse_args = parse_only  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = known_only  # type: ignore[method-assign]
    argparse.ArgumentParser.error = refuse  # type: ignore[method-assign]
    socket.socket.connect = no_network  # type: ignore[method-assign]
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Refused("no parse_args within 120 s")))
    signal.alarm(120)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(script)))
    failed: str | None = None
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        return {"parsed_by": "none", "note": "the script ended without parsing arguments"}
    except _Parsed as p:
        args = p.args[0]
        if args.get("_unparsed"):
            return {"parsed_by": "its own parser", "args": _plain(args), "actions": p.args[1],
                    "problem": f"its parser left {args['_unparsed']} unparsed"}
        return {"parsed_by": "its own parser", "args": _plain(args), "actions": p.args[1]}
    except _Refused as r:
        return {"parsed_by": "its own parser", "problem": f"its own parser refuses {argv}: {r}"}
    except SystemExit as e:
        return {"parsed_by": "its own parser", "problem": f"the script exited ({e.code}) before parsing its arguments"}
    except ImportError as e:  # this host lacks a module the real one has: the parser as the source writes it
        failed = str(e)
    except BaseException as e:  # anything else before parse_args: the parser as the source writes it, and why
        failed = f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved[0], saved[1]  # type: ignore[method-assign]
        argparse.ArgumentParser.error, socket.socket.connect = saved[2], saved[3]  # type: ignore[method-assign]
    static = _static_parse(tree, argv)  # the real parser's methods are back in place
    static["import_error"] = failed
    return static


def _actions(parser: object) -> list[Any]:
    """(dest, its first option string or the dest) of each action of an argparse parser."""
    return [(a.dest, (a.option_strings or [a.dest])[-1]) for a in getattr(parser, "_actions", [])
            if a.dest not in ("help", "==SUPPRESS==")]


def _plain(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in args.items()}


_TYPES = {"int": int, "float": float, "str": str}
_ACTIONS = ("store", "store_true", "store_false", "store_const", "append", "append_const", "count", "extend")


def _static_parse(tree: ast.Module, argv: list[str]) -> dict[str, Any]:
    """argv through a parser rebuilt from the script's ``add_argument`` calls (literal names, types, choices)."""
    import argparse

    class P(argparse.ArgumentParser):
        def error(self, message):  # type: ignore[no-untyped-def]
            raise _Refused(message)

    parser = P(add_help=True)
    n = 0
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == "ArgumentParser":
            for kw in node.keywords:
                if kw.arg == "allow_abbrev" and isinstance(kw.value, ast.Constant):
                    parser.allow_abbrev = bool(kw.value.value)
        if node.func.attr == "add_config_arguments":  # deepspeed's
            for opt, extra in (("--deepspeed", {"action": "store_true"}), ("--deepspeed_config", {}),
                               ("--deepscale", {"action": "store_true"}), ("--deepscale_config", {})):
                parser.add_argument(opt, **extra)  # type: ignore[arg-type]
            continue
        if node.func.attr != "add_argument":
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names:
            continue
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            try:
                v = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError):
                v = None
                if kw.arg == "type" and isinstance(kw.value, ast.Name):
                    kwargs["type"] = _TYPES.get(kw.value.id, str)
                continue
            if kw.arg in ("nargs", "dest", "required", "const", "default", "choices") or \
                    (kw.arg == "action" and v in _ACTIONS):
                kwargs[kw.arg] = v
        try:
            parser.add_argument(*names, **kwargs)
            n += 1
        except (argparse.ArgumentError, ValueError, TypeError):
            continue
    if not n:
        return {"parsed_by": "none (the script declares no arguments)"}
    try:
        return {"parsed_by": "its parser, read from the source", "args": _plain(vars(parser.parse_args(argv))),
                "actions": _actions(parser)}
    except _Refused as r:
        return {"parsed_by": "its parser, read from the source", "problem": f"its own parser refuses {argv}: {r}"}
    except SystemExit:
        return {"parsed_by": "its parser, read from the source", "problem": f"its own parser refuses {argv}"}


def env_reads(tree: ast.Module, script: str, out: dict[str, Any]) -> None:
    """``os.environ["X"]`` read with no default must be set; ``.get``/``getenv`` reads are listed."""
    required, optional = set(), set()
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and _catches_key_error(t)
               for stmt in t.body for n in ast.walk(stmt)}  # read under ``except KeyError``: it has a default
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                (optional.add(key.value) if id(node) in guarded else required.add((key.value, node.lineno)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) and \
                ((node.func.attr == "get" and _is_environ(node.func.value)) or node.func.attr == "getenv"):
            optional.add(node.args[0].value)
    assigned = {t.slice.value for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Subscript) and _is_environ(t.value) and isinstance(t.slice, ast.Constant)}
    skipped = unreachable_lines(tree, out.get("args"))
    for name, line in sorted(required):
        if name not in os.environ and name not in assigned:
            if line in skipped:  # under an `if args.x == ...` that this argv makes false: never read
                out["notes"].append(f"{os.path.basename(script)}:{line} reads ${name} (unset) only where "
                                    f"{skipped[line]}, which this argv does not reach")
                continue
            out["problems"].append(f"{os.path.basename(script)}:{line} reads ${name}, which is not set for this rank")
    out["env_read"] = sorted({n for n, _ in required} | optional)
    out["env_unset"] = sorted(n for n in optional if n not in os.environ)


class _Unknown(Exception):
    pass


def _value(node: ast.AST, args: dict[str, Any]) -> object:
    """``node`` evaluated from the parsed arguments alone (``args.x``, constants, comparisons, and/or/not)."""
    import operator

    ops: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
        ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _value(node.operand, args)
        if isinstance(v, (int, float)):
            return -v
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _value(node.operand, args)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in args:
        return args[node.attr]
    if isinstance(node, ast.BoolOp):
        vals = [_value(v, args) for v in node.values]
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in ops:
        return ops[type(node.ops[0])](_value(node.left, args), _value(node.comparators[0], args))
    raise _Unknown


def unreachable_lines(tree: ast.Module, args: object) -> dict[int, str]:
    """Lines under an ``if`` on the parsed arguments that this argv makes false (or true, for its ``else``): line
    -> the test, as the source writes it. Nothing when the arguments are unknown or a test needs more than them."""
    out: dict[int, str] = {}
    if not isinstance(args, dict):
        return out
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        try:
            v = bool(_value(node.test, args))
        except (_Unknown, TypeError):
            continue
        text = ast.unparse(node.test)
        for stmt in node.orelse if v else node.body:
            for n in ast.walk(stmt):
                if hasattr(n, "lineno"):
                    out.setdefault(n.lineno, text if not v else f"not ({text})")
    return out


def _catches_key_error(t: ast.Try) -> bool:
    names = set()
    for h in t.handlers:
        if h.type is None:
            return True
        for e in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]):
            names.add(e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else "")
    return bool(names & {"KeyError", "LookupError", "Exception", "BaseException"})


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


_WRITERS = {"to_csv", "savefig", "save", "dump", "to_json", "savetxt", "FileHandler", "SummaryWriter"}


def file_uses(tree: ast.Module, script: str, out: dict[str, Any]) -> None:
    """Folders written into and files read by a literal relative path (from the working folder)."""
    made: set[str] = set()
    writes: list[tuple[str, int]] = []
    reads: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id \
            if isinstance(node.func, ast.Name) else ""
        first = _literal_path(node.args[0]) if node.args else None
        if fn in ("makedirs", "mkdir") and first:
            made.add(os.path.normpath(first))
        elif fn == "open" and first:
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                 None)
            m = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            (writes if any(c in m for c in "wax+") else reads).append((first, node.lineno))
        elif fn in _WRITERS:
            target = next((p for p in (_literal_path(a) for a in node.args) if p), None)
            if target:
                writes.append((target, node.lineno))
    name = os.path.basename(script)
    for path, line in writes:
        folder = os.path.dirname(os.path.normpath(path))
        if folder and not os.path.isdir(folder) and not any(folder == m or folder.startswith(m + "/") or
                                                              m.startswith(folder + "/") for m in made):
            out["problems"].append(f"{name}:{line} writes {path}, but {folder}/ does not exist in {os.getcwd()} "
                                   "and the code does not make it")
    for path, line in reads:
        if not os.path.exists(path):
            out["problems"].append(f"{name}:{line} reads {path}, which does not exist in {os.getcwd()}")
    out["writes"] = sorted({p for p, _ in writes})
    out["reads"] = sorted({p for p, _ in reads})


def _is_getcwd(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and not node.args and \
        ((isinstance(node.func, ast.Attribute) and node.func.attr in ("getcwd", "cwd")) or
         (isinstance(node.func, ast.Name) and node.func.id == "getcwd"))


def _cwd_relative(node: ast.AST) -> str | None:
    """The relative path of ``os.path.join(os.getcwd(), "a", "b")``, ``os.getcwd() + "/a"``, ``f"{os.getcwd()}/a"``
    or ``Path.cwd() / "a"`` with literals (the working folder the probe checks from), else None."""
    parts: list[ast.expr] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" and \
            node.args and _is_getcwd(node.args[0]):
        parts = node.args[1:]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)) and _is_getcwd(node.left):
        parts = [node.right]
    elif isinstance(node, ast.JoinedStr) and len(node.values) == 2 and isinstance(node.values[0], ast.FormattedValue) \
            and _is_getcwd(node.values[0].value):
        parts = [node.values[1]]
    words = [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]
    if not parts or len(words) != len(parts):
        return None
    return "/".join(w.strip("/") for w in words if w.strip("/")) or None


def _literal_path(node: ast.AST) -> str | None:
    """A relative path written literally (or an f-string's literal folder part, or one built from the working
    folder with literals: ``_cwd_relative``), else None."""
    cwd_rel = _cwd_relative(node)
    if cwd_rel is not None:
        return cwd_rel if ("/" in cwd_rel or "." in cwd_rel) else cwd_rel + "/."
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        s = node.value
    elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        s = str(node.values[0].value)
        s = s[: s.rfind("/") + 1] + "x" if "/" in s else ""
    else:
        return None
    if not s or s.startswith(("/", "~")) or "\n" in s or len(s) > 200 or ("/" not in s and "." not in s):
        return None
    return s


_IN_FIRST = re.compile(r"(^|_)(init|load|resume|pretrained|from|restore|input|in)(_|$)")
_OUT_NAME = re.compile(r"(^|_)(out|output|outputs|save|saves|log|logs|result|results|ckpt|checkpoint|checkpoints|"
                       r"dump|export)(_|$)|outdir|savedir|logdir|outpath|outfile")
_IN_NAME = re.compile(r"(^|_)(in|input|inputs|data|dataset|datasets|root|config|cfg|file|path|dir|folder|load|"
                      r"resume|pretrained|weights|vocab)(_|$)|datadir|datapath|infile")
_DIR_NAME = re.compile(r"(dir|folder|root)$")
_EXT = re.compile(r"\.(csv|tsv|json|jsonl|txt|ya?ml|pt|pth|ckpt|npy|npz|pkl|pickle|h5|hdf5|log|tar|gz|zip|bin|cfg|"
                  r"ini)$")


def path_kind(dest: str, option: str, value: object) -> str | None:
    """How an argument names a path: 'output' or 'input' (by its dest or option name), 'path' (only its value looks
    like one: a '/' or a data file's extension), or None (not a path: not a string, empty, a URL)."""
    if not isinstance(value, str) or not value or "://" in value or "\n" in value or len(value) > 300 or \
            value.startswith(("-", "[", "(", "<", "{")):  # an option, or the repr of a list or an object
        return None
    name = (option.lstrip("-") or dest).lower().replace("-", "_")
    if _OUT_NAME.search(name) and not _IN_FIRST.search(name):
        return "output"
    if _IN_NAME.search(name) and ("/" in value or _EXT.search(value) or value.startswith(".") or
                                  _DIR_NAME.search(name) or re.search(r"(path|file)$", name)):
        return "input"
    return "path" if ("/" in value or _EXT.search(value)) else None


def _names_arg(node: ast.AST, dest: str, aliases: set[str]) -> bool:
    """Whether ``node`` reads ``args.<dest>`` (any object's attribute of that name) or a name assigned from it."""
    return any((isinstance(n, ast.Attribute) and n.attr == dest) or (isinstance(n, ast.Name) and n.id in aliases)
               for n in ast.walk(node))


def _made_by_code(tree: ast.Module, dest: str) -> bool:
    """Whether the code makes the folder an argument names: ``os.makedirs(args.x)``, ``Path(args.x).mkdir()``,
    through a name assigned from it, or a call with ``download=True`` on it (a data set fetched into it)."""
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _names_arg(n.value, dest, set())
               for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id \
            if isinstance(node.func, ast.Name) else ""
        if fn in ("makedirs", "mkdir") and _names_arg(node, dest, aliases):
            return True
        if any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in node.keywords) and _names_arg(node, dest, aliases):
            return True
    return False


def _skipped_step(path: str, skipped: dict[str, str]) -> str | None:
    """The step the rehearsal skipped (name -> what it would have run) whose command names ``path``'s base name."""
    base = path.rstrip("/").rsplit("/", 1)[-1]
    pattern = r"(?<![\w.-])" + re.escape(base) + r"(?![\w-])"
    return next((n for n, text in skipped.items() if base and re.search(pattern, str(text))), None)


def _missing(out: dict[str, Any], problem: str, path: str, skipped: dict[str, str]) -> None:
    """A missing path: a problem, or not judged where a step the rehearsal skipped names it (it would make it)."""
    step = _skipped_step(path, skipped)
    if step is None:
        out["problems"].append(problem)
    else:
        out.setdefault("not_judged", []).append(f"{problem}: not judged, the skipped step '{step}' names "
                                                f"{path.rstrip('/').rsplit('/', 1)[-1]} (it would make it)")


def argv_paths(tree: ast.Module, script: str, out: dict[str, Any], skipped: dict[str, str]) -> None:
    """The files and folders the argv names (``path_kind``), checked from the working folder: an input must exist;
    an output's folder must exist, or be made by the code, which the probe then makes as the program would (so
    collect and report see the same tree); a path only its value shows must have an existing folder, or one the code
    makes."""
    args, cwd, name = out.get("args"), os.getcwd(), os.path.basename(script)
    if not isinstance(args, dict):
        return
    named: list[dict[str, Any]] = []
    for dest, option in out.pop("actions", []) or []:
        kind = path_kind(dest, option, args.get(dest))
        if kind is None:
            continue
        value = os.path.expanduser(str(args[dest]))
        named.append({"dest": dest, "option": option, "kind": kind, "value": value})
        makes = _made_by_code(tree, dest)
        folder = value if kind == "output" and (_DIR_NAME.search(dest.lower()) or not _EXT.search(value)) \
            else os.path.dirname(os.path.normpath(value))
        if kind == "input":
            if not os.path.exists(value) and not makes:
                _missing(out, f"{name}: {option} names {value}, an input that does not exist in {cwd}", value, skipped)
        elif folder and not os.path.isdir(folder):
            if not makes:
                _missing(out, f"{name}: {option} names {value}, but {folder.rstrip('/')}/ does not exist in {cwd} and "
                         "the code does not make it", folder, skipped)
                continue
            try:
                os.makedirs(folder, exist_ok=True)  # where the program makes it: collect sees the same tree
                out.setdefault("made", []).append(folder)
            except OSError as e:
                out["problems"].append(f"{name}: {option} names {value}, whose folder {folder} cannot be made in "
                                       f"{cwd}: {e.strerror}")
        elif folder and not os.access(folder, os.W_OK | os.X_OK) and kind == "output":
            out["problems"].append(f"{name}: {option} names {value}, but {folder} is not writable in {cwd}")
    out["argv_paths"] = named


# --- reporting --------------------------------------------------------------------------------------------------
def report(findings: dict[str, Any], cfg: dict[str, Any]) -> None:
    run_dir = os.path.expanduser(cfg.get("run_dir", "."))
    path = os.path.join(run_dir, f"probe-{findings['host']}-{findings['pid']}.json")
    try:
        with open(path, "w") as f:
            json.dump(findings, f, indent=1, default=str)
    except OSError as e:
        print(f"testbed probe: cannot write {path}: {e}", file=sys.stderr)
    shown = f"-m {findings['module']}" if findings.get("module") else findings["script"]
    what = f"{shown} {' '.join(findings['argv'])}".strip()
    print(f"testbed probe: {what} (in {findings['cwd']}) replaced by the probe on {findings['host']}; "
          f"argv checked by {findings.get('parsed_by', 'none')}", flush=True)
    for p in findings["problems"]:
        print(f"testbed probe: PROBLEM: {p}", flush=True)


# --- arming ------------------------------------------------------------------------------------------------------
def site_dirs() -> list[str]:
    """Where this interpreter reads .pth files: its site-packages, and the user's when it honours them."""
    import site
    import sysconfig

    dirs = [sysconfig.get_paths()["purelib"]]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def arm(config_json: str) -> int:
    """Install the hook for this interpreter (and /usr/bin/python3) and write the config."""
    import shutil
    import subprocess

    os.makedirs(os.path.dirname(CONFIG), exist_ok=True)
    with open(CONFIG, "w") as f:
        f.write(config_json)
    done = []
    for d in site_dirs():
        try:
            os.makedirs(d, exist_ok=True)
            shutil.copy(__file__, os.path.join(d, HOOK + ".py"))
            with open(os.path.join(d, HOOK + ".pth"), "w") as f:
                f.write(f"import {HOOK}; {HOOK}.hook()\n")
            done.append(d)
        except OSError:
            continue
    other = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(other) and os.access(other, os.X_OK) and \
            "--here" not in sys.argv:
        subprocess.run([other, __file__, "arm", config_json, "--here"], check=False)
    print(f"testbed probe: armed in {', '.join(done) or 'no site folder'}")
    return 0 if done else 1


def disarm() -> int:
    for d in site_dirs():
        for name in (HOOK + ".pth", HOOK + ".py"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(d, name))
    if os.path.exists("/usr/bin/python3") and "--here" not in sys.argv:
        import subprocess

        subprocess.run(["/usr/bin/python3", __file__, "disarm", "--here"], check=False)
    with contextlib.suppress(OSError):
        os.remove(CONFIG)
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "arm":
        sys.exit(arm(sys.argv[2]))
    if len(sys.argv) >= 2 and sys.argv[1] == "disarm":
        sys.exit(disarm())
    print("usage: probe.py arm CONFIG_JSON | disarm", file=sys.stderr)
    sys.exit(2)
