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


def origin() -> str:
    """Where this testbed installs from again, as pip takes it: the checkout it runs from; else the folder, wheel
    file or git URL it was installed from (PEP 610's ``direct_url.json``, when that path still exists); else its
    name on an index (``DIST``: only right for an install from PyPI or a mirror, as the project is not on PyPI
    yet)."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    here = Path(__file__).resolve().parent.parent
    project = here / "pyproject.toml"
    try:
        if project.is_file() and f'name = "{DIST}"' in project.read_text(encoding="utf-8"):
            return str(here)  # a checkout (run from it, or installed from it editable)
    except OSError:
        pass
    try:
        recorded = json.loads(distribution(DIST).read_text("direct_url.json") or "null")
    except (PackageNotFoundError, ValueError, OSError):
        recorded = None
    if isinstance(recorded, dict) and isinstance(recorded.get("url"), str):
        url, vcs = recorded["url"], recorded.get("vcs_info")
        if isinstance(vcs, dict) and vcs.get("vcs"):
            rev = vcs.get("requested_revision")
            return f"{DIST} @ {vcs['vcs']}+{url}" + (f"@{rev}" if rev else "")
        if url.startswith("file://"):
            path = unquote(urlparse(url).path)
            if Path(path).exists():
                return path
    return DIST


def install_command(*extras: str, upgrade: bool = False, reinstall: bool = False, pipx: bool | None = None) -> str:
    """The shell command that installs this project (with ``extras``) into the environment testbed runs from:
    pip's, or pipx's when testbed was installed with pipx (``pipx``: force one or the other); from where it was
    installed (:func:`origin`: a checkout, a wheel file, a git URL), so that the command works as written."""
    from shlex import quote

    where = origin()
    extra = f"[{','.join(sorted(set(extras)))}]" if extras else ""
    name, at, url = where.partition(" @ ")
    req = f"{name}{extra}{at}{url}"
    arg = quote(req)  # quoted when it holds [extras], a space or anything else the shell reads
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
