"""``testbed new NAME [--from README.md|URL] [--to DIR]``: draft a suite folder from an artifact's README.

The reading is :mod:`testbed.drafting` (pure); here the README is read (a bounded local file, or fetched over
http(s) with a timeout and a size bound) and the folder written. Nothing the README says is executed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from testbed.cli.common import JsonOpt, console, escape, print_json

FETCH_TIMEOUT = 20.0
"""Seconds a README fetched by URL may take in all (connecting and reading, however slowly it trickles)."""
STALL = 5.0
"""Seconds one connect or read may wait for a byte (so the total is kept within one stall of FETCH_TIMEOUT)."""


def fetch(url: str, limit: int, timeout: float = FETCH_TIMEOUT) -> str:
    """The text at an http(s) ``url``, at most ``limit`` bytes of UTF-8; any failure is one UsageError."""
    import time
    import urllib.error
    import urllib.request

    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError

    fix = "check the address (an http:// or https:// URL of the README itself, e.g. GitHub's raw one), or " \
          "download the README and pass its path to --from"
    if not re.match(r"^https?://[^/\s]+", url, re.I):
        raise UsageError(f"--from {url!r}: only http:// and https:// URLs are fetched", where="command line", fix=fix)
    class HttpOnly(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            if not re.match(r"^https?://", newurl, re.I):
                raise urllib.error.URLError(f"redirected to {newurl!r}, which is not http(s)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(HttpOnly)
    deadline = time.monotonic() + timeout
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "testbed-new"})  # noqa: S310 (http(s) only)
        with opener.open(req, timeout=min(timeout, STALL)) as resp:
            body = b""
            while len(body) <= limit:  # a total deadline: a server trickling a byte at a time is cut off too
                if time.monotonic() > deadline:
                    raise UsageError(f"the README at this URL did not arrive within {timeout:g} s ({len(body):,} "
                                     "bytes came)", where=url, fix=fix)
                chunk = resp.read1(min(65536, limit + 1 - len(body)))
                if not chunk:
                    break
                body += chunk
    except urllib.error.HTTPError as e:
        raise UsageError(f"could not fetch the README: HTTP {e.code} {e.reason}", where=url, fix=fix) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise UsageError(f"could not fetch the README: {reason}", where=url, fix=fix) from None
    if len(body) > limit:
        raise UsageError(f"the README at this URL is larger than {limit // 1024} KiB", where=url,
                         fix="pass the README itself, not an archive or a page of another kind") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("the README at this URL is not UTF-8 text", where=url, fix=fix) from None


def _read(source: str | None) -> tuple[str, str, str]:
    """(the README's text, the name its lines are cited by, where it came from) for ``--from``."""
    # lazy: testbed --help and completion load every command module
    from testbed import drafting

    if source is None:
        here = Path("README.md")
        if not here.is_file():
            return "", "README.md", ""
        source = str(here)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", source):
        text = fetch(source, drafting.MAX_README_BYTES)
        name = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "README.md"
        return text, name, source
    path = Path(source).expanduser()
    return read_file(path, drafting.MAX_README_BYTES), path.name, str(path)


def read_file(path: Path, limit: int) -> str:
    """A local README: a regular file of at most ``limit`` bytes of UTF-8 (anything else: one UsageError)."""
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError

    fix = "pass the artifact's README (a Markdown file) to --from, or its http(s) URL"
    if not path.is_file():
        raise UsageError(f"--from {path}: no such file" if not path.exists() else f"--from {path}: not a regular "
                         "file", where=str(path), fix=fix)
    if path.stat().st_size > limit:
        raise UsageError(f"--from {path}: it is {path.stat().st_size:,} bytes; a README is read up to {limit:,}",
                         where=str(path), fix=fix)
    try:
        with path.open("rb") as f:
            return f.read(limit + 1)[:limit].decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--from {path}: it is not UTF-8 text", where=str(path), fix=fix) from None
    except OSError as e:
        raise UsageError(f"--from {path}: cannot read it: {e.strerror}", where=str(path), fix=fix) from None


def _readme(name: str, came_from: str, todos: int) -> str:
    # lazy: testbed --help and completion load every command module
    from testbed.textfmt import plural

    origin = ("with no README (a skeleton)" if not came_from else
              f"from the README at `{came_from}` (the artifact's README, read as untrusted text: nothing in it "
              "was run)")
    return (f"# {name}\n\nA suite drafted by `testbed new {name}` {origin}.\n`suite.yml` holds its guesses, each "
            f"with the README line it came from, and {plural(todos, 'TODO comment')} for what the\nREADME did not "
            f"say.\n\n1. `testbed show {name}` lists the TODOs (\"to fill in\"), with their lines.\n"
            f"2. Fill each in and delete its TODO comment; `expected/` holds the README's expected output, for the "
            f"reference stubs.\n3. `testbed rehearse {name}` rehearses it on local hosts once no TODO is left.\n")


def new(name: Annotated[str, typer.Argument(help="The suite's name: lower-case letters, digits and '-'.")],
        from_: Annotated[str | None, typer.Option("--from", help="The artifact's README: a path, or an http(s) "
                                                                 "URL (default: ./README.md when there is one, "
                                                                 "else a skeleton).")] = None,
        to: Annotated[str, typer.Option("--to", help="The folder that gets the suite's folder NAME/.")
                      ] = "experiments",
        override_shipped: Annotated[bool, typer.Option("--override-shipped", help="Draft NAME even when testbed "
                                                       "ships a suite of that name (yours hides it here).")
                                    ] = False,
        json_out: JsonOpt = False) -> None:
    """Draft a suite folder (TO/NAME/suite.yml, a README.md, expected/) from an artifact's README: its shell
    blocks become sources, environment, prepare steps, the launch and outputs; its expected output reference
    stubs. Each guess says the README line it came from; each gap is a TODO that testbed show lists. A
    destructive or piped-to-shell line (rm -rf ~, dd of=/dev/..., curl ... | sh) is never copied into a step:
    it is a TODO with the reason.

    Refused (exit 2), before anything is written: a NAME that is not a suite name, or is a shipped suite's
    (unless --override-shipped), an existing folder, a README over 1 MiB, not UTF-8 or not found, a URL that is
    not http(s) or cannot be fetched, a draft that testbed show would refuse (too large). The folder appears
    whole or not at all (written under a temporary name, then renamed).

    Example: testbed new myartifact --from https://raw.githubusercontent.com/OWNER/REPO/COMMIT/README.md
    """
    # lazy: testbed --help and completion load every command module
    from testbed import drafting
    from testbed.errors import UsageError
    from testbed.suite import SUITE_NAME_RE
    from testbed.yamlfile import MAX_FILE_BYTES

    if not re.match(SUITE_NAME_RE, name):
        raise UsageError(f"'{name}' is not a suite name", where="command line",
                         fix="use lower-case letters, digits and '-', starting with a letter (at most 41)")
    folder = Path(to).expanduser() / name
    for taken in (folder, folder.with_name(f"{name}.yml"), folder.with_name(f"{name}.yaml")):
        if taken.exists() or taken.is_symlink():
            raise UsageError(f"{taken} already exists: testbed new never writes over a suite", where=str(taken),
                             fix=f"pick another name, or move {taken} away first")
    if not override_shipped:
        _refuse_shipped(name)
    text, cited, came_from = _read(from_)
    d = drafting.draft(text)
    expected = [f"expected/README-{g.line}.txt" for g in d.expected]
    where = came_from or "command line"
    if drafting.least_size(d) > MAX_FILE_BYTES:
        raise _too_big(f"the draft would hold more than {MAX_FILE_BYTES:,} bytes, the most a suite file may",
                       where)
    suite_text = drafting.to_yaml(d, name, cited, expected, came_from=came_from or "no README (a skeleton)")
    todos = drafting.todo_comments(suite_text)
    files = {"suite.yml": suite_text, "README.md": _readme(name, came_from, len(todos)),
             **{rel: g.value + "\n" for g, rel in zip(d.expected, expected, strict=True)}}
    write_folder(folder, files, where)
    shown = name if folder.resolve() == (Path("experiments") / name).resolve() else str(folder / "suite.yml")
    if json_out:
        print_json({"suite": str(folder / "suite.yml"), "todos": [{"line": n, "text": t} for n, t in todos],
                    "sources": len(d.sources), "launch_lines": len(d.launches), "outputs": len(d.outputs)})
        return
    # lazy: testbed --help and completion load every command module
    from testbed.textfmt import plural

    console().print(f"drafted {escape(str(folder / 'suite.yml'))} from {escape(came_from or 'no README')}: "
                    f"{plural(len(d.sources), 'source')}, {plural(len(d.steps), 'prepare step')}, "
                    f"{plural(len(d.launches), 'launch line')}, {plural(len(d.outputs), 'output')}, "
                    f"{plural(len(d.expected), 'reference stub')}; {plural(len(todos), 'TODO')} to fill in "
                    f"(testbed show {escape(shown)})", emoji=False)


def _refuse_shipped(name: str) -> None:
    """Refuse ``name`` when testbed ships a suite of that name: a user's suite of it would hide the shipped one."""
    # lazy: testbed --help and completion load every command module
    from testbed import paths
    from testbed.errors import UsageError

    for root in (paths.PACKAGE_DIR / "_data", paths.PACKAGE_DIR.parent):
        for shipped in (root / "experiments" / name / paths.SUITE_FILE, root / "experiments" / f"{name}.yml"):
            if shipped.is_file():
                raise UsageError(f"'{name}' is the name of a suite testbed ships ({shipped}): a suite of yours "
                                 "named so would hide it wherever yours is found first", where="command line",
                                 fix=f"pick another name (e.g. {name}-mine), or pass --override-shipped to hide "
                                     f"the shipped {name} in this folder on purpose")


def _too_big(what: str, where: str) -> Exception:
    # lazy: testbed --help and completion load every command module
    from testbed.errors import UsageError

    return UsageError(f"{what}: testbed new writes no suite that testbed show would refuse", where=where,
                      fix="draft from the part of the README that sets up and runs the artifact (save it as a "
                          "file and pass it to --from)")


def write_folder(folder: Path, files: dict[str, str], where: str) -> None:
    """Write ``files`` (path relative to ``folder`` -> text) as ``folder``, whole or not at all: into a temporary
    folder beside it, loaded as a suite (as testbed show would), then renamed. A failure (a full disk, a draft the
    loader refuses) removes the temporary folder and leaves nothing under ``folder``."""
    import os
    import shutil
    import tempfile

    # lazy: testbed --help and completion load every command module
    from testbed import suite as suite_mod
    from testbed.errors import TestbedError, UsageError

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    except OSError as e:
        raise UsageError(f"cannot make {folder}: {e.strerror}", where=str(folder),
                         fix="give --to a folder you can write (it is made when missing)") from None
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        try:
            suite_mod.load_suite(str(tmp / "suite.yml"))
        except TestbedError as e:
            raise _too_big(f"the draft would not load ({e.what})", where) from None
        if folder.exists() or folder.is_symlink():
            raise UsageError(f"{folder} appeared while the draft was written: testbed new never writes over a "
                             "suite", where=str(folder), fix=f"pick another name, or move {folder} away first")
        os.rename(tmp, folder)
    except OSError as e:
        raise TestbedError(f"cannot write the draft into {folder.parent}: {e.strerror}", where=str(folder),
                           fix="free some space there (or give --to another folder), then run the same command "
                               "again: nothing was left behind") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def register(app: typer.Typer) -> None:
    """Add ``new`` to ``app``."""
    app.command("new")(new)
