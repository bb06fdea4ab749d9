"""One error type the CLI turns into one clear message: what went wrong, where, and what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from testbed.exitcodes import Exit

# which front door the user came in by: "cli" (the testbed command) or "python" (testbed.open, a notebook); a fix
# names what that user can type (a command and its flags, or a method and its arguments)
_FRONT: ContextVar[str] = ContextVar("testbed_front_door", default="python")


class TestbedError(Exception):
    """A failure the user can act on. Rendered without a traceback (``--debug`` shows one)."""

    __test__ = False  # not a pytest class

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None, code: int = Exit.FAILED):
        super().__init__(what)
        self.what = what
        self.where = where
        self.fix = fix
        self.code = code

    def render(self) -> str:
        parts = [self.what]
        if self.where is not None:  # a blank or padded place (a path of spaces) is shown quoted
            plain = self.where and self.where == self.where.strip()
            parts.append(f"  where: {self.where if plain else repr(self.where)}")
        if self.fix:
            parts.append(f"  fix:   {self.fix}")
        return "\n".join(parts)

    def __str__(self) -> str:
        """What, where and fix: an uncaught one (a script, a notebook cell) shows all three, as the CLI does."""
        return self.render()

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in (("where", self.where), ("fix", self.fix)) if v is not None)
        return f"{type(self).__name__}({self.what!r}{extra})"


class UsageError(TestbedError):
    """Bad input from the user (exit code 2): refused before any host is touched."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what, where=where, fix=fix, code=Exit.USAGE)


class HostsFailed(TestbedError):
    """A command or transfer failed on some hosts (as Fabric's ``GroupException``): ``results`` holds what every
    host did (host -> result), ``failed`` the hosts that failed. ``warn=True`` returns the results instead."""

    def __init__(self, what: str, *, results: Any = None, failed: Any = None, where: str | None = None,
                 fix: str | None = None):
        super().__init__(what, where=where, fix=fix)
        self.results = results
        self.failed = failed


class RunFailed(TestbedError):
    """A suite's run ended without succeeding (failed, stopped, timed out...): ``run`` is the run, to look at its
    ``record``, ``logs()`` or to ``collect()``. The exit code is the CLI's for that outcome."""

    def __init__(self, what: str, *, run: Any = None, where: str | None = None, fix: str | None = None,
                 code: int = Exit.FAILED):
        super().__init__(what, where=where, fix=fix, code=code)
        self.run = run


def has_module(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a missing parent package counts as missing:
    ``find_spec('google.cloud.tpu_v2')`` raises when ``google`` is absent)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or None in sys.modules
        return False


def require_extra(module: str, extra: str, what: str) -> None:
    """Refuse, with the install command, when an optional extra's module is missing (never ModuleNotFoundError)."""
    if not has_module(module):
        # lazy: start-up (testbed status and exec load this module)
        from testbed.distribution import install_command

        raise UsageError(f"{what} needs the '{extra}' extra, which is not installed (no module {module})",
                         where="this Python environment",
                         fix=f"{install_command(extra)} (in the environment testbed runs from), then retry")


@contextmanager
def front_door(name: str) -> Iterator[None]:
    """Within the block, fixes are worded for ``name``'s user: ``"cli"`` (the testbed command sets it) or
    ``"python"`` (the default: the API)."""
    token = _FRONT.set(name)
    try:
        yield
    finally:
        _FRONT.reset(token)


def in_cli() -> bool:
    """Whether this is the testbed command (not a script or notebook calling the API)."""
    return _FRONT.get() == "cli"


def by_door(cli: str, python: str) -> str:
    """The words of a fix for the front door in use: ``cli`` for the testbed command (its commands and flags),
    ``python`` for the API (methods and their arguments; never a command-line flag)."""
    return cli if in_cli() else python


def provision_fix(name: str) -> str:
    """How to provision testbed ``name`` from the front door in use."""
    return by_door(f"testbed provision {name}", f"testbed.open({name!r}).provision()")
