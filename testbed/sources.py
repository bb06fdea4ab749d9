"""Source overrides: run an artifact from a local checkout, a fork or an offline mirror.

``--source NAME=PATH|URL[@REF]`` (``testbed run`` and ``testbed setup``) and a testbed spec's ``sources:``
mapping replace the repository of a suite source (``sources:`` in the suite) or of a profile build
(``source_build_name``); a name matches either, and an override of a suite source also applies to the profile
builds of the same repository. Everything is checked on the controller before any host is touched:

- a **local path** (or ``file://`` URL) is snapshotted into a git bundle under the state home: a git
  repository at REF (default: HEAD, plus uncommitted changes to tracked files, as ``git stash create`` sees
  them), or a plain folder as it is (every file, a fresh commit). The bundle travels with the run (or set-up)
  and the host checks out exactly that commit, so hosts need no network and the manifest names the commit;
- a **URL** is asked for its refs (``git ls-remote``); the hosts clone it themselves. A REF that is neither a
  branch nor a tag of it is refused, except a commit id, which only a clone can check (the host's checkout
  fails with its own message then).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import git, paths, quoting
from testbed.errors import TestbedError, UsageError, by_door
from testbed.records import Override
from testbed.setup.profiles import load_profile
from testbed.spec import load_testbed
from testbed.suite import render

if TYPE_CHECKING:
    from testbed.suite import Suite

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
HEX_RE = re.compile(r"^[0-9a-f]{7,40}$")
BUNDLE_REF = "refs/heads/testbed-source"
_FIXED_DATES = {"GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
"""Snapshot commits carry fixed dates, so the same files always give the same commit (and one bundle)."""


def parse(items: list[str], where: str = "--source") -> dict[str, str]:
    """``["name=spec", ...]`` -> {name: spec}; malformed items are refused."""
    out: dict[str, str] = {}
    for it in items:
        name, sep, spec = it.partition("=")
        name = name.strip()
        if not sep or not NAME_RE.match(name) or not spec.strip():
            raise UsageError(f"'{where} {it}' is not NAME=PATH|URL[@REF]", where=where,
                             fix=by_door("e.g. --source app=~/src/my-app or --source "
                                         "app=https://github.com/me/fork@main",
                                         "e.g. sources={'app': '~/src/my-app'}"))
        if name in out:
            raise UsageError(f"{where} {name} is given twice ({out[name]!r} and {spec.strip()!r})", where=where,
                             fix="give each source once")
        out[name] = spec.strip()
    return out


def _split_ref(spec: str) -> tuple[str, str | None]:
    """(location, ref): the ref is what follows the last '@' when what precedes it is a path or a URL."""
    at = spec.rfind("@")
    if at <= 0 or at == len(spec) - 1:
        return spec, None
    loc, ref = spec[:at], spec[at + 1:]
    if _is_url(loc) or Path(loc).expanduser().exists():
        return loc, ref
    return spec, None


def _is_url(s: str) -> bool:
    return "://" in s or bool(re.match(r"^[\w.-]+@[\w.-]+:", s))


def resolve(name: str, spec: str, where: str = "--source") -> Override:
    """Check one override and, for a local path, make its bundle. Raises UsageError before any host."""
    loc, ref = _split_ref(spec)
    if loc.startswith("file://"):
        loc = loc[len("file://"):]
    if _is_url(loc):
        return _resolve_url(name, spec, loc, ref, where)
    path = Path(loc).expanduser()
    if not path.is_dir():
        raise UsageError(f"source override {name}={spec}: {path} is not a folder", where=where,
                         fix="give an existing checkout or folder, or a URL (https://..., git@host:repo)")
    return _resolve_path(name, spec, path.resolve(), ref, where)


def _resolve_url(name: str, spec: str, url: str, ref: str | None, where: str) -> Override:
    r = git.run(["ls-remote", url])
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise UsageError(f"source override {name}={spec}: cannot reach the repository ({last})", where=where,
                         fix="check the URL and your credentials, or give a local checkout or mirror")
    if ref:
        refs = {ln.split("\t", 1)[1] for ln in r.stdout.splitlines() if "\t" in ln}
        shas = {ln.split("\t", 1)[0] for ln in r.stdout.splitlines() if "\t" in ln}
        known = {ref, f"refs/heads/{ref}", f"refs/tags/{ref}"} & refs
        if not known and not any(s.startswith(ref) for s in shas) and not HEX_RE.match(ref):
            raise UsageError(f"source override {name}={spec}: {url} has no branch or tag '{ref}'", where=where,
                             fix="name an existing branch, tag or commit id (git ls-remote " + url + ")")
    return Override(name, spec, "url", url, ref)


def _resolve_path(name: str, spec: str, path: Path, ref: str | None, where: str) -> Override:
    top = git.run(["rev-parse", "--show-toplevel"], cwd=path)
    bare = git.run(["rev-parse", "--is-bare-repository"], cwd=path)
    is_repo = (top.returncode == 0 and Path(top.stdout.strip()).resolve() == path) or \
        (bare.returncode == 0 and bare.stdout.strip() == "true" and git.run(["rev-parse", "--git-dir"], cwd=path)
         .stdout.strip() in (".", str(path)))
    cache = paths.user_cache() / "bundles"  # keyed by commit: one per user, shared by every state home
    cache.mkdir(parents=True, exist_ok=True)
    dirty = False
    if is_repo:
        if ref:
            r = git.run(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=path)
            if r.returncode != 0:
                raise UsageError(f"source override {name}={spec}: {path} has no commit, branch or tag '{ref}'",
                                 where=where, fix=f"git -C {shlex.quote(str(path))} log --oneline shows what it has")
            commit = r.stdout.strip()
        else:
            head = git.run(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=path)
            if head.returncode != 0:
                raise UsageError(f"source override {name}={spec}: {path} has no commit yet", where=where,
                                 fix="commit something first, or give a plain folder")
            commit = head.stdout.strip()
            stash = git.run(["stash", "create"], cwd=path, env_extra=_FIXED_DATES) \
                if bare.stdout.strip() != "true" else None
            if stash is not None and stash.returncode == 0 and stash.stdout.strip():
                commit, dirty = stash.stdout.strip(), True
        bundle = cache / f"{name}-{commit[:16]}.bundle"
        if not bundle.is_file():
            _bundle_from_repo(path, commit, bundle, name, spec, where)
    else:
        if ref:
            raise UsageError(f"source override {name}={spec}: {path} is not a git repository, so it has no "
                             f"'{ref}'", where=where, fix="drop @REF to use the folder as it is")
        commit, bundle = _bundle_from_folder(path, cache, name, spec, where)
    return Override(name, spec, "path", str(path), ref, commit, str(bundle), dirty)


def _bundle_from_repo(repo: Path, commit: str, bundle: Path, name: str, spec: str, where: str) -> None:
    """A bundle holding ``commit`` of ``repo`` under BUNDLE_REF; the user's repository is left untouched
    (a scratch repository borrows its objects through ``objects/info/alternates``)."""
    import tempfile

    git_dir = git.run(["rev-parse", "--absolute-git-dir"], cwd=repo).stdout.rstrip("\n")
    objects = str(Path(git_dir) / "objects")
    if (c := quoting.control_char(objects)) is not None:  # the alternates file holds one path a line
        raise UsageError(f"source override {name}={spec}: the repository's path {quoting.shown(objects)} holds {c}",
                         where=where, fix="move the repository to a path without it, or give a plain folder")
    with tempfile.TemporaryDirectory(prefix="testbed-src-") as tmp:
        git.run(["init", "-q", "--bare", tmp])
        (Path(tmp) / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (Path(tmp) / "objects" / "info" / "alternates").write_bytes(os.fsencode(objects) + b"\n")
        part = f"{bundle}.{os.getpid()}.tmp"  # one per process: two state homes may bundle one commit at once
        for args in (["update-ref", BUNDLE_REF, commit], ["bundle", "create", part, BUNDLE_REF]):
            r = git.run(args, cwd=tmp, timeout=600)
            if r.returncode != 0:
                raise UsageError(f"source override {name}={spec}: cannot bundle {repo} at {commit[:12]} "
                                 f"({(r.stderr.strip().splitlines() or ['?'])[-1]})", where=where,
                                 fix="check the repository (git fsck), or give a plain folder")
    Path(part).replace(bundle)


def _bundle_from_folder(folder: Path, cache: Path, name: str, spec: str, where: str) -> tuple[str, Path]:
    """Every file of ``folder`` as one commit in a bundle (deterministic: same files, same commit)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="testbed-src-") as tmp:
        git.run(["init", "-q", tmp])
        env = {"GIT_DIR": str(Path(tmp) / ".git"), "GIT_WORK_TREE": str(folder), "GIT_AUTHOR_NAME": "testbed",
               "GIT_AUTHOR_EMAIL": "testbed@localhost", "GIT_COMMITTER_NAME": "testbed",
               "GIT_COMMITTER_EMAIL": "testbed@localhost", **_FIXED_DATES}
        for args in (["add", "-A", "-f", "."],
                     ["commit", "-q", "--no-verify", "--no-gpg-sign", "-m", f"snapshot of {folder}"]):
            r = git.run(args, cwd=folder, env_extra=env, timeout=600)
            if r.returncode != 0:
                raise UsageError(f"source override {name}={spec}: cannot snapshot {folder} "
                                 f"({(r.stderr.strip().splitlines() or ['?'])[-1]})", where=where,
                                 fix="check that every file in the folder is readable")
        commit = git.run(["rev-parse", "HEAD"], cwd=folder, env_extra=env).stdout.strip()
        bundle = cache / f"{name}-{commit[:16]}.bundle"
        if not bundle.is_file():
            git.run(["update-ref", BUNDLE_REF, commit], cwd=folder, env_extra=env)
            part = f"{bundle}.{os.getpid()}.tmp"
            r = git.run(["bundle", "create", part, BUNDLE_REF], cwd=folder, env_extra=env, timeout=600)
            if r.returncode != 0:
                raise UsageError(f"source override {name}={spec}: cannot bundle {folder} ({r.stderr.strip()})",
                                 where=where, fix="check free space under the state home")
            Path(part).replace(bundle)
    return commit, bundle


def repo_key(url: str) -> str:
    """A repository URL normalised for matching (scheme, user, ``.git`` and case dropped)."""
    u = url.strip().lower()
    u = re.sub(r"^git@([^:]+):", r"\1/", u)
    u = re.sub(r"^[a-z+]+://(?:[^@/]+@)?", "", u)
    return u.removesuffix("/").removesuffix(".git")


MIRROR_TIMEOUT = 900.0
"""The longest a controller-side clone into the user's mirror cache may take."""


def mirror_path(url: str) -> Path:
    """Where the user's cache keeps a bare mirror of ``url``: one per repository, shared by every state home."""
    key = repo_key(url)
    safe = re.sub(r"[^a-z0-9._-]+", "_", key)[:80].strip("._") or "repo"
    return paths.user_cache() / "mirrors" / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:8]}.git"


def from_mirror(name: str, url: str, ref: str | None, *, fetch: bool,
                say: Callable[[str], None] | None = None) -> Override | str:
    """An override of source ``name`` from the user's mirror of ``url`` at ``ref``: the cached mirror when it holds
    ``ref``, else (with ``fetch``) after cloning or fetching it on this machine. A string says why there is none."""
    dest = mirror_path(url)
    want = f"{ref}^{{commit}}" if ref else "HEAD^{commit}"

    def has_ref() -> bool:
        return dest.is_dir() and git.run(["rev-parse", "--verify", "--quiet", want], cwd=dest).returncode == 0

    if not has_ref():
        if not fetch:
            return f"no copy of {url} in {dest.parent}"
        if say:
            say(f"source '{name}': fetching {url} on this machine into {dest} (once per user)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        r = git.run(["fetch", "--quiet", "origin", "+refs/*:refs/*"], cwd=dest, timeout=MIRROR_TIMEOUT) \
            if dest.is_dir() else _clone_mirror(url, dest)
        if r.returncode != 0:
            return f"fetching {url} here failed ({(r.stderr.strip().splitlines() or [f'exit {r.returncode}'])[-1]})"
        if not has_ref():
            return f"{url} has no commit, branch or tag '{ref}'"
    return resolve(name, f"{dest}@{ref}" if ref else str(dest), where=f"source '{name}' from {dest}")


def _clone_mirror(url: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """``git clone --mirror`` into a temporary folder beside ``dest``, renamed into place only when complete."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=dest.parent))
    try:
        r = git.run(["clone", "--quiet", "--mirror", url, str(tmp / "m.git")], timeout=MIRROR_TIMEOUT)
        if r.returncode == 0:
            (tmp / "m.git").replace(dest)
        return r
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def profile_builds(profile: str | None) -> dict[str, str]:
    """{source_build_name: repo} of a profile's source_build roles (includes too): :func:`profile_build_refs`."""
    return {name: repo for name, (repo, _) in profile_build_refs(profile).items()}


def profile_build_refs(profile: str | None) -> dict[str, tuple[str, str | None]]:
    """{source_build_name: (repo, version)} of a profile's source_build roles (includes too), their templates
    (``source_build_repo: "{{ app_repo }}"``) rendered with the profile's vars and the step's own; a build whose
    name or repo needs what only a host knows (its facts) is left out."""
    if not profile:
        return {}
    plan = load_profile(profile)
    out: dict[str, tuple[str, str | None]] = {}
    for step in plan.steps:
        if step.role != "source_build":
            continue
        context = {**plan.vars, **step.vars}
        name, repo = _rendered(step.vars.get("source_build_name"), context), \
            _rendered(step.vars.get("source_build_repo"), context)
        if name and repo:
            out[name] = (repo, _rendered(step.vars.get("source_build_version"), context))
    return out


def _rendered(value: object, context: dict[str, Any], depth: int = 4) -> str | None:
    """``value`` with its ``{{ }}`` rendered from ``context`` (vars naming vars: ``depth`` rounds); None when it is
    not a string or names what the context lacks."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    text = str(value)
    for _ in range(depth):
        if "{{" not in text and "{%" not in text:
            return text.strip() or None
        try:
            text = render(text, context, shell=False, where="a profile's source_build")
        except UsageError:
            return None
    return None


def setup_vars(overrides: Mapping[str, Override], suite: Suite | None,
               builds: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The set-up's extra vars that carry ``overrides`` to the source_build role:
    ``{"testbed_source_overrides": {build name: override}}``, or {} when no build is overridden.

    An override applies to the profile build of its name, and one of a ``suite``'s sources also to the builds of
    the same repository. ``builds``: the profile's builds (:func:`profile_builds`) when already read, else those
    of the suite's profile.
    """
    if not overrides:
        return {}
    if builds is None:
        builds = profile_builds(suite.profile if suite is not None else None)
    suite_sources = {x.name: x.repo for x in suite.sources} if suite is not None else {}
    out: dict[str, dict[str, Any]] = {}
    for name, o in overrides.items():
        targets = [name] if name in builds else []
        if name in suite_sources:
            key = repo_key(suite_sources[name])
            targets += [b for b, repo in builds.items() if repo_key(repo) == key and b not in targets]
        for b in targets:
            out[b] = {"kind": o.kind, "location": o.location, "ref": o.ref, "commit": o.commit, "bundle": o.bundle}
    return {"testbed_source_overrides": out} if out else {}


def spec_sources(testbed: str | None) -> dict[str, str]:
    """The testbed spec's ``sources:`` (mirrors); {} when there is no testbed or its spec does not load."""
    if not testbed:
        return {}
    import contextlib

    with contextlib.suppress(TestbedError):
        return dict(load_testbed(testbed).sources)
    return {}


def overrides_for(mirrors: dict[str, str], given: dict[str, str] | None, suite_sources: dict[str, str],
                  builds: dict[str, str]) -> dict[str, Override]:
    """``given`` (--source) over a testbed's ``mirrors``, for a suite's sources (name -> repo) and its profile's
    builds, resolved and checked. A mirror for a name this suite lacks is not an error."""
    known = {**{k: f"suite source {v}" for k, v in suite_sources.items()},
             **{k: f"profile build {v}" for k, v in builds.items() if k not in suite_sources}}
    merged = {k: v for k, v in mirrors.items() if k in known}
    merged.update(given or {})
    return resolve_all(merged, known) if merged else {}


def for_suite(suite: Suite, testbed: str | None, given: dict[str, str] | None) -> dict[str, Override]:
    """:func:`overrides_for` a loaded suite; nothing is read beyond the spec when there is nothing to override."""
    mirrors = spec_sources(testbed)
    if not given and not mirrors:
        return {}
    return overrides_for(mirrors, given, {x.name: x.repo for x in suite.sources}, profile_builds(suite.profile))


def resolve_all(given: dict[str, str], known: dict[str, str], *, where: str = "--source") -> dict[str, Override]:
    """Resolve ``given`` (name -> spec); ``known`` maps the names that may be overridden to what they are."""
    import difflib

    out: dict[str, Override] = {}
    for name, spec in given.items():
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            raise UsageError(f"there is no source named '{name}' to override", where=f"{where} {name}=...",
                             fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"sources: {', '.join(sorted(known)) or 'none'}")
        out[name] = resolve(name, spec, where)
    return out


def checkout_command(path_words: str, o: Override, bundle_word: str) -> str:
    """Shell: put the override's commit (from the bundle in the run folder) at ``path_words`` on a host."""
    c = shlex.quote(o.commit or "")
    return (f'tb_b="$(pwd)"/{bundle_word}; if [ -d {path_words}/.git ]; then '
            f'git -C {path_words} fetch --quiet "$tb_b" {BUNDLE_REF}; else '
            f'mkdir -p {path_words} && git clone --quiet --no-checkout "$tb_b" {path_words}; fi '
            f"&& git -C {path_words} -c advice.detachedHead=false checkout --quiet --force {c}")
