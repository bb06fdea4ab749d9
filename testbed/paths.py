"""Where things live: the state home (.testbed/), the per-user index of state homes, and the shipped resource
folders.

Resource folders (playbooks, inventories, templates, experiments) are searched in the user's working
directory first, then in the installed package (``testbed/_data``), then in the source checkout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

RESOURCE_KINDS = ("playbooks", "inventories", "templates", "experiments")
PACKAGE_DIR = Path(__file__).resolve().parent
# in a results folder, next to the file it belongs to: what an interrupted collect received (never a result)
PARTIAL_DIR = ".testbed-partial"
# a collected run on disk, the contract between collect, report and reproduce (its manifest's type:
# testbed.records.Manifest): <to>/<suite>/<run-id>/ holding manifest.json and one folder per host
RESULTS = "results"  # where collect puts runs unless told (--to)
MANIFEST = "manifest.json"


def run_folder(to: str | Path, suite: str, run_id: str) -> Path:
    """``<to>/<suite>/<run-id>``: where collect puts a run, and where report and reproduce find it."""
    return Path(to) / suite / run_id


# a state home other than this folder's, for the code that reads another folder's testbeds (testbed.ledger)
_AT: ContextVar[Path | None] = ContextVar("testbed_home_at", default=None)


def state_home() -> Path:
    """The state directory, not created: ``$TESTBED_HOME`` or ``./.testbed`` (or the one ``at_home`` set).

    Refused (UsageError) when its path cannot be written into the testbed's ssh_config, inventories and
    command lines (:func:`testbed.quoting.path_problem`: a line break would add an ssh_config directive)."""
    at = _AT.get()
    if at is not None:
        return _usable(at, "the state home", "the index of state homes", "move that folder to a plain path")
    env = os.environ.get("TESTBED_HOME")
    if env:
        return _usable(Path(env).absolute(), "TESTBED_HOME", "TESTBED_HOME",
                       "set TESTBED_HOME to a folder whose path has none of these")
    return _usable(Path.cwd() / ".testbed", "the working folder's state home", "the working folder",
                   "run testbed from a folder whose path has none of these, or set TESTBED_HOME to one")


def _usable(p: Path, what: str, where: str, fix: str) -> Path:
    """``p`` when the testbed's generated files can hold it (else one UsageError naming ``what``)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import quoting

    why = quoting.path_problem(str(p))
    if why is None:
        return p
    # lazy: start-up (testbed status and exec load this module)
    from testbed.errors import UsageError

    raise UsageError(f"{what} {quoting.shown(str(p))} {why}: testbed writes that path into ssh_config, Ansible "
                     "inventories and command lines, where it would not read back as the same path (a line break "
                     "would add an ssh_config directive, such as a ProxyCommand run on this machine)",
                     where=where,
                     fix=f"{fix} (no line break or other control character, no '\"', '\\', '${{' or '{{{{', "
                         "and valid UTF-8)")


def check_state_home() -> None:
    """Refuse (TestbedError) a state home that exists and is not a folder (a file, a link to nothing): it
    would otherwise read as a home without testbeds."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.errors import TestbedError

    p = state_home()
    if p.is_dir() or not (p.exists() or p.is_symlink()):
        return
    kind = "a link to nothing" if not p.exists() else "a file" if p.is_file() else "not a folder"
    source = "TESTBED_HOME" if os.environ.get("TESTBED_HOME") and not _AT.get() else "the state home"
    raise TestbedError(f"the state home {p} is {kind}, not a folder: testbed keeps its state in a folder there",
                       where=f"{p} ({source})",
                       fix="move that file away (or point TESTBED_HOME at a folder), then retry")


def home() -> Path:
    """The state directory (``state_home``), created 0700: for the commands that write state."""
    check_state_home()
    p = state_home()
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


@contextmanager
def at_home(p: Path) -> Iterator[Path]:
    """Within the block, ``state_home``/``home`` answer ``p``: another folder's testbeds read as that folder
    reads them (their files, their names at the provider, their price table)."""
    token = _AT.set(Path(p).absolute())
    try:
        yield Path(p).absolute()
    finally:
        _AT.reset(token)


def user_cache() -> Path:
    """What one user downloads once for every state home: ``$TESTBED_CACHE``, else ``$XDG_CACHE_HOME/testbed``
    (default ``~/.cache``; a relative XDG_CACHE_HOME is ignored, as the XDG spec says)."""
    own = os.environ.get("TESTBED_CACHE", "")
    if own and os.path.isabs(own):
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "testbed"


def index_path() -> Path:
    """The per-user index of state homes: ``$XDG_STATE_HOME/testbed/homes.json`` (default
    ``~/.local/state``; a relative XDG_STATE_HOME is ignored, as the XDG spec says)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "testbed" / "homes.json"


def testbed_dir(name: str) -> Path:
    """Per-testbed files: keys, known_hosts, ssh_config, inventory, provider scratch."""
    p = home() / "testbeds" / name
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def resource_roots() -> list[Path]:
    """The folders whose playbooks/, inventories/, templates/ and experiments/ testbed reads, highest priority
    first: the working folder, the installed package's data, the source checkout."""
    seen: list[Path] = []
    for c in (Path.cwd(), PACKAGE_DIR / "_data", PACKAGE_DIR.parent):
        c = c.resolve()
        if c not in seen:
            seen.append(c)
    return seen


def resource_dirs(kind: str) -> list[Path]:
    """Folders holding ``kind`` resources, highest priority first (cwd overrides the package)."""
    if kind not in RESOURCE_KINDS:
        raise ValueError(kind)
    seen: list[Path] = []
    for root in resource_roots():
        c = (root / kind).resolve()
        if c.is_dir() and c not in seen:
            seen.append(c)
    return seen


def find_resource(kind: str, relpath: str) -> Path | None:
    """The first ``kind/relpath`` found, cwd first."""
    for d in resource_dirs(kind):
        p = d / relpath
        if p.exists():
            return p
    return None


def list_resources(kind: str, pattern: str = "*.yml") -> dict[str, Path]:
    """Name (stem) -> path of every resource, cwd entries overriding packaged ones."""
    found: dict[str, Path] = {}
    for d in reversed(resource_dirs(kind)):
        for p in sorted(d.glob(pattern)):
            found[p.stem] = p
    return dict(sorted(found.items()))


SUITE_FILE = "suite.yml"
"""A suite folder's YAML: ``experiments/<name>/suite.yml`` (beside it: profile.yml, roles/, report.py, workloads/)."""


def suite_name_of(path: Path) -> str:
    """The name a suite file goes by: its folder's for ``<name>/suite.yml``, else its stem (``<name>.yml``)."""
    return path.parent.name if path.name == SUITE_FILE else path.stem


def find_suite(name: str) -> Path | None:
    """The YAML of the suite ``name``: ``experiments/<name>/suite.yml``, else the single file
    ``experiments/<name>.yml``, in the working folder first, then the shipped ones."""
    for d in resource_dirs("experiments"):
        for p in (d / name / SUITE_FILE, d / f"{name}.yml"):
            if p.exists():  # a FIFO or a device too: the loader refuses it, naming what it is
                return p
    return None


def list_suite_files() -> dict[str, Path]:
    """Name -> YAML of every suite (folders and single files), the working folder's overriding shipped ones."""
    found: dict[str, Path] = {}
    for d in reversed(resource_dirs("experiments")):
        for p in sorted(d.glob("*.yml")):
            found[p.stem] = p
        for p in sorted(d.glob(f"*/{SUITE_FILE}")):
            found[p.parent.name] = p
    return dict(sorted(found.items()))


# the suite folders named by their path (or fetched from git) in the command under way (None: no command)
_NAMED: ContextVar[list[Path] | None] = ContextVar("testbed_named_suites", default=None)


@contextmanager
def one_command() -> Iterator[None]:
    """Within the block, one command: the suite folders it names by path (:func:`name_suite_folder`) count until
    it ends, and no other command sees them. The front doors enter it (the CLI for each command line, the
    services for each verb a script calls); one inside another is part of the outer command."""
    if _NAMED.get() is not None:
        yield
        return
    token = _NAMED.set([])
    try:
        yield
    finally:
        _NAMED.reset(token)


def name_suite_folder(folder: Path) -> None:
    """Count ``folder`` (a suite folder named by its path, or fetched from git) among :func:`named_suite_folders`:
    its roles/ and profile.yml add to the shipped ones for the rest of this command (:func:`one_command`);
    outside a command, for nothing after this call."""
    named = _NAMED.get()
    folder = folder.resolve()
    if named is not None and folder not in named:
        named.append(folder)


def named_suite_folders() -> list[Path]:
    """The suite folders named by their path (or fetched from git) in this command, first named first."""
    return [f for f in _NAMED.get() or [] if (f / SUITE_FILE).is_file()]


IMAGE_RECORD = ".cache/testbed/image.json"
"""Where an image of a set-up holds its record on a host, relative to the login user's home (the hosts booted from
it read it there; see testbed.setup.images)."""


def own_copy(path: str | Path) -> tuple[str, str] | None:
    """For a spec or suite that testbed ships (found in the installed package or its checkout, not in this
    folder): the shell command that copies it into this folder, where the user may edit it, and the path of the
    copy (``inventories/my-lab.yml``; a suite's whole folder: ``experiments/my-suite/suite.yml``). None for a file
    of the user's own (this folder's, or given by its path elsewhere)."""
    from shlex import quote

    p = Path(path).resolve()
    if p.is_relative_to(Path.cwd().resolve()):
        return None
    for root in (PACKAGE_DIR / "_data", PACKAGE_DIR.parent):
        for kind in ("inventories", "experiments"):
            base = (root / kind).resolve()
            if not p.is_relative_to(base) or p == base:
                continue
            top = base / p.relative_to(base).parts[0]  # the suite's folder, or the spec file itself
            copy = f"mkdir -p {kind} && cp {'-r ' if top.is_dir() else ''}{quote(str(top))} {kind}/"
            return copy, f"{kind}/{p.relative_to(base)}"
    return None


def edit_hint(path: str | Path, change: str) -> str:
    """How to ``change`` (``set provider.project``) in the spec or suite at ``path``: in that file when it is the
    user's own; for one that testbed ships (inside site-packages, which an upgrade overwrites), in a copy in
    this folder, with the command that makes it."""
    copied = own_copy(path)
    if copied is None:
        return f"{change} in {path}"
    copy, local = copied
    return f"copy it here ({copy}), then {change} in {local}"



@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` to write into: renamed over ``path`` when the block ends, removed (and the
    previous ``path``, if any, left as it was) when it fails, a full disk included."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` whole or not at all (:func:`replacing`), flushed to the disk before the rename."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def copy_atomic(src: Path, dest: Path) -> str:
    """Copy ``src`` to ``dest`` whole or not at all (:func:`replacing`); the sha256 of what was written."""
    import hashlib

    h = hashlib.sha256()
    with replacing(dest) as tmp, open(src, "rb") as fin, open(tmp, "wb") as fout:
        for chunk in iter(lambda: fin.read(1 << 20), b""):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest()
