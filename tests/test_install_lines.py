"""Every install line a user can copy works as written today: in README.md, docs/*.md and the example notebooks,
each pip or pipx command names this project by a path (a checkout, a wheel file) or a git URL, with extras the
project has; the PyPI name only under a "once released" marker (it is not published yet); pipx is told how to add
an extra (``pipx install --force``: a plain second ``pipx install`` says "already installed" and adds nothing), and
never ``pipx inject`` of the project itself. Fast: reads the files, installs nothing (tests/test_wheel.py installs)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST, EXTRAS = PROJECT["name"], set(PROJECT["optional-dependencies"])
COMMAND = re.compile(r"(?<![\w-])%?(?:pip3?|pipx|python3? -m pip) (install|inject)\b")
VALUED = {"-r", "--requirement", "-c", "--constraint", "-t", "--target", "-i", "--index-url", "--extra-index-url",
          "-f", "--find-links", "--python", "--suffix"}
RELEASED = re.compile(r"once released", re.I)
# a fenced block a page marks as an artifact's own text (its README quoted, the draft testbed new made of it): its
# pip lines install that artifact, not this project (docs/your-artifact.md)
QUOTED = re.compile(r"^<!-- (?:quoted|drafted): \S+ -->\n```\w*\n.*?^```$", re.S | re.M)


def without_quoted(text: str) -> str:
    """``text`` with each block marked as an artifact's own blanked (its lines kept, empty, so numbers hold)."""
    return QUOTED.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def pages() -> dict[str, str]:
    """Each page a user reads install lines from, as one text (a notebook: its cells, each a paragraph)."""
    out = {"README.md": (ROOT / "README.md").read_text()}
    out |= {str(p.relative_to(ROOT)): without_quoted(p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))}
    for nb in sorted((ROOT / "examples").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out[str(nb.relative_to(ROOT))] = "\n\n".join("".join(c["source"]) for c in cells)
    return out


def install_lines(text: str) -> list[tuple[str, list[str], str]]:
    """(the command as written, its requirements, the paragraph's text before it) for each pip/pipx command: its
    words end at a shell comment, a parenthesis, or the end of a code span, clause or sentence."""
    out = []
    for m in COMMAND.finditer(text):
        words: list[str] = []
        for raw in text[m.end():].split():
            if raw.startswith(("(", "#")):
                break
            tok, closes = raw, False
            while len(tok) > 1 and tok[-1] in "`,;:).":
                closes = True
                tok = tok[:-1]
            words.append(tok.lstrip("`"))
            if closes or raw.endswith("`"):
                break
        cmd = " ".join([m.group(0), *words])
        reqs, skip = [], False
        for w in shlex.split(" ".join(words)):
            if skip:
                skip = False
            elif w in VALUED:
                skip = True
            elif not w.startswith("-"):
                reqs.append(w)
        before = text[:m.start()].rsplit("\n\n", 1)[-1]
        out.append((cmd, reqs, before))
    return out


def why_not(cmd: str, reqs: list[str], before: str) -> str | None:
    """Why this command does not work as written today (None: it does)."""
    if not reqs:
        return "names nothing to install"
    for r in reqs:
        base, extras = re.fullmatch(r"([^\[]*)(?:\[([^\]]*)\])?.*", r).groups()  # type: ignore[union-attr]
        wanted = {e.strip() for e in (extras or "").split(",") if e.strip()}
        if wanted - EXTRAS:
            return f"{r}: no extra {sorted(wanted - EXTRAS)} (the project has {sorted(EXTRAS)})"
        if base.startswith((".", "/", "~")) or base.endswith(".whl") or "git+" in r:
            continue  # a checkout, a wheel file or a git URL: installable today
        if base.lower().replace("_", "-") == DIST:
            if " inject" in cmd:
                return "pipx inject adds packages to a venv, not an extra: pipx install --force '.[EXTRA]'"
            if not RELEASED.search(before[-200:]):
                return f"the PyPI name {DIST} outside a 'once released' marker (it is not on PyPI yet)"
            continue
        return f"{r} is not this project"
    return None


def test_every_install_line_works_as_written() -> None:
    found = {(page, cmd): why for page, text in pages().items() for cmd, reqs, before in install_lines(text)
             if (why := why_not(cmd, reqs, before))}
    assert not found, "\n".join(f"{page}: {cmd}: {why}" for (page, cmd), why in found.items())


def test_the_pages_say_how_to_install_and_how_a_pipx_user_adds_an_extra() -> None:
    every = {page: install_lines(text) for page, text in pages().items()}
    for page in ("README.md", "docs/api.md", "docs/providers.md", "examples/local.ipynb", "examples/chameleon.ipynb"):
        assert every[page], f"{page} gives no install line"
        assert any(not why_not(c, r, b) and not any(x.startswith(DIST) for x in r) for c, r, b in every[page]), \
            f"{page}: no install line that works before the release"
    pipx = [c for lines in every.values() for c, r, _ in lines if c.startswith("pipx install") and "[" in " ".join(r)]
    assert pipx and all("--force" in c for c in pipx), pipx  # a second plain `pipx install` adds no extra


def test_the_scan_finds_what_is_wrong() -> None:
    """The checks above can fail: each kind of wrong line is caught, each right one passes."""
    def check(text: str) -> list[str | None]:
        return [why_not(c, r, b) for c, r, b in install_lines(text)]

    assert check(f"Install: `pip install {DIST}` for the command.") == [
        f"the PyPI name {DIST} outside a 'once released' marker (it is not on PyPI yet)"]
    assert check(f"once released: `pip install '{DIST}[tpu]'`") == [None]
    assert check(f"`pipx inject {DIST} python-chi`")[0].startswith("pipx inject")  # type: ignore[union-attr]
    assert check("`pip install '.[nosuch]'`")[0].startswith(".[nosuch]: no extra")  # type: ignore[union-attr]
    assert check("`pip install testbed`") == ["testbed is not this project"]
    assert check("pipx install .            # from this checkout") == [None]
    assert check("`%pip install ..` in a cell; `pip install dist/testbed_artifacts-0.1.0-py3-none-any.whl`") == \
        [None, None]
    assert check(f"`pip install '{DIST}[chameleon] @ git+https://example.org/testbed.git'`") == [None]


# the install command every message gives (testbed.distribution.install_command) names where testbed came from ------
class _Dist:
    def __init__(self, direct_url: dict[str, object] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        return json.dumps(self.direct_url) if name == "direct_url.json" and self.direct_url else None


def _installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, object] | None) -> None:
    """testbed as an install leaves it: its modules in site-packages (no checkout around them), the distribution's
    metadata recording ``direct_url`` (PEP 610; None: installed from an index)."""
    import importlib.metadata

    from testbed import distribution

    site = tmp_path / "site-packages" / "testbed"
    site.mkdir(parents=True)
    monkeypatch.setattr(distribution, "__file__", str(site / "distribution.py"))
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _Dist(direct_url))


def test_install_command_names_the_checkout_it_runs_from() -> None:
    from testbed.distribution import install_command, origin

    assert origin() == str(ROOT)
    assert install_command("tpu", pipx=False) == f"pip install '{ROOT}[tpu]'"
    assert install_command("chameleon", pipx=True) == f"pipx install --force '{ROOT}[chameleon]'"
    assert install_command(upgrade=True, pipx=False) == f"pip install -U {ROOT}"


def test_install_command_names_the_wheel_or_git_url_it_was_installed_from(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.distribution import install_command

    whl = tmp_path / "dist" / "testbed_artifacts-0.1.0-py3-none-any.whl"
    whl.parent.mkdir()
    whl.write_bytes(b"PK")
    _installed(tmp_path, monkeypatch, {"url": whl.as_uri(), "archive_info": {}})
    assert install_command("tpu", pipx=False) == f"pip install '{whl}[tpu]'"
    _installed(tmp_path / "b", monkeypatch, {"url": "https://example.org/me/testbed.git",
                                             "vcs_info": {"vcs": "git", "commit_id": "ab" * 20,
                                                          "requested_revision": "main"}})
    assert install_command("chameleon", pipx=False) == \
        f"pip install '{DIST}[chameleon] @ git+https://example.org/me/testbed.git@main'"
    _installed(tmp_path / "c", monkeypatch, None)  # from an index (once released): the name there
    assert install_command("tpu", pipx=False) == f"pip install '{DIST}[tpu]'"
    gone = tmp_path / "gone.whl"  # a wheel file deleted since: no path that fails; the name
    _installed(tmp_path / "d", monkeypatch, {"url": gone.as_uri(), "archive_info": {}})
    assert install_command(pipx=False) == f"pip install {DIST}"
