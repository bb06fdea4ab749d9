"""The Jinja2 environment suites render in: sandboxed, and bounded in steps, time and size.

A suite is data, yet a template is a small program: ``{% for i in range(10**5) %}`` nested twice, ``{{ 'a' |
center(10**9) }}`` or a macro that calls itself twice would run for hours or fill the memory. Every render holds a
:class:`Budget`, and everything a template can do is counted against it before or after it happens:

- each loop iteration, call (macros included), filter, test and operator is a step (``MAX_STEPS``), and the render
  stops past ``MAX_SECONDS`` of wall-clock time;
- each value an operation makes, and each piece of output (template text included), is weighed (characters, or
  items of a list); one value may weigh ``MAX_VALUE``, all of one render's ``MAX_MADE``;
- operations that build a large value in one go are refused before they run when their arguments say it would be
  too large: ``*`` and ``**``, widths in ``center``/``ljust``/``rjust``/``zfill``/``indent``/``format``/``%``,
  ``join``, ``replace``, ``batch``, ``slice``, ``sum`` and ``lipsum``; a string method outside ``STR_METHODS`` is
  refused.

A refusal raises :class:`TooMuch` (its message says which bound), which :func:`testbed.suite.render` turns into
the suite's usual ``file:line`` error.
"""

from __future__ import annotations

import contextvars
import functools
import math
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

MAX_STEPS = 200_000
"""Loop iterations, calls, filters, tests and operators one render may take (a real suite's take tens)."""
MAX_SECONDS = 10.0
"""Wall-clock seconds one render may take: the backstop behind the step count."""
MAX_VALUE = 1 << 20
"""The most characters (or list items) one value a template makes may hold, and its whole output."""
MAX_MADE = 16 << 20
"""The most characters (or items) all values made and all output written by one render may hold together."""
MAX_DIGITS = 4300
"""The longest whole number a template may make (Python's own limit on printing one)."""
STR_METHODS = frozenset([
    "capitalize", "casefold", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
    "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
    "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
    "upper", "zfill"])
"""The string methods a template may call (``expandtabs``, ``translate``, ``encode`` ... are not among them)."""
_WIDTHS = {"center": (1, "width"), "ljust": (1, "width"), "rjust": (1, "width"), "zfill": (1, "width"),
           "indent": (1, "width"), "batch": (1, "linecount"), "slice": (1, "slices")}
"""Filters and string methods whose number argument (position after the value, name) sizes what they make."""


class TooMuch(Exception):
    """A template went past one of its bounds; the message says which."""


class Budget:
    """What one render may still do: its steps, its deadline and the weight of what it made."""

    def __init__(self) -> None:
        self.steps = 0
        self.made = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TooMuch(f"it takes more than {MAX_STEPS:,} steps (loop iterations, calls, filters, operators)")
        if self.steps % 64 == 0 and time.monotonic() > self.deadline:
            raise TooMuch(f"it runs for more than {MAX_SECONDS:g} s")

    def make(self, value: Any) -> Any:
        """Count ``value`` (a result or a piece of output) against the budget; return it."""
        w = weight(value, MAX_VALUE)
        if w > MAX_VALUE:
            raise TooMuch(f"it makes a value of more than {MAX_VALUE:,} characters or items")
        self.made += w
        if self.made > MAX_MADE:
            raise TooMuch(f"it makes more than {MAX_MADE:,} characters or items in all")
        return value


_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("template_budget", default=None)


def bounded(render: Callable[[], str]) -> str:
    """``render()`` under a fresh budget; its output is refused past ``MAX_VALUE`` characters."""
    token = _current.set(Budget())
    try:
        out = render()
    finally:
        _current.reset(token)
    if len(out) > MAX_VALUE:
        raise TooMuch(f"its output is more than {MAX_VALUE:,} characters")
    return out


def weight(value: Any, cap: int) -> int:
    """Characters of the strings in ``value`` plus items of its lists and mappings, counted up to just past
    ``cap`` (a list repeating one large string weighs what printing it would write)."""
    total, stack = 0, [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str | bytes):
            total += len(v)
        elif isinstance(v, list | tuple | set | frozenset | dict):
            total += len(v)
            if len(v) <= cap:
                stack.extend(v.items() if isinstance(v, dict) else v)
        else:
            total += 1
    return total


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left <operator> right`` when it would make a value too large to compute or print."""
    if operator == "**" and _whole(left) and _whole(right) and abs(left) > 1 and right > 0 \
            and right * math.log10(abs(left)) > MAX_DIGITS:
        raise TooMuch(f"{left} ** {right} has more than {MAX_DIGITS} digits")
    if operator == "*" and _whole(left) and _whole(right) \
            and (left.bit_length() + right.bit_length()) * math.log10(2) > MAX_DIGITS + 1:
        raise TooMuch(f"a product of whole numbers has more than {MAX_DIGITS} digits")
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and _whole(n) and n > 0 and weight(seq, MAX_VALUE) * n > MAX_VALUE:
                raise TooMuch(f"repeating a {type(seq).__name__} {n:,} times makes more than {MAX_VALUE:,} "
                              "characters or items")
    if operator == "%" and isinstance(left, str):
        _check_printf(left, right if isinstance(right, tuple) else (right,))


def _too_wide(n: Any, what: str) -> None:
    if _whole(n) and abs(n) > MAX_VALUE:
        raise TooMuch(f"{what} {n:,} is more than {MAX_VALUE:,}")


def _check_printf(fmt: str, args: Iterable[Any]) -> None:
    """Refuse a ``%`` format whose widths or precisions (written, or given by ``*``) are too large."""
    for m in re.finditer(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?", fmt):
        for g in m.groups():
            if g == "*":
                for a in args if not isinstance(args, dict) else args.values():
                    _too_wide(a, "a format width")
            elif g:
                _too_wide(int(g), "a format width")


def _check_format(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a ``str.format`` whose field widths or precisions (written, or nested fields) are too large."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # the call itself reports the bad format
    for _, _, spec, _ in fields:
        for digits in re.findall(r"\d+", spec or ""):
            _too_wide(int(digits), "a format width")
        if spec and "{" in spec:
            for a in [*args, *kwargs.values()]:
                _too_wide(a, "a format width")


def _check_call(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse filter or string method ``name`` on ``value`` when its arguments say the result would be too large."""
    if name in _WIDTHS:
        pos, key = _WIDTHS[name]
        n = args[pos - 1] if len(args) >= pos else kwargs.get(key)
        _too_wide(n, f"{name}'s {key}")
    elif name == "join":  # str.join(items), or the filter: items | join(separator)
        items, sep = (args[0], value) if isinstance(value, str) and args else (value, args[0] if args else "")
        if isinstance(items, list | tuple | set | frozenset | dict | range):
            size = weight(list(items) if isinstance(items, range) else items, MAX_VALUE)
            if size + len(items) * len(str(sep)) > MAX_VALUE:
                raise TooMuch(f"join would make more than {MAX_VALUE:,} characters")
    elif name == "replace" and isinstance(value, str) and len(args) >= 2 and isinstance(args[0], str):
        old, new = args[0], str(args[1])
        hits = value.count(old) if old else len(value) + 1
        if len(value) + hits * max(len(new) - len(old), 0) > MAX_VALUE:
            raise TooMuch(f"replace would make more than {MAX_VALUE:,} characters")
    elif name == "format" and isinstance(value, str):  # str.format (the filter is checked as printf)
        _check_format(value, args, kwargs)
    elif name == "sum" and not _whole(kwargs.get("start", args[1] if len(args) > 1 else 0)) \
            and isinstance(value, list | tuple) and weight(value, MAX_VALUE) > MAX_VALUE:
        raise TooMuch(f"sum would make more than {MAX_VALUE:,} items")
    elif name == "lipsum":
        for a in [value, *args, *kwargs.values()]:
            if _whole(a) and a > 1000:
                raise TooMuch(f"lipsum's {a:,} is more than 1,000")


def check_method(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call of a string method outside ``STR_METHODS``, or one whose arguments make too large a value."""
    inner = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner, name = getattr(inner, "__self__", None), getattr(inner, "__name__", "")
    if isinstance(owner, str):
        if name not in STR_METHODS:
            raise TooMuch(f"a template may not call str.{name} (string methods allowed: "
                          f"{', '.join(sorted(STR_METHODS))})")
        _check_call(name, owner, args, kwargs)
    elif name == "generate_lorem_ipsum":
        _check_call("lipsum", args[0] if args else 5, args[1:], kwargs)


def check_filter(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse filter ``name`` when its arguments say the result would be too large."""
    if name == "format":  # the filter is printf-style: 'x=%d'|format(3)
        if isinstance(value, str):
            _check_printf(value, kwargs or args)
        return
    _check_call(name, value, args, kwargs)


def made(value: Any) -> Any:
    """``value`` (what a ``~`` made), a step of the render's budget and weighed against its bounds."""
    b = _current.get()
    if b is None:
        return value
    b.step()
    return b.make(value)


def current() -> Budget | None:
    """The budget of the render going on in this context (None outside :func:`bounded`)."""
    return _current.get()


def counted(items: Iterable[Any]) -> Iterator[Any]:
    """``items``, each one a step of the render's budget (every ``{% for %}`` loops through this)."""
    for item in items:
        b = _current.get()
        if b is not None:
            b.step()
        yield item


def bounded_filter(name: str, f: Callable[..., Any], passes: bool) -> Callable[..., Any]:
    """Filter (or test) ``f`` counted as a step, checked before it runs and weighed after (``passes``: its first
    argument is the context or environment Jinja2 passes, not the value)."""
    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        b = _current.get()
        if b is None:
            return f(*args, **kwargs)
        b.step()
        rest = args[1:] if passes else args
        if rest:
            check_filter(name, rest[0], tuple(rest[1:]), kwargs)
        return b.make(f(*args, **kwargs))

    return run
