"""The README's first screen says why testbed, beside SkyPilot, dstack and a Trovi notebook: every testbed cell
is backed by tests that exist, "only testbed" (bold) is said only where every peer's cell is empty, and the table
fits the first screen, measured in headless Chromium at 1280x800 on the README rendered as GitHub lays it out."""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
from pathlib import Path

from markdown_it import MarkdownIt
from test_report_browser import _browser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PEERS = ("SkyPilot", "dstack", "Trovi")

# each row of the table: the tests that show testbed doing what its cell says (they run in `make test`)
BACKING: dict[str, dict[str, tuple[str, ...]]] = {
    "machines": {
        "tests/test_local_provider.py": (),
        "tests/test_lab_provider.py": (),
        "tests/test_slurm_provider.py": ("test_provision_run_destroy_through_slurm",),
        "tests/test_cloud_e2e.py": ("test_chameleon_end_to_end_on_real_hosts", "test_tpu_end_to_end_on_real_hosts"),
    },
    "set-up": {
        "tests/test_setup_skip.py": ("test_unchanged_rerun_is_skipped_without_ansible",),
        "tests/test_images.py": ("test_a_second_testbed_and_a_new_disk_boot_from_the_image",),
    },
    "rehearse": {
        "tests/test_rehearse_mutants.py": ("test_a_mutant_of_a_shipped_suite_fails_its_rehearsal_naming_the_defect",
                                           "test_the_shipped_suite_unmutated_rehearses_green"),
        "tests/test_rehearse.py": ("test_tesla_hello_rehearsed_on_a_replica_of_the_lab",),
    },
    "faults": {
        "tests/test_run_local.py": ("test_fault_drill_fault_on_log_line_and_recovery",),
        "tests/test_repair.py": ("test_ten_seeds_each_host_kill_detected_repaired_resumed",),
    },
    "recovery": {
        "tests/test_repair.py": ("test_fault_drill_host_killed_repaired_and_resumed",
                                 "test_ten_seeds_each_host_kill_detected_repaired_resumed"),
    },
    "verdict": {
        "tests/test_collect.py": (),
        "tests/test_references.py": ("test_within_outside_and_not_measured",),
    },
    "replay": {
        "tests/test_reproduce.py": ("test_a_changed_suite_is_refused_naming_the_difference",),
    },
    "unattended": {
        "tests/test_deadman.py": ("test_chameleon_expired_testbed_releases_itself",
                                  "test_tpu_expired_testbed_deletes_itself"),
    },
}


def _section() -> str:
    text = README.read_text()
    m = re.search(r"^## Why testbed\n(.*?)^## ", text, re.S | re.M)
    assert m, "README.md has no '## Why testbed' section"
    return m[1]


def _table(section: str) -> tuple[list[str], list[list[str]]]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    return cells[0], [c for c in cells[2:]]


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name.startswith("test_")}


def test_the_table_sets_testbed_beside_its_peers() -> None:
    head, rows = _table(_section())
    assert head == ["", "testbed", *PEERS]
    assert [r[0] for r in rows] == list(BACKING), "each row needs its backing tests in BACKING"
    for label, *cells in rows:
        assert len(cells) == 1 + len(PEERS), label
        assert cells[0] and cells[0] != "—", f"{label}: testbed's cell is empty"


def test_only_testbed_is_said_only_where_every_peer_has_nothing() -> None:
    _, rows = _table(_section())
    only = [r[0] for r in rows if r[1].startswith("**")]
    assert only, "the table says nothing that only testbed does"
    for label, _mine, *peers in rows:
        if label in only:
            assert all(p == "—" for p in peers), f"{label}: bold says only testbed, but a peer has {peers}"
        assert not any(p.startswith("**") for p in peers), label


def test_every_testbed_cell_is_backed_by_tests_that_exist() -> None:
    section = _section()
    links = dict(re.findall(r"\[([^\]]+)\]\((tests/[^)]+\.py)\)", section))
    for label, files in BACKING.items():
        assert label in links, f"README: the '{label}' row has no link to its test"
        assert links[label] in files, f"README links '{label}' to {links[label]}, not to a test that backs it"
        for file, names in files.items():
            path = ROOT / file
            assert path.is_file(), file
            defined = _defined_tests(path)
            assert defined, f"{file} defines no test"
            missing = set(names) - defined
            assert not missing, f"{file} no longer defines {sorted(missing)}, which back the '{label}' row"


# GitHub's README column at a 1280-pixel window: about 830 pixels of text at 16 px, line height 1.5
PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body{margin:0;font:16px/1.5 -apple-system,"Segoe UI","Noto Sans",Helvetica,Arial,sans-serif}
article{width:830px;padding:32px;box-sizing:border-box}
h1{font-size:2em;margin:.67em 0 16px;padding-bottom:.3em}
h2{font-size:1.5em;margin:24px 0 16px;padding-bottom:.3em}
p,table{margin:0 0 16px}
table{border-collapse:collapse;display:block;width:max-content;max-width:100%%;overflow:auto}
td,th{padding:6px 13px;border:1px solid #d0d7de}
code{font-size:85%%;padding:.2em .4em}
</style></head><body><article>%s</article><pre id="result">pending</pre>
<script>
const t = document.querySelector("article table"), r = t.getBoundingClientRect();
document.getElementById("result").textContent = JSON.stringify({
  top: r.top, bottom: r.bottom, right: r.right, scroll: t.scrollWidth > t.clientWidth,
  window: [innerWidth, innerHeight]});
</script></body></html>
"""


def test_the_why_table_fits_the_first_screen_in_chromium(tmp_path: Path) -> None:
    body = MarkdownIt("commonmark").enable("table").render(README.read_text())
    page = tmp_path / "readme.html"
    page.write_text(PAGE % body)
    r = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                        "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120, check=False)
    m = re.search(r'<pre id="result">(.*?)</pre>', r.stdout, re.S)
    assert m and m[1] != "pending", r.stdout[-2000:] + r.stderr[-2000:]
    box = json.loads(html.unescape(m[1]))
    assert box["window"] == [1280, 800], box
    assert not box["scroll"], f"the table is wider than the README column: {box}"
    assert box["bottom"] <= 800, f"the 'Why testbed' table ends at {box['bottom']:.0f} px, past the first screen"
