"""The bad-input corpus (tests/bad_inputs/): every file is one thing a user gets wrong.

Each must give ONE clear message through the CLI -- exit code 1 or 2, an ``error:`` line with a ``where:`` and
a ``fix:`` line, the expected fragments, no traceback -- and touch no host: no network namespace appears and
state records nothing (unless the case says ``# touches: state``).

File format (data-driven; the first line holds what the message must contain)::

    # expect: fragment one && fragment two      (case-insensitive, whitespace-normalised)
    # cmd: exec {name} -- true                  (optional; default 'provision {name}' for .yml files)
    # unset: VAR GLOB_*                         (optional; environment variables removed)
    # set: VAR=value VAR2=value                 ({tmp} is the case's working directory, {newline} a line
                                                 break; a TESTBED_HOME set here replaces the case's own)
    # code: 1                                   (optional; default: 2, bad input)
    # touches: state                            (optional; the command may record the testbed)
    # install: experiments                      (optional; where the .yml goes, default inventories;
                                                 playbooks/profiles for a profile)
    # xfail: reason                             (optional; a known bug, strict: fixing it flips the test)

``*.yml`` files are installed as ``inventories/<stem>.yml`` (or ``experiments/``, ``playbooks/profiles/``) of an
empty working directory; ``*.args`` files hold the command line (shell words) on their first non-comment line.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "bad_inputs"
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Case:
    path: Path
    expect: list[str]
    argv: list[str]
    unset: list[str] = field(default_factory=list)
    set: dict[str, str] = field(default_factory=dict)
    code: int = 2
    touches_state: bool = False
    install: str = "inventories"
    xfail: str | None = None


def parse_case(path: Path) -> Case:
    """Read the header comments (and, for .args, the command line) of one corpus file."""
    lines = path.read_text().splitlines()
    m = re.match(r"#\s*expect:\s*(.+)$", lines[0])
    assert m, f"{path.name}: the first line must be '# expect: <fragment>'"
    expect = [f.strip() for f in m.group(1).split("&&") if f.strip()]
    meta: dict[str, str] = {}
    for ln in lines[1:]:
        mm = re.match(r"#\s*(cmd|unset|set|code|touches|install|xfail):\s*(.*)$", ln)
        if mm:
            meta[mm.group(1)] = mm.group(2).strip()
    if path.suffix == ".args":
        argv = shlex.split(next(ln for ln in lines if ln.strip() and not ln.startswith("#")))
    else:
        argv = shlex.split(meta.get("cmd", "provision {name}").replace("{name}", path.stem))
    sets = dict(kv.split("=", 1) for kv in shlex.split(meta.get("set", "")))
    return Case(path, expect, argv, meta.get("unset", "").split(), sets, int(meta.get("code", "2")),
                meta.get("touches") == "state", meta.get("install", "inventories"), meta.get("xfail"))


CASES = sorted(p for p in CORPUS.iterdir() if p.suffix in (".yml", ".args"))
PARAMS = [pytest.param(p, id=p.name, marks=[pytest.mark.xfail(strict=True, reason=x)] if (x := parse_case(p).xfail)
                       else []) for p in CASES]


def _kernel_objects(home: Path, testbed: str) -> list[str]:
    """Network namespaces and links the local provider would create for ``testbed`` under ``home``.

    Named by the provider's tag (a hash of the testbed's state directory), so tests running concurrently
    with other local testbeds do not disturb the check.
    """
    tag = hashlib.sha256(str((home / "testbeds" / testbed).absolute()).encode()).hexdigest()[:6]
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    return [w for w in (ns + " " + links).replace(":", " ").replace("@", " ").split() if w.startswith(f"tb{tag}")]


def _recorded(home: Path) -> list[tuple[str, ...]]:
    db = home / "state.db"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        rows = [("testbed", *map(str, r)) for r in con.execute("SELECT name, status FROM testbeds")]
        rows += [("resource", *map(str, r)) for r in con.execute("SELECT testbed, kind, id FROM resources")]
        rows += [("host", *map(str, r)) for r in con.execute("SELECT testbed, name FROM hosts")]
        return rows
    finally:
        con.close()


def _prepare(case: Case, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Working directory with the case's inventory, isolated TESTBED_HOME and the case's environment."""
    for d in ("inventories", "experiments"):
        (tmp / d).mkdir()
    if case.path.suffix == ".yml":
        (tmp / case.install).mkdir(parents=True, exist_ok=True)
        (tmp / case.install / case.path.name).write_text(case.path.read_text())
    env = dict(os.environ)
    for pat in case.unset:
        for k in list(env):
            if fnmatch.fnmatchcase(k, pat):
                env.pop(k)
                monkeypatch.delenv(k, raising=False)
    for k, v in {"TESTBED_HOME": str(tmp / ".testbed"), "COLUMNS": "400", "TERM": "dumb"}.items():
        env[k] = v
        monkeypatch.setenv(k, v)
    for k, v in case.set.items():
        v = v.replace("{tmp}", str(tmp)).replace("{newline}", "\n")
        env[k] = v
        monkeypatch.setenv(k, v)
    env.pop("TESTBED_DEBUG", None)
    monkeypatch.delenv("TESTBED_DEBUG", raising=False)
    monkeypatch.chdir(tmp)
    return env


def run_main(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``testbed <argv>`` in this process through ``cli.main()`` (what the console script runs)."""
    from testbed import cli
    from testbed.cli import typer_app

    monkeypatch.setattr(sys, "argv", ["testbed", *argv])
    monkeypatch.setattr(typer_app, "tracebacks", False)
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out + out.err


def _cleanup(home: Path, testbed: str, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> None:
    """Should a case wrongly succeed in provisioning a local testbed, destroy it."""
    if _kernel_objects(home, testbed):
        with contextlib.suppress(BaseException):
            run_main(["destroy", testbed, "--yes"], monkeypatch, capsys)


def check_message(case: Case, code: int, out: str) -> None:
    flat = " ".join(out.split())
    assert "Traceback" not in out, out
    assert "internal error" not in out, out
    assert code == case.code, f"exit {code}, expected {case.code}:\n{out}"
    assert re.search(r"(?m)^error: ", out), out
    assert re.search(r"(?m)^\s+where: \S", out), out
    assert re.search(r"(?m)^\s+fix: +\S", out), out
    for frag in case.expect:
        assert " ".join(frag.split()).lower() in flat.lower(), f"missing {frag!r} in:\n{out}"
    assert out.count("error:") == 1, out


def test_corpus_is_big_enough() -> None:
    assert len(CASES) >= 40
    for p in CASES:
        parse_case(p)  # every header parses


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PARAMS)
def test_bad_input(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    case = parse_case(path)
    _prepare(case, tmp_path, monkeypatch)
    home = tmp_path / ".testbed"
    try:
        code, out = run_main(case.argv, monkeypatch, capsys)
    finally:
        _cleanup(home, path.stem, monkeypatch, capsys)
    check_message(case, code, out)
    assert _kernel_objects(home, path.stem) == [], "the local provider created namespaces or links"
    if not case.touches_state:
        assert _recorded(tmp_path / ".testbed") == [], "state recorded something for a refused input"
    assert not Path("/tmp/tb-pwned").exists()


# The real entry point (console script in a fresh process) for a sample of the corpus.
SAMPLE = ["yaml-tab.yml", "unknown-local-key.yml", "env-missing-user.yml", "meta-user.yml",
          "cli-meta-testbed-name.args", "cli-exec-unprovisioned.args"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", SAMPLE)
def test_bad_input_subprocess(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = parse_case(CORPUS / name)
    env = _prepare(case, tmp_path, monkeypatch)
    r = subprocess.run([sys.executable, "-m", "testbed", *case.argv], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=50, check=False)
    assert r.stdout.strip() == "" or "error:" not in r.stdout, "errors go to stderr"
    check_message(case, r.returncode, r.stderr)


# Usage errors caught by Typer itself (missing argument, option of the wrong type, unknown command):
# exit 2 and a message naming the problem, never a traceback.
USAGE = [
    (["exec", "local", "--timeout", "abc", "--", "true"], "--timeout"),
    (["provision"], "Missing argument"),
    (["no-such-command"], "No such command"),
    (["status", "--no-such-option"], "No such option"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "frag"), USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(argv: list[str], frag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    case = Case(tmp_path / "x.args", [frag], argv)
    _prepare(case, tmp_path, monkeypatch)
    code, out = run_main(argv, monkeypatch, capsys)
    assert code == 2, out
    assert "Traceback" not in out
    assert frag.lower() in " ".join(out.split()).lower(), out
    assert _recorded(tmp_path / ".testbed") == []


# Host names on a testbed state records (the corpus's working folders have none): a name that is no host of it,
# or an empty one, is refused with the closest name before any host is reached.
RECORDED = [
    (["exec", "lab1", "--hosts", "alpha,betta", "--", "true"], ["no host or group matches 'betta'",
                                                                "did you mean 'beta'"]),
    (["exec", "lab1", "-H", "workrs", "--", "true"], ["no host or group matches 'workrs'", "did you mean 'workers'"]),
    (["ssh", "lab1", "alpah"], ["no host 'alpah' in testbed 'lab1'", "did you mean 'alpha'"]),
    (["ssh", "lab1", ""], ["the host name is empty"]),
    (["forget-host", "lab1", "betta"], ["no host 'betta' in testbed 'lab1'", "did you mean 'beta'"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "frags"), RECORDED, ids=[" ".join(a) for a, _ in RECORDED])
def test_unknown_host_on_a_recorded_testbed(argv: list[str], frags: list[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from testbed import remote
    from testbed.hosts import Host
    from testbed.state import Store

    _prepare(Case(tmp_path / "x.args", frags, argv), tmp_path, monkeypatch)
    (tmp_path / "inventories" / "lab1.yml").write_text(
        "provider:\n  kind: lab\n  hosts:\n    - {name: alpha, address: 127.0.0.1, port: 9}\n"
        "    - {name: beta, address: 127.0.0.2, port: 9}\n")
    st = Store(tmp_path / ".testbed" / "state.db")
    st.upsert_testbed("lab1", "lab", None, "up", {})
    st.set_hosts("lab1", [Host(name="alpha", address="127.0.0.1", port=9, groups=["master"]),
                          Host(name="beta", address="127.0.0.2", port=9, groups=["workers"])])
    st.close()

    def touched(*a: object, **k: object) -> None:
        raise AssertionError("a host was reached for a refused input")

    monkeypatch.setattr(remote, "run", touched)
    monkeypatch.setattr(remote, "interactive", touched)
    code, out = run_main(argv, monkeypatch, capsys)
    check_message(Case(tmp_path / "x.args", frags, argv), code, out)
