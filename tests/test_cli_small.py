"""The small things users trip on (issue 32, item 7): --version; --json honoured by every command that has it;
help text that is plain prose at 80 and 120 columns; run ids never broken in tables; counts that agree with their
nouns; times as ISO 8601 (UTC, Z); a dry run that the real run would refuse says so and exits 2."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (80, 120)


def cli(tb_home: Path, *argv: str, columns: int = 100, **env: str) -> subprocess.CompletedProcess[str]:
    """The real command line (the console script's ``main``: the one Typer app, one-message errors)."""
    return subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=tb_home, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tb_home / ".testbed"),
                               "COLUMNS": str(columns), "XDG_CACHE_HOME": str(tb_home / "cache"), **env})


def invoke(argv: list[str], columns: int = 100) -> Any:
    from testbed.cli.typer_app import app

    return CliRunner().invoke(app, argv, env={"COLUMNS": str(columns)}, prog_name="testbed")


# --- --version -----------------------------------------------------------------------------------------------------
def test_version_is_the_installed_distributions(tb_home: Path) -> None:
    from importlib import metadata

    dist = next(d for d in metadata.distributions()
                if any(ep.group == "console_scripts" and ep.value == "testbed.cli:main" for ep in d.entry_points))
    for argv in (["--version"], ["--debug", "--version"]):  # Typer's eager option, alone or after another
        r = cli(tb_home, *argv)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[0].split(" (")[0] == f"testbed {dist.version}", r.stdout
    assert "--version" in invoke(["--help"]).stdout


# --- --json everywhere ---------------------------------------------------------------------------------------------
def _tree() -> dict[tuple[str, ...], Any]:
    """Every command of the app by its path (``("list", "suites")``)."""
    from typer.main import get_command

    from testbed.cli.typer_app import app

    out: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        out[path] = cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(get_command(app), ())
    return out


def _with_json() -> set[tuple[str, ...]]:
    return {p for p, c in _tree().items() if any("--json" in getattr(x, "opts", []) for x in c.params)}


# commands that need provisioned hosts: their --json is exercised on local hosts by these tests
ON_HOSTS = {("provision",): "test_lab_provider.py", ("exec",): "test_lab_provider.py",
            ("setup",): "test_setup_skip.py", ("rehearse",): "test_rehearse.py", ("reproduce",): "test_reproduce.py",
            ("image", "bake"): "test_images.py"}


def _a_run(root: Path) -> Path:
    run = root / "results" / "demo" / "demo-1"
    (run / "node0").mkdir(parents=True)
    (run / "node0" / "rank0.out").write_text("hi\n")
    (run / "manifest.json").write_text(json.dumps({"run_id": "demo-1", "suite": "demo", "status": "succeeded"}))
    return run


@pytest.mark.slow
def test_every_command_with_json_prints_json(tb_home: Path) -> None:
    run = _a_run(tb_home)
    forms: dict[tuple[str, ...], list[list[str]]] = {
        ("list",): [["list", "--json"]],
        ("list", "testbeds"): [["list", "testbeds", "--json"], ["list", "--json", "testbeds"]],
        ("list", "profiles"): [["list", "profiles", "--json"], ["list", "--json", "profiles"]],
        ("list", "runs"): [["list", "runs", "--json"], ["list", "--json", "runs"]],
        ("list", "suites"): [["list", "suites", "--json"], ["list", "--json", "suites"]],
        ("status",): [["status", "--json"], ["--debug", "status", "--json"]],
        ("show",): [["show", "mpi-hello", "--json"]],
        ("run",): [["run", "mpi-hello", "--on", "local", "--dry-run", "--json"],
                   ["run", "matmul-baseline", "--on", "local", "--matrix", "--dry-run", "--json"]],
        ("plan",): [["plan", "matmul-baseline", "--matrix", "--on", "local", "--json"]],
        ("doctor",): [["doctor", "--json"]],
        ("check",): [["check", "local", "--json"]],
        ("report",): [["report", str(run), "--json"]],
        ("collect",): [["collect", "--all", "--json"]],
        ("image", "list"): [["image", "list", "--json"]],
        ("image", "prune"): [["image", "prune", "--yes", "--json"]],
        ("new",): [["new", "drafted", "--json"]],  # no README.md here: a skeleton
    }
    assert _with_json() == set(forms) | set(ON_HOSTS), "a command with --json is not checked here"
    for path, argvs in forms.items():
        for argv in argvs:
            r = cli(tb_home, *argv)
            assert r.returncode in (0, 1), (argv, r.stdout, r.stderr)  # doctor: 1 when this machine lacks a tool
            assert r.stdout.strip()[:1] in "[{", (argv, r.stdout)
            json.loads(r.stdout)
    for path, test_file in ON_HOSTS.items():
        text = (ROOT / "tests" / test_file).read_text()
        assert re.search(rf'"{path[0]}"[^\n]*"--json"|"--json"[^\n]*"{path[0]}"', text), (path, test_file)


# --- help ----------------------------------------------------------------------------------------------------------
def broken_lines(text: str, width: int) -> list[str]:
    """Lines a greedy wrap would not have ended where they do: the next line's first word fits after them. Run
    over the help's prose and over each panel's text column (rows continuing in the same column)."""
    bad: list[str] = []
    lines = text.split("\n")
    for a, b in itertools.pairwise(lines):
        if a.startswith("│") and b.startswith("│"):
            ia, ib = a[2:-2], b[2:-2]
            col = len(ib) - len(ib.lstrip(" "))
            gaps = [m.end() for m in re.finditer(r" {2,}", ia.rstrip())]  # cells are two spaces apart or more
            last = gaps[-1] if gaps else len(ia) - len(ia.lstrip(" "))
            if not ib.strip() or col == 0 or col != last:  # b is not a continuation of a's last cell
                continue
            prev, first = ia[col:].rstrip(), ib.strip().split(" ")[0]
            if prev and not first.startswith("[") and len(prev) + 1 + len(first) <= len(ia) - col - 2:
                bad.append(f"{a.strip()} / {b.strip()}")
        elif a.startswith(" ") and b.startswith(" ") and a.strip() and b.strip() and not a.startswith(" Usage"):
            prev, first = a.strip(), b.strip().split(" ")[0]
            if len(prev) + 1 + len(first) <= width - 4:
                bad.append(f"{prev} / {b.strip()}")
    return bad


@pytest.mark.slow
def test_help_is_plain_prose_at_80_and_120_columns(tb_home: Path) -> None:
    paths = sorted(_tree())
    assert ("list", "suites") in paths and ("report",) in paths
    for width in WIDTHS:
        outputs = {("root, console script",): cli(tb_home, "--help", columns=width).stdout}
        outputs.update({p: invoke([*p, "--help"], columns=width).stdout for p in paths})
        for path, out in outputs.items():
            assert "Usage:" in out, (path, out)
            assert "``" not in out, (path, width, out)
            assert not re.search(r"(?i)<(list\[)?(str|int|float|path|bool|text)\]?>", out), (path, width, out)
            assert not re.search(r"Usage: .*\{\w+\}", out), (path, width, out)
            assert broken_lines(out, width) == [], (path, width, broken_lines(out, width))
    run = invoke(["run", "--help"], columns=120).stdout
    assert "NAME=PATH|URL[@REF]" in run and re.search(r"--param\s+-p\s+TEXT", run), run  # brackets are text


def test_the_break_detector_finds_a_docstrings_hard_line_break() -> None:
    """What the help looked like before: a docstring's line break kept in the middle of a paragraph."""
    prose = (" Without options the testbed's default profile (its spec's `profile:`) is applied. Hosts whose "
             "recorded \n set-up matches what would be applied are skipped.\n")
    panel = ("│ status       What state knows, without touching the network (--probe checks  │\n"
             "│              reachability). With no name: the ledger                         │\n"
             "│              of every testbed.                                               │\n")
    assert len(broken_lines(prose, 120)) == 1 and len(broken_lines(panel, 80)) == 1


# --- ids in tables, plurals, times ---------------------------------------------------------------------------------
def _state_with_runs(n: int = 4) -> list[str]:
    from testbed.records import RunInfo, RunRecord
    from testbed.state import Store

    st = Store.open_default()
    st.upsert_testbed("local", "local", None, "up", {})
    for i in range(4):
        st.add_resource("local", "netns", f"tb-local-node{i}")
    from testbed.hosts import Host

    st.set_hosts("local", [Host(name="node0", address="10.213.9.2")])
    ids = []
    for i in range(n):
        rid = f"fault-drill-20250101-12000{i}-ab{i:02d}"
        st.add_run(RunRecord(id=rid, suite="fault-drill", testbed="local", status="running",
                             created=1_796_000_000.0 + i, info=RunInfo()), [("node0", 0)])
        if i:
            st.update_run(rid, status="failed", started=1_796_000_000.0 + i, ended=1_796_000_060.0 + i,
                          reason="node1 rank 1: exit 3, after a very long explanation of what went wrong and why")
        else:
            st.update_run(rid, started=1_796_000_000.0)
        ids.append(rid)
    st.close()
    return ids


def test_run_ids_are_never_broken_in_tables(tb_home: Path) -> None:
    ids = _state_with_runs()
    for width in WIDTHS:
        for argv in (["list", "runs"], ["status"]):
            out = cli(tb_home, *argv, columns=width).stdout
            for rid in ids if argv[0] == "list" else ids[:1]:  # the ledger shows the active run
                assert any(rid in line for line in out.splitlines()), (width, argv, rid, out)


def test_counts_agree_with_their_nouns(tb_home: Path) -> None:
    from testbed.records import RunEvent
    from testbed.run.runner import describe_event
    from testbed.textfmt import plural

    assert [plural(1, "rank"), plural(4, "rank"), plural(4, "netns"), plural(2, "process"), plural(0, "host")] == \
        ["1 rank", "4 ranks", "4 netns", "2 processes", "0 hosts"]
    assert describe_event(RunEvent(seq=1, run_id="r", ts=0.0, kind="started",
                                   detail={"ranks": 1, "hosts": ["node0"]})) == "started 1 rank on node0"
    _state_with_runs(1)
    out = cli(tb_home, "status", columns=160).stdout
    assert "4 netns" in out and "netnss" not in out, out


# a kind of host, a "did you mean", SQL columns; a quoted selection ("'x,y' names no host": the verb) and a count
# over a thousand (":," formats it: always plural) are not counts glued by hand
NOT_COUNTS = ("{req.accelerator}", "{closest(", "{cols}", "{what}", "{option}", "{module}")  # words, not counts


@pytest.mark.slow
def test_no_count_is_glued_to_a_plural_by_hand() -> None:
    """Every count shown with a noun goes through textfmt.plural: no f-string puts a number before a noun ending in
    's' or '(s)' (words that are always plural, such as 'seconds' after a float, are allowed)."""
    pattern = re.compile(r"\{[^{}]+\} ?(?:[A-Za-z]+ )?(?:host|rank|run|file|point|step|node|server|problem|"
                         r"resource|netns|lease|line|epoch|name|suite|error|fault|role)(?:s\b|\(s\))")
    found = []
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                src = ast.get_source_segment(path.read_text(), node) or ""
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in pattern.findall(src)
                          if not m.startswith(NOT_COUNTS) and "!r}" not in m and ":,}" not in m]
    assert found == [], "\n".join(found)


def test_times_are_iso_8601_utc(tb_home: Path) -> None:
    ids = _state_with_runs(2)
    out = cli(tb_home, "list", "runs", columns=200).stdout
    assert "2026-11-30T00:53:20Z" in out and "e+09" not in out, out
    out = cli(tb_home, "status", ids[0], columns=200).stdout
    assert "started 2026-11-30T00:53:20Z" in out, out
    # a report's time columns (fault-drill's train log and event steps, unix seconds in the data)
    from testbed.report.build import build_report

    run = tb_home / "results" / "fault-drill" / "run-1"
    shutil.copytree(ROOT / "tests" / "samples" / "fault-drill", run)
    for host in ("node0", "node1"):
        log = run / host / "train_log.csv"
        rows = log.read_text().splitlines()
        log.write_text("\n".join([rows[0], *(f"{float(r.split(',')[0]) + 1_796_000_000:.2f},"
                                             + r.split(",", 1)[1] for r in rows[1:])]) + "\n")
    (run / "manifest.json").write_text(json.dumps({"run_id": "run-1", "suite": "fault-drill", "status": "succeeded"}))
    md = build_report(run).path.read_text()
    assert "e+09" not in md and re.search(r"\| 2026-11-30T01:10:00(\.000)?Z \|", md), md
    csv = (run / "report" / "train_log.csv").read_text()
    assert "1796001000" in csv  # the tidy CSV keeps the number


def test_clock_and_iso_agree() -> None:
    from testbed.textfmt import clock, iso

    t = time.mktime((2025, 1, 1, 12, 0, 1, 0, 0, -1)) + 0.25
    assert iso(t)[11:19] == clock(t)[:8] and clock(t).endswith("Z") and iso(t).endswith("Z")
    assert iso(None) is None and clock(None) == ""


# --- a dry run the real run would refuse ---------------------------------------------------------------------------
def test_a_dry_run_the_real_run_would_refuse_says_so_and_exits_2(tb_home: Path) -> None:
    r = cli(tb_home, "run", "isca-resnet18", "--on", "local", "--dry-run")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "dry run" in r.stdout and "prepare" in r.stdout  # the commands are shown all the same
    err = " ".join(r.stderr.split())
    assert "error: dry run shown above, but the real run would be refused: suite 'isca-resnet18' runs on gcp-tpu " \
           "testbeds; 'local' is local" in err and "where: --on local" in err and "fix:" in err, err
    r = cli(tb_home, "run", "isca-resnet18", "--on", "local", "--dry-run", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["refused"][0]["where"] == "--on local"
    r = cli(tb_home, "run", "isca-resnet18", "--on", "local", "--matrix", "--dry-run")
    assert r.returncode == 2 and r.stderr.count("error:") == 1, r.stderr
    ok = cli(tb_home, "run", "mpi-hello", "--on", "local", "--dry-run")
    assert ok.returncode == 0 and "refused" not in ok.stderr, ok.stderr


def test_list_names_a_broken_spec_and_one_that_needs_a_variable(tb_home: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec that cannot be provisioned as it stands is never listed as plain 'not provisioned': a broken one says
    so with its first problem and file:line; one that reads an unset environment variable names the variable."""
    from testbed.cli import app

    monkeypatch.delenv("TB_LIST_NEVER_SET", raising=False)
    inv = tb_home / "inventories"
    inv.mkdir(exist_ok=True)
    (inv / "typo.yml").write_text("provider:\n  kind: chameloen\n")
    (inv / "envy.yml").write_text("provider: {kind: local}\nuser: ${TB_LIST_NEVER_SET}\n")
    (inv / "fine.yml").write_text("provider: {kind: local, hosts: 2}\n")
    r = CliRunner().invoke(app, ["list", "testbeds", "--json"])
    assert r.exit_code == 0, r.stdout
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert rows["typo"]["status"] == "broken spec" and "did you mean" not in rows["typo"]["problem"]
    assert "unknown provider.kind 'chameloen'" in rows["typo"]["problem"] and "typo.yml:2" in rows["typo"]["problem"]
    assert rows["envy"]["status"] == "needs $TB_LIST_NEVER_SET"
    assert rows["fine"]["status"] == "not provisioned" and "problem" not in rows["fine"]
    r = CliRunner().invoke(app, ["list", "testbeds"])
    assert "broken spec" in r.stdout and "typo: typo.yml: unknown provider.kind" in " ".join(r.stdout.split())


def test_show_prints_templates_as_the_default_testbed_renders_them(tb_home: Path) -> None:
    """`show` never prints raw Jinja: a templated default is shown as its default testbed renders it, and a
    templated fault pattern as the pattern that testbed's plan watches for; with no testbed, it says so."""
    from testbed.cli import app

    r = CliRunner().invoke(app, ["show", "fault-drill"])
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "{{" not in text and "{%" not in text, text
    assert "python (str) = '~/tb-venv/bin/python' on local (rendered per testbed)" in text
    assert "fault kill-host: kill-host when /epoch [0-9]+ step 5 loss/" in text
    r = CliRunner().invoke(app, ["show", "neuronabox"])  # no default testbed
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "{{" not in text and "(a template, rendered per testbed)" in text, text
