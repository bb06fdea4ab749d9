"""The distribution's name and the one install command every message and page gives.

On PyPI, "testbed" is an unrelated project; this one is published as ``testbed-artifacts``. The import name
(``import testbed``) and the ``testbed`` command keep their names. Every hint that tells a user to install,
upgrade or reinstall this project comes from :func:`install_command` (tests/test_wheel.py checks each command
found in the package and its docs against the built wheel's metadata).
"""

from __future__ import annotations

import sys

DIST = "testbed-artifacts"  # pyproject.toml [project] name


def _pipx() -> bool:
    """This interpreter is a pipx-managed virtualenv (``pipx install``): pip there is not the user's pip."""
    return "/pipx/venvs/" in sys.prefix.replace("\\", "/")


def install_command(*extras: str, upgrade: bool = False, reinstall: bool = False, pipx: bool | None = None) -> str:
    """The shell command that installs this project (with ``extras``) into the environment testbed runs from:
    pip's, or pipx's when testbed was installed with pipx (``pipx``: force one or the other)."""
    req = DIST + (f"[{','.join(sorted(set(extras)))}]" if extras else "")
    arg = f"'{req}'" if extras else req
    if _pipx() if pipx is None else pipx:
        if extras or reinstall:  # pipx changes what a venv holds by installing it again
            return f"pipx install --force {arg}"
        return f"pipx upgrade {DIST}" if upgrade else f"pipx install {arg}"
    flags = " -U" if upgrade else " --force-reinstall" if reinstall else ""
    return f"pip install{flags} {arg}"


SOURCE_VERSION = "0.1.0"
"""The version this source tree carries (``pyproject.toml``'s; ``testbed.__version__``)."""


def version() -> str:
    """This installation's version (the package's own when no distribution metadata is found: a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DIST)
    except PackageNotFoundError:
        return SOURCE_VERSION
