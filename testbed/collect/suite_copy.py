"""The suite a run ran, copied into its results folder at collect time (``<run>/.suite/``), so that
``testbed reproduce`` replays what is inside the run folder and nothing a manifest names outside it.

Collect copies the suite's YAML and its ``files:`` (the workloads, by their path relative to the suite; a suite
folder's into ``.suite/<name>/``) when
each still has the sha256 the run recorded when it was planned, and the run's profile as it is at collect time
(``<run>/.profile/<name>.yml``; profiles are not hashed at plan time). The manifest's ``suite_copy`` records
each copied file by its path inside the run folder and its sha256. A results folder is untrusted input:
:func:`inside` refuses an absolute path, ``..`` or a link leading out of the folder, naming the manifest field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from testbed.errors import UsageError
from testbed.paths import MANIFEST, SUITE_FILE, copy_atomic
from testbed.setup.profiles import available_profiles
from testbed.suite import SUITE_NAME_RE

COPY_DIR = ".suite"
PROFILE_DIR = ".profile"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def sha256(path: Path) -> str:
    """The sha256 of the file at ``path`` (hex)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_suite(info: dict[str, Any], folder: Path, old: object) -> tuple[dict[str, Any] | None, str | None]:
    """(the ``suite_copy`` record, None) or (None, why the suite could not be copied). ``info``: the run's
    RunInfo as JSON; ``old``: the record an earlier collect wrote (kept while its files are whole)."""
    if isinstance(old, dict) and _whole(folder, old):
        return old, None
    src, want = info.get("suite_file"), info.get("suite_sha256")
    if not src or not want:
        return None, "the run recorded no suite file (planned by an older testbed): its suite was not copied"
    src_path = Path(str(src))
    if not src_path.is_file() or sha256(src_path) != want:
        return None, (f"the suite {src_path} changed (or is gone) since the run: not copied into the run folder; "
                      "testbed reproduce will need --suite")
    base = _copy_base(src_path, info.get("suite"))
    pairs = [(src_path, f"{base}/{src_path.name}")]
    for rel, sha in sorted((info.get("suite_files") or {}).items()):
        p = src_path.parent / rel
        if not p.is_file() or sha256(p) != sha:
            return None, f"the suite's file {p} changed (or is gone) since the run: the suite was not copied"
        pairs.append((p, f"{base}/{os.path.normpath(rel)}"))
    rec: dict[str, Any] = {"path": pairs[0][1], "sha256": want, "files": {}}
    try:  # each file whole or not at all: a full disk leaves no empty copy under a copied file's name
        for p, dest in pairs:
            target = folder / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            got = copy_atomic(p, target)
            if dest != rec["path"]:
                rec["files"][dest] = got
        profile = _copy_profile(info.get("profile"), folder)
    except OSError as exc:
        return None, (f"the suite was not copied into the run folder {folder}: {exc.strerror or exc} (is its disk "
                      "full?); the run's files are collected, testbed reproduce will need --suite")
    if profile:
        rec["profile"] = profile
    return rec, None


def _copy_base(src: Path, name: object) -> str:
    """Where a suite's copy lives in the run folder: ``.suite/`` for a single file, ``.suite/<name>/`` for a
    folder's ``suite.yml`` (so the copy reads back under the suite's name, as the folder gave it)."""
    if src.name != SUITE_FILE:
        return COPY_DIR
    own = name if isinstance(name, str) and re.match(SUITE_NAME_RE, name) else src.parent.name
    return f"{COPY_DIR}/{own}" if re.match(SUITE_NAME_RE, own) else COPY_DIR


def _copy_profile(name: object, folder: Path) -> dict[str, Any] | None:
    """The run's profile file copied as it is now (profiles are not hashed when a run is planned)."""
    path = available_profiles().get(str(name)) if name else None
    if path is None or not path.is_file():
        return None
    dest = f"{PROFILE_DIR}/{name}.yml"  # a suite folder's profile.yml goes by its profile's name
    (folder / PROFILE_DIR).mkdir(exist_ok=True)
    return {"name": str(name), "path": dest, "sha256": copy_atomic(path, folder / dest), "copied": "at collect"}


def _whole(folder: Path, rec: dict[str, Any]) -> bool:
    """Whether every file ``rec`` lists is in ``folder`` with its sha256."""
    try:
        files = {rec["path"]: rec["sha256"], **rec.get("files", {})}
        if isinstance(rec.get("profile"), dict):
            files[rec["profile"]["path"]] = rec["profile"]["sha256"]
        return all((folder / p).is_file() and sha256(folder / p) == s for p, s in files.items())
    except (KeyError, TypeError, AttributeError, OSError):
        return False


def inside(run_dir: Path, value: object, field: str) -> Path:
    """``value`` (a path a manifest holds) as a file inside ``run_dir``; refused (UsageError naming ``field``)
    when it is not a relative path, holds ``..``, or leads out of the folder through a link."""
    where = f"{run_dir / MANIFEST}: {field}"
    fix = ("a results folder never makes reproduce run files outside it: collect the run again with this "
           "testbed, or name the suite yourself with --suite PATH")
    if not isinstance(value, str) or not value or "\x00" in value:
        raise UsageError(f"{field} is not a path ({value!r})", where=where, fix=fix)
    pure = PurePosixPath(value)
    if pure.is_absolute() or value.startswith("~"):
        raise UsageError(f"{field} is an absolute path ({value}): only a path inside the run folder is followed",
                         where=where, fix=fix)
    if ".." in pure.parts:
        raise UsageError(f"{field} leads out of the run folder ({value}: '..')", where=where, fix=fix)
    root = run_dir.resolve()
    p = (run_dir / value).resolve()
    if not p.is_relative_to(root):
        raise UsageError(f"{field} ({value}) is a link leading out of the run folder, to {p}", where=where,
                         fix=fix)
    if not p.is_file():
        raise UsageError(f"{field}: {value} is not in the run folder", where=where, fix=fix)
    return run_dir / value


def verified(run_dir: Path, rec: object) -> tuple[Path, dict[str, Path]]:
    """The copied suite's YAML and the other copied files (record path -> path), each inside ``run_dir`` with
    the sha256 the manifest records; one UsageError naming the first that is not."""
    where = str(run_dir / MANIFEST)
    if not isinstance(rec, dict) or not isinstance(rec.get("files", {}), dict):
        raise UsageError("suite_copy is not a record of copied files", where=f"{where}: suite_copy",
                         fix="collect the run again, or name the suite with --suite PATH")
    out: dict[str, Path] = {}
    pairs = [("suite_copy.path", rec.get("path"), rec.get("sha256"))]
    pairs += [(f"suite_copy.files[{k!r}]", k, v) for k, v in rec.get("files", {}).items()]
    prof = rec.get("profile")
    if isinstance(prof, dict):
        pairs.append(("suite_copy.profile.path", prof.get("path"), prof.get("sha256")))
    for field, value, want in pairs:
        p = inside(run_dir, value, field)
        if not isinstance(want, str) or not _HEX64.match(want) or sha256(p) != want:
            raise UsageError(f"{field}: {value} does not have the sha256 the manifest records (changed since "
                             "collect, or the record is forged)", where=f"{where}: {field}",
                             fix="collect the run again, or name the suite with --suite PATH")
        out[str(value)] = p
    if not str(rec["path"]).startswith(f"{COPY_DIR}/") or not str(rec["path"]).endswith((".yml", ".yaml")):
        raise UsageError(f"suite_copy.path ({rec['path']}) is not a suite under {COPY_DIR}/",
                         where=f"{where}: suite_copy.path", fix="collect the run again, or use --suite PATH")
    return out.pop(str(rec["path"])), out
