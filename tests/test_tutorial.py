"""docs/your-artifact.md, executed: the page is the test's input.

The page is read in order. A ``<!-- file: PATH -->`` line before a fenced block writes that block to PATH in the
working folder; ``<!-- drafted: PATH -->`` checks that ``testbed new`` wrote exactly that block (``quoted``: the
artifact's text, only shown); a ```console block holds one ``$ COMMAND`` line and the output it printed. Each
command runs with bash in a fresh working folder (its own state home, ``testbed`` being this checkout's), on real
local hosts; its exit status must be 0 and every line of the output the page shows must be among the lines it
prints, both sides normalised as the page says (run ids, times, decimal numbers, addresses, byte counts, the
working folder, the width of table rules and spaces).

What the page shows but this test cannot run: ``git clone`` (no network here): the same commit comes from
``../shared/artifacts/minio.tar.gz`` (skipped when absent); its SOURCE file's URL and commit must be the page's and
the suite's. Two changes keep parallel tests apart: the spec's subnet is a free one, and ``testbed rehearse`` gets
``--subnet`` with another. With ``TESTBED_TUTORIAL_WRITE=1`` the test writes the outputs it got into the page
instead of comparing (how the page's outputs were captured).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from artifacts import ARTIFACTS, artifact
from localbed import free_subnet

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "your-artifact.md"
WORK_SHOWN = "~/work"  # how the page shows the working folder
COLUMNS = "160"
pytestmark = pytest.mark.slow


@dataclass
class Block:
    kind: str  # console, file, drafted, text
    body: str
    start: int  # the body's first line index in the page
    end: int  # the index of its closing fence
    path: str = ""
    command: str = ""
    output: list[str] | None = None


_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!-- (file|drafted|quoted): (\S+) -->$")  # quoted: an artifact's text, not run


def blocks(text: str) -> list[Block]:
    """The fenced blocks of the page, each with its kind (from the marker line before it, or its language)."""
    lines, out, i, mark = text.split("\n"), [], 0, None
    while i < len(lines):
        m = _MARK.match(lines[i])
        if m:
            mark = m
            i += 1
            continue
        f = _FENCE.match(lines[i])
        if not f:
            if lines[i].strip():
                mark = None
            i += 1
            continue
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        body = lines[i + 1:j]
        kind = mark.group(1) if mark and mark.group(1) != "quoted" else "console" if f.group(1) == "console" else "text"
        b = Block(kind, "\n".join(body) + "\n", i + 1, j, path=mark.group(2) if mark else "")
        if b.kind == "console":
            assert body and body[0].startswith("$ "), f"docs/your-artifact.md:{i + 2}: a console block opens with '$ '"
            b.command, b.output = body[0][2:], body[1:]
        out.append(b)
        mark = None
        i = j + 1
    return out


_RUN = re.compile(r"\bminio-\d{8}-\d{6}-[0-9a-f]{4}\b")
_NORMALISE = [
    (_RUN, "minio-RUN"),
    (re.compile(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b"), "ADDRESS"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?Z"), "TIME"),
    (re.compile(r"[+-]?\d+\.\d+"), "N"),  # signed too: a difference from a reference changes sign
    # a set-up's row (host, ok, changed, failed, unreachable, skipped, status): ok, changed and skipped depend on
    # what this machine's root already has (local hosts see its files: ~/.ssh, its login shell); the rest is checked
    (re.compile(r"^\s*│\s*(\S+)\s*│\s*\d+\s*│\s*\d+\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*\d+\s*│\s*(\w+)\s*│\s*$"),
     r"│ \1 │ N │ N │ \2 │ \3 │ N │ \4 │"),
    (re.compile(r"\b\d+ B\b"), "N B"),
    (re.compile(r"[━─]+"), "─"),
    (re.compile(r"\s+"), " "),
]


def normalise(line: str, work: Path) -> str:
    line = line.replace(str(work), WORK_SHOWN)
    for pattern, repl in _NORMALISE:
        line = pattern.sub(repl, line)
    return line.strip()


def _shown(line: str, shown_as: dict[str, str]) -> str:
    for ours, shown in shown_as.items():
        line = line.replace(ours, shown)
    return line.rstrip()


def _shim(bin_dir: Path) -> None:
    """``testbed`` on PATH: this checkout's, run by this interpreter."""
    bin_dir.mkdir()
    (bin_dir / "testbed").write_text(f'#!/bin/sh\nexec {sys.executable} -m testbed "$@"\n')
    (bin_dir / "testbed").chmod(0o755)


def test_the_tutorial_runs_as_shown(need_local: None, tmp_path: Path) -> None:
    text = DOC.read_text()
    page = blocks(text)
    write = os.environ.get("TESTBED_TUTORIAL_WRITE") == "1"
    source = (ARTIFACTS / "minio.SOURCE").read_text() if (ARTIFACTS / "minio.SOURCE").is_file() else ""
    url = re.search(r"^upstream: (\S+)", source, re.M)
    commit = re.search(r"^commit: (\S+)", source, re.M)
    clone = next(b.body for b in page if b.kind == "text" and "git clone" in b.body)
    if url and commit:  # the page clones the commit the archive holds, and the suite pins it
        assert f"git clone {url.group(1)}.git" in clone and f"checkout {commit.group(1)}" in clone, clone
        assert any(b.path.endswith("suite.yml") and f"ref: {commit.group(1)}" in b.body
                   for b in page if b.kind == "file"), "the suite's source is not pinned to the archive's commit"

    # a working folder whose path has one length wherever the test runs (xdist's popen-gwN folders are longer):
    # the commands' output wraps at the same places as on the page
    work = Path(tempfile.mkdtemp(prefix="tbtut-", dir="/tmp")) / "work"
    work.mkdir()
    shutil.copytree(artifact("minio"), work / "minio")  # what the page's git clone and checkout make (skips if absent)
    _shim(tmp_path / "bin")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(work / ".testbed"), "COLUMNS": COLUMNS,
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    doc_ids: list[str] = []
    our_ids: list[str] = []
    edits: list[tuple[Block, list[str]]] = []
    shown_as = {str(work): WORK_SHOWN}
    try:
        for b in page:
            if b.kind == "file":
                body = b.body
                if b.path.startswith("inventories/"):
                    shown = re.search(r"subnet: ([0-9.]+)\.0/", body)
                    ours = free_subnet()
                    body = body.replace(f"subnet: {shown.group(1)}.0/24", f"subnet: {ours}") if shown else body
                    if shown:  # a new page shows the page's addresses, not the free subnet taken here
                        shown_as[ours.rsplit(".", 1)[0] + "."] = shown.group(1) + "."
                (work / b.path).parent.mkdir(parents=True, exist_ok=True)
                (work / b.path).write_text(body)
            elif b.kind == "drafted" and write:
                edits.append((b, (work / b.path).read_text().rstrip("\n").split("\n")))
            elif b.kind == "drafted":
                assert (work / b.path).read_text() == b.body, f"testbed new drafted another {b.path}"
            elif b.kind == "console":
                assert b.output is not None
                doc_ids += [i for ln in [b.command, *b.output] for i in _RUN.findall(ln) if i not in doc_ids]
                command = b.command
                for doc_id, ours in zip(doc_ids, our_ids, strict=False):
                    command = command.replace(doc_id, ours)
                if write and our_ids:
                    command = command.replace("minio-RUN", our_ids[-1])  # a new page: the latest run
                run = command + (f" --subnet {free_subnet()}" if command.startswith("testbed rehearse") else "")
                r = subprocess.run(["bash", "-c", run], cwd=work, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
                got = r.stdout.rstrip("\n").split("\n")
                our_ids += [i for ln in got for i in _RUN.findall(ln) if i not in our_ids]
                assert r.returncode == 0, f"$ {run}\nexit {r.returncode}\n{r.stdout[-4000:]}"
                if write:
                    edits.append((b, [f"$ {command}", *(_shown(ln, shown_as) for ln in got)]))
                    continue
                ours_n = {normalise(ln, work) for ln in got}
                missing = [ln for ln in b.output if ln.strip() and normalise(ln, work) not in ours_n]
                assert not missing, (f"docs/your-artifact.md:{b.start + 1}: $ {b.command}\nlines the page shows "
                                     "but the command did not print:\n" + "\n".join(missing)
                                     + "\n--- it printed:\n" + r.stdout[-4000:])
    finally:
        for name in ("box", "rehearse-box"):
            subprocess.run(["bash", "-c", f"testbed destroy {name} --yes"], cwd=work, env=env, capture_output=True,
                           timeout=300, check=False)
        shutil.rmtree(work.parent, ignore_errors=True)
    if write:
        lines = text.split("\n")
        for b, new in reversed(edits):
            lines[b.start:b.end] = new
        DOC.write_text("\n".join(lines))
