"""Users' regular expressions (a suite's tables, progress and checkpoint lines), run in linear time by RE2.

A pattern a suite declares is matched against whatever its program printed; Python's ``re`` backtracks, so one
such as ``(a+)+$`` takes minutes on a 37-byte line. RE2 (``google-re2``) matches every pattern in time linear in
the text and refuses, at load, the features that need backtracking (backreferences, lookaround): :func:`problem`
says which, and the suite's loader names the line. Patterns testbed writes itself use ``re``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is our message, not a line RE2 logs on stderr


@functools.lru_cache(maxsize=512)
def compile(pattern: str, *, multiline: bool = False) -> Any:
    """``pattern`` compiled by RE2 (``multiline``: ``^`` and ``$`` at each line); re2.error when RE2 refuses it."""
    return re2.compile(f"(?m){pattern}" if multiline else pattern, options=_OPTIONS)


def group_names(pattern: str) -> list[str]:
    """The named groups of ``pattern`` in the order they open (RE2's groupindex is ordered by name)."""
    index = compile(pattern).groupindex
    return sorted(index, key=index.get)


def problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a user's pattern (None: it can): not a regular expression, or a feature only a
    backtracking engine has."""
    try:
        compile(pattern)
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if re.search(r"invalid escape sequence: \\[1-9]|invalid perl operator: \(\?<?[=!]", why):
            return (f"{why}: testbed matches your patterns in linear time (RE2), which has no backreferences "
                    "and no lookahead or lookbehind; rewrite it without them")
        return f"not a regular expression RE2 accepts: {why}"
    return None
