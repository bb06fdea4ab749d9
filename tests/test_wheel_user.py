"""Issue 38, done when: a user with only the wheel installed writes, rehearses and reports a new artifact with
verdicts on its metrics, without touching testbed's package.

The wheel is built from this checkout and installed into a fresh venv (tests/test_wheel.py's fixtures); the user
works in a folder outside the checkout with its own state home, writes a suite folder there (a workload under
``workloads/``, ``suite.yml`` with a declared table and references, ``report.py`` registering a parser through
``testbed.results``) and a two-host local spec, then runs the venv's own ``testbed``: show, rehearse (on real local
hosts), collect and report. The verdicts are real: three references the workload meets exactly, one deliberately
off. Nothing is written inside the installed package or the checkout."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sysconfig
from pathlib import Path

import pytest
from localbed import free_subnet
from test_wheel import _plain_env, _run, installed, wheel  # noqa: F401  (fixtures: the wheel, its venv)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

WORKLOAD = '''"""Counts the words of a public-domain sentence (the first of the Declaration of Independence, 1776) and
multiplies two small integer matrices: writes words_rank<R>.csv (word,count) and one summary line."""

import argparse
import collections
import csv
import re
import time

TEXT = ("When in the Course of human events, it becomes necessary for one people to dissolve the political bands "
        "which have connected them with another, and to assume among the powers of the earth, the separate and "
        "equal station to which the Laws of Nature and of Nature's God entitle them, a decent respect to the "
        "opinions of mankind requires that they should declare the causes which impel them to the separation.")

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, required=True)
p.add_argument("--repeat", type=int, default=1)
p.add_argument("--size", type=int, default=24)
args = p.parse_args()

counts = collections.Counter(w for _ in range(args.repeat) for w in re.findall(r"[a-z']+", TEXT.lower()))
with open(f"words_rank{args.rank}.csv", "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["word", "count"])
    out.writerows(sorted(counts.items()))

n = args.size
a = [[(i * n + j) % 7 for j in range(n)] for i in range(n)]
b = [[(i + 2 * j) % 5 for j in range(n)] for i in range(n)]
start = time.perf_counter()
for _ in range(3):
    c = [[sum(a[i][k] * b[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
seconds = time.perf_counter() - start
print(f"rank {args.rank}: counted {sum(counts.values())} words, {len(counts)} distinct; "
      f"matmul {n}x{n} checksum {sum(map(sum, c))} in {seconds:.4f} s", flush=True)
'''

SUITE = r"""# A user's own artifact: word counts and a small matmul on every host, reported with verdicts.
name: wordcount
description: word counts of a public-domain sentence and a small integer matmul on every host
testbed: pair
requires: {hosts: 2}
files: [workloads/wordcount.py]
parameters:
  repeat: {type: int, default: 3, min: 1, help: times the sentence is counted}
steps:
  launch:
    command: "python3 wordcount.py --rank {{ rank }} --repeat {{ repeat }}"
estimate: 10s
timeouts: {run: 120, grace: 5, poll: 0.5}
outputs: ["words_rank*.csv"]
tables:
  summary:
    files: "rank*.out"
    regex: 'counted (?P<words>\d+) words, (?P<distinct>\d+) distinct; matmul \d+x\d+ checksum (?P<checksum>\d+)'
references:
  metrics:
    - {metric: words counted by rank 0, table: summary, column: words, where: {rank: 0}, value: 213,
       tolerance: {exact: true, why: "a count: 71 words, repeat 3"}, source: "the sentence, counted by hand"}
    - {metric: matmul checksum on rank 1, table: summary, column: checksum, where: {rank: 1}, value: 82702,
       tolerance: {exact: true, why: "integer arithmetic"}, source: "workloads/wordcount.py run once"}
    - {metric: "'the' on every host", table: words, column: count, where: {word: the}, reduce: sum, value: 54,
       tolerance: {exact: true, why: "9 per sentence, repeat 3, 2 hosts"}, source: "the sentence"}
    - {metric: distinct words (deliberately off), table: summary, column: distinct, where: {rank: 0}, value: 60,
       tolerance: {abs: 1, why: "a count; 60 is wrong on purpose"}, source: "a wrong claim, to see it fail"}
"""

REPORT = '''"""wordcount's parser: one row per word of each words_rank<R>.csv."""

from testbed import results

results.require(2)


@results.parser("words", files="words_rank*.csv", columns=["word", "count"])
def words(text: str) -> list[dict]:
    rows, _notes = results.csv_rows(text, ("word", "count"))
    return [{"word": r["word"], "count": int(r["count"])} for r in rows]
'''

SPEC = """description: two local hosts, the testbed this artifact is rehearsed like
provider: {{kind: local, hosts: 2, subnet: {subnet}}}
user: root
"""


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (its path) with its sha256: a new, removed or changed file shows."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _checkout_state() -> list[str]:
    """What git sees in the checkout: its changed and untracked files, and among the ignored ones a results folder,
    a state home or anything of this artifact (caches, builds and the venv are others' to write meanwhile)."""
    out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all", "--ignored"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    ours = ("results/", ".testbed/", "wordcount", "pair.yml")
    return sorted(ln for ln in out.splitlines() if not ln.startswith("!! ") or any(o in ln for o in ours))


def test_a_wheel_user_writes_rehearses_and_reports_a_new_artifact(installed: Path,  # noqa: F811
                                                                   need_local: None, tmp_path: Path) -> None:
    venv, py, exe = installed, installed / "bin" / "python", str(installed / "bin" / "testbed")
    work = tmp_path / "user"
    suite = work / "experiments" / "wordcount"
    (suite / "workloads").mkdir(parents=True)
    assert not work.is_relative_to(ROOT) and not venv.is_relative_to(ROOT)
    env = {**_plain_env(work / ".testbed"), "COLUMNS": "300"}

    # the venv's testbed is the wheel's: its script runs the venv's Python, which imports testbed from the venv
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work,
                     env=env).stdout.strip())
    assert site.is_relative_to(venv) and site != Path(sysconfig.get_paths()["purelib"]), site
    assert Path(exe).read_text().splitlines()[0] == f"#!{py}"
    where = _run([str(py), "-c", "import testbed, testbed.results as r; print(testbed.__file__); print(r.__file__)"],
                 cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(site / "testbed") for f in where.stdout.split()), where.stdout
    package = site / "testbed"
    before, checkout = _tree(package), _checkout_state()

    # the artifact, as a user writes it
    (suite / "workloads" / "wordcount.py").write_text(WORKLOAD)
    (suite / "suite.yml").write_text(SUITE)
    (suite / "report.py").write_text(REPORT)
    (work / "inventories").mkdir()
    (work / "inventories" / "pair.yml").write_text(SPEC.format(subnet=free_subnet()))

    r = _run([exe, "show", "wordcount"], cwd=work, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"file: {suite / 'suite.yml'}" in r.stdout, r.stdout  # the user's folder, not a shipped suite
    r = _run([exe, "list", "suites", "--json"], cwd=work, env=env, timeout=120)
    mine = next(s for s in json.loads(r.stdout) if s["name"] == "wordcount")
    assert mine["path"] == str(suite / "suite.yml"), mine

    replica = "rehearse-pair"
    try:
        r = _run([exe, "rehearse", "wordcount", "--like", "pair", "--subnet", free_subnet(), "--keep", "--json"],
                 cwd=work, env=env, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        out = json.loads(r.stdout)
        (run_dir,) = [m.parent for m in (work / "results" / "wordcount").glob("*/manifest.json")]
        run_id = run_dir.name
        assert json.loads((run_dir / "manifest.json").read_text())["rehearsal"]["like"] == "pair", out
        for h, rank in (("node0", 0), ("node1", 1)):
            assert (run_dir / h / f"words_rank{rank}.csv").is_file(), sorted(p.name for p in run_dir.rglob("*"))
        r = _run([exe, "collect", run_id, "--to", "results"], cwd=work, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        gone = _run([exe, "destroy", replica, "--yes"], cwd=work, env=env, timeout=300)
    assert gone.returncode == 0, gone.stdout + gone.stderr

    for f in (run_dir / "report").iterdir():  # the report again, from the collected run alone
        f.unlink()
    r = _run([exe, "report", "results"], cwd=work, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = run_dir / "report"
    assert {"summary.csv", "words.csv", "verdicts.csv"} <= {p.name for p in report.iterdir()}, list(report.iterdir())
    with (report / "words.csv").open() as f:
        the = [row for row in csv.DictReader(f) if row["word"] == "the"]
    assert sorted((row["host"], row["count"]) for row in the) == [("node0", "27"), ("node1", "27")], the
    with (report / "verdicts.csv").open() as f:
        verdicts = {row["metric"]: row for row in csv.DictReader(f)}
    assert {m: v["verdict"] for m, v in verdicts.items()} == {
        "words counted by rank 0": "within tolerance", "matmul checksum on rank 1": "within tolerance",
        "'the' on every host": "within tolerance", "distinct words (deliberately off)": "outside tolerance"}, verdicts
    md = (report / "report.md").read_text()
    assert "| distinct words (deliberately off) | 60 | 49 |" in md and "outside tolerance" in md, md[:2000]

    assert _tree(package) == before, "the run wrote inside the installed package"
    assert _checkout_state() == checkout, "the run wrote inside the checkout"
