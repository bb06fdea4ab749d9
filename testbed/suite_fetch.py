"""Where a suite comes from, and suites fetched from git at a commit.

A suite argument ``git+URL@COMMIT#PATH`` names the suite at ``PATH`` (a suite folder, or a .yml file; empty: the
repository's top folder) of the repository at ``URL`` (https://, http://, ssh://, git:// or file://) at
``COMMIT``, a full 40-hex commit (a branch or tag can move between runs, so it is refused). testbed fetches it with
git, bounded by a timeout, into the state home (``.testbed/suites/<commit>/``, with ``<commit>.json`` beside it
recording the URL), checks that exact commit out, and loads the suite from there; a later command finds the
checkout and fetches nothing. A run of it records the URL and commit in its manifest (``suite_file.git``).

The URL is untrusted: one that looks like an option, holds a control character, a password or another transport
(``ext::``) is refused before git runs; it reaches git as an argument after ``--``, never through a shell.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from testbed import paths
from testbed.errors import UsageError

PREFIX = "git+"
SCHEMES = ("https://", "http://", "ssh://", "git://", "file://")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
MAX_URL = 2000
GIT_TIMEOUT = 300.0
"""The longest one git command may take (a fetch of a large repository over a slow link included)."""
FORM = "git+https://host/repo.git@<40-hex commit>#path/to/suite"
SUITES_DIR = "suites"


@dataclass(frozen=True)
class GitSuite:
    """A suite in a git repository: its URL, the commit, and the path of the suite inside (``""``: the top)."""

    url: str
    commit: str
    path: str

    def shown(self) -> str:
        return f"{self.url}@{self.commit}" + (f"#{self.path}" if self.path else "")


def is_git_suite(arg: str) -> bool:
    """Whether a suite argument names a suite in git (``git+...``)."""
    return arg.startswith(PREFIX)


def parse(arg: str) -> GitSuite:
    """The parts of ``git+URL@COMMIT#PATH``; refused (UsageError) when any part is not of that form."""
    fix = f"write {FORM} (a full 40-hex commit: git ls-remote URL BRANCH prints it)"
    if len(arg) > MAX_URL or any(ord(c) < 32 or ord(c) == 127 for c in arg):
        raise UsageError("the git suite URL holds a control character or is longer than "
                         f"{MAX_URL} characters", where="command line", fix=fix)
    rest = arg[len(PREFIX):]
    rest, _, sub = rest.partition("#")
    url, at, commit = rest.rpartition("@")
    commit = commit.lower()
    if not at or not url:
        raise UsageError(f"{arg!r} names no commit", where="command line", fix=fix)
    if not COMMIT_RE.match(commit):
        raise UsageError(f"{commit!r} is not a full commit: a suite from git is pinned to one (a branch or tag can "
                         "move between runs)", where="command line", fix=fix)
    _check_url(url, fix)
    return GitSuite(url, commit, _check_sub(sub, fix))


def _check_url(url: str, fix: str) -> None:
    if url.startswith("-"):
        raise UsageError(f"the URL {url!r} looks like an option", where="command line", fix=fix)
    if not url.startswith(SCHEMES):
        raise UsageError(f"the URL {url!r} is not one of {', '.join(SCHEMES)}", where="command line",
                         fix="give the repository's https://, ssh:// or file:// URL (ssh://git@host/owner/repo.git, "
                             "not git@host:owner/repo.git)")
    userinfo = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
    if ":" in userinfo:
        raise UsageError("the URL holds a password: it would be written into the run's manifest",
                         where="command line", fix="let git's credential helper or ssh keys give it, not the URL")


def _check_sub(sub: str, fix: str) -> str:
    pure = PurePosixPath(sub) if sub else PurePosixPath(".")
    if sub.startswith("/") or ".." in pure.parts or "\\" in sub:
        raise UsageError(f"the suite's path {sub!r} is not a path inside the repository", where="command line",
                         fix=fix)
    return "" if str(pure) == "." else str(pure)


def _env() -> dict[str, str]:
    """git with no prompt (a password asked for would wait forever), ssh without one, and only the transports a
    suite URL may name (a submodule or redirect cannot switch to ext::)."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": "https:http:ssh:git:file",
            "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"), "LC_ALL": "C"}


def _git(args: list[str], cwd: Path, gs: GitSuite, timeout: float) -> subprocess.CompletedProcess[str]:
    """One git command (argv, no shell); a missing git or a timeout is one UsageError naming the suite."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UsageError("git is not installed: a suite from git is fetched with it", where=gs.shown(),
                         fix="install git (apt-get install git), or clone the suite and name its folder") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git did not finish fetching {gs.url} in {timeout:g} s", where=gs.shown(),
                         fix="check the URL and this machine's network, or clone it yourself and name the "
                             "suite's folder") from None


def _said(r: subprocess.CompletedProcess[str]) -> str:
    """git's last line of complaint, one line, bounded."""
    lines = [ln.strip() for ln in (r.stderr or r.stdout or "").splitlines() if ln.strip()]
    text = lines[-1] if lines else f"git exited {r.returncode}"
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


def checkout_dir(commit: str) -> Path:
    """Where the checkout of ``commit`` lives: ``<state home>/suites/<commit>/``."""
    return paths.state_home() / SUITES_DIR / commit


def fetch(gs: GitSuite, timeout: float = GIT_TIMEOUT) -> Path:
    """The checkout of ``gs``'s commit under the state home (fetched once; a later call finds it)."""
    dest = checkout_dir(gs.commit)
    if not (dest / ".git").is_dir() or _head(dest, gs, timeout) != gs.commit:
        base = paths.home() / SUITES_DIR
        base.mkdir(exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=base))
        try:
            _fetch_into(tmp, gs, timeout)
            shutil.rmtree(dest, ignore_errors=True)
            try:
                tmp.rename(dest)
            except OSError:  # another command fetched the same commit meanwhile: its checkout is as good
                if _head(dest, gs, timeout) != gs.commit:
                    raise UsageError(f"cannot put the checkout of {gs.commit[:12]} at {dest}", where=gs.shown(),
                                     fix=f"remove {dest} and retry") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    record = dest.with_name(f"{gs.commit}.json")
    seen = _record(record)
    urls = [u for u in seen.get("urls", []) if isinstance(u, str) and u != gs.url]
    record.write_text(json.dumps({"commit": gs.commit, "urls": [gs.url, *urls]}, indent=1) + "\n")
    return dest


def _head(dest: Path, gs: GitSuite, timeout: float) -> str:
    r = _git(["rev-parse", "HEAD"], dest, gs, timeout)
    return r.stdout.strip() if r.returncode == 0 else ""


def _fetch_into(tmp: Path, gs: GitSuite, timeout: float) -> None:
    """Fetch ``gs.commit`` from ``gs.url`` into the fresh folder ``tmp`` and check it out (UsageError else)."""
    _git(["init", "-q"], tmp, gs, timeout)
    r = _git(["fetch", "-q", "--depth", "1", "--", gs.url, gs.commit], tmp, gs, timeout)
    if r.returncode != 0:  # a server that refuses a commit by its hash: every branch and tag, then look for it
        r = _git(["fetch", "-q", "--tags", "--", gs.url, "+refs/heads/*:refs/remotes/origin/*"], tmp, gs, timeout)
        if r.returncode != 0:
            raise UsageError(f"cannot fetch {gs.url}: {_said(r)}", where=gs.shown(),
                             fix="check the URL (and that this machine can reach it), then retry")
    r = _git(["-c", "advice.detachedHead=false", "checkout", "-q", "--detach", gs.commit], tmp, gs, timeout)
    if r.returncode != 0:
        raise UsageError(f"commit {gs.commit} is not in {gs.url}", where=gs.shown(),
                         fix="give a commit the repository holds (git ls-remote URL shows its branches' commits)")


def _record(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def suite_file(arg: str) -> Path:
    """The suite YAML that ``git+URL@COMMIT#PATH`` names, fetched (UsageError when there is none at PATH)."""
    gs = parse(arg)
    top = fetch(gs)
    p = top / gs.path if gs.path else top
    if p.suffix in (".yml", ".yaml") and p.is_file():
        found: Path | None = p
    else:
        found = p / paths.SUITE_FILE if (p / paths.SUITE_FILE).is_file() else None
    if found is None or not found.resolve().is_relative_to(top.resolve()):
        raise UsageError(f"no suite at {gs.path or 'the top folder'} of {gs.url}@{gs.commit[:12]}",
                         where=gs.shown(),
                         fix=f"name the folder holding its {paths.SUITE_FILE} (or the .yml file) after '#'")
    return found


def git_origin(path: Path) -> dict[str, str] | None:
    """``{url, commit, path}`` of a suite file inside a checkout fetched from git; None for any other file."""
    base = (paths.state_home() / SUITES_DIR).resolve()
    p = path.resolve()
    if not p.is_relative_to(base) or p == base:
        return None
    commit = p.relative_to(base).parts[0]
    if not COMMIT_RE.match(commit):
        return None
    urls = _record(base / f"{commit}.json").get("urls") or []
    inside = p.relative_to(base / commit)
    return {"url": str(urls[0]) if urls else "", "commit": commit, "path": str(inside)}


def origin(path: Path) -> dict[str, str]:
    """Where the suite file at ``path`` comes from: ``{"from": "here"}`` (the working folder's experiments/),
    ``"shipped"`` (testbed's own), ``"git"`` (with url, commit, path) or ``"path"`` (anywhere else)."""
    got = git_origin(path)
    if got is not None:
        return {"from": "git", **got}
    p = path.resolve()
    shipped = [(root / "experiments").resolve() for root in (paths.PACKAGE_DIR / "_data", paths.PACKAGE_DIR.parent)]
    if any(p.is_relative_to(d) for d in shipped):
        return {"from": "shipped"}
    if p.is_relative_to((Path.cwd() / "experiments").resolve()):
        return {"from": "here"}
    return {"from": "path"}


def origin_text(o: dict[str, str]) -> str:
    """One word or line for a table: here, shipped, path, or git URL@COMMIT."""
    if o.get("from") == "git":
        return f"git {o.get('url')}@{o.get('commit')}"
    return o.get("from", "path")


def fetched_suites() -> list[Path]:
    """The suite files of the checkouts fetched into this state home (their suite folders and .yml at the top)."""
    base = paths.state_home() / SUITES_DIR
    out: list[Path] = []
    for top in sorted(base.glob("*")) if base.is_dir() else []:
        if top.is_dir() and COMMIT_RE.match(top.name):
            out += sorted(p for p in top.rglob(paths.SUITE_FILE) if ".git" not in p.relative_to(top).parts)[:100]
    return out
