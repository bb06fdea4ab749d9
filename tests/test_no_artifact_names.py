"""The package holds no artifact-specific code: no suite's or artifact's name appears anywhere under ``testbed/``
(code, docstrings, help text, shipped scripts and data alike). The names are derived from what the repository
ships, never hand-listed, so a new suite or inventory is covered the day it lands:

- every suite's name (``experiments/<name>/`` or ``experiments/<name>.yml``) and the stems of the files it
  ships (``files:``);
- each suite's ``sources:`` (the source's name, its repo's and its checkout path's last part) and the
  ``owner/repo`` its leading comment names the artifact by;
- each suite profile's source builds (``source_build_name``) and every git repository URL it names (the last
  part);
- the inventories made for an artifact (whose ``profile:`` is a suite's own): their names, their hosts' names
  and the first label of every address they name.

Matching is case-insensitive on whole words (a letter or digit on either side is no match: ``discard`` holds no
``isca``); ``-``, ``_`` and ``.`` inside a name match any of them or none (``mpi-hello`` finds ``mpi_hello``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

# Words a derivation yields that are no artifact's: generic names a suite may give a source or an inventory.
GENERIC = frozenset({
    "src",  # a source checked out to ~/src
    "tpu",  # inventories/tpu.yml: named for the accelerator, not for the artifact it serves
})

# a repository's URL on a git host (https or ssh): group 1 is the repository's name
_GIT_URL = re.compile(r"(?:https?://(?:github|gitlab|bitbucket)\.(?:com|org)/|git@[\w.-]+:)[\w.-]+/([\w.-]+?)"
                      r"(?:\.git)?(?![\w.-])")
_OWNER_REPO = re.compile(r"\A#\s*[\w.-]+/([\w.-]+)")
_ENV_DEFAULT = re.compile(r"\$\{\w+:-([^}]*)\}")


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else {}


def _last(text: str) -> str:
    """The last part of a path or URL, without ``.git``: ``~/src/open-jitc`` -> ``open-jitc``."""
    return re.sub(r"\.git$", "", str(text).rstrip("/").rsplit("/", 1)[-1])


def _suite_names(suite: Path) -> Iterator[str]:
    """A suite's names: ``suite`` is a folder's ``suite.yml`` (its ``profile.yml`` beside it) or a single file."""
    folder = suite.name == "suite.yml"
    profile = suite.parent / "profile.yml" if folder else suite.with_suffix(".none")
    yield suite.parent.name if folder else suite.stem
    data = _load(suite)
    for f in data.get("files") or []:
        yield Path(str(f)).stem
    for src in data.get("sources") or []:
        for key in ("name", "repo", "path"):
            if src.get(key):
                yield _last(src[key])
    if m := _OWNER_REPO.match(suite.read_text()):
        yield m.group(1)
    text = profile.read_text() if profile.is_file() else ""
    yield from (m.group(1) for m in _GIT_URL.finditer(text))
    yield from re.findall(r"^\s*source_build_name:\s*[\"']?([\w.-]+)[\"']?\s*$", text, re.M)


def _inventory_names(path: Path, suites: set[str]) -> Iterator[str]:
    """An artifact's inventory (its profile is a suite's own): its name, its hosts and its addresses' hosts."""
    from testbed.providers import PROVIDERS

    data = _load(path)
    if data.get("profile") not in suites:
        return
    if path.stem not in PROVIDERS:
        yield path.stem
    text = _ENV_DEFAULT.sub(r"\1", path.read_text())
    yield from re.findall(r"\bname:\s*([\w.-]+)", text)
    yield from (a.split(".")[0] for a in re.findall(r"\baddress:\s*([\w.-]+)", text))


def artifact_names(root: Path = ROOT) -> set[str]:
    """Every suite and artifact name the repository under ``root`` ships, less the generic words."""
    exp = root / "experiments"
    names = {n for s in sorted([*exp.glob("*/suite.yml"), *exp.glob("*.yml")]) for n in _suite_names(s)}
    suites = {p.parent.name for p in exp.glob("*/profile.yml") if (p.parent / "suite.yml").is_file()}
    for inv in sorted((root / "inventories").glob("*.yml")):
        names |= set(_inventory_names(inv, suites))
    return {n for n in names if n and "{" not in n and n.lower() not in GENERIC}


def _pattern(names: set[str]) -> re.Pattern[str]:
    alts = sorted(("[-_.]?".join(re.escape(p) for p in re.split(r"[-_.]", n) if p) for n in names),
                  key=len, reverse=True)
    return re.compile(rf"(?<![a-z0-9])(?:{'|'.join(alts)})(?![a-z0-9])", re.I)


def hits(package: Path, names: set[str]) -> list[str]:
    """``file:line: name in the line`` for every line under ``package`` naming one of ``names``."""
    pat, found = _pattern(names), []
    for p in sorted(package.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        try:
            lines = p.read_text().splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{p.relative_to(package.parent)}:{i}: {m.group(0)!r} in {ln.strip()[:120]}"
                  for i, ln in enumerate(lines, 1) if (m := pat.search(ln))]
    return found


def test_the_names_are_derived_from_the_suites_and_inventories() -> None:
    """The derivation finds what each kind of place holds (a folder, a source, a leading comment, a profile's
    build, a git URL, an inventory and its hosts), so an empty list cannot pass the scan below."""
    names = {n.lower() for n in artifact_names()}
    assert {"mpi-hello", "fault-drill", "tesla", "jitc", "open-jitc", "scalable_vit_dt", "isca_ae",
            "osre_deliverable", "neuronabox", "gpufs", "mlock", "minio", "ecetesla3", "matmul"} <= names
    assert not names & GENERIC and "local" not in names and "base" not in names


def test_the_scan_matches_whole_words_and_any_separator(tmp_path: Path) -> None:
    pkg = tmp_path / "testbed"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1  # discard it\nctx['mpi_hello']\n")
    (pkg / "b.sh").write_text("echo JITC\nfoo-jitcx\n")
    assert hits(pkg, {"isca", "mpi-hello", "jitc"}) == [
        "testbed/a.py:2: 'mpi_hello' in ctx['mpi_hello']", "testbed/b.sh:1: 'JITC' in echo JITC"]


def test_no_suite_or_artifact_name_in_the_package() -> None:
    found = hits(ROOT / "testbed", artifact_names())
    assert not found, "artifact-specific names in the package (use a generic example or derive it):\n" + \
        "\n".join(found)
