"""Load YAML keeping line numbers, and validate it with pydantic into one clear error.

A bad file is refused with ``file:line``, the field, what was expected and, for an unknown key, the
closest valid one. ``${VAR}`` and ``${VAR:-default}`` in strings are expanded from the environment.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from testbed import paths
from testbed.errors import UsageError

M = TypeVar("M", bound=BaseModel)
Loc = tuple[str | int, ...]  # where in a document: its keys and list indexes (pydantic's error ``loc``)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Located:
    """Line lookup for a loaded document: path tuple -> 1-based line."""

    def __init__(self, root: Any):
        self.root = root

    def line(self, loc: Loc) -> int | None:
        node, best = self.root, None
        for part in loc:
            lc = getattr(node, "lc", None)
            try:
                if isinstance(node, dict) and part in node:
                    if lc is not None:
                        best = lc.key(part)[0] + 1
                    node = node[part]
                elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                    if lc is not None:
                        best = lc.item(part)[0] + 1
                    node = node[part]
                else:
                    break
            except (KeyError, IndexError, TypeError):
                break
        if best is None and getattr(self.root, "lc", None) is not None:
            best = (self.root.lc.line or 0) + 1
        return best


class Invalid(ValueError):
    """A validator's refusal that knows where, below the field it checks, the culprit sits (``loc``: keys and
    indexes), and what to do: :func:`validate` reports that line, not the field's."""

    def __init__(self, what: str, *, loc: Loc = (), fix: str | None = None):
        super().__init__(what)
        self.loc = loc
        self.fix = fix


def _key(k: Any, seen: dict[str, Any], path: Path, located: Located, loc: Loc) -> str:
    """A mapping key as the string the models see: an empty key (``"":``, ``null:``, ``~:``), a list or mapping
    as a key, or two keys that read the same once made strings (``1:`` and ``"1":``) are refused."""
    line = located.line((*loc, k))
    where = f"{path}:{line}" if line else str(path)
    field = ".".join(map(str, loc)) or "the top level"
    if k is None or (isinstance(k, str) and not k.strip()):
        raise UsageError(f"{path.name}: an empty key in {field}", where=where,
                         fix="give the key a name, or remove the line (a key is the text before its colon)")
    if isinstance(k, Mapping | Sequence | AbstractSet) and not isinstance(k, str):  # ? [a, b]: and ? {a: 1}:
        raise UsageError(f"{path.name}: a key in {field} is a {'mapping' if isinstance(k, Mapping) else 'list'}",
                         where=where, fix="keys are plain names: write 'name: value'")
    name = str(k)
    if name in seen:
        raise UsageError(f"{path.name}: two keys in {field} read as '{name}' ({seen[name]!r} and {k!r})",
                         where=where, fix="keep one of them (a number and a quoted number are the same key here)")
    seen[name] = k
    return name


def declared_env(doc: Any) -> dict[str, dict[str, str]]:
    """A file's own ``env:`` section, read before anything is expanded: each variable it uses, with its ``help``
    (what to set it to) and an optional ``example`` (a value a rehearsal may stand in with). Entries that are not
    of that shape are left to the model's validation."""
    env = doc.get("env") if isinstance(doc, Mapping) else None
    if not isinstance(env, Mapping):
        return {}
    out: dict[str, dict[str, str]] = {}
    for name, v in env.items():
        if isinstance(name, str) and isinstance(v, Mapping):
            out[name] = {k: str(v[k]) for k in ("help", "example") if isinstance(v.get(k), str | int)}
    return out


def _plain(node: Any, path: Path, located: Located, loc: Loc = (),
           declared: Mapping[str, Mapping[str, str]] | None = None) -> Any:
    """ruamel nodes -> plain dict/list/str with ${VAR} expanded (errors carry file:line, and what the file's
    ``env:`` says the variable is)."""
    if isinstance(node, dict):
        seen: dict[str, Any] = {}
        return {_key(k, seen, path, located, loc): _plain(v, path, located, (*loc, k), declared)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v, path, located, (*loc, i), declared) for i, v in enumerate(node)]
    if isinstance(node, str):
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            val = os.environ.get(name)
            if val:
                return val
            if default is not None:
                return default
            line = located.line(loc)
            said = (declared or {}).get(name, {})
            helped = f": {said['help']}" if said.get("help") else ""
            fix = (f"export {name}=... (yours; for example {shlex.quote(said['example'])}) before running testbed"
                   if said.get("example") else f"export {name}=... before running testbed") + \
                ("" if said else ", or " + paths.edit_hint(path, f"write ${{{name}:-default}}"))
            raise UsageError(
                f"environment variable {name} is not set (used by {'.'.join(map(str, loc)) or 'the file'})"
                + helped, where=f"{path}:{line}" if line else str(path), fix=fix)
        return _VAR.sub(sub, str(node))
    return node


MAX_FILE_BYTES = 1 << 20
"""The largest spec or suite file read (the biggest shipped one is about 20 KB)."""


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The text of ``path`` if it is a regular UTF-8 file of at most ``limit`` bytes; anything else (a FIFO, a
    device, a folder, a larger file, bytes that are not UTF-8) is refused before it is read, without blocking."""
    import stat

    def refuse(what: str, fix: str, line: int | None = None) -> UsageError:
        return UsageError(f"{path.name}: {what}", where=f"{path}:{line}" if line else str(path), fix=fix)

    try:  # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise refuse(f"cannot read it: {e.strerror}", "check the file name and its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise refuse(f"it is {kind}, not a regular file", "name a YAML file (a link to one is fine)")
        if st.st_size > limit:
            raise refuse(f"it is {st.st_size:,} bytes; a spec or suite is at most {limit:,}",
                         "name the right file, or split it (large data belongs in files the suite ships)")
        data = os.read(fd, limit + 1)  # a file growing as it is read is cut at the bound, and refused
        while len(data) <= limit and (more := os.read(fd, limit + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > limit:
        raise refuse(f"it is more than {limit:,} bytes", "name the right file, or split it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise refuse(f"it is not UTF-8 text (byte {e.start + 1}, 0x{data[e.start]:02x})",
                     "save the file as UTF-8 text", line) from None


MAX_NODES = 200_000  # values in a document once its aliases are expanded (a real spec or suite has hundreds)
MAX_DEPTH = 64  # levels of nesting (a real spec or suite has under ten)


def _expanded_size(doc: Any) -> tuple[int, int]:
    """How many values ``doc`` holds with aliases expanded (memoised: a bomb is counted, never expanded), and how
    deep it nests."""
    sizes: dict[int, tuple[int, int]] = {}

    def size(node: Any) -> tuple[int, int]:
        if not isinstance(node, dict | list):
            return 1, 0
        if id(node) not in sizes:
            items = [size(v) for v in (list(node.values()) if isinstance(node, dict) else node)]
            sizes[id(node)] = 1 + sum(n for n, _ in items), 1 + max((d for _, d in items), default=0)
        return sizes[id(node)]

    return size(doc)


def load(path: Path) -> tuple[Any, Located]:
    """Parse ``path``; a syntax error becomes a UsageError with its line and column."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="rt")
    text = read_text(path)
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise UsageError(f"{path.name} is not valid YAML: {e.problem or e.context}", where=where,
                         fix="fix the YAML syntax at that line (indentation, a missing ':' or quote)") from None
    except YAMLError as e:
        raise UsageError(f"{path.name} is not valid YAML: {e}", where=str(path),
                         fix="fix the YAML syntax") from None
    except RecursionError:
        raise UsageError(f"{path.name} is nested deeper than testbed reads (at most {MAX_DEPTH} levels)",
                         where=str(path), fix="flatten it: a spec or suite nests a few levels") from None
    if doc is None:
        doc = {}
    n, depth = _expanded_size(doc)
    if depth > MAX_DEPTH:
        raise UsageError(f"{path.name} is nested {depth} levels deep (at most {MAX_DEPTH})", where=str(path),
                         fix="flatten it: a spec or suite nests a few levels")
    if n > MAX_NODES:
        raise UsageError(f"{path.name} expands to {n:,} values through its aliases (at most {MAX_NODES:,})",
                         where=str(path), fix="write the values out or use fewer nested aliases (*name)")
    located = Located(doc)
    return _plain(doc, path, located, declared=declared_env(doc)), located


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """BaseModel classes reachable in an annotation (through Optional, Union, list, dict)."""
    from typing import get_args

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for a in get_args(ann):
        out += _models_in(a)
    return out


def _is_mapping(ann: Any) -> bool:
    """Whether an annotation is (or may be) a mapping of names to values (``dict[str, Fault] | None``)."""
    from typing import get_args, get_origin

    return get_origin(ann) is dict or any(_is_mapping(a) for a in get_args(ann))


def _tag_of(m: type[BaseModel]) -> str | None:
    f = m.model_fields.get("kind")
    if f is not None and isinstance(f.default, str):
        return f.default
    return None


def _resolve(model: type[BaseModel], loc: Loc) -> tuple[Loc, list[str]]:
    """Strip discriminator tags from a pydantic loc; also return the valid keys where it ends."""
    clean: list[Any] = []
    current: list[type[BaseModel]] = [model]
    keyed = False  # the field just passed is a mapping: the next part is one of its keys (faults.<name>)
    for part in loc:
        if isinstance(part, int):
            clean.append(part)
            continue
        if len(current) > 1:
            tagged = [m for m in current if _tag_of(m) == part]
            if tagged:
                current = tagged
                continue
        owner = next((m for m in current if part in m.model_fields), None)
        clean.append(part)
        if owner is None:
            if keyed:
                keyed = False
                continue
            break
        ann = owner.model_fields[part].annotation
        keyed = _is_mapping(ann)
        current = _models_in(ann) or current
    valid = sorted({f.alias or n for m in current for n, f in m.model_fields.items()})
    return tuple(clean), valid


def _describe(err: Mapping[str, Any], clean_loc: Loc, valid: list[str]) -> tuple[str, str]:
    """(message, fix) for one pydantic error."""
    field = ".".join(str(p) for p in clean_loc) or "(top level)"
    t = err["type"]
    got = err.get("input")
    if t == "extra_forbidden":
        key = str(clean_loc[-1]) if clean_loc else "?"
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys here: {', '.join(sorted(valid))}"
        return f"unknown key '{key}'", hint
    if t == "missing":
        return f"missing required field '{field}'", f"add '{clean_loc[-1]}:' to the file"
    if t == "union_tag_invalid":  # a discriminated union (a provider's kind): say which word, and the close one
        ctx = err.get("ctx") or {}
        tag, disc = str(ctx.get("tag", got)), str(ctx.get("discriminator", "kind")).strip("'")
        tags = re.findall(r"'([^']+)'", str(ctx.get("expected_tags", "")))
        close = difflib.get_close_matches(tag, tags, n=1, cutoff=0.5)
        return (f"unknown {field}.{disc} '{tag}'",
                (f"did you mean '{close[0]}'? " if close else "") + f"{disc} is one of: {', '.join(tags)}")
    expected = err.get("msg", "invalid value")
    shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    return f"bad value for '{field}': {expected} (got {shown})", "correct the value as described"


def validate(model: type[M], data: Any, path: Path, located: Located, **context: Any) -> M:
    """``model.model_validate(data)``; the first error becomes a UsageError with file:line."""
    try:
        return model.model_validate(data, context=context or None)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        # an unknown key explains a 'missing' one next to it (a misspelling): report it first, with the hint
        errs.sort(key=lambda x: x["type"] != "extra_forbidden")
        err = errs[0]
        loc = tuple(err["loc"])
        clean, _ = _resolve(model, loc)
        _, valid = _resolve(model, (*loc[:-1], "\0")) if err["type"] == "extra_forbidden" else ((), [])
        msg, fix = _describe(err, clean, valid)
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, Invalid):  # the validator named the culprit below its field: report that line
            clean = (*clean, *cause.loc)
            msg, fix = f"{'.'.join(map(str, clean))}: {cause}", cause.fix or fix
        if err["type"] == "union_tag_invalid":  # the line of the word itself
            clean = (*clean, str((err.get("ctx") or {}).get("discriminator", "kind")).strip("'"))
        line = located.line(clean)
        raise UsageError(f"{path.name}: {msg}{_more(model, errs[1:], path, located)}",
                         where=f"{path}:{line}" if line else str(path), fix=fix) from None


def _more(model: type[BaseModel], rest: list[Any], path: Path, located: Located, shown: int = 3) -> str:
    """The other problems of one file, each with its line (a few; the count of the rest): fixed in one pass, not
    found one run at a time."""
    if not rest:
        return ""
    parts = []
    for err in rest[:shown]:
        clean, _ = _resolve(model, tuple(err["loc"]))
        _, valid = _resolve(model, (*tuple(err["loc"])[:-1], "\0")) if err["type"] == "extra_forbidden" else ((), [])
        msg, _ = _describe(err, clean, valid)
        line = located.line(clean)
        parts.append(f"{msg} (line {line})" if line else msg)
    left = len(rest) - len(parts)
    return "; also: " + "; ".join(parts) + (f"; and {left} more" if left else "")


def validate_file(model: type[M], path: Path, **context: Any) -> M:
    data, located = load(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path.name}: the top level must be a mapping of keys", where=f"{path}:1",
                         fix="start the file with 'key: value' lines")
    return validate(model, data, path, located, **context)
