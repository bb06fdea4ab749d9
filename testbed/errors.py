"""One error type the CLI turns into one clear message: what went wrong, where, and what to do."""

from __future__ import annotations


class TestbedError(Exception):
    """A failure the user can act on. Rendered without a traceback (``--debug`` shows one)."""

    __test__ = False  # not a pytest class

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None, code: int = 1):
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


class UsageError(TestbedError):
    """Bad input from the user (exit code 2): refused before any host is touched."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what, where=where, fix=fix, code=2)


DISTRIBUTION = "testbed"
"""The name this project is installed by (its wheel's metadata Name): every install hint is built from it."""


def install_command(extra: str | None = None) -> str:
    """The command that installs this project, with ``extra`` (``chameleon``, ``tpu``) when given."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"


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
        raise UsageError(f"{what} needs the '{extra}' extra, which is not installed (no module {module})",
                         where="this Python environment",
                         fix=f"{install_command(extra)} (in the environment testbed runs from), then retry")
